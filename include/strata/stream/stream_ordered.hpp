#pragma once
#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <stdexcept>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/capture_guard.hpp>
#include <strata/detail/emptied_on_move.hpp>
#include <strata/detail/event_ledger.hpp>
#include <strata/detail/graph_router.hpp>
#include <strata/detail/stream_cache.hpp>
#include <strata/detail/resource_device.hpp>
#include <strata/stream/cuda_events.hpp>
#include <strata/stream/identified_stream.hpp>

namespace strata {

/// Makes any policy stream-ordered, at no cost in memory where one stream does the freeing
/// (docs/architecture.md, "Stream-ordered reuse", has the whole design).
///
/// One stream at a time owns the policy: its frees go straight back (the policy sees exactly the calls it
/// would see without this layer). A block freed on another stream is cached on that stream
/// (detail::stream_cache) and reused there at once; it reaches the policy, or another stream, only after an
/// event recorded behind it (detail::event_ledger) completes or the taker is made to wait for it on the GPU.
/// Synchronous frees are set aside until a device-wide wait. Allocations made under CUDA graph capture come
/// from private pools (detail::graph_router); no host wait, event record or query is made for a capturing
/// stream (detail::capture_guard).
///
/// The host waits only where stats() counts it: a synchronous allocate whose block may still be in use, a
/// synchronous free that fills the set-aside batch, out of memory with frees pending, release(), a free whose
/// bookkeeping cannot be kept, and the first other stream needing the owner's frees made before it shared
/// the layer. A failed call changes nothing, except that on the way to out_of_memory cached blocks merge into
/// the policy.
///
/// Models: stream_resource (CCCL 3.0 async_resource and the 3.1 names), owning/sized/usage when the policy
/// is; the policy's properties. Cost: on the owner, the policy's allocate or free and a few comparisons,
/// plus the stream's id lookup (a driver call; none with an identified_stream) and, with `check_capture`, one
/// capture query; on another stream, a cached allocate or free is a hash lookup, O(1); a miss costs the
/// policy's allocate, an event query per pending event and at most one event record and cudaStreamWaitEvent
/// per batch of frees. Unsynchronized. Move-only: a move hands every block, event and pool over.
template <resource Policy, event_backend Backend = cuda_events>
class stream_ordered : public forward_properties<stream_ordered<Policy, Backend>, Policy>,
                       public stream_names<stream_ordered<Policy, Backend>> {
public:
  using stream_names<stream_ordered>::allocate;
  using stream_names<stream_ordered>::deallocate;
  using event = typename Backend::event;

  /// A stream records an event after its cached blocks once more of them lack one than this, or than twice
  /// what it cached when it last recorded (a stream cycling through its usual shapes then records nothing).
  struct options {
    std::size_t frees_per_event = 8;
    std::size_t bytes_per_event = std::size_t{16} << 20;  ///< ... or once they hold more bytes than this
    std::size_t sync_frees_per_wait = 64;  ///< synchronous frees set aside before one device-wide wait returns them
    /// Ask at every allocate and free whether the stream is being captured (docs/architecture.md). Off: ask
    /// only while a capture may be under way (a route is open, or a capture was seen and not yet known
    /// ended), as PyTorch's caching allocator does; then a capture must be announced with
    /// begin_allocate_to_pool before it allocates or frees through this layer (PyTorch's torch.cuda.graph
    /// does; the plug-in's default), else its allocations are served as if uncaptured.
    bool check_capture = true;
    bool graph_pools = true;  ///< serve allocations under capture from a private pool per capture (needs a graph_backend)
    /// Not used while the owner is permanent (the legacy stream: its frees carry no event, see docs/architecture.md).
    /// Once another stream shares the layer, the owner's frees carry events (one cudaEventRecord each) only
    /// while another stream needed them within this many of the owner's frees; past it they carry none, and
    /// the next stream to need them makes one device-wide wait instead of a cudaStreamWaitEvent (then the
    /// events resume). SIZE_MAX: always. For loops where the other streams mostly reuse their own frees
    /// (PyTorch's side streams with record_stream): the plug-in sets it. Events stay on while a capture may be
    /// under way (no host wait is allowed then).
    std::size_t owner_cover_window = SIZE_MAX;
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

  explicit stream_ordered(Policy policy = Policy{}, options opts = options{}, Backend backend = Backend{})
      : m_{.policy = std::move(policy), .backend = std::move(backend), .opts = opts}
  {
    m_.policy_device = detail::resource_device(m_.policy);
    if (opts.frees_per_event == 0 || opts.bytes_per_event == 0 || opts.sync_frees_per_wait == 0)
      throw std::invalid_argument("stream_ordered: frees_per_event, bytes_per_event and sync_frees_per_wait must be positive");
  }

  /// A move hands every block, event and pool over; the moved-from layer is empty.
  stream_ordered(stream_ordered&&) noexcept = default;
  stream_ordered& operator=(stream_ordered&& other) noexcept
  {
    if (this != &other) {
      return_everything();
      m_ = std::move(other.m_);
    }
    return *this;
  }
  stream_ordered(const stream_ordered&) = delete;
  stream_ordered& operator=(const stream_ordered&) = delete;
  ~stream_ordered() { return_everything(); }

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
  {
    return allocate_ordered(bytes, alignment, stream, nullptr);
  }
  /// The same, with the stream's id known: no backend call on a hit.
  void* allocate_async(std::size_t bytes, std::size_t alignment, const identified_stream& stream)
  {
    const std::uint64_t id = stream.id();
    return allocate_ordered(bytes, alignment, stream.stream(), stream.valid_here() ? &id : nullptr);
  }

  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
  {
    free_ordered(p, bytes, alignment, stream, nullptr);
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, const identified_stream& stream) noexcept
  {
    const std::uint64_t id = stream.id();
    free_ordered(p, bytes, alignment, stream.stream(), stream.valid_here() ? &id : nullptr);
  }

  /// Tells the layer that `stream` will share it: from now on the owner's frees carry events, so that this
  /// stream waits for them on the GPU. (A stream first seen later makes its first request wait for the device
  /// once instead: the owner's earlier frees have no event, and its handle is never touched from another
  /// stream's call.) A driver call; no memory. Nothing on a capturing stream (asking its id would invalidate
  /// the capture; what it allocates is its graph's private pool's, which nobody else gets anyway).
  void share(cuda::stream_ref stream)
  {
    if (checks_capture() && captures(stream)) return;
    (void)state_of(m_.backend.id_of(stream), stream);
  }

  /// On the legacy default stream; the block is ready for the host and any stream when this returns.
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("stream_ordered", alignment, largest_alignment);
    if (bytes == 0) return nullptr;
    collect_released_pools();
    refuse_host_wait_under_capture();  // as cudaMalloc is refused under global capture: it may have to wait
    const cuda::stream_ref legacy{cudaStreamLegacy};
    const std::uint64_t id = m_.backend.id_of(legacy);
    if (bytes > largest_cached) return m_.policy.allocate(bytes, alignment);  // fails there, naming the policy
    return allocate_on(shape_of(bytes, alignment), legacy, id, /*for_host=*/true);
  }

  /// Safe for any prior work on any stream, as cudaFree is: set aside until a device-wide wait (docs/architecture.md).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    collect_released_pools_noexcept();
    const shape sh = shape_of(bytes, alignment);
    if (!m_.graphs.pools().empty() && free_in_pools(p, sh, cuda::stream_ref{cudaStreamLegacy}, /*capturing=*/false, /*synchronous=*/true))
      return;
    try {
      const cuda::stream_ref legacy{cudaStreamLegacy};
      state_of(m_.backend.id_of(legacy), legacy);  // so that the device-wide wait covers this device
      m_.deferred.blocks.push_back({p, sh});
    } catch (...) {
      return_unordered(p, sh);
      return;
    }
    m_.deferred.bytes += sh.footprint;
    if (m_.deferred.blocks.size() >= m_.opts.sync_frees_per_wait || m_.deferred.bytes >= m_.opts.bytes_per_event) {
      try {
        wait_for_pending_frees(/*policy_too=*/false);
      } catch (...) {
        // Still set aside: a later wait returns them.
      }
    }
  }

