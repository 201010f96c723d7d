#pragma once
// The stream layer (strata::stream_ordered's machinery): its state and every rule that decides where a block
// freed on a stream may go next. One class, so that one allocation or free is read in this file and its
// public face (stream/stream_ordered.hpp); the parts it holds keep their own data behind small interfaces:
// the per-stream free lists (stream_cache), the events (event_ledger), the captures seen (capture_guard), the
// private pools of CUDA graphs (graph_router) and the lone owner's recent frees (recent_frees).
// docs/architecture.md, "Stream-ordered reuse", has the whole design.
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/config.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/event_backend.hpp>
#include <strata/core/tags.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/block_tags.hpp>
#include <strata/detail/emptied_on_move.hpp>
#include <strata/detail/resource_device.hpp>
#include <strata/detail/stream/capture_guard.hpp>
#include <strata/detail/stream/event_ledger.hpp>
#include <strata/detail/stream/graph_router.hpp>
#include <strata/detail/stream/recent_frees.hpp>
#include <strata/detail/stream/stream_cache.hpp>

namespace strata::detail {

/// The owner's side: its frees go straight to the policy, numbered, and are known complete up to a number.
template <class Event>
struct owner_books {
  stream_free_lists<Event>* owner = nullptr;
  bool shared = false;  ///< a second stream has used the layer
  std::size_t frees_unneeded = 0;  ///< owner frees since another stream last needed them (owner_cover_window)
  std::uint64_t policy_seq = 0;    ///< the owner's frees into the policy, numbered (across owners)
  std::uint64_t safe_seq = 0;      ///< policy frees numbered up to this are known complete
};

/// A synchronous free (or a released private pool's free block), set aside until a device-wide wait.
struct set_aside {
  void* p;
  block_shape sh;
};

/// Synchronous frees waiting for a device-wide wait.
struct set_aside_frees {
  std::vector<set_aside> blocks;
  std::size_t bytes = 0;
};

/// The stream layer over `Policy`: what stream_ordered (its public face, which documents the behaviour and
/// the costs) does, with every part of its state. Its calls are stream_ordered's, taking the stream's id when
/// the caller knows it. The sections below follow one call: the lookup of its stream, the lone owner's short
/// path, a stream's own cache, the ownership of the policy, the miss path, the pending frees and the capture
/// path. Models nothing itself (stream_ordered is the resource). Cost: stream_ordered's, each section saying
/// its own; the calls stream_ordered forwards inline, so its face adds none. Unsynchronized. Move-only: a move
/// hands every block, event and pool over and leaves the moved-from layer empty.
template <resource Policy, event_backend Backend>
class stream_ordered_impl {
public:
  using event = typename Backend::event;

  /// A stream records an event after its cached blocks once more of them lack one than this, or than twice
  /// what it cached when it last recorded (a stream cycling through its usual shapes then records nothing).
  struct options {
    std::size_t frees_per_event = 8;
    std::size_t bytes_per_event = std::size_t{16} << 20;  ///< ... or once they hold more bytes than this
    std::size_t sync_frees_per_wait = 64;  ///< synchronous frees set aside before one device-wide wait returns them
    /// Find captures nobody announced: a capture query at every allocate and free, and one of the legacy
    /// stream before a host wait (docs/architecture.md). Off: only captures announced with
    /// begin_allocate_to_pool (PyTorch's torch.cuda.graph does; the plug-in's default) or already seen are
    /// known, as in PyTorch's caching allocator, and an identified_stream then costs no driver call.
    bool check_capture = true;
    bool graph_pools = true;  ///< serve allocations under capture from a private pool per capture (needs a graph_backend)
    /// Keep the lone owner's recent frees unmerged (recent_frees): a loop that frees and allocates the
    /// same shapes on one stream then reuses a block with a pop, without asking the policy. Off, the policy
    /// sees exactly the calls it would see without this layer and holds exactly the memory; on, later blocks
    /// land elsewhere than they would without it, so the memory held can differ, either way.
    bool reuse_recent_frees = false;
    /// Not used while the owner is permanent (the legacy stream: its frees carry no event, see docs/architecture.md).
    /// Once another stream shares the layer, the owner's frees carry events (one cudaEventRecord each) only
    /// while another stream needed them within this many of the owner's frees; past it they carry none, and
    /// the next stream to need them makes one device-wide wait instead of a cudaStreamWaitEvent (then the
    /// events resume). SIZE_MAX: always. For loops where the other streams mostly reuse their own frees
    /// (PyTorch's side streams with record_stream): the plug-in sets it. Events stay on while a capture may be
    /// under way (no host wait is allowed then).
    std::size_t owner_cover_window = SIZE_MAX;
    /// Checked before anything is built, so a refused constructor leaves nothing half made.
    void check() const
    {
      if (frees_per_event == 0 || bytes_per_event == 0 || sync_frees_per_wait == 0) throw std::invalid_argument("stream_ordered: frees_per_event, bytes_per_event and sync_frees_per_wait must be positive");
    }
  };

  /// What the layer did, for tuning and tests.
  struct counters {
    std::uint64_t hits = 0;         ///< served from the stream's own free lists
    std::uint64_t misses = 0;       ///< went to the policy
    std::uint64_t events = 0;       ///< events recorded
    std::uint64_t handovers = 0;    ///< blocks taken from another stream with a cudaStreamWaitEvent
    std::uint64_t orderings = 0;    ///< cudaStreamWaitEvent calls before taking from the policy
    std::uint64_t host_waits = 0;   ///< every host wait: event_syncs + stream_syncs + device_syncs
    std::uint64_t event_syncs = 0;  ///< cudaEventSynchronize
    std::uint64_t stream_syncs = 0; ///< cudaStreamSynchronize
    std::uint64_t device_syncs = 0; ///< cudaDeviceSynchronize (one per device waited for)
    std::uint64_t abandoned_blocks = 0;  ///< never returned: no wait could make them safe (still counted in_use)
    std::uint64_t abandoned_bytes = 0;
    std::uint64_t pool_hits = 0;       ///< private-pool allocations served by the pool's own frees
    std::uint64_t pool_misses = 0;     ///< private-pool allocations taken from the policy
    std::uint64_t pool_adoptions = 0;  ///< blocks from outside the pools freed under capture, kept for the graph
    std::uint64_t pools_released = 0;  ///< private pools whose graphs are gone (release_pool or the graph's end)
  };

  explicit stream_ordered_impl(Policy policy, options opts, Backend backend)
      : policy_((opts.check(), std::move(policy))), backend_(std::move(backend)), opts_(opts),
        policy_device_(resource_device(policy_))
  {}

  stream_ordered_impl(stream_ordered_impl&&) noexcept = default;
  stream_ordered_impl& operator=(stream_ordered_impl&& other) noexcept
  {
    if (this != &other) {
      return_everything();
      // Each part leaves itself empty when moved from (emptied_on_move, or its own moves).
      policy_ = std::move(other.policy_);
      backend_ = std::move(other.backend_);
      opts_ = other.opts_;
      policy_device_ = other.policy_device_;
      shapes_ = std::move(other.shapes_);
      cache_ = std::move(other.cache_);
      ledger_ = std::move(other.ledger_);
      own_ = std::move(other.own_);
      deferred_ = std::move(other.deferred_);
      recent_ = std::move(other.recent_);
      captures_ = std::move(other.captures_);
      graphs_ = std::move(other.graphs_);
      stats_ = std::move(other.stats_);
    }
    return *this;
  }
  stream_ordered_impl(const stream_ordered_impl&) = delete;
  stream_ordered_impl& operator=(const stream_ordered_impl&) = delete;
  ~stream_ordered_impl() { return_everything(); }

  // The calls stream_ordered forwards (its comments say what each does for its caller).

