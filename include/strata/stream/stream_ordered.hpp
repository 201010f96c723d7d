#pragma once
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/block_tags.hpp>
#include <strata/detail/capture_guard.hpp>
#include <strata/detail/capture_path.hpp>
#include <strata/detail/emptied_on_move.hpp>
#include <strata/detail/event_ledger.hpp>
#include <strata/detail/graph_router.hpp>
#include <strata/detail/miss_path.hpp>
#include <strata/detail/pending_frees.hpp>
#include <strata/detail/recent_frees.hpp>
#include <strata/detail/stream_cache.hpp>
#include <strata/detail/stream_lookup.hpp>
#include <strata/detail/resource_device.hpp>
#include <strata/detail/stream_ownership.hpp>
#include <strata/stream/cuda_events.hpp>
#include <strata/stream/identified_stream.hpp>

namespace strata {

/// Makes any policy stream-ordered, at no cost in memory where one stream does the freeing
/// (docs/architecture.md, "Stream-ordered reuse", has the whole design).
///
/// One stream at a time owns the policy: its frees go straight back (the policy sees exactly the calls it
/// would see without this layer), or with `reuse_recent_frees` wait unmerged for its next allocations of their
/// shape until the policy is next asked (detail::recent_frees). A block freed on another stream is cached there (detail::stream_cache) and
/// reused at once, under its own tag only (detail/block_tags.hpp); it reaches the policy, or another
/// stream, only after an event recorded behind it (detail::event_ledger) completes or the taker is made to
/// wait for it on the GPU. Synchronous frees are set aside until a device-wide wait. Allocations made under
/// CUDA graph capture come from private pools (detail::graph_router); no host wait, event record or query is
/// made for a capturing stream (detail::capture_guard).
///
/// The host waits only where stats() counts it: a synchronous allocate whose block may still be in use, a
/// synchronous free that fills the set-aside batch, out of memory with frees pending, release(), a free whose
/// bookkeeping cannot be kept, and the first other stream needing the owner's frees made before it shared
/// the layer. A failed call changes nothing, except that on the way to out_of_memory cached blocks merge into
/// the policy.
///
/// Models: stream_resource (CCCL 3.0 async_resource and the 3.1 names), owning/sized/usage when the policy
/// is; the policy's properties. Cost: on the owner, the policy's allocate or free (a recent free's reuse: a
/// pop) and a few comparisons, plus
/// the stream's lookup (detail::stream_lookup): with `check_capture` a capture query (none without it, when
/// captures are announced); for a plain handle the id lookup besides (both in one backend call where the
/// backend answers them together: capture_then_id_backend); a capture query for every stream
/// while a capture is announced or seen. On another stream, a cached allocate or free is a
/// hash lookup, O(1), plus a tag check for a tagging policy; a miss costs the policy's allocate, an event
/// query per pending event and at most one event record and cudaStreamWaitEvent per batch of frees.
/// Unsynchronized. Move-only: a move hands every block, event and pool over.
template <resource Policy, event_backend Backend = cuda_events>
class stream_ordered : public forward_properties<stream_ordered<Policy, Backend>, Policy>,
                       public stream_names<stream_ordered<Policy, Backend>>,
                       private detail::stream_ownership<stream_ordered<Policy, Backend>, Backend>,
                       private detail::miss_path<stream_ordered<Policy, Backend>, Policy, Backend>,
                       private detail::pending_frees<stream_ordered<Policy, Backend>, Backend>,
                       private detail::capture_path<stream_ordered<Policy, Backend>, Backend>,
                       private detail::stream_lookup<stream_ordered<Policy, Backend>, Backend> {
  // Its ownership, miss path, pending frees, capture handling and lookup are bases that work on m_ (detail/).
  friend detail::stream_ownership<stream_ordered, Backend>;
  friend detail::miss_path<stream_ordered, Policy, Backend>;
  friend detail::pending_frees<stream_ordered, Backend>;
  friend detail::capture_path<stream_ordered, Backend>;
  friend detail::stream_lookup<stream_ordered, Backend>;

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
    /// Find captures nobody announced: a capture query at every allocate and free, and one of the legacy
    /// stream before a host wait (docs/architecture.md). Off: only captures announced with
    /// begin_allocate_to_pool (PyTorch's torch.cuda.graph does; the plug-in's default) or already seen are
    /// known, as in PyTorch's caching allocator, and an identified_stream then costs no driver call.
    bool check_capture = true;
    bool graph_pools = true;  ///< serve allocations under capture from a private pool per capture (needs a graph_backend)
    /// Keep the lone owner's recent frees unmerged (detail::recent_frees): a loop that frees and allocates the
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

  stream_ordered() requires std::default_initializable<Policy> && std::default_initializable<Backend> : stream_ordered(Policy{}) {}
  explicit stream_ordered(Policy policy, options opts = options{}) requires std::default_initializable<Backend>
      : stream_ordered(std::move(policy), opts, Backend{}) {}
  explicit stream_ordered(Policy policy, options opts, Backend backend)
      : m_{.policy = (opts.check(), std::move(policy)), .backend = std::move(backend), .opts = opts}
  { m_.policy_device = detail::resource_device(m_.policy); }

  /// A move hands every block, event and pool over; the moved-from layer is empty.
  stream_ordered(stream_ordered&&) noexcept = default;
  stream_ordered& operator=(stream_ordered&& other) noexcept
  {
    if (this != &other) {
      this->return_everything();
      m_ = std::move(other.m_);
    }
    return *this;
  }
  stream_ordered(const stream_ordered&) = delete;
  stream_ordered& operator=(const stream_ordered&) = delete;
  ~stream_ordered() { this->return_everything(); }

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
    if (this->checks_capture() && this->captures(stream)) return;
    (void)state_of(m_.backend.id_of(stream), stream);
  }