  /// Waits (on the host) for every pending free, returns every cached block to the policy, then releases
  /// the policy's free chunks when it can.
  void release()
  {
    collect_released_pools();
    refuse_host_wait_under_capture();  // the policy's release frees chunks (cudaFree waits, illegal in capture)
    wait_for_pending_frees(/*policy_too=*/true);
    if constexpr (releasable_resource<Policy>) m_.policy.release();
  }

  /// From now on, allocations on streams for which `filter(cudaStream_t)` is true (checked newest route
  /// first) are served from private pool `pool` (PyTorch's beginAllocateToPool). Called before the capture
  /// begins, it waits (on the host, once) for this layer's pending frees, so nothing freed before it is still
  /// in use when the graph first runs. Throws (nothing changed) if that wait fails.
  template <class Filter>
    requires std::predicate<Filter&, cudaStream_t> && graph_backend<Backend>
  void begin_allocate_to_pool(std::uint64_t pool, Filter filter)
  {
    add_route(pool, std::function<bool(cudaStream_t)>(std::move(filter)));
  }
  /// The same, for every stream being captured.
  void begin_allocate_to_pool(std::uint64_t pool)
    requires graph_backend<Backend>
  {
    add_route(pool, {});
  }
  /// Stops routing to `pool` (its newest route); the pool keeps its blocks for its graphs.
  void end_allocate_to_pool(std::uint64_t pool)
  {
    // PyTorch ends a route after cudaStreamEndCapture: the captures routed to the pool have ended.
    m_.captures.forget_route(pool);
    m_.graphs.end_route(pool);
  }
  /// The graphs using `pool` are gone: its free blocks go back (as synchronous frees: after a device-wide
  /// wait), its live blocks as they are freed. Routing to it stops. An unknown pool is ignored (PyTorch
  /// releases pools nothing was allocated in). Throws (nothing changed) only on host memory exhaustion.
  void release_pool(std::uint64_t pool)
  {
    if (auto* pl = m_.graphs.pools().find({pool, false})) release_pool_blocks(*pl);
    m_.graphs.drop_routes(pool);
  }
  /// Releases the pools whose graphs CUDA reported destroyed (every allocate and free does this first).
  void collect_released_pools()
  {
    m_.graphs.collect_released([this](std::uint64_t id) { m_.captures.forget_capture(id); },
                               [this](auto& pl) { release_pool_blocks(pl); });
  }
  /// Private pools held (live graphs', and released ones whose blocks are not all freed yet).
  std::size_t private_pools() const noexcept { return m_.graphs.pools().size(); }
  /// Blocks held by private pools, live and free, and their bytes (as the policy counts them).
  std::size_t private_pool_blocks() const noexcept { return m_.graphs.pools().blocks(); }
  std::size_t private_pool_free_blocks() const noexcept { return m_.graphs.pools().free_blocks(); }
  std::size_t private_pool_bytes() const noexcept { return m_.graphs.pools().bytes(); }
  /// Blocks and bytes in one pool (an explicit pool's id, or a capture's id with `automatic`); 0 if none.
  std::size_t pool_blocks(std::uint64_t pool, bool automatic = false) const noexcept
  {
    const auto* pl = m_.graphs.pools().find({pool, automatic});
    return pl == nullptr ? 0 : pl->live_blocks + pl->free_blocks;
  }

  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const
    requires sized_resource<Policy>
  {
    return m_.policy.good_size(bytes, alignment);
  }

  bool owns(const void* p) const noexcept
    requires owning_resource<Policy>
  {
    return m_.policy.owns(p);
  }