  /// An allocate on `stream`, whose id is `known_id` when the caller knows it (an identified_stream).
  void* allocate_ordered(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, const std::uint64_t* known_id)
  {
    check_alignment("stream_ordered", alignment, largest_alignment);
    std::uint64_t looked_up = 0;  // a plain handle's id, when allocate_alone asked it
    if (void* p = allocate_alone(bytes, alignment, stream, known_id, looked_up)) [[likely]] return p;
    if (bytes == 0) return policy_.allocate(0, alignment);  // null, once the policy has checked the alignment
    collect_released_pools();
    const tag_id tag = allocation_tag(policy_);  // a sleeping tag's cached blocks have no memory: the policy refuses it
    if (bytes > largest_cached || tag_sleeps(policy_, tag)) return policy_.allocate(bytes, alignment);  // fails there
    const shape sh = shape_of(bytes, alignment, tag);
    void* pooled = nullptr;  // a block handed to a capture without its pool knowing could be reused while the graph lives
    std::uint64_t id = 0;
    if (!id_to_allocate(sh, stream, known_id, id, pooled)) return pooled;
    if (alone_with(id)) [[likely]] {  // the capture query answered: the lone owner's short path
      own_.owner->handle = stream;
      if (void* p = reuse_recent(sh)) return p;
      ++stats_.misses;
      return grow_policy(sh);
    }
    return allocate_on(sh, stream, id, /*for_host=*/false, /*capture_checked=*/true);
  }

  /// A free on `stream`, whose id is `known_id` when the caller knows it.
  void free_ordered(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, const std::uint64_t* known_id) noexcept
  {
    std::uint64_t looked_up = 0;  // a plain handle's id, when free_alone asked it
    if (p == nullptr || free_alone(p, bytes, alignment, stream, known_id, looked_up)) return;
    collect_released_pools_noexcept();
    const shape sh = shape_of(bytes, alignment);
    if (std::uint64_t id = 0; id_to_free(p, sh, stream, known_id, id)) deallocate_on(p, sh, stream, id);
  }

  void share(cuda::stream_ref stream)
  {
    if (checks_capture() && captures(stream)) return;  // its id cannot be asked; its blocks are its pool's
    (void)state_of(backend_.id_of(stream), stream);
  }

  /// The synchronous allocate, on the legacy default stream: ready for the host and any stream on return.
  void* allocate_sync(std::size_t bytes, std::size_t alignment)
  {
    check_alignment("stream_ordered", alignment, largest_alignment);
    if (bytes == 0) return policy_.allocate(0, alignment);  // null, once the policy has checked the alignment
    collect_released_pools();
    refuse_host_wait_under_capture();  // as cudaMalloc is refused under global capture: it may have to wait
    const cuda::stream_ref legacy{cudaStreamLegacy};
    const std::uint64_t id = backend_.id_of(legacy);
    const tag_id tag = allocation_tag(policy_);  // a sleeping tag's cached blocks have no memory: the policy refuses it
    if (bytes > largest_cached || tag_sleeps(policy_, tag)) return policy_.allocate(bytes, alignment);  // fails there
    return allocate_on(shape_of(bytes, alignment, tag), legacy, id, /*for_host=*/true);
  }

  /// The synchronous free: set aside until a device-wide wait, unless a private pool holds the block.
  void free_sync(void* p, std::size_t bytes, std::size_t alignment) noexcept
  {
    if (p == nullptr) return;
    collect_released_pools_noexcept();
    const shape sh = shape_of(bytes, alignment);
    if (!graphs_.pools().empty() && free_in_pools(p, sh, cuda::stream_ref{cudaStreamLegacy}, /*capturing=*/false, /*synchronous=*/true))
      return;
    set_aside_free(p, sh);
  }

  void release(bool policy_too)
  {
    collect_released_pools();
    refuse_host_wait_under_capture();  // the policy's release frees chunks (cudaFree waits, illegal in capture)
    give_back_recent();
    wait_for_pending_frees(policy_too);
    if constexpr (releasable_resource<Policy>) if (policy_too) policy_.release();
  }

  /// Opens a route to private pool `pool_id` (begin_allocate_to_pool); an empty filter takes every capture.
  void add_route(std::uint64_t pool_id, std::function<bool(cudaStream_t)> filter)
  {
    graphs_.reserve_route();
    auto [pl, fresh] = graphs_.pools().open({pool_id, false});
    try {
      // Outside capture, once: nothing freed before this is still running when the graph first does.
      bool capture_on = false;
      try {
        refuse_host_wait_under_capture();
      } catch (const usage_error&) {
        capture_on = true;
      }
      if (!capture_on) give_back_recent();  // the owner's frees: the wait below covers them as any other
      if (!capture_on && (!policy_clean() || cache_.blocks() > 0 || !deferred_.blocks.empty()))
        wait_for_pending_frees(/*policy_too=*/true);
    } catch (...) {
      if (fresh) graphs_.pools().erase_if_empty(*pl);
      throw;
    }
    graph_pools<set_aside>::reopen(*pl);
    graphs_.add_route(pool_id, std::move(filter));
  }

  void end_route(std::uint64_t pool)
  {
    // PyTorch ends a route after cudaStreamEndCapture: the captures routed to the pool have ended.
    captures_.forget_route(pool);
    graphs_.end_route(pool);
  }

  void release_pool(std::uint64_t pool)
  {
    if (auto* pl = graphs_.pools().find({pool, false})) release_pool_blocks(*pl);
    graphs_.drop_routes(pool);
  }

  void collect_released_pools()
  {
    graphs_.collect_released([this](std::uint64_t id) { captures_.forget_capture(id); },
                             [this](auto& pl) { release_pool_blocks(pl); });
  }

  // What the layer holds and did (stream_ordered's observers).
  const graph_pools<set_aside>& private_pools() const noexcept { return graphs_.pools(); }
  std::size_t pool_blocks(std::uint64_t pool, bool automatic) const noexcept
  {
    return graphs_.pools().blocks_in({pool, automatic});
  }
  /// Blocks and bytes freed by streams and not yet back in the policy (the lone owner's recent frees included).
  std::size_t cached_bytes() const noexcept { return cache_.bytes() + recent_.bytes(); }
  std::size_t cached_blocks() const noexcept { return cache_.blocks() + recent_.blocks(); }
  std::size_t set_aside_blocks() const noexcept { return deferred_.blocks.size(); }
  /// The policy's figures, with cached and set-aside blocks counted as free.
  strata::usage usage() const noexcept
    requires usage_reporting_resource<Policy>
  {
    strata::usage u = policy_.usage();
    u.in_use -= cached_bytes() + deferred_.bytes;
    u.used_blocks -= cached_blocks() + deferred_.blocks.size();
    u.free_blocks += cached_blocks() + deferred_.blocks.size();
    return u;
  }
  std::size_t pending_events() const noexcept { return ledger_.pending(); }
  std::size_t streams_tracked() const noexcept { return cache_.streams(); }
  std::optional<std::uint64_t> owner() const noexcept
  {
    return own_.owner != nullptr ? std::optional<std::uint64_t>(own_.owner->id) : std::nullopt;
  }
  std::uint64_t stream_id(cuda::stream_ref stream) const
  {
    if (checks_capture() && backend_.capturing(stream)) {  // never asked: it is being captured
      if (const stream_state* st = cache_.with_handle(stream)) return st->id;
      if constexpr (graph_backend<Backend>) return (std::uint64_t{1} << 63) | backend_.capture_of(stream).id;
      else return std::uint64_t{1} << 63;
    }
    return backend_.id_of(stream);
  }
  const counters& stats() const noexcept { return stats_; }
  Policy& policy() noexcept { return policy_; }
  const Policy& policy() const noexcept { return policy_; }
  Backend& backend() noexcept { return backend_; }

private:
  static constexpr std::size_t largest_alignment = std::size_t{1} << 56;
  static constexpr std::size_t largest_cached = std::size_t{1} << 56;

