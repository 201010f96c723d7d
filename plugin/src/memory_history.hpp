#pragma once
// torch.cuda.memory._record_memory_history and memory_snapshot() for the torch backend, without PyTorch so
// the host tests check them: the trace of allocations and frees with where they came from (a Context, the
// backend's stack frames), and the segments of a snapshot assembled from strata's own listing of its chunks
// with the backend's live blocks laid over it.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

/// The segments strata holds, as last told to the trace: each change becomes PyTorch's SEGMENT_ALLOC or
/// SEGMENT_FREE event (PyTorch's NCCL registration hook registers and deregisters memory by them). A segment
/// whose size changed at the same address is freed and taken again. Models: the segment events of PyTorch's
/// trace. Cost: O(segments log segments) per update, which the backend makes only while recording and only
/// when the stack's segment figures moved; no lock (the backend holds the device's), no CUDA call.
class segment_ledger {
public:
  struct change {
    trace_action action{};  ///< segment_alloc or segment_free
    std::uintptr_t address = 0;
    std::size_t size = 0;
    bool operator==(const change&) const = default;
  };

  bool adopted() const noexcept { return adopted_; }
  /// Takes the segments as they are without reporting them (recording starts: PyTorch's trace reports only
  /// changes from then on).
  void adopt(const snapshot& now)
  {
    std::map<std::uintptr_t, std::size_t> next;
    for (const segment_info& seg : now.segments) next.emplace(seg.address, seg.size);
    known_ = std::move(next);
    adopted_ = true;
  }
  /// Forgets the segments (recording stops).
  void forget() noexcept
  {
    known_.clear();
    adopted_ = false;
  }
  /// The changes from the segments last known to `now`: every free first, in address order, then every
  /// allocation (an address freed and taken again is freed before it is taken).
  std::vector<change> update(const snapshot& now)
  {
    std::map<std::uintptr_t, std::size_t> next;
    for (const segment_info& seg : now.segments) next.emplace(seg.address, seg.size);
    std::vector<change> out;
    for (const auto& [a, n] : known_) {
      const auto it = next.find(a);
      if (it == next.end() || it->second != n) out.push_back({trace_action::segment_free, a, n});
    }
    for (const auto& [a, n] : next) {
      const auto it = known_.find(a);
      if (it == known_.end() || it->second != n) out.push_back({trace_action::segment_alloc, a, n});
    }
    known_ = std::move(next);
    adopted_ = true;
    return out;
  }
  const std::map<std::uintptr_t, std::size_t>& known() const noexcept { return known_; }

private:
  std::map<std::uintptr_t, std::size_t> known_;
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
  std::vector<snapshot_block<Context>> blocks;
};

/// The segments of memory_snapshot(): strata's chunks, each block marked by the table (live: allocated; parked
/// in a graph pool: inactive; neither and not free in strata: freed but held for another stream's work); a
/// block that is a private pool's segment is listed as its pieces.
/// Blocks tile their segment (ranges strata does not list become free blocks). Only segments holding a block
/// of `only_pool` when it is not (0, 0). O(blocks).
template <class Context>
std::vector<snapshot_segment<Context>> snapshot_segments(const snapshot& strata_view, const block_table<Context>& table, pool_id only_pool = {})
{
  std::vector<snapshot_segment<Context>> out;
  out.reserve(strata_view.segments.size());
  for (const segment_info& seg : strata_view.segments) {
    snapshot_segment<Context> s;
    s.address = seg.address;
    s.total = seg.size;
    bool in_pool = only_pool.none();
    std::size_t covered = 0;
    for (const block_info& b : seg.blocks) {
      // PyTorch lays blocks end to end from the segment's address: a range strata does not list is free.
      if (b.offset > covered) s.blocks.push_back(snapshot_block<Context>{.size = b.offset - covered});
      covered = b.offset + b.size;
      snapshot_block<Context> sb;
      sb.size = b.size;
      const std::uintptr_t address = seg.address + b.offset;
      // A private pool's segment: its pieces, as PyTorch lists a segment's blocks.
      pool_id owner{};
      if (!b.free && !(owner = table.for_each_piece(address, [&](const pool_piece& pc) {
            snapshot_block<Context> piece;
            piece.size = pc.size;
            if (const auto* live = pc.live ? table.find(pc.address) : nullptr) {
              piece.allocated = piece.active = true;
              piece.requested = live->requested;
              piece.context = live->context;
              if (s.pool.none()) s.pool = live->pool;
              if (s.stream == nullptr) s.stream = live->stream;
              in_pool = in_pool || live->pool == only_pool;
            }
            s.requested += piece.requested;
            s.allocated += piece.allocated ? piece.size : 0;
            s.active += piece.active ? piece.size : 0;
            s.blocks.push_back(std::move(piece));
          })).none()) {
        if (s.pool.none()) s.pool = owner;
        in_pool = in_pool || owner == only_pool;
        continue;
      }
      if (!b.free) {
        if (const auto* live = table.find(address)) {
          sb.allocated = sb.active = true;
          sb.requested = live->requested;
          sb.context = live->context;
          if (s.pool.none()) s.pool = live->pool;
          if (s.stream == nullptr) s.stream = live->stream;
          in_pool = in_pool || live->pool == only_pool;
        } else {
          sb.active = !table.parked(address);
        }
      }
      s.requested += sb.requested;
      s.allocated += sb.allocated ? sb.size : 0;
      s.active += sb.active ? sb.size : 0;
      s.blocks.push_back(std::move(sb));
    }
    if (seg.size > covered) s.blocks.push_back(snapshot_block<Context>{.size = seg.size - covered});
    if (in_pool) out.push_back(std::move(s));
  }
  return out;
}

