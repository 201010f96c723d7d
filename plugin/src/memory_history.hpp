#pragma once
// torch.cuda.memory._record_memory_history and memory_snapshot() for the torch backend, without PyTorch so
// the host tests check them: the trace of allocations and frees with where they came from (a Context, the
// backend's stack frames), the segment events of the trace (Note [Segments and mapped ranges]), and the
// segments of a snapshot assembled from strata's own listing of its chunks with the backend's live blocks laid
// over it.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <strata/core/snapshot.hpp>

#include "block_table.hpp"

namespace strata::plugin {

/// PyTorch's trace actions, in c10's TraceEntry::Action order.
enum class trace_action { alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, segment_unmap, snapshot, oom };

inline constexpr std::string_view action_name(trace_action a) noexcept
{
  constexpr std::string_view names[] = {"alloc",       "free_requested", "free_completed", "segment_alloc", "segment_free",
                                        "segment_map", "segment_unmap",  "snapshot",       "oom"};
  return names[static_cast<int>(a)];
}

/// Throws std::invalid_argument naming the action when it is not one of PyTorch's.
inline trace_action parse_action(std::string_view name)
{
  for (int i = 0; i <= static_cast<int>(trace_action::oom); ++i)
    if (action_name(static_cast<trace_action>(i)) == name) return static_cast<trace_action>(i);
  throw std::invalid_argument("memory history: '" + std::string(name) + "' is not a trace action (alloc, free_requested, "
                              "free_completed, segment_alloc, segment_free, segment_map, segment_unmap, snapshot, oom)");
}

/// When stack frames are gathered: PyTorch's RecordContext.
enum class context_mode { never = 0, state = 1, alloc = 2, all = 3 };

template <class Context>
struct trace_record {
  trace_action action{};
  std::uintptr_t address = 0;  ///< for oom: the device's free bytes, as PyTorch does
  std::size_t size = 0;
  void* stream = nullptr;
  pool_id pool{};
  std::uint64_t time = 0;  ///< the caller's clock
  Context context{};
  /// What the user named the program's phase when this happened (PyTorch's _set_memory_metadata); null: none.
  std::shared_ptr<const std::string> user_metadata{};
  /// The compiled region running on the recording thread then (PyTorch's pushCompileContext); null: none.
  std::shared_ptr<const std::string> compile_context{};
};

/// The recording switch and the trace ring of one device. Models: PyTorch's recordHistory (enabled, context
/// mode, max entries as a ring, clear, skipped actions). Cost: O(1) amortized per record (a deque), no lock
/// (the backend holds the device's), no CUDA call.
template <class Context>
class memory_history {
public:
  /// recordHistory: turning recording off, or `clear`, empties the trace. Throws std::invalid_argument
  /// (nothing changed) on an unknown skipped action name.
  void configure(bool enabled, context_mode when, std::size_t max_entries, bool clear, const std::vector<std::string>& skip)
  {
    std::vector<bool> skipped(static_cast<std::size_t>(trace_action::oom) + 1, false);
    for (const std::string& name : skip) skipped[static_cast<std::size_t>(parse_action(name))] = true;
    enabled_ = enabled;
    when_ = enabled ? when : context_mode::never;
    max_entries_ = max_entries;
    skipped_ = std::move(skipped);
    if (clear || !enabled) trace_.clear();  // turning recording off drops the trace, as PyTorch's does
    trim();
  }

  bool enabled() const noexcept { return enabled_; }
  /// Whether an allocation gathers its frames (kept with the live block and in the trace).
  bool context_on_alloc() const noexcept { return enabled_ && when_ != context_mode::never; }
  /// Whether a free gathers its own frames.
  bool context_on_free() const noexcept { return enabled_ && when_ == context_mode::all; }
  /// Whether the trace keeps alloc frames (state: only live blocks keep them).
  bool trace_keeps_alloc_context() const noexcept { return when_ == context_mode::alloc || when_ == context_mode::all; }

  void record(trace_record<Context> r)
  {
    if (!enabled_ || max_entries_ == 0 || skipped_[static_cast<std::size_t>(r.action)]) return;
    if (r.action == trace_action::alloc && !trace_keeps_alloc_context()) r.context = Context{};
    trace_.push_back(std::move(r));
    trim();
  }

  const std::deque<trace_record<Context>>& trace() const noexcept { return trace_; }

private:
  void trim()
  {
    while (trace_.size() > max_entries_) trace_.pop_front();
  }