  using shape = block_shape;
  using node = cached_block;
  using stream_state = stream_free_lists<event>;
  using pending_event = detail::pending_event<event>;
  using event_queue = typename event_ledger<event>::queue;
  using router = graph_router<set_aside>;
  using pool_target = typename router::target;
  using pool = typename graph_pools<set_aside>::pool;

  // ---- The stream of a call ---------------------------------------------------------------------------------
  // The id a call files its blocks under, and whether its stream captures. The capture query always comes
  // before the id: the driver refuses the id of a capturing stream and invalidates the capture for asking.
  // - While a capture may be under way (a route is open, or a capture was seen and is not known ended), every
  //   call asks the capture query, as PyTorch's allocator does while its list of captures is not empty.
  // - Otherwise, with options::check_capture, every call asks the capture query: the only way to find a
  //   capture nobody announced. Without it (captures announced with begin_allocate_to_pool, as PyTorch does)
  //   an identified_stream needs no call at all.
  // - A plain handle costs the id lookup besides, asked with the capture query in one backend call where the
  //   backend can (capture_then_id_backend: the capture query still first, no id for a capturing stream). A
  //   handle is never taken for the stream it named before: see Note [A handle names whichever stream has it].
  // - The owner alone with the policy, with nothing to ask about captures or pools (quiet), needs nothing else
  //   either: its allocate and free go straight to the policy (allocate_alone, free_alone), as one stream's
  //   calls would without the layer, or, with reuse_recent_frees, its own recent free of the shape serves the
  //   allocation. Asked about captures, its allocation is served the same way once the query answers
  //   (alone_with).
  // Note [A handle names whichever stream has it]. Ids are never reused; handles are: the driver hands a
  // destroyed stream's handle to the next stream at once, while the old one's work still runs, and the next
  // stream may belong to another device. So every call on a plain handle asks its id: a handle that comes back
  // gets a new id and none of the old stream's blocks, and a free on it is filed as the new stream's, with its
  // device, never as the owner's it once was (a wait for the owner's devices would miss the new stream's work).
  // Cost: while no capture may be under way, an identified stream needs the capture query (check_capture) or
  // nothing; a plain handle the id lookup besides, which a free by the lone owner skips.

  /// An allocation by the owner alone, served by its own recent free of the shape or as the policy alone
  /// would serve it; null when the call needs more. Alone: no other stream has used the layer, no other
  /// stream's block is cached, nothing pending or set aside, so there is nothing else to reuse, reap or order
  /// after; and quiet (quiet()): no capture to ask about, no private pool to collect or serve from. A plain
  /// handle's id is asked here, the only time this call asks it (`looked_up`, and `known_id` then points to
  /// it). A sleeping tag is the policy's to refuse (its recent frees are never reused).
  void* allocate_alone(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, const std::uint64_t*& known_id,
                       std::uint64_t& looked_up)
  {
    if (!quiet() || bytes == 0 || bytes > largest_cached) return nullptr;
    if (known_id == nullptr) known_id = &(looked_up = backend_.id_of(stream));  // no capture to break: quiet
    if (!alone_with(*known_id)) return nullptr;
    own_.owner->handle = stream;
    const tag_id tag = opts_.reuse_recent_frees ? allocation_tag(policy_) : 0;  // read only where recent frees are kept
    const block_shape sh = shapes_.of(policy_, bytes, alignment, tag);
    if (void* p = reuse_recent(sh)) return p;
    give_back_recent_for(sh);
    ++stats_.misses;
    return policy_.allocate(sh.request, sh.align);
  }

  /// Whether stream `id` is the owner alone with the policy: no other stream has used the layer, nothing is
  /// cached, pending or set aside. Its allocation then has nothing to reuse, reap or order after: the policy
  /// serves it, as it would without the layer.
  bool alone_with(std::uint64_t id) const noexcept
  {
    const auto* const o = own_.owner;
    return o != nullptr && o->id == id && !own_.shared && cache_.blocks() == 0 && ledger_.pending() == 0 &&
           deferred_.blocks.empty();
  }

  /// A free by the owner alone (as allocate_alone), straight back to the policy; false when the call needs
  /// more. A plain handle's id is asked here (Note [A handle names whichever stream has it]), the only time
  /// this call asks it (`looked_up`, and `known_id` then points to it).
  bool free_alone(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, const std::uint64_t*& known_id,
                  std::uint64_t& looked_up) noexcept
  {
    auto* const o = own_.owner;
    if (!quiet() || o == nullptr || own_.shared) return false;
    if (known_id == nullptr) {
      try {
        known_id = &(looked_up = backend_.id_of(stream));  // no capture to break: quiet
      } catch (...) {
        return false;  // an unknown stream: the general path decides what is safe
      }
    }
    if (o->id != *known_id) return false;
    const block_shape sh = shapes_.of(policy_, bytes, alignment);
    o->handle = stream;
    ++o->recent_frees;
    owner_free(p, sh);
    return true;
  }

  /// The id an allocation on `stream` is filed under, in `id` (`known_id` when the caller knows it): true; or
  /// false when a private pool served it (the block in `out`). Throws usage_error under a capture nothing can
  /// serve, and the id lookup's error for an unknown stream. Inline where nothing is captured or routed.
  bool id_to_allocate(const block_shape& sh, cuda::stream_ref stream, const std::uint64_t* known_id, std::uint64_t& id, void*& out)
  {
    // The capture query comes before the id, even on a hit: a block handed to a capture without its pool
    // knowing could be reused while the graph lives.
    if constexpr (capture_then_id_backend<Backend>) {
      if (known_id == nullptr && asks_capture()) {  // both questions in one backend call
        const stream_query q = backend_.capture_then_id(stream);
        if (q.capturing || captures_.any() || graphs_.routing()) [[unlikely]]
          return pool_or_id(sh, stream, q, id, out);
        id = q.id;
        return true;
      }
    }
    if (known_id != nullptr) {
      if (asks_capture() && routed(sh, stream, out)) return false;
      id = *known_id;
      return true;
    }
    return id_to_allocate_asked_apart(sh, stream, id, out);
  }

  /// The id a free on `stream` is filed under, in `id`: true; or false when the free was settled here: filed
  /// in a private pool, abandoned (under a capture, or when a capture query fails while one may go on: the
  /// graph may use the block whenever it runs), or returned after a device-wide wait (an unknown stream).
  bool id_to_free(void* p, const block_shape& sh, cuda::stream_ref stream, const std::uint64_t* known_id, std::uint64_t& id) noexcept
  {
    if (!asks_capture()) return id_to_free_asked_apart(p, sh, stream, known_id, id);
    if (known_id != nullptr) {  // the id known without asking: the capture query alone
      bool capturing = false;
      try {
        capturing = captures(stream);
      } catch (...) {
        return id_to_free_asked_apart(p, sh, stream, known_id, id);  // what a failed query allows is decided there
      }
      const std::uint64_t known = *known_id;
      if (capturing || !graphs_.pools().empty()) [[unlikely]]
        return in_pools_or_id(p, sh, stream, capturing, known, id);
      id = known;
      return true;
    }
    if constexpr (capture_then_id_backend<Backend>) {  // both questions in one backend call
      stream_query q;
      try {
        q = backend_.capture_then_id(stream);
      } catch (...) {
        return id_to_free_asked_apart(p, sh, stream, nullptr, id);  // which of the two failed decides what is safe
      }
      const bool capturing = captures_.saw(backend_, stream, q.capturing);
      if (capturing || !graphs_.pools().empty()) [[unlikely]]
        return in_pools_or_id(p, sh, stream, capturing, q.id, id);
      id = q.id;
      return true;
    }
    return id_to_free_asked_apart(p, sh, stream, known_id, id);
  }