  /// The policy's figures, with cached and set-aside blocks counted as free (a private pool's free blocks are
  /// in use: its graph uses them at every replay).
  strata::usage usage() const noexcept
    requires usage_reporting_resource<Policy>
  {
    strata::usage u = m_.policy.usage();
    u.in_use -= m_.cache.bytes() + m_.deferred.bytes;
    u.used_blocks -= m_.cache.blocks() + m_.deferred.blocks.size();
    u.free_blocks += m_.cache.blocks() + m_.deferred.blocks.size();
    return u;
  }

  /// Bytes and blocks freed by streams and not yet back in the policy.
  std::size_t cached_bytes() const noexcept { return m_.cache.bytes(); }
  std::size_t cached_blocks() const noexcept { return m_.cache.blocks(); }
  /// Synchronous frees waiting for a device-wide wait.
  std::size_t set_aside_blocks() const noexcept { return m_.deferred.blocks.size(); }
  /// Events recorded and not yet seen complete.
  std::size_t pending_events() const noexcept { return m_.ledger.pending(); }
  /// Streams with cached blocks or pending events, and the owner.
  std::size_t streams_tracked() const noexcept { return m_.cache.streams(); }
  /// The id of the stream whose frees go straight to the policy (none before the first free).
  std::optional<std::uint64_t> owner() const noexcept
  {
    return m_.own.owner != nullptr ? std::optional<std::uint64_t>(m_.own.owner->id) : std::nullopt;
  }
  /// The id this layer files a stream under (what checked<> compares). A capturing stream cannot be asked
  /// (that would invalidate its capture): it is the id last seen with its handle, else one made from the
  /// capture's id (top bit set, so it is no stream's id).
  std::uint64_t stream_id(cuda::stream_ref stream) const
  {
    if (checks_capture() && m_.backend.capturing(stream)) {
      if (const stream_state* st = m_.cache.with_handle(stream)) return st->id;
      if constexpr (graph_backend<Backend>) return (std::uint64_t{1} << 63) | m_.backend.capture_of(stream).id;
      else return std::uint64_t{1} << 63;
    }
    return m_.backend.id_of(stream);
  }
  const counters& stats() const noexcept { return m_.stats; }

  Policy& policy() noexcept { return m_.policy; }
  const Policy& policy() const noexcept { return m_.policy; }
  Backend& backend() noexcept { return m_.backend; }

  friend bool operator==(const stream_ordered& a, const stream_ordered& b) noexcept { return &a == &b; }

private:
  static constexpr std::size_t largest_alignment = std::size_t{1} << 56;
  static constexpr std::size_t largest_cached = std::size_t{1} << 56;

  using shape = detail::block_shape;
  using node = detail::cached_block;
  using pending_event = detail::pending_event<event>;
  using event_queue = typename detail::event_ledger<event>::queue;
  using stream_state = detail::stream_free_lists<event>;
  struct set_aside {
    void* p;
    shape sh;
  };

  /// Requests of one good size share a key when the policy's good size is its own good size (asking for it
  /// consumes exactly it): then any of them may reuse the block, and the policy always sees that one request.
  /// Otherwise (e.g. alignment slack added on top) the key is the request rounded to 256 bytes.
  shape shape_of(std::size_t bytes, std::size_t alignment) const noexcept
  {
    const std::size_t align = effective_alignment(alignment);
    std::size_t request = align_up(bytes, default_alignment);
    std::size_t footprint = request;
    if constexpr (sized_resource<Policy>) {
      footprint = m_.policy.good_size(bytes, align);
      if (m_.policy.good_size(footprint, align) == footprint) request = footprint;
    }
    return {request, footprint, align, (std::uint64_t{request} << 6) | static_cast<std::uint64_t>(std::countr_zero(align))};
  }

  /// An allocate on `stream`, whose id is `known_id` when the caller knows it.
  void* allocate_ordered(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, const std::uint64_t* known_id)
  {
    check_alignment("stream_ordered", alignment, largest_alignment);
    if (bytes == 0) return nullptr;
    collect_released_pools();
    if (bytes > largest_cached) return m_.policy.allocate(bytes, alignment);  // fails there, naming the policy
    const shape sh = shape_of(bytes, alignment);
    // Before the id, even on a hit: asking a capturing stream for its id invalidates the capture, and a block
    // handed to a capture without the pool knowing could be reused while the graph lives.
    if (void* p = nullptr; routed(sh, stream, p)) return p;
    const std::uint64_t id = known_id != nullptr ? *known_id : id_for_allocate(stream);
    return allocate_on(sh, stream, id, /*for_host=*/false, /*capture_checked=*/true);
  }

  /// A free on `stream`, whose id is `known_id` when the caller knows it.
  void free_ordered(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, const std::uint64_t* known_id) noexcept
  {
    if (p == nullptr) return;
    collect_released_pools_noexcept();
    const shape sh = shape_of(bytes, alignment);
    bool capturing = false;
    try {
      capturing = checks_capture() && captures(stream);
    } catch (...) {
      if (capture_possible()) return abandon(sh);  // see capture_possible()
      // No capture known: an unknown stream, which the id lookup below reports.
    }
    if ((capturing || !m_.graphs.pools().empty()) && free_in_pools(p, sh, stream, capturing)) return;
    if (capturing) return abandon(sh);  // the graph may use the block whenever it is launched; asking the id would break it
    std::uint64_t id = 0;
    if (known_id != nullptr) {
      id = *known_id;
    } else {
      try {
        id = m_.backend.id_of(stream);
      } catch (...) {
        return return_unordered(p, sh);  // an unknown stream: nothing to order the reuse by
      }
    }
    deallocate_on(p, sh, stream, id);
  }