  bool enabled_ = false;
  context_mode when_ = context_mode::never;
  std::size_t max_entries_ = 0;
  std::vector<bool> skipped_ = std::vector<bool>(static_cast<std::size_t>(trace_action::oom) + 1, false);
  std::deque<trace_record<Context>> trace_;
};

// Note [Segments and mapped ranges]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch's trace trackers (attachAllocatorTraceTracker; the NCCL registration hook of
// TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK, which registers memory with NCCL as it is reported and
// deregisters it as it goes) hear of device memory in two ways: SEGMENT_ALLOC and SEGMENT_FREE for an
// allocation of its own (a cudaMalloc'd chunk), SEGMENT_MAP and SEGMENT_UNMAP for physical memory mapped into
// and out of a reserved address range (PyTorch's expandable segments), each event with the address and size of
// the range. A chunked stack's segments are allocations of their own. A page-mapped pool's segments
// (mapped_pool: one reserved range per size band) hold no memory as such and stay as they are while pages are
// mapped and unmapped: what a tracker must hear of is each physical allocation as mapped (one cuMemMap each),
// so that every SEGMENT_UNMAP names exactly a range an earlier SEGMENT_MAP named. strata's listing gives those
// as the segment's "mapped" ranges; a page-mapped listing without them reports nothing rather than the
// reservation, which no tracker may register.
//
// The listing is read again only when a figure that moves with it moved (segment_figures_of): the bytes and
// chunks held and the physical allocations made and released, for segments and new memory, and the mappings
// made and unmapped, for what moves no other figure: a relocation maps idle memory at a new range (leaving the
// old one mapped, stale, until tidied), tidying or moving back unmaps stale ranges, and a spare kept by a
// reclaim is mapped again, all without memory taken or given back.

/// One range of device memory: its address and size.
using held_ranges = std::map<std::uintptr_t, std::size_t>;

/// The device memory a stack holds, as PyTorch's trace trackers count it (Note [Segments and mapped ranges]).
struct held_memory {
  held_ranges segments;  ///< allocations of their own: SEGMENT_ALLOC / SEGMENT_FREE
  held_ranges mapped;    ///< physical allocations mapped into reserved ranges: SEGMENT_MAP / SEGMENT_UNMAP
  bool operator==(const held_memory&) const = default;
};

/// The box a page-mapped pool's listing names (mapped_pool's snapshot): its segments are reserved ranges.
inline constexpr std::string_view page_mapped_box = "mapped_pool";

/// The memory strata's listing says the stack holds (Note [Segments and mapped ranges]): a segment's mapped
/// ranges where it lists them, else the segment itself, unless the listing is a page-mapped pool's. O(ranges).
inline held_memory held_memory_of(const snapshot& listing)
{
  held_memory h;
  const bool page_mapped = listing.box == page_mapped_box;
  for (const segment_info& seg : listing.segments) {
    for (const mapped_range& m : seg.mapped) h.mapped.emplace(seg.address + m.offset, m.size);
    if (seg.mapped.empty() && !page_mapped) h.segments.emplace(seg.address, seg.size);
  }
  return h;
}

/// The memory strata holds, as last told to the trace: each change becomes PyTorch's SEGMENT_ALLOC or
/// SEGMENT_FREE event for a segment, SEGMENT_MAP or SEGMENT_UNMAP for a mapped range (Note [Segments and mapped
/// ranges]). A range whose size changed at the same address goes and comes again. Models: the segment events
/// of PyTorch's trace. Cost: O(ranges log ranges) per update, which the backend makes only while recording and
/// only when the stack's segment figures moved; no lock (the backend holds the device's), no CUDA call.
class segment_ledger {
public:
  struct change {
    trace_action action{};  ///< segment_alloc, segment_free, segment_map or segment_unmap
    std::uintptr_t address = 0;
    std::size_t size = 0;
    bool operator==(const change&) const = default;
  };

  bool adopted() const noexcept { return adopted_; }
  /// Takes the memory as it is without reporting it (recording starts: PyTorch's trace reports only changes
  /// from then on).
  void adopt(held_memory now)
  {
    known_ = std::move(now);
    adopted_ = true;
  }
  void adopt(const snapshot& now) { adopt(held_memory_of(now)); }
  /// Forgets the memory (recording stops).
  void forget() noexcept
  {
    known_ = {};
    adopted_ = false;
  }
  /// The changes from the memory last known to `now`: every range that went first (unmaps, then segment
  /// frees), in address order, then every range that came (segment allocations, then maps); a range gone and
  /// come again at the same address is reported gone before it comes.
  std::vector<change> update(held_memory now)
  {
    std::vector<change> out;
    gone(known_.mapped, now.mapped, trace_action::segment_unmap, out);
    gone(known_.segments, now.segments, trace_action::segment_free, out);
    gone(now.segments, known_.segments, trace_action::segment_alloc, out);
    gone(now.mapped, known_.mapped, trace_action::segment_map, out);
    known_ = std::move(now);
    adopted_ = true;
    return out;
  }
  std::vector<change> update(const snapshot& now) { return update(held_memory_of(now)); }
  /// The segments (allocations of their own) and the mapped ranges last known.
  const held_ranges& known() const noexcept { return known_.segments; }
  const held_ranges& known_mapped() const noexcept { return known_.mapped; }

private:
  /// Appends `action` for every range of `from` that `to` lacks at its address and size.
  static void gone(const held_ranges& from, const held_ranges& to, trace_action action, std::vector<change>& out)
  {
    for (const auto& [a, n] : from) {
      const auto it = to.find(a);
      if (it == to.end() || it->second != n) out.push_back({action, a, n});
    }
  }