  /// An allocation whose stream captures, or while a capture may go on (a route is open, or one was seen):
  /// files what the capture query said, then serves it from a private pool or refuses it.
  [[gnu::noinline]] bool pool_or_id(const block_shape& sh, cuda::stream_ref stream, const stream_query& q, std::uint64_t& id, void*& out)
  {
    if (routed_as(sh, stream, captures_.saw(backend_, stream, q.capturing), out)) return false;
    id = q.id;  // not capturing: routed_as refuses a capture it cannot serve
    return true;
  }

  /// id_to_allocate with the capture query and the id asked one after the other.
  [[gnu::noinline]] bool id_to_allocate_asked_apart(const block_shape& sh, cuda::stream_ref stream, std::uint64_t& id, void*& out)
  {
    if (asks_capture() && routed(sh, stream, out)) return false;
    try {
      id = backend_.id_of(stream);
      return true;
    } catch (const std::exception&) {
      // A capture the query did not report (none was asked for, check_capture off) breaks the lookup: say so.
      bool capturing = false;
      try {
        capturing = checks_capture() && captures(stream);
      } catch (...) {  // not even that: an unknown stream, reported as the lookup's own error
      }
      if (capturing) refuse_capture("an allocation asked for its stream");
      throw;
    }
  }

  /// A free on a capturing stream, or while private pools exist: filed in a pool, abandoned, or given its id.
  [[gnu::noinline]] bool in_pools_or_id(void* p, const block_shape& sh, cuda::stream_ref stream, bool capturing, std::uint64_t asked,
                                        std::uint64_t& id) noexcept
  {
    if (free_in_pools(p, sh, stream, capturing)) return false;
    if (capturing) return abandoned(sh);  // the graph may use the block whenever it runs
    id = asked;
    return true;
  }

  /// id_to_free with the capture query and the id asked one after the other, each failure handled as its own.
  [[gnu::noinline]] bool id_to_free_asked_apart(void* p, const block_shape& sh, cuda::stream_ref stream, const std::uint64_t* known_id,
                                                std::uint64_t& id) noexcept
  {
    bool capturing = false;
    if (asks_capture()) {
      try {
        capturing = captures(stream);
      } catch (...) {
        if (capture_possible()) return abandoned(sh);
        // No capture known: an unknown stream, which the id lookup below reports.
      }
    }
    if ((capturing || !graphs_.pools().empty()) && free_in_pools(p, sh, stream, capturing)) return false;
    if (capturing) return abandoned(sh);  // asking the id would break the capture
    if (known_id != nullptr) {
      id = *known_id;
      return true;
    }
    try {
      id = backend_.id_of(stream);
      return true;
    } catch (...) {
    }
    return_unordered(p, sh);  // an unknown stream: nothing to order the reuse by
    return false;
  }

  /// Whether a call may skip capture queries and the private pools altogether: no capture is looked for
  /// (check_capture off), announced or seen, and no private pool exists. Then a released graph's pool cannot
  /// exist either, and its id waits for the next call that is not quiet (collecting it changes nothing else).
  bool quiet() const noexcept { return !opts_.check_capture && !capture_possible() && graphs_.pools().empty(); }

  /// Whether this call asks the capture query: while a capture may be under way, and on every stream with
  /// check_capture (the only way to find a capture nobody announced, identified streams included).
  bool asks_capture() const noexcept { return capture_possible() || opts_.check_capture; }

  bool abandoned(const block_shape& sh) noexcept
  {
    abandon(sh);
    return false;
  }

  // ---- A stream's own cache, and the owner's frees ----------------------------------------------------------
  // A block freed on a stream other than the owner is filed in that stream's free lists (stream_cache) and
  // reused there at once, under its own tag; the owner's frees go straight to the policy (or, with
  // reuse_recent_frees and the owner alone, wait unmerged in recent_frees). Cost: a hit or a cached free is a
  // hash lookup, O(1), plus a tag check for a tagging policy.

  /// How a request is filed and what the policy is asked for (shape_for, through shape_memo).
  shape shape_of(std::size_t bytes, std::size_t alignment, tag_id tag = 0) noexcept { return shapes_.of(policy_, bytes, alignment, tag); }

  /// `for_host`: the block must be ready for the host and every stream when this returns (the synchronous
  /// allocate): a reused block is waited for, a handed-over one too.
  /// `capture_checked`: the caller already asked whether the stream captures (once per call is enough).
  void* allocate_on(const shape& sh, cuda::stream_ref stream, std::uint64_t id, bool for_host, bool capture_checked = false)
  {
    refuse_alignment_first(sh);
    stream_state& s = state_of(id, stream);
    if (node* n = s.oldest != nullptr ? s.take(sh.key, sh.tag) : nullptr) {
      if (for_host) {
        try {
          refuse_host_wait_under_capture();
          count_wait(stats_.stream_syncs);
          backend_.wait_stream(stream);
        } catch (...) {
          cache_.put_back(s, n);
          throw;
        }
      }
      return hand_out(n);
    }
    return allocate_on_miss(sh, stream, s, for_host, capture_checked);
  }

  /// A free on a stream known not to capture.
  void deallocate_on(void* p, const shape& sh, cuda::stream_ref stream, std::uint64_t id) noexcept
  {
    if (stream_state* o = own_.owner; o != nullptr && o->id == id && !own_.shared) [[likely]] {  // the owner alone: inline
      o->handle = stream;
      ++o->recent_frees;
      owner_free(p, sh);
      return;
    }
    deallocate_on_other(p, sh, stream, id);
  }
  /// Any other stream's free, and the owner's once another stream shares the layer.
  [[gnu::noinline]] void deallocate_on_other(void* p, const shape& sh, cuda::stream_ref stream, std::uint64_t id) noexcept
  {
    stream_state* s = nullptr;
    try {
      s = &state_of(id, stream);
    } catch (...) {
      return_unordered(p, sh);
      return;
    }
    ++s->recent_frees;
    if (own_.owner == nullptr) become_owner(*s, stream);
    if (own_.owner == s) {
      // Straight back, so it merges now: the policy then sees exactly the calls it would see without this
      // layer, and holds exactly what it would hold.
      policy_.deallocate(p, sh.request, sh.align);
      ++own_.policy_seq;
      if (own_.shared && !covers_owner_on_demand()) {
        if (own_.frees_unneeded < opts_.owner_cover_window || capture_possible()) cover_owner(stream);
        if (own_.frees_unneeded < opts_.owner_cover_window) ++own_.frees_unneeded;
      }
      return;
    }
    const tag_id tag = block_tag(policy_, p);
    if (tag_sleeps(policy_, tag)) return policy_.deallocate(p, sh.request, sh.align);  // unmapped: no work can use it
    try {
      cache_.file(*s, p, {sh.request, sh.footprint, sh.align, sh.key, tag});
    } catch (...) {
      return_unordered(p, sh);
      return;
    }
    if (s->wants_event(opts_.frees_per_event, opts_.bytes_per_event)) {
      try {
        cover(*s, stream);
      } catch (...) {
        // Left uncovered: the blocks are still reused on this stream, and reclaimed by a later event or wait.
      }
    }
  }

  void abandon(const shape& sh) noexcept
  {
    ++stats_.abandoned_blocks;
    stats_.abandoned_bytes += sh.footprint;
  }

  void count_wait(std::uint64_t& kind) noexcept
  {
    ++kind;
    ++stats_.host_waits;
  }