/// Reads strata's to_json(snapshot) text back (what libstrata_alloc.so's strata_snapshot_json writes).
/// Throws std::invalid_argument naming the position of anything else.
inline snapshot parse_snapshot_json(std::string_view text)
{
  struct reader {
    std::string_view t;
    std::size_t i = 0;
    [[noreturn]] void fail(const char* what) const
    {
      throw std::invalid_argument(std::string("strata snapshot JSON: ") + what + " at offset " + std::to_string(i));
    }
    void expect(std::string_view s)
    {
      if (t.substr(i, s.size()) != s) fail(("expected '" + std::string(s) + "'").c_str());
      i += s.size();
    }
    bool take(char c)
    {
      if (i < t.size() && t[i] == c) return ++i, true;
      return false;
    }
    long long integer()
    {
      const bool negative = take('-');
      if (i >= t.size() || t[i] < '0' || t[i] > '9') fail("expected a number");
      unsigned long long v = 0;
      while (i < t.size() && t[i] >= '0' && t[i] <= '9') v = v * 10 + static_cast<unsigned long long>(t[i++] - '0');
      return negative ? -static_cast<long long>(v) : static_cast<long long>(v);
    }
    std::string string()
    {
      expect("\"");
      std::string s;
      while (i < t.size() && t[i] != '"') {
        if (t[i] == '\\') ++i;
        if (i < t.size()) s += t[i++];
      }
      expect("\"");
      return s;
    }
  } r{text};
  snapshot snap;
  r.expect("{\"box\":");
  snap.box = r.string();
  r.expect(",\"segments\":[");
  while (!r.take(']')) {
    if (!snap.segments.empty()) r.expect(",");
    segment_info seg;
    r.expect("{\"address\":");
    seg.address = static_cast<std::uintptr_t>(r.integer());
    r.expect(",\"size\":");
    seg.size = static_cast<std::size_t>(r.integer());
    r.expect(",\"blocks\":[");
    while (!r.take(']')) {
      if (!seg.blocks.empty()) r.expect(",");
      block_info b;
      r.expect("{\"offset\":");
      b.offset = static_cast<std::size_t>(r.integer());
      r.expect(",\"size\":");
      b.size = static_cast<std::size_t>(r.integer());
      r.expect(",\"free\":");
      b.free = r.take('t');
      r.expect(b.free ? "rue" : "false");
      r.expect(",\"stream\":");
      b.stream = r.integer();
      r.expect("}");
      seg.blocks.push_back(b);
    }
    r.expect("}");
    snap.segments.push_back(std::move(seg));
  }
  r.expect("}");
  if (r.i != text.size()) r.fail("trailing text");
  return snap;
}

} // namespace strata::plugin