  held_memory known_;
  bool adopted_ = false;
};

/// Trace trackers (attachAllocatorTraceTracker), each called with every event under one lock that the thread
/// holding it may take again: a tracker that allocates records events of its own, which reach the trackers
/// on the same thread, while other threads wait their turn. A tracker attached during a call is called from
/// the next event on. Models: PyTorch's list of allocator trace trackers. Cost: one recursive lock per event
/// while any tracker is attached (one atomic load otherwise).
template <class Event>
class tracker_list {
public:
  using tracker = std::function<void(const Event&)>;

  void attach(tracker t)
  {
    std::lock_guard lock(mutex_);
    trackers_.push_back(std::move(t));
    any_.store(true, std::memory_order_release);
  }
  bool any() const noexcept { return any_.load(std::memory_order_acquire); }
  void call(const Event& e)
  {
    std::lock_guard lock(mutex_);
    // By index over a deque: a tracker attached inside a call neither moves the one running nor joins this call.
    const std::size_t n = trackers_.size();
    for (std::size_t i = 0; i < n; ++i) trackers_[i](e);
  }

private:
  std::recursive_mutex mutex_;
  std::deque<tracker> trackers_;
  std::atomic<bool> any_{false};
};

/// A block of a snapshot segment, as PyTorch's BlockInfo has it.
template <class Context>
struct snapshot_block {
  std::size_t size = 0;
  std::size_t requested = 0;
  bool allocated = false;  ///< live: handed to PyTorch
  bool active = false;     ///< live, or freed and waiting for other streams' work
  Context context{};
};

template <class Context>
struct snapshot_segment {
  std::uintptr_t address = 0;
  std::size_t total = 0, requested = 0, allocated = 0, active = 0;
  void* stream = nullptr;
  pool_id pool{};
  bool large = false;  ///< PyTorch's segment kind: a private pool's by its blocks, else over 1 MiB
  std::vector<snapshot_block<Context>> blocks;
};

namespace detail {

template <class Context>
void mark_live(snapshot_segment<Context>& s, snapshot_block<Context>& sb, const live_block<Context>& live)
{
  sb.allocated = sb.active = true;
  sb.requested = live.requested;
  sb.context = live.context;
  if (s.stream == nullptr) s.stream = live.stream;
}

template <class Context>
void add(snapshot_segment<Context>& s, snapshot_block<Context>&& sb)
{
  s.requested += sb.requested;
  s.allocated += sb.allocated ? sb.size : 0;
  s.active += sb.active ? sb.size : 0;
  s.blocks.push_back(std::move(sb));
}

} // namespace detail

/// A private pool's segment as PyTorch lists it: its pool, its kind, its pieces (live ones allocated with
/// their frames, parked ones inactive). O(pieces + pools).
template <class Context>
snapshot_segment<Context> pool_segment_snapshot(const block_table<Context>& table, const typename block_table<Context>::segment_view& segment)
{
  snapshot_segment<Context> ps;
  ps.address = segment.base;
  ps.total = segment.size;
  ps.pool = segment.pool;
  ps.large = !segment.small;
  ps.stream = segment.stream;
  (void)table.for_each_piece(segment.base, [&](const pool_piece& pc) {
    snapshot_block<Context> piece{.size = pc.size};
    if (const auto* live = pc.live ? table.find(pc.address) : nullptr) detail::mark_live(ps, piece, *live);
    detail::add(ps, std::move(piece));
  });
  return ps;
}

/// The segments of memory_snapshot(): strata's chunks, each block marked by the table (live: allocated; parked
/// in a graph pool: inactive; neither and not free in strata: freed but held for another stream's work). A
/// block that is a private pool's segment is listed as a segment of its own, with its pool and its pieces, as
/// PyTorch lists a pool's segments (Note [Private pools are laid out as PyTorch lays them out]); the chunk's
/// ranges around it are listed as segments of their own. Blocks tile their segment (ranges strata does not
/// list become free blocks). Only the segments of `only_pool` when it is not (0, 0). O(blocks + pools).
template <class Context>
std::vector<snapshot_segment<Context>> snapshot_segments(const snapshot& strata_view, const block_table<Context>& table, pool_id only_pool = {})
{
  std::vector<snapshot_segment<Context>> out;
  out.reserve(strata_view.segments.size());
  using detail::add;
  using detail::mark_live;
  for (const segment_info& seg : strata_view.segments) {
    snapshot_segment<Context> rest;  // the chunk's range since the last pool segment
    rest.address = seg.address;
    const auto close_rest = [&](std::uintptr_t end) {
      rest.total = end - rest.address;
      rest.large = rest.total > pool_layout::small_block_limit;
      if (rest.total > 0 && only_pool.none()) out.push_back(std::move(rest));
      rest = snapshot_segment<Context>{};
      rest.address = end;
    };
    std::size_t covered = 0;
    for (const block_info& b : seg.blocks) {
      // PyTorch lays blocks end to end from the segment's address: a range strata does not list is free.
      if (b.offset > covered) add(rest, snapshot_block<Context>{.size = b.offset - covered});
      covered = b.offset + b.size;
      const std::uintptr_t address = seg.address + b.offset;
      if (!b.free)
        if (const auto pool_segment = table.segment_at(address)) {
          close_rest(address);
          if (only_pool.none() || pool_segment->pool == only_pool) out.push_back(pool_segment_snapshot(table, *pool_segment));
          rest.address = address + pool_segment->size;
          if (b.size > pool_segment->size) add(rest, snapshot_block<Context>{.size = b.size - pool_segment->size, .active = true});
          continue;
        }
      snapshot_block<Context> sb{.size = b.size};
      if (!b.free) {
        if (const auto* live = table.find(address)) mark_live(rest, sb, *live);
        else sb.active = true;  // freed, held for another stream's work
      }
      add(rest, std::move(sb));
    }
    if (seg.size > covered) add(rest, snapshot_block<Context>{.size = seg.size - covered});
    close_rest(seg.address + seg.size);
  }
  return out;
}

namespace detail {

/// strata's snapshot JSON as a document; text that is not JSON throws std::invalid_argument naming the offset
/// (and nlohmann's line and column) where reading stopped.
inline nlohmann::json snapshot_document(std::string_view text)
{
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    const std::size_t at = e.byte == 0 ? 0 : e.byte - 1;  // e.byte counts from 1
    throw std::invalid_argument("strata snapshot JSON: not JSON at offset " + std::to_string(at) + " (" + e.what() + ")");
  }
}

/// Runs `read` over the document; a member missing or of the wrong type throws std::invalid_argument saying which.
template <class Read>
auto read_snapshot_document(std::string_view text, Read&& read)
{
  const nlohmann::json doc = snapshot_document(text);
  try {
    return read(doc);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("strata snapshot JSON: not a strata snapshot (") + e.what() + ")");
  }
}

} // namespace detail