  stream_state& state_of(std::uint64_t id, cuda::stream_ref stream)
  {
    const auto [s, added] = cache_.find_or_add(id, stream, [&] { return backend_.device_of(stream); });
    if (added && !own_.shared && cache_.streams() > 1) {  // from now on the owner's frees carry events
      give_back_recent();  // as the owner's frees made before: the policy is made safe for the newcomer
      own_.shared = true;
    }
    return *s;
  }

  /// A free by the owner alone: kept for its next allocation of the shape (recent_frees), else
  /// straight back to the policy, numbered as the owner's. A sleeping tag's block goes back at once: the policy
  /// drops it from the tag's backup.
  void owner_free(void* p, shape sh) noexcept
  {
    if (!opts_.reuse_recent_frees) return policy_free(p, sh.request, sh.align);
    sh.tag = block_tag(policy_, p);
    if (tag_sleeps(policy_, sh.tag) ||
        !recent_.keep(p, sh, [this](void* q, std::size_t request, std::size_t align) { policy_free(q, request, align); }))
      policy_free(p, sh.request, sh.align);
  }
  void policy_free(void* p, std::size_t request, std::size_t align) noexcept
  {
    policy_.deallocate(p, request, align);
    ++own_.policy_seq;
  }
  /// The owner alone reuses its own recent free of the shape: its stream ordered it. Null when none, or when
  /// the tag sleeps (paused on the policy directly): the block goes back, and the policy refuses the request.
  void* reuse_recent(const shape& sh) noexcept
  {
    if (recent_.empty()) return nullptr;
    void* p = recent_.take(sh.key, sh.tag);
    if (p == nullptr) return nullptr;
    if (tag_sleeps(policy_, sh.tag)) [[unlikely]] {
      policy_free(p, sh.request, sh.align);
      return nullptr;
    }
    ++stats_.hits;
    return p;
  }
  /// Every recent free goes to the policy, where it merges: before the policy is asked for a block, before
  /// another stream shares the layer, on release and at the end.
  bool recent_frees_empty() const noexcept { return recent_.empty(); }
  void give_back_recent() noexcept
  {
    if (!recent_.empty()) recent_.give_back_all([this](void* q, std::size_t request, std::size_t align) { policy_free(q, request, align); });
  }
  /// The same before the policy is asked for `sh`, so they merge before it places the request, as without the
  /// layer; an alignment the policy may refuse is refused first, so that the refused call changes nothing.
  void give_back_recent_for(const shape& sh)
  {
    if (recent_.empty()) return;
    refuse_alignment_first(sh);
    give_back_recent();
  }
  /// An alignment the policy cannot honour is refused before the call changes anything (a new stream sharing
  /// the layer gives the recent frees back; a miss returns cached blocks): allocate(0, a) checks the alignment
  /// and does nothing else, and every policy honours the default (docs/architecture.md, Note [Alignments no
  /// chunk can honour]).
  void refuse_alignment_first(const shape& sh)
  {
    if (sh.align > default_alignment) [[unlikely]] (void)policy_.allocate(0, sh.align);
  }

  void* hand_out(node* n) noexcept
  {
    ++stats_.hits;
    return cache_.release(n).p;
  }

  void give_back(node* n) noexcept
  {
    const auto b = cache_.release(n);
    policy_.deallocate(b.p, b.request, b.align);
  }

  // ---- Ownership of the policy ------------------------------------------------------------------------------
  // Which stream owns the policy: the owner's frees go straight back to the policy, numbered (own_), and are
  // covered by events (or, for a permanent owner, by one event made when another stream needs them), so that
  // another stream takes from the policy only after the owner's frees there are complete. Cost: an event
  // record per owner free while another stream shares the layer (none for a permanent owner); making the
  // policy safe for another stream is one event query and one cudaStreamWaitEvent, or a host wait for a
  // synchronous allocate.

  bool policy_clean() const noexcept { return own_.safe_seq >= own_.policy_seq; }

  /// Whether the owner's frees get their event from the stream that needs them, when it needs them, instead
  /// of one per free: the owner's handle must outlive every call (a permanent stream: the legacy default
  /// stream), and no capture may be under way (an event recorded on the legacy stream joins a blocking
  /// stream's capture; while one may go on, frees carry their events as for any owner).
  bool covers_owner_on_demand() const noexcept
  {
    return own_.owner != nullptr && permanent(own_.owner->handle) && !capture_possible();
  }

  /// s's frees go straight to the policy from now on, and what s has cached goes there now: every
  /// block is safe for s itself. Only while the policy holds no other stream's unfinished frees.
  void become_owner(stream_state& s, cuda::stream_ref stream) noexcept
  {
    own_.owner = &s;
    while (!s.events.empty()) retire_front(s.events);
    flush_owner_cache();
    if (own_.shared && !policy_clean() && !covers_owner_on_demand()) cover_owner(stream);  // the flushed blocks, for the other streams
  }

  /// Ownership moves to t when the owner's frees are all known complete and t has been freeing more.
  void weigh_ownership(stream_state& t, cuda::stream_ref stream) noexcept
  {
    auto& own = own_;
    if (own.owner == &t) return;
    if (own.owner == nullptr || t.recent_frees > own.owner->recent_frees) {
      if (own.owner != nullptr) own.owner->recent_frees = 0;
      t.recent_frees = 0;
      become_owner(t, stream);
    } else {
      own.owner->recent_frees = 0;
      t.recent_frees = 0;
    }
  }

  /// Once another stream shares the layer, every owner free records an event after itself, on the owner's
  /// stream while it is known alive (this call): so another stream never has to touch the owner's handle,
  /// which may belong to a stream destroyed since. A failed record leaves the free uncovered; a taker then
  /// waits device-wide (owner_event). Not for a permanent owner (covers_owner_on_demand).
  void cover_owner(cuda::stream_ref stream) noexcept
  {
    try {
      record_into(ledger_.owner_events(), stream, own_.policy_seq, own_.owner->device);
    } catch (...) {
    }
  }

  /// Makes whatever the policy hands out next safe for stream t: the owner's frees not yet known complete are
  /// waited for, on the GPU (t waits for an event on the owner) or, for the host, on the host.
  void make_policy_safe_for(stream_state& t, cuda::stream_ref stream, bool for_host)
  {
    if (!policy_clean() && (for_host || (&t != own_.owner && t.ordered_after < own_.policy_seq))) {
      own_.frees_unneeded = 0;  // the owner's frees were needed: they carry events again (owner_cover_window)
      reap_owner();
      if (!policy_clean()) {
        if (const pending_event* e = owner_event()) {
          if (!event_done(e->e)) {
            if (!for_host) {
              backend_.order_after(stream, e->e);
              ++stats_.orderings;
              t.ordered_after = e->covers_below;
              return;
            }
            refuse_host_wait_under_capture();
            count_wait(stats_.event_syncs);
            backend_.wait_host(e->e);
          }
          // Ownership passes only when the policy is clean, so an event on the owner after its last policy
          // free covers every policy free before it.
          mark_safe(e->covers_below);
        }
      }
    }
    if (!for_host && policy_clean()) weigh_ownership(t, stream);
  }

  void mark_safe(std::uint64_t seq) noexcept
  {
    own_.safe_seq = std::max(own_.safe_seq, seq);
    while (!ledger_.owner_events().empty() && ledger_.owner_events().front().covers_below <= own_.safe_seq)
      retire_front(ledger_.owner_events());
  }

  /// The owner's completed events: its policy frees they cover are safe for everyone.
  void reap_owner()
  {
    auto& events = ledger_.owner_events();
    while (!events.empty() && event_done(events.front().e)) mark_safe(events.front().covers_below);
  }

  /// Records e on `stream` from a call on another stream, on `device` (only for a permanent stream, which a
  /// backend without the capability never has).
  void record_on(event e, cuda::stream_ref stream, int device)
  {
    if constexpr (permanent_stream_backend<Backend>) backend_.record_on(e, stream, device);
    else backend_.record(e, stream);
  }