  /// `for_host`: the block must be ready for the host and every stream when this returns (the synchronous
  /// allocate): a reused block is waited for, a handed-over one too.
  /// `capture_checked`: the caller already asked whether the stream captures (once per call is enough).
  void* allocate_on(const shape& sh, cuda::stream_ref stream, std::uint64_t id, bool for_host, bool capture_checked = false)
  {
    stream_state& s = state_of(id, stream);
    if (node* n = s.oldest != nullptr ? s.take(sh.key) : nullptr) {
      if (for_host) {
        try {
          refuse_host_wait_under_capture();
          count_wait(m_.stats.stream_syncs);
          m_.backend.wait_stream(stream);
        } catch (...) {
          s.put(n);  // cannot throw: the bin for this key exists
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
    stream_state* s = nullptr;
    try {
      s = &state_of(id, stream);
    } catch (...) {
      return_unordered(p, sh);
      return;
    }
    ++s->recent_frees;
    if (m_.own.owner == nullptr) become_owner(*s, stream);
    if (m_.own.owner == s) {
      // Straight back, so it merges now: the policy then sees exactly the calls it would see without this
      // layer, and holds exactly what it would hold.
      m_.policy.deallocate(p, sh.request, sh.align);
      ++m_.own.policy_seq;
      if (m_.own.shared && !covers_owner_on_demand()) {
        if (m_.own.frees_unneeded < m_.opts.owner_cover_window || capture_possible()) cover_owner(stream);
        if (m_.own.frees_unneeded < m_.opts.owner_cover_window) ++m_.own.frees_unneeded;
      }
      return;
    }
    try {
      m_.cache.file(*s, p, sh);
    } catch (...) {
      return_unordered(p, sh);
      return;
    }
    if (s->wants_event(m_.opts.frees_per_event, m_.opts.bytes_per_event)) {
      try {
        cover(*s, stream);
      } catch (...) {
        // Left uncovered: the blocks are still reused on this stream, and reclaimed by a later event or wait.
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
    m_.policy.deallocate(p, sh.request, sh.align);
  }

  void abandon(const shape& sh) noexcept
  {
    ++m_.stats.abandoned_blocks;
    m_.stats.abandoned_bytes += sh.footprint;
  }

  // ---- private pools (CUDA graphs) ----

  using router = detail::graph_router<set_aside>;
  using pool_target = typename router::target;

  /// Serves an allocation from a private pool when it belongs to one (true, the block in `out`); refuses an
  /// allocation under capture that cannot be served so (usage_error, nothing changed).
  bool routed(const shape& sh, cuda::stream_ref stream, void*& out)
  {
    if (!checks_capture()) return false;
    const bool capturing = captures(stream);
    if (!capturing && !m_.graphs.routing()) return false;
    if constexpr (graph_backend<Backend>) {
      if (const std::optional<pool_target> t = target_for(stream, capturing)) {
        out = allocate_in_pool(*t, sh);
        return true;
      }
    }
    if (capturing) refuse_capture("an allocation was asked of it");
    return false;
  }

  std::optional<pool_target> target_for(cuda::stream_ref stream, bool capturing)
    requires graph_backend<Backend>
  {
    return m_.graphs.target_for(m_.backend, m_.captures, stream, capturing, m_.opts.graph_pools);
  }

  /// The pool's own free block of this shape in the same stream order, else a new one from the policy.
  void* allocate_in_pool(const pool_target& t, const shape& sh)
    requires graph_backend<Backend>
  {
    auto [pl, fresh] = m_.graphs.open(m_.backend, t);
    set_aside b{};
    if (m_.graphs.pools().take(*pl, t.tag, sh.key, b)) {
      ++m_.stats.pool_hits;
      return b.p;
    }
    void* p = nullptr;
    try {
      m_.graphs.pools().prepare_adopt();  // before the policy: giving a block back does not undo the policy's growth
      p = grow_pool(sh, t.capturing);
    } catch (...) {
      if (fresh) m_.graphs.pools().erase_if_empty(*pl);
      throw;
    }
    m_.graphs.pools().adopt(*pl, p, sh.footprint);
    ++m_.stats.pool_misses;
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

  /// The policy's allocate. While a stream this layer has seen capturing may still capture, with the calling
  /// thread's capture mode relaxed around the call: a source's cudaMalloc or cuMemCreate is "potentially
  /// unsafe" under capture, and in the default (global) mode any thread's call invalidates every capture going
  /// on, even for an allocation on an uncaptured stream. The call is not captured either way, which is what a
  /// pool wants (its memory belongs to the pool, not to a graph); PyTorch relaxes the mode the same way.
  void* grow_policy(const shape& sh)
  {
    return relaxed_while_capturing([&] { return m_.policy.allocate(sh.request, sh.align); });
  }

  /// Runs f with the calling thread's capture mode relaxed while a stream this layer has seen capturing may
  /// still capture: in the default (global) mode a "potentially unsafe" call from any thread (a source's
  /// cudaMalloc, an event query for an uncaptured stream) invalidates every capture going on.
  template <class F>
  decltype(auto) relaxed_while_capturing(F&& f)
  {
    return m_.captures.relaxed(m_.backend, std::forward<F>(f));
  }

  /// Whether an event has completed; relaxed while a capture goes on (see relaxed_while_capturing).
  bool event_done(const event& e)
  {
    return relaxed_while_capturing([&] { return m_.backend.done(e); });
  }

  /// A free that concerns the private pools: a pool block (filed in its pool, or, its pool released, freed the
  /// common way: false), or any block freed under capture (it joins the capture's pool: the graph may use it
  /// at every replay). False: not for the pools. Never throws: a block that cannot be filed is abandoned.
  bool free_in_pools(void* p, const shape& sh, cuda::stream_ref stream, bool capturing, bool synchronous = false) noexcept
  {
    if constexpr (!graph_backend<Backend>) {
      return false;
    } else {
      auto* pl = m_.graphs.pools().owner_of(p);
      if (pl != nullptr && pl->released) {
        m_.graphs.pools().disown(*pl, p, sh.footprint);
        pl = nullptr;
      }
      if (pl == nullptr && !capturing) return false;
      try {
        detail::reuse_tag tag = detail::reuse_tag::nowhere();
        if (pl == nullptr) {  // from outside the pools, freed under capture
          const std::optional<pool_target> t = target_for(stream, capturing);
          if (!t) return false;  // the caller abandons it
          pl = m_.graphs.open(m_.backend, *t).first;
          try {
            m_.graphs.pools().prepare_adopt();
          } catch (...) {
            m_.graphs.pools().erase_if_empty(*pl);
            throw;
          }
          m_.graphs.pools().adopt(*pl, p, sh.footprint);
          ++m_.stats.pool_adoptions;
          tag = t->tag;
        } else if (synchronous) {
          tag = detail::reuse_tag::nowhere();
        } else if (capturing) {
          const capture_info info = m_.backend.capture_of(stream);
          if (info.active) tag = router::captured_tag(pl->name, info.id, stream);
        } else {
          try {
            tag = {0, m_.backend.id_of(stream)};
          } catch (...) {  // an unknown stream: kept, never reused in the pool
          }
        }
        m_.graphs.pools().put(*pl, tag, sh.key, set_aside{p, sh});
      } catch (...) {
        if (pl != nullptr && m_.graphs.pools().owner_of(p) == pl) m_.graphs.pools().disown(*pl, p, sh.footprint);
        abandon(sh);
      }
      return true;
    }
  }

  void add_route(std::uint64_t pool, std::function<bool(cudaStream_t)> filter)
  {
    m_.graphs.reserve_route();
    auto [pl, fresh] = m_.graphs.pools().open({pool, false});
    try {
      // Outside capture, once: nothing freed before this is still running when the graph first does.
      bool capture_on = false;
      try {
        refuse_host_wait_under_capture();
      } catch (const usage_error&) {
        capture_on = true;
      }
      if (!capture_on && (!policy_clean() || m_.cache.blocks() > 0 || !m_.deferred.blocks.empty()))
        wait_for_pending_frees(/*policy_too=*/true);
    } catch (...) {
      if (fresh) m_.graphs.pools().erase_if_empty(*pl);
      throw;
    }
    pl->released = false;  // a pool id used again after release_pool: its remaining blocks are its own again
    m_.graphs.add_route(pool, std::move(filter));
  }

  /// A pool's free blocks become synchronous frees (set aside until a device-wide wait, which covers every
  /// launch and stream that used them); its live blocks follow as they are freed.
  void release_pool_blocks(typename detail::graph_pools<set_aside>::pool& pl)
  {
    m_.deferred.blocks.reserve(m_.deferred.blocks.size() + pl.free_blocks);
    m_.graphs.pools().drain(pl, [](const set_aside& b) noexcept { return b.sh.footprint; }, [this](const set_aside& b) noexcept {
      m_.deferred.blocks.push_back(b);  // capacity reserved
      m_.deferred.bytes += b.sh.footprint;
    });
    ++m_.stats.pools_released;
    if (m_.deferred.blocks.size() >= m_.opts.sync_frees_per_wait || m_.deferred.bytes >= m_.opts.bytes_per_event) {
      try {
        refuse_host_wait_under_capture();
        wait_for_pending_frees(/*policy_too=*/false);
      } catch (...) {
        // Still set aside: a later wait returns them.
      }
    }
  }

  void collect_released_pools_noexcept() noexcept
  {
    try {
      collect_released_pools();
    } catch (...) {  // host memory exhausted: the ids stay posted for a later call
    }
  }

  /// The stream's id; a stream being captured cannot even be asked for it (the driver refuses): that is the
  /// capture refusal, not a CUDA failure.
  std::uint64_t id_for_allocate(cuda::stream_ref stream)
  {
    try {
      return m_.backend.id_of(stream);
    } catch (const std::exception&) {
      bool capturing = false;
      try {
        capturing = checks_capture() && captures(stream);
      } catch (...) {  // not even that: an unknown stream, reported as the lookup's own error
      }
      if (capturing) refuse_capture("an allocation asked for its stream");
      throw;
    }
  }

  /// Whether a capture may be under way: a stream seen capturing, or a route (PyTorch announces its captures
  /// with begin_allocate_to_pool). A free whose capture query fails then assumes the worst: its stream may be
  /// captured, where asking its id would invalidate the capture and a block filed for reuse could be handed
  /// out while a graph still uses it, so the block is abandoned (counted in stats().abandoned_blocks).
  bool capture_possible() const noexcept { return m_.captures.any() || m_.graphs.routing(); }

  /// Whether streams are asked about capture now: always with options::check_capture; without it, only while
  /// a capture may be under way (announced by a route, as all of PyTorch's are), which is when PyTorch's
  /// caching allocator asks too.
  bool checks_capture() const noexcept { return m_.opts.check_capture || capture_possible(); }

  bool captures(cuda::stream_ref stream) { return m_.captures.captures(m_.backend, stream); }
  [[noreturn]] static void refuse_capture(const char* what) { detail::refuse_capture(what); }

  /// Host waits are refused while a capture may go on (detail::capture_guard says when). The layer never asks
  /// the driver about a stream handle outside a call on that stream: it may have been destroyed since.
  void refuse_host_wait_under_capture()
  {
    if (checks_capture()) m_.captures.refuse_host_wait(m_.backend);
  }

  void count_wait(std::uint64_t& kind) noexcept
  {
    ++kind;
    ++m_.stats.host_waits;
  }

  stream_state& state_of(std::uint64_t id, cuda::stream_ref stream)
  {
    const auto [s, added] = m_.cache.find_or_add(id, stream, [&] { return m_.backend.device_of(stream); });
    if (added) m_.own.shared = m_.own.shared || m_.cache.streams() > 1;  // from now on the owner's frees carry events
    return *s;
  }

  void* hand_out(node* n) noexcept
  {
    ++m_.stats.hits;
    return m_.cache.release(n).p;
  }

  void give_back(node* n) noexcept
  {
    const auto b = m_.cache.release(n);
    m_.policy.deallocate(b.p, b.request, b.align);
  }

  /// Records an event on `stream` (of `device`) into `events`, covering what is numbered below `covers_below`.
  /// `on_its_device`: a permanent stream's handle, recorded on as a stream of `device` whichever is current.
  void record_into(event_queue& events, cuda::stream_ref stream, std::uint64_t covers_below, int device,
                   bool on_its_device = false)
  {
    m_.ledger.record_into(events, m_.backend, device, covers_below, [&](event e) {
      if (on_its_device) record_on(e, stream, device);
      else m_.backend.record(e, stream);
    });
    ++m_.stats.events;
  }

  void retire_front(event_queue& events) noexcept { m_.ledger.retire_front(events); }

  /// Records an event after the stream's uncovered blocks, so they can be reclaimed once it completes.
  void cover(stream_state& s, cuda::stream_ref stream)
  {
    if (s.uncovered_blocks == 0) return;
    reap(s);
    if (checks_capture() && captures(stream)) refuse_capture("an event was needed");
    record_into(s.events, stream, s.next_seq, s.device);
    s.covered_seq = s.next_seq;
    s.uncovered_blocks = 0;
    s.uncovered_bytes = 0;
    s.blocks_at_cover = s.blocks;
    s.bytes_at_cover = s.bytes;
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

  /// The owner's completed events: its policy frees they cover are safe for everyone.
  void reap_owner()
  {
    while (!m_.ledger.owner_events().empty() && event_done(m_.ledger.owner_events().front().e)) mark_safe(m_.ledger.owner_events().front().covers_below);
  }

  /// Reaps every stream and forgets streams with nothing left (destroyed streams never come back).
  void reap_all(const stream_state& keep)
  {
    reap_owner();
    m_.cache.for_each([this](stream_state& s) { reap(s); });
    forget_empty_streams(keep);
  }

  /// Streams with nothing cached and no event pending are forgotten (destroyed streams never come back).
  void forget_empty_streams(const stream_state& keep) noexcept { m_.cache.forget_empty(keep, m_.own.owner); }

  bool policy_clean() const noexcept { return m_.own.safe_seq >= m_.own.policy_seq; }

  /// Whether the owner's frees get their event from the stream that needs them, when it needs them, instead
  /// of one per free: the owner's handle must outlive every call (a permanent stream: the legacy default
  /// stream), and no capture may be under way (an event recorded on the legacy stream joins a blocking
  /// stream's capture; while one may go on, frees carry their events as for any owner).
  bool covers_owner_on_demand() const noexcept { return m_.own.owner != nullptr && permanent(m_.own.owner->handle) && !capture_possible(); }

  bool permanent(cuda::stream_ref stream) const noexcept
  {
    if constexpr (permanent_stream_backend<Backend>) return m_.backend.permanent(stream);
    else return false;
  }

  /// Records e on `stream` from a call on another stream, on `device` (only for a permanent stream, which a
  /// backend without the capability never has).
  void record_on(event e, cuda::stream_ref stream, int device)
  {
    if constexpr (permanent_stream_backend<Backend>) m_.backend.record_on(e, stream, device);
    else m_.backend.record(e, stream);
  }

  /// s's frees go straight to the policy from now on, and what s has cached goes there now: every
  /// block is safe for s itself. Only while the policy holds no other stream's unfinished frees.
  void become_owner(stream_state& s, cuda::stream_ref stream) noexcept
  {
    m_.own.owner = &s;
    while (!s.events.empty()) retire_front(s.events);
    flush_owner_cache();
    if (m_.own.shared && !policy_clean() && !covers_owner_on_demand()) cover_owner(stream);  // the flushed blocks, for the other streams
  }

  /// The owner's cached blocks go to the policy (where they merge), as the owner's unfinished frees.
  void flush_owner_cache() noexcept
  {
    stream_state& s = *m_.own.owner;
    while (s.oldest != nullptr) {
      node* n = s.oldest;
      s.remove(n);
      give_back(n);
      ++m_.own.policy_seq;
    }
    s.covered_seq = s.next_seq;
    s.uncovered_blocks = s.uncovered_bytes = s.blocks_at_cover = s.bytes_at_cover = 0;
  }

  /// Makes whatever the policy hands out next safe for stream t: the owner's frees not yet known complete are
  /// waited for, on the GPU (t waits for an event on the owner) or, for the host, on the host.
  void make_policy_safe_for(stream_state& t, cuda::stream_ref stream, bool for_host)
  {
    if (!policy_clean() && (for_host || (&t != m_.own.owner && t.ordered_after < m_.own.policy_seq))) {
      m_.own.frees_unneeded = 0;  // the owner's frees were needed: they carry events again (owner_cover_window)
      reap_owner();
      if (!policy_clean()) {
        if (const pending_event* e = owner_event()) {
          if (!event_done(e->e)) {
            if (!for_host) {
              m_.backend.order_after(stream, e->e);
              ++m_.stats.orderings;
              t.ordered_after = e->covers_below;
              return;
            }
            refuse_host_wait_under_capture();
            count_wait(m_.stats.event_syncs);
            m_.backend.wait_host(e->e);
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
    m_.own.safe_seq = std::max(m_.own.safe_seq, seq);
    while (!m_.ledger.owner_events().empty() && m_.ledger.owner_events().front().covers_below <= m_.own.safe_seq) retire_front(m_.ledger.owner_events());
  }

  /// Once another stream shares the layer, every owner free records an event after itself, on the owner's
  /// stream while it is known alive (this call): so another stream never has to touch the owner's handle,
  /// which may belong to a stream destroyed since. A failed record leaves the free uncovered; a taker then
  /// waits device-wide (owner_event). Not for a permanent owner (covers_owner_on_demand).
  void cover_owner(cuda::stream_ref stream) noexcept
  {
    try {
      record_into(m_.ledger.owner_events(), stream, m_.own.policy_seq, m_.own.owner->device);
    } catch (...) {
    }
  }

  /// An event after all the owner's policy frees, or null when some have none (made before another stream
  /// shared the layer, or a record failed): then every device was waited for and the policy is clean.
  const pending_event* owner_event()
  {
    if (!m_.ledger.owner_events().empty() && m_.ledger.owner_events().back().covers_below >= m_.own.policy_seq) return &m_.ledger.owner_events().back();
    if (covers_owner_on_demand()) {
      try {
        record_into(m_.ledger.owner_events(), m_.own.owner->handle, m_.own.policy_seq, m_.own.owner->device, /*on_its_device=*/true);
        return &m_.ledger.owner_events().back();
      } catch (...) {
        // Not recorded: wait for the devices instead, as for frees made before the layer was shared.
      }
    }
    refuse_host_wait_under_capture();
    wait_all_devices();
    mark_safe(m_.own.policy_seq);
    return nullptr;
  }

  /// Ownership moves to t when the owner's frees are all known complete and t has been freeing more.
  void weigh_ownership(stream_state& t, cuda::stream_ref stream) noexcept
  {
    if (m_.own.owner == &t) return;
    if (m_.own.owner == nullptr || t.recent_frees > m_.own.owner->recent_frees) {
      if (m_.own.owner != nullptr) m_.own.owner->recent_frees = 0;
      t.recent_frees = 0;
      become_owner(t, stream);
    } else {
      m_.own.owner->recent_frees = 0;
      t.recent_frees = 0;
    }
  }

  /// The stream's own safe blocks go back to the policy here, so they merge before the policy is asked;
  /// other streams' safe blocks, and set-aside synchronous frees, before the policy grows.
  void* allocate_on_miss(const shape& sh, cuda::stream_ref stream, stream_state& s, bool for_host, bool capture_checked)
  {
    if (checks_capture() && !capture_checked && captures(stream)) refuse_capture("an allocation missed its stream's cache");
    ++m_.stats.misses;
    // The owner alone with the policy (one stream, nothing pending, nothing cached or set aside): nothing to
    // reap, wait for or hand back first, so the policy is asked at once, as it would be without this layer.
    if (!for_host && &s == m_.own.owner && m_.ledger.pending() == 0 && m_.cache.blocks() == 0 && m_.deferred.blocks.empty())
      return grow_policy(sh);
    // An alignment the policy cannot honour is refused before any cached block goes back (allocate(0, a)
    // checks the alignment and does nothing else), so that the refused call changes nothing.
    (void)m_.policy.allocate(0, sh.align);
    if (m_.ledger.pending() > 0) {  // other streams keep their blocks until the policy would grow (docs/architecture.md)
      reap_owner();
      reap(s);
      forget_empty_streams(s);
    }
    make_policy_safe_for(s, stream, for_host);
    if ((m_.cache.blocks() > 0 || !m_.deferred.blocks.empty()) && !policy_has_room(sh)) {
      cover(s, stream);
      reap_all(s);
      if (!m_.deferred.blocks.empty() && !policy_has_room(sh)) {
        try {
          wait_for_pending_frees(/*policy_too=*/false);
        } catch (const usage_error&) {  // a capture forbids host waits now: let the policy grow instead
        }
      }
    }
    try {
      return grow_policy(sh);
    } catch (const std::bad_alloc&) {
      if (m_.cache.blocks() == 0 && m_.deferred.blocks.empty()) throw;
    }
    if (void* p = hand_over(sh.key, stream, s, for_host)) return p;
    wait_for_pending_frees(/*policy_too=*/false);
    return grow_policy(sh);
  }

  bool policy_has_room(const shape& sh) const noexcept
  {
    if constexpr (room_reporting_resource<Policy>) return m_.policy.has_room_for(sh.request, sh.align);
    else return false;
  }

  /// A block of this shape freed on another stream and covered by an event: the requesting stream is made
  /// to wait on that event (the host, for a synchronous allocate), and gets the block.
  void* hand_over(std::uint64_t key, cuda::stream_ref stream, stream_state& self, bool for_host)
  {
    stream_state* from = nullptr;
    node* n = nullptr;
    const pending_event* cover = nullptr;
    m_.cache.for_each([&](stream_state& other) {
      if (n == nullptr && &other != &self && (n = covered_block(other, key, cover)) != nullptr) from = &other;
    });
    if (n == nullptr) return nullptr;
    if (for_host) {
      refuse_host_wait_under_capture();
      count_wait(m_.stats.event_syncs);
      m_.backend.wait_host(cover->e);
    } else {
      m_.backend.order_after(stream, cover->e);
    }
    ++m_.stats.handovers;
    from->remove(n);
    return hand_out(n);
  }

  /// A block of `key` cached by `other` and covered by one of its events (that event in `cover`), or null.
  static node* covered_block(stream_state& other, std::uint64_t key, const pending_event*& cover) noexcept
  {
    const auto bin = other.bins.find(key);
    if (bin == other.bins.end()) return nullptr;
    for (node* n = bin->second; n != nullptr; n = n->bin_next) {
      if (n->seq >= other.covered_seq) continue;
      for (const pending_event& pe : other.events)
        if (pe.covers_below > n->seq) {
          cover = &pe;
          return n;
        }
      // No event covers it: cannot happen, a completed event's blocks were reaped with it.
    }
    return nullptr;
  }

  /// cudaDeviceSynchronize of the device the policy's memory lives on and of every device whose streams used
  /// this layer; the current device only when none of those is known.
  void wait_all_devices()
  {
    if (m_.policy_device) {
      count_wait(m_.stats.device_syncs);
      m_.backend.wait_device(*m_.policy_device);
    } else if (m_.cache.devices().empty()) {
      count_wait(m_.stats.device_syncs);
      m_.backend.wait_device(m_.backend.device_of(cuda::stream_ref{cudaStreamLegacy}));
    }
    for (const int device : m_.cache.devices()) {
      if (m_.policy_device && device == *m_.policy_device) continue;
      count_wait(m_.stats.device_syncs);
      m_.backend.wait_device(device);
    }
  }

  /// Host-waits for every pending free and returns every cached and set-aside block to the policy (with
  /// `policy_too`, the owner's frees already there are waited for as well). Blocks freed after a stream's
  /// last event, and synchronous frees, have nothing to wait on but the devices. Throws, changing nothing,
  /// when a wait fails.
  void wait_for_pending_frees(bool policy_too)
  {
    const bool owner_dirty = policy_too && !policy_clean();
    if (m_.cache.blocks() == 0 && m_.deferred.blocks.empty() && !owner_dirty) return;
    refuse_host_wait_under_capture();
    bool uncovered = !m_.deferred.blocks.empty() ||
                     (owner_dirty && (m_.ledger.owner_events().empty() || m_.ledger.owner_events().back().covers_below < m_.own.policy_seq));
    m_.cache.for_each([&](const stream_state& s) { uncovered |= s.uncovered_blocks > 0; });
    if (uncovered) {
      wait_all_devices();
    } else {
      m_.cache.for_each([&](const stream_state& s) {
        for (const pending_event& pe : s.events) {
          count_wait(m_.stats.event_syncs);
          m_.backend.wait_host(pe.e);
        }
      });
      if (owner_dirty) {
        count_wait(m_.stats.event_syncs);
        m_.backend.wait_host(m_.ledger.owner_events().back().e);
      }
    }
    m_.cache.for_each([this](stream_state& s) { drain(s); });
    if (owner_dirty || uncovered) mark_safe(m_.own.policy_seq);
    for (const set_aside& b : m_.deferred.blocks) m_.policy.deallocate(b.p, b.sh.request, b.sh.align);
    m_.deferred.blocks.clear();
    m_.deferred.bytes = 0;
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
    s.covered_seq = s.next_seq;
    s.uncovered_blocks = s.uncovered_bytes = 0;
  }

  /// At destruction and move-assignment: cached blocks go back only after a successful wait; if the wait
  /// fails (a sticky CUDA error, the runtime gone at exit) they are abandoned, never handed back as if safe.
  void return_everything() noexcept
  {
    // The layer is going away: its graphs must be gone too (a box outlives its blocks). Free pool blocks join
    // the set-aside frees; live ones stay with their holders.
    while (!m_.graphs.pools().empty()) {
      auto* pl = first_unreleased_pool();
      if (pl == nullptr) break;
      try {
        release_pool_blocks(*pl);
      } catch (...) {
        m_.stats.abandoned_blocks += pl->free_blocks;
        pl->released = true;
      }
    }
    m_.graphs.clear_routes();
    if (m_.cache.no_streams() && m_.ledger.empty() && m_.deferred.blocks.empty()) return;
    try {
      wait_for_pending_frees(/*policy_too=*/false);
    } catch (...) {
      m_.stats.abandoned_blocks += m_.cache.blocks() + m_.deferred.blocks.size();
      m_.stats.abandoned_bytes += m_.cache.bytes() + m_.deferred.bytes;
    }
    m_.cache.for_each([this](const stream_state& s) { detail::event_ledger<event>::destroy(m_.backend, s.events); });
    m_.ledger.destroy_own(m_.backend);
    m_.cache.clear();
    m_.deferred = {};
    m_.own = {};
  }

  typename detail::graph_pools<set_aside>::pool* first_unreleased_pool() noexcept
  {
    return m_.graphs.pools().first_where([](const auto& pl) { return !pl.released; });
  }

  /// The owner's side: its frees go straight to the policy, numbered, and are known complete up to a number.
  struct owner_books {
    stream_state* owner = nullptr;
    bool shared = false;  ///< a second stream has used the layer
    std::size_t frees_unneeded = 0;  ///< owner frees since another stream last needed them (owner_cover_window)
    std::uint64_t policy_seq = 0;    ///< the owner's frees into the policy, numbered (across owners)
    std::uint64_t safe_seq = 0;      ///< policy frees numbered up to this are known complete
  };
  /// Synchronous frees waiting for a device-wide wait.
  struct set_aside_frees {
    std::vector<set_aside> blocks;
    std::size_t bytes = 0;
  };
  /// Everything the layer holds, grouped so that the defaulted moves hand it all over: each part leaves
  /// itself empty when moved from.
  struct members {
    [[no_unique_address]] Policy policy{};
    [[no_unique_address]] Backend backend{};
    options opts{};
    std::optional<int> policy_device{};  ///< where the policy's memory lives, when it says (device-wide waits)
    detail::stream_cache<event> cache{};
    detail::event_ledger<event> ledger{};
    detail::emptied_on_move<owner_books> own{};
    detail::emptied_on_move<set_aside_frees> deferred{};
    detail::capture_guard captures{};
    detail::graph_router<set_aside> graphs{};
    detail::emptied_on_move<counters> stats{};
  };
  members m_;
};

namespace detail::stream_ordered_claims {
using S = stream_ordered<archetype_resource>;
static_assert(stream_resource<S> && !owning_resource<S> && !sized_resource<S>);
static_assert(cccl::stream_resource_with<S, device_accessible> && !has_property<S, host_accessible>);
static_assert(answers_to_cccl31_stream_names<S>);
static_assert(!std::is_copy_constructible_v<S> && std::is_nothrow_move_constructible_v<S>);
} // namespace detail::stream_ordered_claims

} // namespace strata