/// Reads strata's to_json(snapshot) text back (what libstrata_alloc.so's strata_snapshot_json writes).
/// Throws std::invalid_argument naming the position of text that is not JSON, or the member that is missing
/// or of the wrong type. O(length of the text).
inline snapshot parse_snapshot_json(std::string_view text)
{
  return detail::read_snapshot_document(text, [](const nlohmann::json& doc) {
    snapshot snap;
    snap.box = doc.at("box").get<std::string>();
    for (const nlohmann::json& s : doc.at("segments")) {
      segment_info seg;
      seg.address = s.at("address").get<std::uintptr_t>();
      seg.size = s.at("size").get<std::size_t>();
      for (const nlohmann::json& b : s.at("blocks"))
        seg.blocks.push_back({.offset = b.at("offset").get<std::size_t>(), .size = b.at("size").get<std::size_t>(),
                              .free = b.at("free").get<bool>(), .stream = b.at("stream").get<long long>()});
      if (const auto mapped = s.find("mapped"); mapped != s.end())
        for (const nlohmann::json& m : *mapped)
          seg.mapped.push_back({.offset = m.at("offset").get<std::size_t>(), .size = m.at("size").get<std::size_t>()});
      snap.segments.push_back(std::move(seg));
    }
    return snap;
  });
}

/// The memory strata's snapshot JSON says the stack holds: held_memory_of its listing. Throws as
/// parse_snapshot_json. O(length of the text).
inline held_memory parse_held_memory(std::string_view text) { return held_memory_of(parse_snapshot_json(text)); }

} // namespace strata::plugin