  bool permanent(cuda::stream_ref stream) const noexcept
  {
    if constexpr (permanent_stream_backend<Backend>) return backend_.permanent(stream);
    else return false;
  }

  /// The owner's cached blocks go to the policy (where they merge), as the owner's unfinished frees.
  void flush_owner_cache() noexcept
  {
    stream_state& s = *own_.owner;
    while (s.oldest != nullptr) {
      node* n = s.oldest;
      s.remove(n);
      give_back(n);
      ++own_.policy_seq;
    }
    s.mark_covered();  // nothing left to cover: the counts at the last event are zero too
  }

  /// An event after all the owner's policy frees, or null when some have none (made before another stream
  /// shared the layer, or a record failed): then every device was waited for and the policy is clean.
  const pending_event* owner_event()
  {
    if (!ledger_.owner_events().empty() && ledger_.owner_events().back().covers_below >= own_.policy_seq)
      return &ledger_.owner_events().back();
    if (covers_owner_on_demand()) {
      try {
        record_into(ledger_.owner_events(), own_.owner->handle, own_.policy_seq, own_.owner->device,
                        /*on_its_device=*/true);
        return &ledger_.owner_events().back();
      } catch (...) {
        // Not recorded: wait for the devices instead, as for frees made before the layer was shared.
      }
    }
    refuse_host_wait_under_capture();
    wait_all_devices();
    mark_safe(own_.policy_seq);
    return nullptr;
  }

  // ---- The miss path ----------------------------------------------------------------------------------------
  // When a stream's own cache has no block of the shape asked: reap the blocks whose events completed, make
  // the policy safe for the stream, hand a block over from another stream, wait for the pending frees, and
  // grow the policy, in that order of cost. Cost: an event query per pending event, at most one event record
  // and one cudaStreamWaitEvent per batch of frees, and the policy's allocate; the host waits only for a
  // synchronous allocate or when the policy is out of memory with frees pending.

  /// The stream's own safe blocks go back to the policy here, so they merge before the policy is asked;
  /// other streams' safe blocks, and set-aside synchronous frees, before the policy grows.
  void* allocate_on_miss(const shape& sh, cuda::stream_ref stream, stream_state& s, bool for_host, bool capture_checked)
  {
    // The owner alone with the policy (one stream, nothing pending, nothing cached or set aside): nothing to
    // reap, wait for or hand back first, so the policy is asked at once, as it would be without this layer.
    // Inline, so that a loop on one stream pays no call; the rest is out of line.
    if (capture_checked && !for_host && &s == own_.owner && ledger_.pending() == 0 && cache_.blocks() == 0 &&
        deferred_.blocks.empty()) [[likely]] {
      ++stats_.misses;
      return grow_policy(sh);
    }
    return allocate_on_full_miss(sh, stream, s, for_host, capture_checked);
  }

  [[gnu::noinline]] void* allocate_on_full_miss(const shape& sh, cuda::stream_ref stream, stream_state& s, bool for_host, bool capture_checked)
  {
    if (!capture_checked && checks_capture() && captures(stream)) refuse_capture("an allocation missed its stream's cache");
    ++stats_.misses;
    // The owner's frees, before the policy is made safe for this stream (the alignment was checked first, by
    // refuse_alignment_first: nothing is refused now).
    give_back_recent();
    if (ledger_.pending() > 0) {  // other streams keep their blocks until the policy would grow (docs/architecture.md)
      reap_owner();
      reap(s);
      forget_empty_streams(s);
    }
    make_policy_safe_for(s, stream, for_host);
    if ((cache_.blocks() > 0 || !deferred_.blocks.empty()) && !policy_has_room(sh)) {
      cover(s, stream);
      reap_all(s);
      if (!deferred_.blocks.empty() && !policy_has_room(sh)) {
        try {
          wait_for_pending_frees(/*policy_too=*/false);
        } catch (const usage_error&) {  // a capture forbids host waits now: let the policy grow instead
        }
      }
    }
    try {
      return grow_policy(sh);
    } catch (const std::bad_alloc&) {
      if (cache_.blocks() == 0 && deferred_.blocks.empty()) throw;
    }
    if (void* p = hand_over(bin_key{sh.key, sh.tag}, stream, s, for_host)) return p;
    wait_for_pending_frees(/*policy_too=*/false);
    return grow_policy(sh);
  }

  /// The policy's allocate, with the thread's capture mode relaxed while a capture this layer has seen may
  /// still go on (Note [Capture mode relaxed]).
  void* grow_policy(const shape& sh)
  {
    give_back_recent_for(sh);
    return relaxed_while_capturing([&] { return policy_.allocate(sh.request, sh.align); });
  }

  /// Records an event on `stream` (of `device`) into `events`, covering what is numbered below `covers_below`.
  /// `on_its_device`: a permanent stream's handle, recorded on as a stream of `device` whichever is current.
  void record_into(event_queue& events, cuda::stream_ref stream, std::uint64_t covers_below, int device,
                   bool on_its_device = false)
  {
    ledger_.record_into(events, backend_, device, covers_below, [&](event e) {
      if (on_its_device) record_on(e, stream, device);
      else backend_.record(e, stream);
    });
    ++stats_.events;
  }

  void retire_front(event_queue& events) noexcept { ledger_.retire_front(events); }

  /// Records an event after the stream's uncovered blocks, so they can be reclaimed once it completes.
  void cover(stream_state& s, cuda::stream_ref stream)
  {
    if (s.uncovered_blocks == 0) return;
    reap(s);
    if (checks_capture() && captures(stream)) refuse_capture("an event was needed");
    record_into(s.events, stream, s.next_seq, s.device);
    s.mark_covered();
  }

  bool policy_has_room(const shape& sh) const noexcept
  {
    if constexpr (room_reporting_resource<Policy>) return policy_.has_room_for(sh.request, sh.align);
    else return false;
  }

  /// Returns to the policy every block of s whose covering event has completed.
  void reap(stream_state& s)
  {
    while (!s.events.empty() && event_done(s.events.front().e)) {
      const std::uint64_t below = s.events.front().covers_below;
      retire_front(s.events);
      while (s.oldest != nullptr && s.oldest->seq < below) {
        node* n = s.oldest;
        s.remove(n);
        give_back(n);
      }
    }
  }

  /// Reaps every stream and forgets streams with nothing left (destroyed streams never come back).
  void reap_all(const stream_state& keep)
  {
    reap_owner();
    cache_.for_each([this](stream_state& s) { reap(s); });
    forget_empty_streams(keep);
  }

  /// Streams with nothing cached and no event pending are forgotten (destroyed streams never come back).
  void forget_empty_streams(const stream_state& keep) noexcept { cache_.forget_empty(keep, own_.owner); }

  /// A block of this shape and tag freed on another stream and covered by an event: the requesting stream is
  /// made to wait on that event (the host, for a synchronous allocate), and gets the block.
  void* hand_over(bin_key key, cuda::stream_ref stream, stream_state& self, bool for_host)
  {
    stream_state* from = nullptr;
    node* n = nullptr;
    const pending_event* cover = nullptr;
    cache_.for_each([&](stream_state& other) {
      if (n == nullptr && &other != &self && (n = other.covered_block(key, cover)) != nullptr) from = &other;
    });
    if (n == nullptr) return nullptr;
    if (for_host) {
      refuse_host_wait_under_capture();
      count_wait(stats_.event_syncs);
      backend_.wait_host(cover->e);
    } else {
      backend_.order_after(stream, cover->e);
    }
    ++stats_.handovers;
    from->remove(n);
    return hand_out(n);
  }