  /// On the legacy default stream; the block is ready for the host and any stream when this returns.
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("stream_ordered", alignment, largest_alignment);
    if (bytes == 0) return m_.policy.allocate(0, alignment);  // null, once the policy has checked the alignment
    collect_released_pools();
    this->refuse_host_wait_under_capture();  // as cudaMalloc is refused under global capture: it may have to wait
    const cuda::stream_ref legacy{cudaStreamLegacy};
    const std::uint64_t id = m_.backend.id_of(legacy);
    const tag_id tag = detail::allocation_tag(m_.policy);  // a sleeping tag's cached blocks have no memory: the policy refuses it
    if (bytes > largest_cached || detail::tag_sleeps(m_.policy, tag)) return m_.policy.allocate(bytes, alignment);  // fails there
    return allocate_on(shape_of(bytes, alignment, tag), legacy, id, /*for_host=*/true);
  }

  /// Safe for any prior work on any stream, as cudaFree is: set aside until a device-wide wait (docs/architecture.md).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    this->collect_released_pools_noexcept();
    const shape sh = shape_of(bytes, alignment);
    if (!m_.graphs.pools().empty() && this->free_in_pools(p, sh, cuda::stream_ref{cudaStreamLegacy}, /*capturing=*/false, /*synchronous=*/true))
      return;
    this->set_aside_free(p, sh);
  }

  /// Waits (on the host) for every pending free and returns every cached block to the policy; with `policy_too`
  /// also for the owner's frees, then releases the policy's free chunks when it can (strata::pause: without).
  void release(bool policy_too = true)
  {
    collect_released_pools();
    this->refuse_host_wait_under_capture();  // the policy's release frees chunks (cudaFree waits, illegal in capture)
    give_back_recent();
    this->wait_for_pending_frees(policy_too);
    if constexpr (releasable_resource<Policy>) if (policy_too) m_.policy.release();
  }

  /// From now on, allocations on streams for which `filter(cudaStream_t)` is true (checked newest route
  /// first) are served from private pool `pool` (PyTorch's beginAllocateToPool). Called before the capture
  /// begins, it waits (on the host, once) for this layer's pending frees, so nothing freed before it is still
  /// in use when the graph first runs. Throws (nothing changed) if that wait fails.
  template <class Filter>
    requires std::predicate<Filter&, cudaStream_t> && graph_backend<Backend>
  void begin_allocate_to_pool(std::uint64_t pool, Filter filter)
  {
    this->add_route(pool, std::function<bool(cudaStream_t)>(std::move(filter)));
  }
  /// The same, for every stream being captured.
  void begin_allocate_to_pool(std::uint64_t pool)
    requires graph_backend<Backend>
  {
    this->add_route(pool, {});
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
    if (auto* pl = m_.graphs.pools().find({pool, false})) this->release_pool_blocks(*pl);
    m_.graphs.drop_routes(pool);
  }
  /// Releases the pools whose graphs CUDA reported destroyed (every allocate and free does this first).
  void collect_released_pools()
  {
    m_.graphs.collect_released([this](std::uint64_t id) { m_.captures.forget_capture(id); },
                               [this](auto& pl) { this->release_pool_blocks(pl); });
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
    u.in_use -= cached_bytes() + m_.deferred.bytes;
    u.used_blocks -= cached_blocks() + m_.deferred.blocks.size();
    u.free_blocks += cached_blocks() + m_.deferred.blocks.size();
    return u;
  }

  /// Bytes and blocks freed by streams and not yet back in the policy (the lone owner's recent frees included).
  std::size_t cached_bytes() const noexcept { return m_.cache.bytes() + m_.recent.bytes(); }
  std::size_t cached_blocks() const noexcept { return m_.cache.blocks() + m_.recent.blocks(); }
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
    if (this->checks_capture() && m_.backend.capturing(stream)) {
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
  using stream_state = detail::stream_free_lists<event>;

  /// How a request is filed and what the policy is asked for (detail::shape_for, through detail::shape_memo).
  shape shape_of(std::size_t bytes, std::size_t alignment, tag_id tag = 0) noexcept { return m_.shapes.of(m_.policy, bytes, alignment, tag); }

  /// An allocate on `stream`, whose id is `known_id` when the caller knows it.
  void* allocate_ordered(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, const std::uint64_t* known_id)
  {
    check_alignment("stream_ordered", alignment, largest_alignment);
    std::uint64_t looked_up = 0;  // a plain handle's id, when allocate_alone asked it
    if (void* p = this->allocate_alone(bytes, alignment, stream, known_id, looked_up)) [[likely]] return p;
    if (bytes == 0) return m_.policy.allocate(0, alignment);  // null, once the policy has checked the alignment
    collect_released_pools();
    const tag_id tag = detail::allocation_tag(m_.policy);  // a sleeping tag's cached blocks have no memory: the policy refuses it
    if (bytes > largest_cached || detail::tag_sleeps(m_.policy, tag)) return m_.policy.allocate(bytes, alignment);  // fails there
    const shape sh = shape_of(bytes, alignment, tag);
    void* pooled = nullptr;  // a block handed to a capture without its pool knowing could be reused while the graph lives
    std::uint64_t id = 0;
    if (!this->id_to_allocate(sh, stream, known_id, id, pooled)) return pooled;
    if (this->alone_with(id)) [[likely]] {  // the capture query answered: the lone owner's short path
      m_.own.owner->handle = stream;
      if (void* p = reuse_recent(sh)) return p;
      ++m_.stats.misses;
      return this->grow_policy(sh);
    }
    return allocate_on(sh, stream, id, /*for_host=*/false, /*capture_checked=*/true);
  }

  /// A free on `stream`, whose id is `known_id` when the caller knows it.
  void free_ordered(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, const std::uint64_t* known_id) noexcept
  {
    std::uint64_t looked_up = 0;  // a plain handle's id, when free_alone asked it
    if (p == nullptr || this->free_alone(p, bytes, alignment, stream, known_id, looked_up)) return;
    this->collect_released_pools_noexcept();
    const shape sh = shape_of(bytes, alignment);
    if (std::uint64_t id = 0; this->id_to_free(p, sh, stream, known_id, id)) deallocate_on(p, sh, stream, id);
  }

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
          this->refuse_host_wait_under_capture();
          count_wait(m_.stats.stream_syncs);
          m_.backend.wait_stream(stream);
        } catch (...) {
          s.put(n);  // cannot throw: the bin for this key exists
          throw;
        }
      }
      return hand_out(n);
    }
    return this->allocate_on_miss(sh, stream, s, for_host, capture_checked);
  }

  /// A free on a stream known not to capture.
  void deallocate_on(void* p, const shape& sh, cuda::stream_ref stream, std::uint64_t id) noexcept
  {
    if (stream_state* o = m_.own.owner; o != nullptr && o->id == id && !m_.own.shared) [[likely]] {  // the owner alone: inline
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
      this->return_unordered(p, sh);
      return;
    }
    ++s->recent_frees;
    if (m_.own.owner == nullptr) this->become_owner(*s, stream);
    if (m_.own.owner == s) {
      // Straight back, so it merges now: the policy then sees exactly the calls it would see without this
      // layer, and holds exactly what it would hold.
      m_.policy.deallocate(p, sh.request, sh.align);
      ++m_.own.policy_seq;
      if (m_.own.shared && !this->covers_owner_on_demand()) {
        if (m_.own.frees_unneeded < m_.opts.owner_cover_window || this->capture_possible()) this->cover_owner(stream);
        if (m_.own.frees_unneeded < m_.opts.owner_cover_window) ++m_.own.frees_unneeded;
      }
      return;
    }
    const tag_id tag = detail::block_tag(m_.policy, p);
    if (detail::tag_sleeps(m_.policy, tag)) return m_.policy.deallocate(p, sh.request, sh.align);  // unmapped: no work can use it
    try {
      m_.cache.file(*s, p, {sh.request, sh.footprint, sh.align, sh.key, tag});
    } catch (...) {
      this->return_unordered(p, sh);
      return;
    }
    if (s->wants_event(m_.opts.frees_per_event, m_.opts.bytes_per_event)) {
      try {
        this->cover(*s, stream);
      } catch (...) {
        // Left uncovered: the blocks are still reused on this stream, and reclaimed by a later event or wait.
      }
    }
  }

  void abandon(const shape& sh) noexcept
  {
    ++m_.stats.abandoned_blocks;
    m_.stats.abandoned_bytes += sh.footprint;
  }

  void count_wait(std::uint64_t& kind) noexcept
  {
    ++kind;
    ++m_.stats.host_waits;
  }

  stream_state& state_of(std::uint64_t id, cuda::stream_ref stream)
  {
    const auto [s, added] = m_.cache.find_or_add(id, stream, [&] { return m_.backend.device_of(stream); });
    if (added && !m_.own.shared && m_.cache.streams() > 1) {  // from now on the owner's frees carry events
      give_back_recent();  // as the owner's frees made before: the policy is made safe for the newcomer
      m_.own.shared = true;
    }
    return *s;
  }

  /// A free by the owner alone: kept for its next allocation of the shape (detail::recent_frees), else
  /// straight back to the policy, numbered as the owner's. A sleeping tag's block goes back at once: the policy
  /// drops it from the tag's backup.
  void owner_free(void* p, shape sh) noexcept
  {
    if (!m_.opts.reuse_recent_frees) return policy_free(p, sh.request, sh.align);
    sh.tag = detail::block_tag(m_.policy, p);
    if (detail::tag_sleeps(m_.policy, sh.tag) ||
        !m_.recent.keep(p, sh, [this](void* q, std::size_t request, std::size_t align) { policy_free(q, request, align); }))
      policy_free(p, sh.request, sh.align);
  }
  void policy_free(void* p, std::size_t request, std::size_t align) noexcept
  {
    m_.policy.deallocate(p, request, align);
    ++m_.own.policy_seq;
  }
  /// The owner alone reuses its own recent free of the shape: its stream ordered it. Null when none, or when
  /// the tag sleeps (paused on the policy directly): the block goes back, and the policy refuses the request.
  void* reuse_recent(const shape& sh) noexcept
  {
    if (m_.recent.empty()) return nullptr;
    void* p = m_.recent.take(sh.key, sh.tag);
    if (p == nullptr) return nullptr;
    if (detail::tag_sleeps(m_.policy, sh.tag)) [[unlikely]] {
      policy_free(p, sh.request, sh.align);
      return nullptr;
    }
    ++m_.stats.hits;
    return p;
  }
  /// Every recent free goes to the policy, where it merges: before the policy is asked for a block, before
  /// another stream shares the layer, on release and at the end.
  bool recent_frees_empty() const noexcept { return m_.recent.empty(); }
  void give_back_recent() noexcept
  {
    if (!m_.recent.empty()) m_.recent.give_back_all([this](void* q, std::size_t request, std::size_t align) { policy_free(q, request, align); });
  }
  /// The same before the policy is asked for `sh`, so they merge before it places the request, as without the
  /// layer; an alignment the policy may refuse is refused first, so that the refused call changes nothing.
  void give_back_recent_for(const shape& sh)
  {
    if (m_.recent.empty()) return;
    refuse_alignment_first(sh);
    give_back_recent();
  }
  /// An alignment the policy cannot honour is refused before the call changes anything (a new stream sharing
  /// the layer gives the recent frees back; a miss returns cached blocks): allocate(0, a) checks the alignment
  /// and does nothing else, and every policy honours the default (docs/architecture.md, Note [Alignments no
  /// chunk can honour]).
  void refuse_alignment_first(const shape& sh)
  {
    if (sh.align > default_alignment) [[unlikely]] (void)m_.policy.allocate(0, sh.align);
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

  /// Everything the layer holds, grouped so that the defaulted moves hand it all over: each part leaves
  /// itself empty when moved from.
  struct members {
    [[no_unique_address]] Policy policy{};
    [[no_unique_address]] Backend backend{};
    options opts{};
    std::optional<int> policy_device{};  ///< where the policy's memory lives, when it says (device-wide waits)
    detail::emptied_on_move<detail::shape_memo> shapes{};  ///< shapes of recent requests
    detail::stream_cache<event> cache{};
    detail::event_ledger<event> ledger{};
    detail::emptied_on_move<detail::owner_books<event>> own{};
    detail::emptied_on_move<detail::set_aside_frees> deferred{};
    detail::emptied_on_move<detail::recent_frees> recent{};  ///< the lone owner's, unmerged
    detail::capture_guard captures{};
    detail::graph_router<detail::set_aside> graphs{};
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