  // ---- Pending frees ----------------------------------------------------------------------------------------
  // The frees the layer cannot yet hand back: synchronous frees set aside (deferred_) until a device-wide
  // wait, and the host waits that return every pending free to the policy (out of memory, release(),
  // destruction). Cost: a set-aside free is a vector push; a wait is one event synchronize per pending event,
  // or one device synchronize per device when some frees carry no event.

  /// A synchronous free: set aside until a device-wide wait, which one free in a full batch makes. A sleeping
  /// tag's block goes straight back: no work can use memory that is not there, and the policy no longer
  /// counts it in use, so the layer must not subtract it again.
  void set_aside_free(void* p, const shape& sh) noexcept
  {
    if (tag_sleeps(policy_, block_tag(policy_, p))) return policy_.deallocate(p, sh.request, sh.align);
    try {
      const cuda::stream_ref legacy{cudaStreamLegacy};
      state_of(backend_.id_of(legacy), legacy);  // so that the device-wide wait covers this device
      deferred_.blocks.push_back({p, sh});
    } catch (...) {
      return_unordered(p, sh);
      return;
    }
    deferred_.bytes += sh.footprint;
    if (deferred_.blocks.size() >= opts_.sync_frees_per_wait || deferred_.bytes >= opts_.bytes_per_event) {
      try {
        wait_for_pending_frees(/*policy_too=*/false);
      } catch (...) {
        // Still set aside: a later wait returns them.
      }
    }
  }

  /// No bookkeeping possible: make the block safe for everyone the slow way, then hand it back; if even that
  /// fails, the block is abandoned rather than handed to work that may race it.
  void return_unordered(void* p, const shape& sh) noexcept
  {
    try {
      refuse_host_wait_under_capture();
      wait_all_devices();
    } catch (...) {
      abandon(sh);
      return;
    }
    policy_.deallocate(p, sh.request, sh.align);
  }

  /// cudaDeviceSynchronize of the device the policy's memory lives on and of every device whose streams used
  /// this layer; the current device only when none of those is known.
  void wait_all_devices()
  {
    if (policy_device_) {
      count_wait(stats_.device_syncs);
      backend_.wait_device(*policy_device_);
    } else if (cache_.devices().empty()) {
      count_wait(stats_.device_syncs);
      backend_.wait_device(backend_.device_of(cuda::stream_ref{cudaStreamLegacy}));
    }
    for (const int device : cache_.devices()) {
      if (policy_device_ && device == *policy_device_) continue;
      count_wait(stats_.device_syncs);
      backend_.wait_device(device);
    }
  }

  /// Host-waits for every pending free and returns every cached and set-aside block to the policy (with
  /// `policy_too`, the owner's frees already there are waited for as well). Blocks freed after a stream's
  /// last event, and synchronous frees, have nothing to wait on but the devices. Throws, changing nothing,
  /// when a wait fails.
  void wait_for_pending_frees(bool policy_too)
  {
    if (!recent_frees_empty()) {
      refuse_host_wait_under_capture();
      give_back_recent();  // the owner's frees: covered by the waits below like any other
    }
    const bool owner_dirty = policy_too && !policy_clean();
    if (cache_.blocks() == 0 && deferred_.blocks.empty() && !owner_dirty) return;
    refuse_host_wait_under_capture();
    bool uncovered = !deferred_.blocks.empty() ||
                     (owner_dirty && (ledger_.owner_events().empty() || ledger_.owner_events().back().covers_below < own_.policy_seq));
    cache_.for_each([&](const stream_state& s) { uncovered |= s.uncovered_blocks > 0; });
    if (uncovered) {
      wait_all_devices();
    } else {
      cache_.for_each([&](const stream_state& s) {
        for (const pending_event& pe : s.events) {
          count_wait(stats_.event_syncs);
          backend_.wait_host(pe.e);
        }
      });
      if (owner_dirty) {
        count_wait(stats_.event_syncs);
        backend_.wait_host(ledger_.owner_events().back().e);
      }
    }
    cache_.for_each([this](stream_state& s) { drain(s); });
    if (owner_dirty || uncovered) mark_safe(own_.policy_seq);
    for (const set_aside& b : deferred_.blocks) policy_.deallocate(b.p, b.sh.request, b.sh.align);
    deferred_.blocks.clear();
    deferred_.bytes = 0;
  }

  /// At destruction and move-assignment: cached blocks go back only after a successful wait; if the wait
  /// fails (a sticky CUDA error, the runtime gone at exit) they are abandoned, never handed back as if safe.
  void return_everything() noexcept
  {
    give_back_recent();
    // The layer is going away: its graphs must be gone too (a box outlives its blocks). Free pool blocks join
    // the set-aside frees; live ones stay with their holders.
    while (!graphs_.pools().empty()) {
      auto* pl = first_unreleased_pool();
      if (pl == nullptr) break;
      try {
        release_pool_blocks(*pl);
      } catch (...) {
        stats_.abandoned_blocks += pl->free_blocks;
        pl->released = true;
      }
    }
    graphs_.clear_routes();
    if (cache_.no_streams() && ledger_.empty() && deferred_.blocks.empty()) return;
    try {
      wait_for_pending_frees(/*policy_too=*/false);
    } catch (...) {
      stats_.abandoned_blocks += cache_.blocks() + deferred_.blocks.size();
      stats_.abandoned_bytes += cache_.bytes() + deferred_.bytes;
    }
    cache_.for_each([this](const stream_state& s) { event_ledger<event>::destroy(backend_, s.events); });
    ledger_.destroy_own(backend_);
    cache_.clear();
    deferred_ = {};
    own_ = {};
  }

  /// Everything s holds goes back: only after its work is known to be complete.
  void drain(stream_state& s) noexcept
  {
    while (!s.events.empty()) retire_front(s.events);
    while (s.oldest != nullptr) {
      node* n = s.oldest;
      s.remove(n);
      give_back(n);
    }
    s.drained();
  }

  // ---- Capture ----------------------------------------------------------------------------------------------
  // Under CUDA graph capture: when a stream is asked whether it captures, what a capture forbids (host waits,
  // stream id lookups), and how captures are served: an allocation on a capturing (or routed) stream comes
  // from the capture's or route's private pool (graph_router), a block freed under capture joins that pool,
  // and a released pool's free blocks become synchronous frees. What captures were seen is captures_'s
  // (capture_guard). Cost: one capture query per call that asks (the stream of a call, above); a pool hit is
  // a hash lookup; a miss is the policy's allocate, with the thread's capture mode relaxed (Note [Capture
  // mode relaxed]). The host waits only when a route opens outside capture with frees pending.

  /// Runs f as captures_.relaxed does (Note [Capture mode relaxed]).
  template <class F>
  [[gnu::always_inline]] decltype(auto) relaxed_while_capturing(F&& f)
  {
    return captures_.relaxed(backend_, std::forward<F>(f));
  }

  /// Whether an event has completed; relaxed while a capture goes on (Note [Capture mode relaxed]).
  bool event_done(const event& e)
  {
    return relaxed_while_capturing([&] { return backend_.done(e); });
  }

  void collect_released_pools_noexcept() noexcept
  {
    try {
      collect_released_pools();
    } catch (...) {  // host memory exhausted: the ids stay posted for a later call
    }
  }

  /// Whether a capture may be under way: a stream seen capturing, or a route (PyTorch announces its captures
  /// with begin_allocate_to_pool). A free whose capture query fails then assumes the worst: its stream may be
  /// captured, where asking its id would invalidate the capture and a block filed for reuse could be handed
  /// out while a graph still uses it, so the block is abandoned (counted in stats().abandoned_blocks).
  bool capture_possible() const noexcept { return captures_.any() || graphs_.routing(); }

  /// Whether captures nobody announced are looked for (options::check_capture), or a capture may be under way
  /// (announced by a route, as all of PyTorch's are, or seen). "The stream of a call" says which calls ask.
  bool checks_capture() const noexcept { return opts_.check_capture || capture_possible(); }

  bool captures(cuda::stream_ref stream) { return captures_.captures(backend_, stream); }

  /// Host waits are refused while a capture may go on (capture_guard says when). The layer never asks
  /// the driver about a stream handle outside a call on that stream: it may have been destroyed since.
  void refuse_host_wait_under_capture()
  {
    if (checks_capture()) captures_.refuse_host_wait(backend_);
  }

  /// Serves an allocation from a private pool when it belongs to one (true, the block in `out`); refuses an
  /// allocation under capture that cannot be served so (usage_error, nothing changed).
  bool routed(const shape& sh, cuda::stream_ref stream, void*& out)
  {
    if (!checks_capture()) return false;
    return routed_as(sh, stream, captures(stream), out);
  }
  /// routed(), the stream's capture query already asked and filed (`capturing`).
  bool routed_as(const shape& sh, cuda::stream_ref stream, bool capturing, void*& out)
  {
    if (!capturing && !graphs_.routing()) [[likely]] return false;
    return serve_from_pool(sh, stream, capturing, out);
  }

  /// Out of line: a capturing or routed stream's allocation, served from its pool or refused.
  [[gnu::noinline]] bool serve_from_pool(const shape& sh, cuda::stream_ref stream, bool capturing, void*& out)
  {
    if constexpr (graph_backend<Backend>) {
      if (const std::optional<pool_target> t = target_for(stream, capturing)) {
        out = allocate_in_pool(*t, sh);
        return true;
      }
    }
    if (capturing) refuse_capture("an allocation was asked of it");
    return false;
  }

  /// A free that concerns the private pools: a pool block (filed in its pool under its tag, or, its pool
  /// released, freed the common way: false), or any block freed under capture (it joins the capture's pool:
  /// the graph may use it at every replay). False: not for the pools. Never throws: a block that cannot be
  /// filed is abandoned.
  bool free_in_pools(void* p, const shape& sh, cuda::stream_ref stream, bool capturing, bool synchronous = false) noexcept
  {
    if constexpr (!graph_backend<Backend>) {
      return false;
    } else {
      auto* pl = graphs_.pools().owner_of(p);
      if (pl != nullptr && pl->released) {
        graphs_.pools().disown(*pl, p, sh.footprint);
        pl = nullptr;
      }
      if (pl == nullptr && !capturing) return false;
      try {
        reuse_tag tag = reuse_tag::nowhere();
        if (pl == nullptr) {  // from outside the pools, freed under capture
          const std::optional<pool_target> t = target_for(stream, capturing);
          if (!t) return false;  // the caller abandons it
          pl = graphs_.open(backend_, *t).first;
          try {
            graphs_.pools().prepare_adopt();
          } catch (...) {
            graphs_.pools().erase_if_empty(*pl);
            throw;
          }
          graphs_.pools().adopt(*pl, p, sh.footprint);
          ++stats_.pool_adoptions;
          tag = t->tag;
        } else if (synchronous) {
          tag = reuse_tag::nowhere();
        } else if (capturing) {
          const capture_info info = backend_.capture_of(stream);
          if (info.active) tag = router::captured_tag(pl->name, info.id, stream);
        } else {
          try {
            tag = {0, backend_.id_of(stream)};
          } catch (...) {  // an unknown stream: kept, never reused in the pool
          }
        }
        shape own = sh;
        own.tag = block_tag(policy_, p);  // reused only under its own tag: it sleeps and wakes with that tag
        graphs_.pools().put(*pl, tag, own.tag, own.key, set_aside{p, own});
      } catch (...) {
        if (pl != nullptr && graphs_.pools().owner_of(p) == pl) graphs_.pools().disown(*pl, p, sh.footprint);
        abandon(sh);
      }
      return true;
    }
  }

  /// A pool's free blocks become synchronous frees (set aside until a device-wide wait, which covers every
  /// launch and stream that used them); its live blocks follow as they are freed. A sleeping tag's blocks go
  /// straight back (set_aside_free says why).
  void release_pool_blocks(pool& pl)
  {
    deferred_.blocks.reserve(deferred_.blocks.size() + pl.free_blocks);
    graphs_.pools().drain(pl, [](const set_aside& b) noexcept { return b.sh.footprint; }, [this](const set_aside& b) noexcept {
      if (tag_sleeps(policy_, b.sh.tag)) return policy_.deallocate(b.p, b.sh.request, b.sh.align);
      deferred_.blocks.push_back(b);  // capacity reserved
      deferred_.bytes += b.sh.footprint;
    });
    ++stats_.pools_released;
    if (deferred_.blocks.size() >= opts_.sync_frees_per_wait || deferred_.bytes >= opts_.bytes_per_event) {
      try {
        refuse_host_wait_under_capture();
        wait_for_pending_frees(/*policy_too=*/false);
      } catch (...) {
        // Still set aside: a later wait returns them.
      }
    }
  }

  pool* first_unreleased_pool() noexcept
  {
    return graphs_.pools().first_where([](const auto& pl) { return !pl.released; });
  }

  std::optional<pool_target> target_for(cuda::stream_ref stream, bool capturing)
    requires graph_backend<Backend>
  {
    return graphs_.target_for(backend_, captures_, stream, capturing, opts_.graph_pools);
  }

  /// The pool's own free block of this shape in the same stream order, else a new one from the policy.
  void* allocate_in_pool(const pool_target& t, const shape& sh)
    requires graph_backend<Backend>
  {
    auto [pl, fresh] = graphs_.open(backend_, t);
    set_aside b{};
    if (graphs_.pools().take(*pl, t.tag, sh.tag, sh.key, b)) {
      ++stats_.pool_hits;
      return b.p;
    }
    void* p = nullptr;
    try {
      graphs_.pools().prepare_adopt();  // before the policy: giving a block back does not undo the policy's growth
      p = grow_pool(sh, t.capturing);
    } catch (...) {
      if (fresh) graphs_.pools().erase_if_empty(*pl);
      throw;
    }
    graphs_.pools().adopt(*pl, p, sh.footprint);
    ++stats_.pool_misses;
    return p;
  }

  /// The policy's allocate, for a pool: under capture with the thread's capture mode relaxed (grow_policy).
  /// A policy that must wait for the device cannot grow under capture: its failure becomes a usage_error
  /// saying so (out of memory stays itself).
  void* grow_pool(const shape& sh, bool capturing)
    requires graph_backend<Backend>
  {
    if (!capturing) return grow_policy(sh);
    try {
      return grow_policy(sh);
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      std::throw_with_nested(usage_error(
          std::string("stream_ordered: the policy could not grow while a stream is being captured into a CUDA graph (") +
          e.what() + "); a policy that waits for the device to grow (mapped_pool reclaiming idle memory) cannot do so "
          "under capture: warm the pool before capturing; the pool is unchanged"));
    }
  }

  // The layer's state, all of it. Each part leaves itself empty when moved from, so the moves hand it over.
  [[no_unique_address]] Policy policy_{};
  [[no_unique_address]] Backend backend_{};
  options opts_{};
  std::optional<int> policy_device_{};  ///< where the policy's memory lives, when it says (device-wide waits)
  emptied_on_move<shape_memo> shapes_{};  ///< shapes of recent requests
  stream_cache<event> cache_{};
  event_ledger<event> ledger_{};
  emptied_on_move<owner_books<event>> own_{};
  emptied_on_move<set_aside_frees> deferred_{};
  emptied_on_move<recent_frees> recent_{};  ///< the lone owner's, unmerged
  capture_guard captures_{};
  graph_router<set_aside> graphs_{};
  emptied_on_move<counters> stats_{};
};

} // namespace strata::detail
