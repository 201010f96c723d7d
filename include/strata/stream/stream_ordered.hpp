#pragma once
#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <stdexcept>
#include <unordered_map>
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
#include <strata/detail/graph_pools.hpp>
#include <strata/detail/object_pool.hpp>
#include <strata/detail/resource_device.hpp>
#include <strata/stream/cuda_events.hpp>
#include <strata/stream/identified_stream.hpp>

namespace strata {

/// Makes any policy stream-ordered, at no cost in memory where one stream does the freeing.
///
/// Where freed blocks go. One stream at a time *owns* the policy: its frees go straight back to the policy,
/// where they merge with their neighbours at once, and its allocations take from the policy with no wait
/// (stream order already puts its new work after its old). With one stream the policy sees exactly the calls
/// it would see without this layer, and holds exactly the memory. The owner is the first stream to free;
/// ownership passes to another stream only when the owner's frees are known complete and that stream has been
/// freeing more. A block freed on any other stream s goes to s's own free lists (binned by the size the policy
/// would give it and the alignment): the next request of that shape on s takes it back at once. Once an event recorded on s after
/// such blocks has completed (recorded in batches: once `frees_per_event` blocks or `bytes_per_event` bytes
/// lack one, or when s misses), they go back to the policy: at s's own misses, and at any stream's miss the
/// policy could not serve without growing (`has_room_for`; every miss for a policy that cannot tell). Until
/// then they stay s's: a stream that keeps allocating the shapes it frees (a copy stream's batches) reuses its
/// own blocks, where taking from the policy would make it wait for all the owner's queued work and serialize
/// the copy with the compute it was meant to overlap.
/// Before another stream t (not the owner) takes anything from the policy while the owner has frees not yet
/// known complete, t is made to wait for them on the GPU (cudaStreamWaitEvent, no host wait): once a second
/// stream has used the layer, every owner free records an event after itself, on the owner's stream during
/// the owner's own call — a stream handle is never touched outside a call on it, since its stream may have
/// been destroyed since (asking the driver about a destroyed stream crashes it). The owner's frees made while
/// it was alone carry no event: the first other stream that needs them waits for the device once. The
/// exception is an owner whose handle never dies, the legacy default stream (PyTorch's main stream, trace
/// stream 0; a backend says which, `permanent_stream_backend`): its frees carry no event at all, and t, when it
/// needs them, records one on the owner then (on the owner's device) and waits for it on the GPU — one event
/// per take instead of one per free (on the two-stream ViT trace: docs/memory.md). While a capture may be
/// under way its frees carry events as any owner's do (an event on the legacy stream would join a blocking
/// stream's capture). When the
/// policy runs out, a block of the same shape cached by another stream is handed over the same way; failing
/// that, the host waits for every pending free, returns them all, and the policy is asked once more before
/// out_of_memory.
///
/// Synchronous calls. `deallocate` (no stream) is safe for any prior work on any stream, as cudaFree is: the
/// block is set aside and reaches the policy only after a device-wide wait (cudaDeviceSynchronize of the
/// policy's device and of every device whose streams used this layer), made once `sync_frees_per_wait` blocks or
/// `bytes_per_event` bytes are set aside, or when the policy would otherwise grow. `allocate` (no stream) runs
/// on the legacy default stream and returns a block ready for the host and every stream: it host-waits for the
/// block's last use when that may still be running.
///
/// When the host waits, and nowhere else (each counted in stats(): event_syncs, stream_syncs, device_syncs,
/// and their sum host_waits): a synchronous allocate whose block may still be in use (an event or stream
/// wait); a synchronous deallocate that fills the set-aside batch, or a miss that would grow the policy while
/// synchronous frees are set aside (device waits); out of memory with frees pending, and release() (event or
/// device waits); a free whose bookkeeping cannot be kept (a host std::bad_alloc, an unknown stream: device
/// waits); the first other stream needing the owner's earlier frees (one device wait), and, with
/// options::owner_cover_window, the first after that many owner frees nobody needed; begin_allocate_to_pool
/// with frees pending, and a released private pool filling the set-aside batch (device waits). A failed wait
/// never returns blocks to the policy: they stay where they were (or, at destruction, are abandoned, counted
/// in stats().abandoned_blocks). While a capture forbids host waits, a miss grows the policy instead of
/// waiting for set-aside frees.
///
/// Events are made on the device of the stream they are recorded on (cuda_events::make_event_on), whichever
/// device is current, so a block may be freed on its stream while another device is current. Device-wide waits cover the policy's device (found through
/// `device()` on the policy or what it is built on, `detail::resource_device`) and the devices of every stream
/// that used the layer, never merely the current device (the current device only when none of those is known).
/// A policy that waits for the device itself (mapped_pool, when it reclaims idle memory after growing) does
/// so inside the policy's allocate: not counted here.
///
/// CUDA graphs: private pools. A graph replays its captured allocations at the same addresses every time it
/// is launched, so the blocks it was given are reserved for it while it lives (PyTorch's "private pool"):
/// - Automatic mode (a `graph_backend`, `options::graph_pools`): an allocation on a capturing stream is served
///   from a private pool keyed by the capture's id (cudaStreamGetCaptureInfo; never the stream's id, whose
///   query invalidates a capture). The pool is tied to the graph by a CUDA user object; once the graph and
///   every executable graph instantiated from it are destroyed (executable graphs hold the user object too, so
///   destroying only the cudaGraph_t keeps the pool), the object's destructor, on a CUDA thread and only once
///   launches using it are done, posts the pool's id, and the layer's next call (or collect_released_pools())
///   releases the pool.
/// - Explicit mode (PyTorch's graph-pool hooks): begin_allocate_to_pool(pool, filter) routes allocations on
///   streams the filter accepts to pool `pool` until end_allocate_to_pool(pool); release_pool(pool) says its
///   graphs are gone.
/// Inside a pool a freed block is reused only by the same pool's later allocations in the same stream order
/// (same capture and capturing stream, or same uncaptured stream; an explicit pool shared by several captures
/// reuses across them on one stream, as PyTorch does, so graphs sharing a pool must be replayed in capture
/// order and never concurrently), never by anyone else while the pool lives,
/// so replays never race other work. A block from outside the pools freed under capture joins the capture's
/// pool (the graph may use it at every replay). Pool blocks come from the policy, allocated during capture
/// with the thread's capture mode relaxed around the call (so a source's cudaMalloc or cuMemCreate is legal,
/// as PyTorch does; so is any stream's policy growth while the layer knows of a capture, since in global mode
/// any thread's cudaMalloc invalidates every capture; a capture the layer has not seen yet, no call having
/// been made on its stream, is not protected). What synchronizes cannot be done under capture in any mode:
/// a policy whose growth frees memory (coalescing_pool handing free chunks back: cudaFree) or waits for the
/// device fails, and a pool allocation then throws usage_error with the policy unchanged (the failed call may
/// still have invalidated the capture); mapped_pool, whose reclaim waits for the device, goes on without the
/// reclaim when the allocation fits under its max_physical anyway (the allocation succeeds), and fails it
/// otherwise (usage_error here, the pool unchanged); either way the failed wait may invalidate the capture. Warm the pool before capturing (run the
/// step once uncaptured). Pool blocks count as in use until released. A released pool's free blocks, and its live blocks
/// as they are freed, return as synchronous frees do (set aside until a device-wide wait): whatever launch or
/// stream used them last is then complete. Nothing freed before a capture is waited for during it (no host
/// wait is legal then): launch a graph after the work that preceded its capture, or ordered after it (as
/// PyTorch does: it synchronizes before capturing; begin_allocate_to_pool waits for this layer's pending
/// frees). No host wait, event record or event query is made on behalf of a capturing stream; while a capture
/// this layer has seen may still be going on, a synchronous allocate or release() is refused (usage_error), as
/// cudaMalloc and cudaFree are under global capture. A stream is asked about only during a call on it (it may
/// be destroyed later), so a capture counts as ended only once a call on its stream sees it so, its graph is
/// destroyed, or (explicit mode) its route ends: see refuse_host_wait_under_capture. Without a graph_backend or with `graph_pools` off, an allocation
/// under capture throws usage_error (nothing changed) and a free under capture is abandoned (counted).
/// A capture query that fails (the backend throws) is taken for the worst: the allocation throws it, nothing
/// changed; a free, while a capture may be under way (a stream seen capturing, or a route), abandons its block.
///
/// Streams are told apart by the backend's ids (for cuda_events, strata::identify: the driver's
/// cuStreamGetId), so a handle reused after cudaStreamDestroy never inherits the old stream's blocks; the
/// legacy and per-thread default streams are ordinary streams with ids of their own. The id lookup is a
/// driver call (about 25 ns); pass an `identified_stream` (strata::identify(stream), once) to skip it (a
/// per-thread default stream's identified_stream used on another thread is looked up again).
///
/// Models: stream_resource (CCCL 3.0 async_resource and the 3.1 names), owning/sized/usage when the policy
/// is; the policy's properties. Cost, on top of the id lookup (unless identified_stream) and, with
/// `check_capture`, one cudaStreamIsCapturing per allocate and per free: on the owner, the policy's
/// allocate or free and a few comparisons; on another stream, a cached allocate or free is a hash lookup, O(1),
/// and a miss costs the policy's allocate, an event query per pending event and at most one event record and
/// cudaStreamWaitEvent per batch of the owner's frees (and, with a permanent owner, one cudaEventRecord on it). While private pools exist, a hash lookup per free; a
/// pool allocate or free is O(log b) in the pool's bins, plus the capture query (and, for a capture's first
/// allocation, a CUDA user object); each explicit route costs one filter call per allocate; while a capture
/// is known, two cudaThreadExchangeStreamCaptureMode around each policy allocate. Unsynchronized.
/// Move-only.
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
    /// Ask at every allocate and free whether the stream is being captured (see the class comment). Off: ask
    /// only while a capture may be under way (a route is open, or a capture was seen and not yet known
    /// ended), as PyTorch's caching allocator does; then a capture must be announced with
    /// begin_allocate_to_pool before it allocates or frees through this layer (PyTorch's torch.cuda.graph
    /// does; the plug-in's default), else its allocations are served as if uncaptured.
    bool check_capture = true;
    bool graph_pools = true;  ///< serve allocations under capture from a private pool per capture (needs a graph_backend)
    /// Not used while the owner is permanent (the legacy stream: its frees carry no event, see the class).
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
      : policy_(std::move(policy)), backend_(std::move(backend)), opts_(opts), policy_device_(detail::resource_device(policy_))
  {
    if (opts.frees_per_event == 0 || opts.bytes_per_event == 0 || opts.sync_frees_per_wait == 0)
      throw std::invalid_argument("stream_ordered: frees_per_event, bytes_per_event and sync_frees_per_wait must be positive");
  }

  stream_ordered(stream_ordered&& other) noexcept
      : policy_(std::move(other.policy_)), backend_(std::move(other.backend_)), opts_(other.opts_),
        policy_device_(other.policy_device_)
  {
    take(other);
  }
  stream_ordered& operator=(stream_ordered&& other) noexcept
  {
    if (this != &other) {
      return_everything();
      policy_ = std::move(other.policy_);
      backend_ = std::move(other.backend_);
      opts_ = other.opts_;
      policy_device_ = other.policy_device_;
      take(other);
    }
    return *this;
  }
  stream_ordered(const stream_ordered&) = delete;
  stream_ordered& operator=(const stream_ordered&) = delete;
  ~stream_ordered() { return_everything(); }

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
  {
    check_alignment("stream_ordered", alignment, largest_alignment);
    if (bytes == 0) return nullptr;
    collect_released_pools();
    // Before the id: asking a capturing stream for its id is itself illegal and invalidates the capture.
    if (void* p = nullptr; routed(bytes, alignment, stream, p)) return p;
    return allocate_on(bytes, alignment, stream, id_for_allocate(stream), /*for_host=*/false, /*capture_checked=*/true);
  }

  /// Tells the layer that `stream` will share it: from now on the owner's frees carry events, so that this
  /// stream waits for them on the GPU. (A stream first seen later makes its first request wait for the device
  /// once instead: the owner's earlier frees have no event, and its handle is never touched from another
  /// stream's call.) A driver call; no memory. Nothing on a capturing stream (asking its id would invalidate
  /// the capture; what it allocates is its graph's private pool's, which nobody else gets anyway).
  void share(cuda::stream_ref stream)
  {
    if (checks_capture() && captures(stream)) return;
    (void)state_of(backend_.id_of(stream), stream);
  }

  /// The same, with the stream's id known: no backend call on a hit.
  void* allocate_async(std::size_t bytes, std::size_t alignment, const identified_stream& stream)
  {
    check_alignment("stream_ordered", alignment, largest_alignment);
    if (bytes == 0) return nullptr;
    collect_released_pools();
    // Even on a hit: a block handed to a capture without the pool knowing could be reused while the graph lives.
    if (void* p = nullptr; routed(bytes, alignment, stream.stream(), p)) return p;
    const std::uint64_t id = stream.valid_here() ? stream.id() : id_for_allocate(stream.stream());
    return allocate_on(bytes, alignment, stream.stream(), id, /*for_host=*/false, /*capture_checked=*/true);
  }

  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
  {
    if (p == nullptr) return;
    collect_released_pools_noexcept();
    std::uint64_t id = 0;
    bool capturing = false;
    try {
      capturing = checks_capture() && captures(stream);
    } catch (...) {
      if (capture_possible()) return abandon(shape_of(bytes, alignment));  // see capture_possible()
      // No capture known: an unknown stream, which the id lookup below reports.
    }
    if ((capturing || !pools_.empty()) && free_in_pools(p, shape_of(bytes, alignment), stream, capturing)) return;
    if (capturing) {  // the graph may use the block whenever it is launched; asking the id would break it
      abandon(shape_of(bytes, alignment));
      return;
    }
    try {
      id = backend_.id_of(stream);
    } catch (...) {
      return_unordered(p, shape_of(bytes, alignment));  // an unknown stream: nothing to order the reuse by
      return;
    }
    deallocate_on(p, bytes, alignment, stream, id, /*capture_checked=*/true);
  }

  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, const identified_stream& stream) noexcept
  {
    if (p == nullptr) return;
    if (!stream.valid_here()) return deallocate_async(p, bytes, alignment, stream.stream());
    collect_released_pools_noexcept();
    bool capturing = false;
    try {
      capturing = checks_capture() && captures(stream.stream());
    } catch (...) {
      if (capture_possible()) return abandon(shape_of(bytes, alignment));  // see capture_possible()
    }
    if ((capturing || !pools_.empty()) && free_in_pools(p, shape_of(bytes, alignment), stream.stream(), capturing)) return;
    if (capturing) {
      abandon(shape_of(bytes, alignment));
      return;
    }
    deallocate_on(p, bytes, alignment, stream.stream(), stream.id(), /*capture_checked=*/true);
  }

  /// On the legacy default stream; the block is ready for the host and any stream when this returns.
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("stream_ordered", alignment, largest_alignment);
    if (bytes == 0) return nullptr;
    collect_released_pools();
    refuse_host_wait_under_capture();  // as cudaMalloc is refused under global capture: it may have to wait
    const cuda::stream_ref legacy{cudaStreamLegacy};
    return allocate_on(bytes, alignment, legacy, backend_.id_of(legacy), /*for_host=*/true);
  }

  /// Safe for any prior work on any stream, as cudaFree is: set aside until a device-wide wait (class comment).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    collect_released_pools_noexcept();
    const shape sh = shape_of(bytes, alignment);
    if (!pools_.empty() && free_in_pools(p, sh, cuda::stream_ref{cudaStreamLegacy}, /*capturing=*/false, /*synchronous=*/true))
      return;
    try {
      const cuda::stream_ref legacy{cudaStreamLegacy};
      state_of(backend_.id_of(legacy), legacy);  // so that the device-wide wait covers this device
      deferred_.push_back({p, sh});
    } catch (...) {
      return_unordered(p, sh);
      return;
    }
    deferred_bytes_ += sh.footprint;
    if (deferred_.size() >= opts_.sync_frees_per_wait || deferred_bytes_ >= opts_.bytes_per_event) {
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
    if constexpr (releasable_resource<Policy>) policy_.release();
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
    std::erase_if(capturing_, [pool](const seen_capture& c) { return c.routed && c.route == pool; });
    for (auto it = routes_.rbegin(); it != routes_.rend(); ++it)
      if (it->pool == pool) {
        routes_.erase(std::next(it).base());
        return;
      }
  }
  /// The graphs using `pool` are gone: its free blocks go back (as synchronous frees: after a device-wide
  /// wait), its live blocks as they are freed. Routing to it stops. An unknown pool is ignored (PyTorch
  /// releases pools nothing was allocated in). Throws (nothing changed) only on host memory exhaustion.
  void release_pool(std::uint64_t pool)
  {
    if (auto* pl = pools_.find({pool, false})) release_pool_blocks(*pl);
    std::erase_if(routes_, [pool](const route& r) { return r.pool == pool; });
  }
  /// Releases the pools whose graphs CUDA reported destroyed (every allocate and free does this first).
  void collect_released_pools()
  {
    if (!inbox_ || !inbox_->any()) return;
    for (std::uint64_t id = 0; inbox_->front(id); inbox_->pop()) {
      // The graph is gone: its id is posted once, and never watched again (capture ids are not reused).
      if (const auto w = std::find(watched_.begin(), watched_.end(), id); w != watched_.end()) {
        *w = watched_.back();
        watched_.pop_back();
      }
      // A destroyed graph's capture has ended: its streams are no longer known capturing.
      std::erase_if(capturing_, [id](const seen_capture& c) { return c.id_known && c.id == id; });
      if (auto* pl = pools_.find({id, true})) release_pool_blocks(*pl);
    }
  }
  /// Private pools held (live graphs', and released ones whose blocks are not all freed yet).
  std::size_t private_pools() const noexcept { return pools_.size(); }
  /// Blocks held by private pools, live and free, and their bytes (as the policy counts them).
  std::size_t private_pool_blocks() const noexcept { return pools_.blocks(); }
  std::size_t private_pool_free_blocks() const noexcept { return pools_.free_blocks(); }
  std::size_t private_pool_bytes() const noexcept { return pools_.bytes(); }
  /// Blocks and bytes in one pool (an explicit pool's id, or a capture's id with `automatic`); 0 if none.
  std::size_t pool_blocks(std::uint64_t pool, bool automatic = false) const noexcept
  {
    const auto* pl = pools_.find({pool, automatic});
    return pl == nullptr ? 0 : pl->live_blocks + pl->free_blocks;
  }

  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const
    requires sized_resource<Policy>
  {
    return policy_.good_size(bytes, alignment);
  }

  bool owns(const void* p) const noexcept
    requires owning_resource<Policy>
  {
    return policy_.owns(p);
  }

  /// The policy's figures, with cached and set-aside blocks counted as free (a private pool's free blocks are
  /// in use: its graph uses them at every replay).
  strata::usage usage() const noexcept
    requires usage_reporting_resource<Policy>
  {
    strata::usage u = policy_.usage();
    u.in_use -= cached_bytes_ + deferred_bytes_;
    u.used_blocks -= cached_blocks_ + deferred_.size();
    u.free_blocks += cached_blocks_ + deferred_.size();
    return u;
  }

  /// Bytes and blocks freed by streams and not yet back in the policy.
  std::size_t cached_bytes() const noexcept { return cached_bytes_; }
  std::size_t cached_blocks() const noexcept { return cached_blocks_; }
  /// Synchronous frees waiting for a device-wide wait.
  std::size_t set_aside_blocks() const noexcept { return deferred_.size(); }
  /// Events recorded and not yet seen complete.
  std::size_t pending_events() const noexcept { return events_pending_; }
  /// Streams with cached blocks or pending events, and the owner.
  std::size_t streams_tracked() const noexcept { return streams_.size(); }
  /// The id of the stream whose frees go straight to the policy (none before the first free).
  std::optional<std::uint64_t> owner() const noexcept
  {
    return owner_ != nullptr ? std::optional<std::uint64_t>(owner_->id) : std::nullopt;
  }
  /// The id this layer files a stream under (what checked<> compares). A capturing stream cannot be asked
  /// (that would invalidate its capture): it is the id last seen with its handle, else one made from the
  /// capture's id (top bit set, so it is no stream's id).
  std::uint64_t stream_id(cuda::stream_ref stream) const
  {
    if (checks_capture() && backend_.capturing(stream)) {
      for (const auto& [id, st] : streams_)
        if (st->handle.get() == stream.get()) return id;
      if constexpr (graph_backend<Backend>) return (std::uint64_t{1} << 63) | backend_.capture_of(stream).id;
      else return std::uint64_t{1} << 63;
    }
    return backend_.id_of(stream);
  }
  const counters& stats() const noexcept { return counters_; }

  Policy& policy() noexcept { return policy_; }
  const Policy& policy() const noexcept { return policy_; }
  Backend& backend() noexcept { return backend_; }

  friend bool operator==(const stream_ordered& a, const stream_ordered& b) noexcept { return &a == &b; }

private:
  static constexpr std::size_t largest_alignment = std::size_t{1} << 56;
  static constexpr std::size_t largest_cached = std::size_t{1} << 56;

  struct shape {
    std::size_t request;    ///< what the policy is asked for, and given back on free: the same for one key
    std::size_t footprint;  ///< what the block costs the policy (its good size)
    std::size_t align;
    std::uint64_t key;  ///< request and log2(alignment): blocks with one key are interchangeable
  };

  struct node {
    void* p = nullptr;
    std::size_t request = 0;
    std::size_t size = 0;  ///< footprint
    std::size_t align = 0;
    std::uint64_t key = 0;
    std::uint64_t seq = 0;  ///< the stream's free counter when freed: events cover frees below a number
    node* bin_prev = nullptr;
    node* bin_next = nullptr;
    node* older = nullptr;
    node* newer = nullptr;
  };

  struct pending_event {
    event e;
    std::uint64_t covers_below;  ///< frees numbered below this happened before the event was recorded
    int device = 0;              ///< the event's device: its stream's (cudaEventRecord requires it)
  };

  struct spare {
    event e;
    int device;
  };

  struct set_aside {
    void* p;
    shape sh;
  };

  /// One stream's free blocks: bins by key (newest first, for cache-warm same-stream reuse) threaded through
  /// an age list (oldest first, the order events cover them in), and its recorded events, oldest first.
  struct stream_state {
    std::uint64_t id = 0;
    int device = 0;  ///< whose work the stream runs: its events are made there
    cuda::stream_ref handle{cudaStreamLegacy};  ///< as last seen (the owner's events are recorded on it)
    std::uint64_t ordered_after = 0;  ///< this stream waits for the owner's policy frees numbered up to this
    std::uint64_t recent_frees = 0;   ///< since ownership was last weighed
    std::unordered_map<std::uint64_t, node*> bins;
    node* oldest = nullptr;
    node* newest = nullptr;
    std::uint64_t next_seq = 0;
    std::uint64_t covered_seq = 0;
    std::size_t uncovered_blocks = 0;
    std::size_t uncovered_bytes = 0;
    std::size_t blocks = 0;  ///< cached on this stream
    std::size_t bytes = 0;
    std::size_t blocks_at_cover = 0;  ///< what was cached when the last event was recorded
    std::size_t bytes_at_cover = 0;
    std::deque<pending_event> events;

    bool empty() const noexcept { return oldest == nullptr && events.empty(); }

    node* take(std::uint64_t key) noexcept
    {
      const auto it = bins.find(key);
      if (it == bins.end() || it->second == nullptr) return nullptr;
      node* n = it->second;
      it->second = n->bin_next;
      if (n->bin_next != nullptr) n->bin_next->bin_prev = nullptr;
      unlink_age(n);
      forget_uncovered(n);
      return n;
    }

    /// Files a freed block; may throw only when the key has no bin yet (a new hash node).
    void put(node* n)
    {
      node*& head = bins[n->key];
      n->seq = next_seq++;
      n->bin_prev = nullptr;
      n->bin_next = head;
      if (head != nullptr) head->bin_prev = n;
      head = n;
      n->older = newest;
      n->newer = nullptr;
      (newest != nullptr ? newest->newer : oldest) = n;
      newest = n;
      ++uncovered_blocks;
      uncovered_bytes += n->size;
      ++blocks;
      bytes += n->size;
    }

    bool wants_event(const options& opts) const noexcept
    {
      return uncovered_blocks >= std::max(opts.frees_per_event, 2 * blocks_at_cover) ||
             uncovered_bytes >= std::max(opts.bytes_per_event, 2 * bytes_at_cover);
    }

    /// Unlinks any block (the handover and reclaim paths).
    void remove(node* n) noexcept
    {
      if (n->bin_prev != nullptr) {
        n->bin_prev->bin_next = n->bin_next;
      } else {
        const auto it = bins.find(n->key);
        it->second = n->bin_next;
        if (it->second == nullptr) bins.erase(it);
      }
      if (n->bin_next != nullptr) n->bin_next->bin_prev = n->bin_prev;
      unlink_age(n);
      forget_uncovered(n);
    }

  private:
    void unlink_age(node* n) noexcept
    {
      --blocks;
      bytes -= n->size;
      (n->older != nullptr ? n->older->newer : oldest) = n->newer;
      (n->newer != nullptr ? n->newer->older : newest) = n->older;
    }
    void forget_uncovered(const node* n) noexcept
    {
      if (n->seq < covered_seq) return;
      --uncovered_blocks;
      uncovered_bytes -= n->size;
    }
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
      footprint = policy_.good_size(bytes, align);
      if (policy_.good_size(footprint, align) == footprint) request = footprint;
    }
    return {request, footprint, align, (std::uint64_t{request} << 6) | static_cast<std::uint64_t>(std::countr_zero(align))};
  }

  /// `for_host`: the block must be ready for the host and every stream when this returns (the synchronous
  /// allocate): a reused block is waited for, a handed-over one too.
  /// `capture_checked`: the caller already asked whether the stream captures (once per call is enough).
  void* allocate_on(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, std::uint64_t id, bool for_host,
                    bool capture_checked = false)
  {
    if (bytes > largest_cached) return policy_.allocate(bytes, alignment);  // fails there, naming the policy
    const shape sh = shape_of(bytes, alignment);
    stream_state& s = state_of(id, stream);
    if (node* n = s.oldest != nullptr ? s.take(sh.key) : nullptr) {
      if (for_host) {
        try {
          refuse_host_wait_under_capture();
          count_wait(counters_.stream_syncs);
          backend_.wait_stream(stream);
        } catch (...) {
          s.put(n);  // cannot throw: the bin for this key exists
          throw;
        }
      }
      return hand_out(n);
    }
    return allocate_on_miss(sh, stream, s, for_host, capture_checked);
  }

  void deallocate_on(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, std::uint64_t id,
                     bool capture_checked = false) noexcept
  {
    const shape sh = shape_of(bytes, alignment);
    if (checks_capture() && !capture_checked && capturing_or_unknown(stream)) {
      abandon(sh);
      return;
    }
    stream_state* s = nullptr;
    try {
      s = &state_of(id, stream);
    } catch (...) {
      return_unordered(p, sh);
      return;
    }
    ++s->recent_frees;
    if (owner_ == nullptr) become_owner(*s, stream);
    if (owner_ == s) {
      // Straight back, so it merges now: the policy then sees exactly the calls it would see without this
      // layer, and holds exactly what it would hold.
      policy_.deallocate(p, sh.request, sh.align);
      ++policy_seq_;
      if (shared_ && !covers_owner_on_demand()) {
        if (owner_frees_unneeded_ < opts_.owner_cover_window || capture_possible()) cover_owner(stream);
        if (owner_frees_unneeded_ < opts_.owner_cover_window) ++owner_frees_unneeded_;
      }
      return;
    }
    try {
      node* n = nodes_.make(node{.p = p, .request = sh.request, .size = sh.footprint, .align = sh.align, .key = sh.key});
      try {
        s->put(n);
      } catch (...) {
        nodes_.recycle(n);
        throw;
      }
    } catch (...) {
      return_unordered(p, sh);
      return;
    }
    cached_bytes_ += sh.footprint;
    ++cached_blocks_;
    if (s->wants_event(opts_)) {
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
    policy_.deallocate(p, sh.request, sh.align);
  }

  void abandon(const shape& sh) noexcept
  {
    ++counters_.abandoned_blocks;
    counters_.abandoned_bytes += sh.footprint;
  }

  // ---- private pools (CUDA graphs) ----

  struct route {
    std::uint64_t pool;
    std::function<bool(cudaStream_t)> filter;  ///< empty: every capturing stream
  };

  /// Where an allocation or a free under capture goes: a pool, the stream order inside it, and (automatic
  /// mode) the graph being captured, which a new pool is tied to.
  struct pool_target {
    detail::pool_name name;
    detail::reuse_tag tag;
    void* graph = nullptr;
    bool capturing = false;
  };

  static std::uint64_t handle_bits(cuda::stream_ref stream) noexcept
  {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(stream.get()));
  }

  /// The stream order of a block freed under capture: the capturing stream within its capture. An explicit
  /// pool may be shared by several captures (PyTorch's graph_pool_handle): there, as in PyTorch, a block freed
  /// in one capture is reused by a later one on the same stream, which is why graphs sharing a pool must be
  /// replayed in the order they were captured and never concurrently. An automatic pool has one capture.
  static detail::reuse_tag captured_tag(detail::pool_name pool, std::uint64_t capture, cuda::stream_ref stream) noexcept
  {
    constexpr std::uint64_t any_capture_of_the_pool = ~std::uint64_t{1};
    return {pool.automatic ? capture : any_capture_of_the_pool, handle_bits(stream)};
  }

  /// Serves an allocation from a private pool when it belongs to one (true, the block in `out`); refuses an
  /// allocation under capture that cannot be served so (usage_error, nothing changed).
  bool routed(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, void*& out)
  {
    if (!checks_capture()) return false;
    const bool capturing = captures(stream);
    if (!capturing && routes_.empty()) return false;
    if constexpr (graph_backend<Backend>) {
      if (const std::optional<pool_target> t = target_for(stream, capturing)) {
        out = allocate_in_pool(*t, bytes, alignment, stream);
        return true;
      }
    }
    if (capturing) refuse_capture("an allocation was asked of it");
    return false;
  }

  /// The pool a call on `stream` belongs to: the newest route whose filter accepts the stream, else (under
  /// capture, automatic mode) the capture's own pool; none otherwise.
  std::optional<pool_target> target_for(cuda::stream_ref stream, bool capturing)
    requires graph_backend<Backend>
  {
    const bool in_capture = capturing;  // the caller asked (checks_capture() holds while a route is open)
    if (in_capture) note_capture(stream);  // so that the policy grows in relaxed mode, and host waits are refused
    for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
      if (!(it->filter ? it->filter(stream.get()) : in_capture)) continue;
      if (!in_capture) return pool_target{{it->pool, false}, {0, backend_.id_of(stream)}, nullptr, false};
      const capture_info info = backend_.capture_of(stream);
      if (!info.active) return std::nullopt;  // implicitly captured (a default stream): no capture of its own
      note_capture(stream, &info, &it->pool);
      return pool_target{{it->pool, false}, captured_tag(detail::pool_name{it->pool, false}, info.id, stream), nullptr, true};
    }
    if (!capturing || !opts_.graph_pools) return std::nullopt;
    const capture_info info = backend_.capture_of(stream);
    if (!info.active) return std::nullopt;
    note_capture(stream, &info);
    return pool_target{{info.id, true}, captured_tag(detail::pool_name{info.id, true}, info.id, stream), info.graph, true};
  }

  /// The pool's own free block of this shape in the same stream order, else a new one from the policy.
  void* allocate_in_pool(const pool_target& t, std::size_t bytes, std::size_t alignment, cuda::stream_ref)
    requires graph_backend<Backend>
  {
    const shape sh = shape_of(bytes, alignment);
    auto [pl, fresh] = open_pool(t);
    set_aside b{};
    if (pools_.take(*pl, t.tag, sh.key, b)) {
      ++counters_.pool_hits;
      return b.p;
    }
    void* p = nullptr;
    try {
      pools_.prepare_adopt();  // before the policy: giving a block back does not undo the policy's growth
      p = grow_pool(sh, t.capturing);
    } catch (...) {
      if (fresh) pools_.erase_if_empty(*pl);
      throw;
    }
    pools_.adopt(*pl, p, sh.footprint);
    ++counters_.pool_misses;
    return p;
  }

  /// The target's pool, made if new (a new automatic pool is tied to its graph first). Strong guarantee.
  std::pair<typename detail::graph_pools<set_aside>::pool*, bool> open_pool(const pool_target& t)
    requires graph_backend<Backend>
  {
    auto opened = pools_.open(t.name);
    if (opened.second && t.graph != nullptr && !watched(t.name.id)) {
      try {
        watched_.reserve(watched_.size() + 1);
        watch_graph(t.graph, t.name.id);
      } catch (...) {
        pools_.erase_if_empty(*opened.first);
        throw;
      }
      watched_.push_back(t.name.id);  // capacity reserved
    }
    return opened;
  }

  /// Whether the capture's graph already carries this layer's user object. A pool is forgotten when its first
  /// allocation fails, but its user object stays on the graph: attaching another would post the id twice.
  /// O(graphs watched and not yet destroyed).
  bool watched(std::uint64_t id) const noexcept { return std::find(watched_.begin(), watched_.end(), id) != watched_.end(); }

  /// Ties a pool to the graph being captured: a user object whose destructor (a CUDA thread, no CUDA calls)
  /// posts the pool's id to the inbox. Nothing is posted if this throws.
  void watch_graph(void* graph, std::uint64_t id)
    requires graph_backend<Backend>
  {
    if (!inbox_) inbox_ = std::make_shared<detail::graph_release_inbox>();
    inbox_->expect_one();
    detail::graph_release_inbox::token* token = nullptr;
    try {
      token = new detail::graph_release_inbox::token{inbox_, id};
      backend_.call_when_graph_destroyed(graph, &detail::graph_release_inbox::on_graph_destroyed, token);
    } catch (...) {
      delete token;
      inbox_->unexpect_one();
      throw;
    }
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
    return relaxed_while_capturing([&] { return policy_.allocate(sh.request, sh.align); });
  }

  /// Runs f with the calling thread's capture mode relaxed while a stream this layer has seen capturing may
  /// still capture: in the default (global) mode a "potentially unsafe" call from any thread (a source's
  /// cudaMalloc, an event query for an uncaptured stream) invalidates every capture going on.
  template <class F>
  decltype(auto) relaxed_while_capturing(F&& f)
  {
    if constexpr (graph_backend<Backend>) {
      if (!capturing_.empty()) {
        const int previous = backend_.exchange_capture_mode(2);  // cudaStreamCaptureModeRelaxed
        struct restore {
          Backend& b;
          int mode;
          ~restore()
          {
            try {
              (void)b.exchange_capture_mode(mode);
            } catch (...) {
            }
          }
        } restore_mode{backend_, previous};
        return std::forward<F>(f)();
      }
    }
    return std::forward<F>(f)();
  }

  /// Whether an event has completed; relaxed while a capture goes on (see relaxed_while_capturing).
  bool event_done(const event& e)
  {
    return relaxed_while_capturing([&] { return backend_.done(e); });
  }

  /// A free that concerns the private pools: a pool block (filed in its pool, or, its pool released, freed the
  /// common way: false), or any block freed under capture (it joins the capture's pool: the graph may use it
  /// at every replay). False: not for the pools. Never throws: a block that cannot be filed is abandoned.
  bool free_in_pools(void* p, const shape& sh, cuda::stream_ref stream, bool capturing, bool synchronous = false) noexcept
  {
    if constexpr (!graph_backend<Backend>) {
      return false;
    } else {
      auto* pl = pools_.owner_of(p);
      if (pl != nullptr && pl->released) {
        pools_.disown(*pl, p, sh.footprint);
        pl = nullptr;
      }
      if (pl == nullptr && !capturing) return false;
      try {
        detail::reuse_tag tag = detail::reuse_tag::nowhere();
        if (pl == nullptr) {  // from outside the pools, freed under capture
          const std::optional<pool_target> t = target_for(stream, capturing);
          if (!t) return false;  // the caller abandons it
          pl = open_pool(*t).first;
          try {
            pools_.prepare_adopt();
          } catch (...) {
            pools_.erase_if_empty(*pl);
            throw;
          }
          pools_.adopt(*pl, p, sh.footprint);
          ++counters_.pool_adoptions;
          tag = t->tag;
        } else if (synchronous) {
          tag = detail::reuse_tag::nowhere();
        } else if (capturing) {
          const capture_info info = backend_.capture_of(stream);
          if (info.active) tag = captured_tag(pl->name, info.id, stream);
        } else {
          try {
            tag = {0, backend_.id_of(stream)};
          } catch (...) {  // an unknown stream: kept, never reused in the pool
          }
        }
        pools_.put(*pl, tag, sh.key, set_aside{p, sh});
      } catch (...) {
        if (pl != nullptr && pools_.owner_of(p) == pl) pools_.disown(*pl, p, sh.footprint);
        abandon(sh);
      }
      return true;
    }
  }

  void add_route(std::uint64_t pool, std::function<bool(cudaStream_t)> filter)
  {
    routes_.reserve(routes_.size() + 1);
    auto [pl, fresh] = pools_.open({pool, false});
    try {
      // Outside capture, once: nothing freed before this is still running when the graph first does.
      bool capture_on = false;
      try {
        refuse_host_wait_under_capture();
      } catch (const usage_error&) {
        capture_on = true;
      }
      if (!capture_on && (!policy_clean() || cached_blocks_ > 0 || !deferred_.empty()))
        wait_for_pending_frees(/*policy_too=*/true);
    } catch (...) {
      if (fresh) pools_.erase_if_empty(*pl);
      throw;
    }
    pl->released = false;  // a pool id used again after release_pool: its remaining blocks are its own again
    routes_.push_back({pool, std::move(filter)});  // capacity reserved
  }

  /// A pool's free blocks become synchronous frees (set aside until a device-wide wait, which covers every
  /// launch and stream that used them); its live blocks follow as they are freed.
  void release_pool_blocks(typename detail::graph_pools<set_aside>::pool& pl)
  {
    deferred_.reserve(deferred_.size() + pl.free_blocks);
    pools_.drain(pl, [](const set_aside& b) noexcept { return b.sh.footprint; }, [this](const set_aside& b) noexcept {
      deferred_.push_back(b);  // capacity reserved
      deferred_bytes_ += b.sh.footprint;
    });
    ++counters_.pools_released;
    if (deferred_.size() >= opts_.sync_frees_per_wait || deferred_bytes_ >= opts_.bytes_per_event) {
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
      return backend_.id_of(stream);
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
  bool capture_possible() const noexcept { return !capturing_.empty() || !routes_.empty(); }

  /// Whether streams are asked about capture now: always with options::check_capture; without it, only while
  /// a capture may be under way (announced by a route, as all of PyTorch's are), which is when PyTorch's
  /// caching allocator asks too.
  bool checks_capture() const noexcept { return opts_.check_capture || capture_possible(); }

  bool capturing_or_unknown(cuda::stream_ref stream) noexcept
  {
    try {
      return captures(stream);
    } catch (...) {
      return true;
    }
  }

  /// Whether a stream a call was just made on (so a live one) is being captured. A capturing stream is
  /// remembered; one seen not capturing is forgotten (see refuse_host_wait_under_capture for the rule).
  bool captures(cuda::stream_ref stream)
  {
    const bool capturing = backend_.capturing(stream);
    if (capturing)
      note_capture(stream);
    else if (!capturing_.empty())
      std::erase_if(capturing_, [stream](const seen_capture& c) { return c.stream == stream; });
    return capturing;
  }

  /// Remembers a stream of the current call as capturing, with its capture's id (`known`, else asked now:
  /// the stream is live, and cudaStreamGetCaptureInfo is legal under capture) and the explicit pool routed to.
  void note_capture(cuda::stream_ref stream, const capture_info* known = nullptr, const std::uint64_t* route = nullptr) noexcept
  {
    auto it = std::find_if(capturing_.begin(), capturing_.end(), [stream](const seen_capture& c) { return c.stream == stream; });
    if (it == capturing_.end()) {
      try {
        capturing_.push_back({stream});
      } catch (...) {  // not remembered: a host wait then fails in the driver instead of being refused
        return;
      }
      it = std::prev(capturing_.end());
      if constexpr (graph_backend<Backend>) {
        if (known == nullptr) {
          try {
            const capture_info info = backend_.capture_of(stream);
            if (info.active) it->id = info.id, it->id_known = true;
          } catch (...) {  // no id: kept until a call on the stream sees it capturing no more
          }
        }
      }
    }
    if (known != nullptr && known->active) it->id = known->id, it->id_known = true;  // a new capture on this stream
    if (route != nullptr) it->route = *route, it->routed = true;
  }

  [[noreturn]] static void refuse_capture(const char* what)
  {
    throw usage_error(std::string("stream_ordered: ") + what +
                      " while a stream is being captured into a CUDA graph, and no private pool can serve it (this "
                      "layer's backend cannot query captures, or options::graph_pools is off); the pool is unchanged");
  }

  /// Host waits are illegal while a stream captures in global mode (and would hang a graph's dependencies).
  /// The rule: the layer never asks the driver about a stream handle outside a call on that stream, since the
  /// stream may have been destroyed since (asking about a destroyed stream is undefined: it crashes current
  /// drivers). So a host wait is refused while a capture the layer has seen may still be going on, i.e. while
  /// `capturing_` holds an entry, and while the legacy stream (never destroyed, so always safe to ask) answers
  /// "implicitly captured" (a blocking stream captures). An entry, made when a call on its stream sees it
  /// capturing, goes only on safe evidence that its capture ended: a later call on the same handle sees it not
  /// capturing; the capture's graph is destroyed (its automatic pool's user object ran); or, in explicit mode,
  /// end_allocate_to_pool ends the route its capture used (PyTorch ends routes after cudaStreamEndCapture). A
  /// stream destroyed after its capture, with its graph alive, therefore keeps host waits refused until that
  /// graph is destroyed: refusing is safe, asking is not. Callers with a stream ask about it themselves.
  void refuse_host_wait_under_capture()
  {
    if (!checks_capture()) return;
    std::erase_if(capturing_, [](const seen_capture& c) { return c.stream.get() == cudaStreamLegacy || c.stream.get() == nullptr; });
    if (!capturing_.empty()) refuse_capture("a host wait was needed");
    if (capturing_or_unknown(cuda::stream_ref{cudaStreamLegacy})) refuse_capture("a host wait was needed");
  }

  void count_wait(std::uint64_t& kind) noexcept
  {
    ++kind;
    ++counters_.host_waits;
  }

  stream_state& state_of(std::uint64_t id, cuda::stream_ref stream)
  {
    if (last_state_ == nullptr || id != last_id_) {
      auto it = streams_.find(id);
      if (it == streams_.end()) {
        const int device = backend_.device_of(stream);
        if (std::find(devices_.begin(), devices_.end(), device) == devices_.end()) devices_.push_back(device);
        auto fresh = std::make_unique<stream_state>();
        fresh->id = id;
        fresh->device = device;
        it = streams_.emplace(id, std::move(fresh)).first;
        shared_ = shared_ || streams_.size() > 1;  // from now on the owner's frees carry events
      }
      last_id_ = id;
      last_state_ = it->second.get();
    }
    last_state_->handle = stream;
    return *last_state_;
  }

  void* hand_out(node* n) noexcept
  {
    void* p = n->p;
    cached_bytes_ -= n->size;
    --cached_blocks_;
    nodes_.recycle(n);
    ++counters_.hits;
    return p;
  }

  void give_back(node* n) noexcept
  {
    policy_.deallocate(n->p, n->request, n->align);
    cached_bytes_ -= n->size;
    --cached_blocks_;
    nodes_.recycle(n);
  }

  /// A spare event of `device` (the newest such), or a new one made there: an event must belong to the device
  /// of the stream it is recorded on, whichever device is current (a per-device stack frees a block of its
  /// device while another is current). Backends without make_event_on make it on the current device.
  event spare_event(int device)
  {
    for (std::size_t i = spare_events_.size(); i-- > 0;)
      if (spare_events_[i].device == device) {
        const event e = spare_events_[i].e;
        spare_events_[i] = spare_events_.back();
        spare_events_.pop_back();
        return e;
      }
    if constexpr (requires { backend_.make_event_on(device); }) return backend_.make_event_on(device);
    else return backend_.make_event();
  }

  /// Records an event on `stream` (of `device`) into `events`, covering what is numbered below `covers_below`.
  /// `on_its_device`: a permanent stream's handle, recorded on as a stream of `device` whichever is current.
  void record_into(std::deque<pending_event>& events, cuda::stream_ref stream, std::uint64_t covers_below, int device,
                   bool on_its_device = false)
  {
    // Every event made is spare or pending: with room for all of them, retiring one never allocates.
    spare_events_.reserve(spare_events_.size() + events_pending_ + 1);
    const event e = spare_event(device);
    try {
      if (on_its_device) record_on(e, stream, device);
      else backend_.record(e, stream);
      events.push_back({e, covers_below, device});
    } catch (...) {
      spare_events_.push_back({e, device});
      throw;
    }
    ++events_pending_;
    ++counters_.events;
  }

  void retire_front(std::deque<pending_event>& events) noexcept
  {
    spare_events_.push_back({events.front().e, events.front().device});  // capacity reserved in record_into
    events.pop_front();
    --events_pending_;
  }

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
    while (!owner_events_.empty() && event_done(owner_events_.front().e)) mark_safe(owner_events_.front().covers_below);
  }

  /// Reaps every stream and forgets streams with nothing left (destroyed streams never come back).
  void reap_all(const stream_state& keep)
  {
    reap_owner();
    for (auto& [id, s] : streams_) reap(*s);
    forget_empty_streams(keep);
  }

  /// Streams with nothing cached and no event pending are forgotten (destroyed streams never come back).
  void forget_empty_streams(const stream_state& keep) noexcept
  {
    for (auto it = streams_.begin(); it != streams_.end();) {
      stream_state& s = *it->second;
      if (s.empty() && &s != &keep && &s != owner_) {
        if (last_state_ == &s) last_state_ = nullptr;
        it = streams_.erase(it);
      } else {
        ++it;
      }
    }
  }

  bool policy_clean() const noexcept { return safe_seq_ >= policy_seq_; }

  /// Whether the owner's frees get their event from the stream that needs them, when it needs them, instead
  /// of one per free: the owner's handle must outlive every call (a permanent stream: the legacy default
  /// stream), and no capture may be under way (an event recorded on the legacy stream joins a blocking
  /// stream's capture; while one may go on, frees carry their events as for any owner).
  bool covers_owner_on_demand() const noexcept { return owner_ != nullptr && permanent(owner_->handle) && !capture_possible(); }

  bool permanent(cuda::stream_ref stream) const noexcept
  {
    if constexpr (permanent_stream_backend<Backend>) return backend_.permanent(stream);
    else return false;
  }

  /// Records e on `stream` from a call on another stream, on `device` (only for a permanent stream, which a
  /// backend without the capability never has).
  void record_on(event e, cuda::stream_ref stream, int device)
  {
    if constexpr (permanent_stream_backend<Backend>) backend_.record_on(e, stream, device);
    else backend_.record(e, stream);
  }

  /// s's frees go straight to the policy from now on, and what s has cached goes there now: every
  /// block is safe for s itself. Only while the policy holds no other stream's unfinished frees.
  void become_owner(stream_state& s, cuda::stream_ref stream) noexcept
  {
    owner_ = &s;
    while (!s.events.empty()) retire_front(s.events);
    flush_owner_cache();
    if (shared_ && !policy_clean() && !covers_owner_on_demand()) cover_owner(stream);  // the flushed blocks, for the other streams
  }

  /// The owner's cached blocks go to the policy (where they merge), as the owner's unfinished frees.
  void flush_owner_cache() noexcept
  {
    stream_state& s = *owner_;
    while (s.oldest != nullptr) {
      node* n = s.oldest;
      s.remove(n);
      give_back(n);
      ++policy_seq_;
    }
    s.covered_seq = s.next_seq;
    s.uncovered_blocks = s.uncovered_bytes = s.blocks_at_cover = s.bytes_at_cover = 0;
  }

  /// Makes whatever the policy hands out next safe for stream t: the owner's frees not yet known complete are
  /// waited for, on the GPU (t waits for an event on the owner) or, for the host, on the host.
  void make_policy_safe_for(stream_state& t, cuda::stream_ref stream, bool for_host)
  {
    if (!policy_clean() && (for_host || (&t != owner_ && t.ordered_after < policy_seq_))) {
      owner_frees_unneeded_ = 0;  // the owner's frees were needed: they carry events again (owner_cover_window)
      reap_owner();
      if (!policy_clean()) {
        if (const pending_event* e = owner_event()) {
          if (!event_done(e->e)) {
            if (!for_host) {
              backend_.order_after(stream, e->e);
              ++counters_.orderings;
              t.ordered_after = e->covers_below;
              return;
            }
            refuse_host_wait_under_capture();
            count_wait(counters_.event_syncs);
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
    safe_seq_ = std::max(safe_seq_, seq);
    while (!owner_events_.empty() && owner_events_.front().covers_below <= safe_seq_) retire_front(owner_events_);
  }

  /// Once another stream shares the layer, every owner free records an event after itself, on the owner's
  /// stream while it is known alive (this call): so another stream never has to touch the owner's handle,
  /// which may belong to a stream destroyed since. A failed record leaves the free uncovered; a taker then
  /// waits device-wide (owner_event). Not for a permanent owner (covers_owner_on_demand).
  void cover_owner(cuda::stream_ref stream) noexcept
  {
    try {
      record_into(owner_events_, stream, policy_seq_, owner_->device);
    } catch (...) {
    }
  }

  /// An event after all the owner's policy frees, or null when some have none (made before another stream
  /// shared the layer, or a record failed): then every device was waited for and the policy is clean.
  const pending_event* owner_event()
  {
    if (!owner_events_.empty() && owner_events_.back().covers_below >= policy_seq_) return &owner_events_.back();
    if (covers_owner_on_demand()) {
      try {
        record_into(owner_events_, owner_->handle, policy_seq_, owner_->device, /*on_its_device=*/true);
        return &owner_events_.back();
      } catch (...) {
        // Not recorded: wait for the devices instead, as for frees made before the layer was shared.
      }
    }
    refuse_host_wait_under_capture();
    wait_all_devices();
    mark_safe(policy_seq_);
    return nullptr;
  }

  /// Ownership moves to t when the owner's frees are all known complete and t has been freeing more.
  void weigh_ownership(stream_state& t, cuda::stream_ref stream) noexcept
  {
    if (owner_ == &t) return;
    if (owner_ == nullptr || t.recent_frees > owner_->recent_frees) {
      if (owner_ != nullptr) owner_->recent_frees = 0;
      t.recent_frees = 0;
      become_owner(t, stream);
    } else {
      owner_->recent_frees = 0;
      t.recent_frees = 0;
    }
  }

  /// The stream's own safe blocks go back to the policy here, so they merge before the policy is asked;
  /// other streams' safe blocks, and set-aside synchronous frees, before the policy grows.
  void* allocate_on_miss(const shape& sh, cuda::stream_ref stream, stream_state& s, bool for_host, bool capture_checked)
  {
    if (checks_capture() && !capture_checked && captures(stream)) refuse_capture("an allocation missed its stream's cache");
    ++counters_.misses;
    // The owner alone with the policy (one stream, nothing pending, nothing cached or set aside): nothing to
    // reap, wait for or hand back first, so the policy is asked at once, as it would be without this layer.
    if (!for_host && &s == owner_ && events_pending_ == 0 && cached_blocks_ == 0 && deferred_.empty())
      return grow_policy(sh);
    // An alignment the policy cannot honour is refused before any cached block goes back (allocate(0, a)
    // checks the alignment and does nothing else), so that the refused call changes nothing.
    (void)policy_.allocate(0, sh.align);
    if (events_pending_ > 0) {  // other streams keep their blocks until the policy would grow (see the class comment)
      reap_owner();
      reap(s);
      forget_empty_streams(s);
    }
    make_policy_safe_for(s, stream, for_host);
    if ((cached_blocks_ > 0 || !deferred_.empty()) && !policy_has_room(sh)) {
      cover(s, stream);
      reap_all(s);
      if (!deferred_.empty() && !policy_has_room(sh)) {
        try {
          wait_for_pending_frees(/*policy_too=*/false);
        } catch (const usage_error&) {  // a capture forbids host waits now: let the policy grow instead
        }
      }
    }
    try {
      return grow_policy(sh);
    } catch (const std::bad_alloc&) {
      if (cached_blocks_ == 0 && deferred_.empty()) throw;
    }
    if (void* p = hand_over(sh.key, stream, s, for_host)) return p;
    wait_for_pending_frees(/*policy_too=*/false);
    return grow_policy(sh);
  }

  bool policy_has_room(const shape& sh) const noexcept
  {
    if constexpr (room_reporting_resource<Policy>) return policy_.has_room_for(sh.request, sh.align);
    else return false;
  }

  /// A block of this shape freed on another stream and covered by an event: the requesting stream is made
  /// to wait on that event (the host, for a synchronous allocate), and gets the block.
  void* hand_over(std::uint64_t key, cuda::stream_ref stream, stream_state& self, bool for_host)
  {
    for (auto& [id, state] : streams_) {
      stream_state& other = *state;
      if (&other == &self) continue;
      const auto bin = other.bins.find(key);
      if (bin == other.bins.end()) continue;
      for (node* n = bin->second; n != nullptr; n = n->bin_next) {
        if (n->seq >= other.covered_seq) continue;
        const pending_event* cover = nullptr;
        for (const pending_event& pe : other.events)
          if (pe.covers_below > n->seq) {
            cover = &pe;
            break;
          }
        if (cover == nullptr) continue;  // cannot happen: a completed event's blocks were reaped with it
        if (for_host) {
          refuse_host_wait_under_capture();
          count_wait(counters_.event_syncs);
          backend_.wait_host(cover->e);
        } else {
          backend_.order_after(stream, cover->e);
        }
        ++counters_.handovers;
        other.remove(n);
        return hand_out(n);
      }
    }
    return nullptr;
  }

  /// cudaDeviceSynchronize of the device the policy's memory lives on and of every device whose streams used
  /// this layer; the current device only when none of those is known.
  void wait_all_devices()
  {
    if (policy_device_) {
      count_wait(counters_.device_syncs);
      backend_.wait_device(*policy_device_);
    } else if (devices_.empty()) {
      count_wait(counters_.device_syncs);
      backend_.wait_device(backend_.device_of(cuda::stream_ref{cudaStreamLegacy}));
    }
    for (const int device : devices_) {
      if (policy_device_ && device == *policy_device_) continue;
      count_wait(counters_.device_syncs);
      backend_.wait_device(device);
    }
  }

  /// Host-waits for every pending free and returns every cached and set-aside block to the policy (with
  /// `policy_too`, the owner's frees already there are waited for as well). Blocks freed after a stream's
  /// last event, and synchronous frees, have nothing to wait on but the devices. Throws, changing nothing,
  /// when a wait fails.
  void wait_for_pending_frees(bool policy_too)
  {
    const bool owner_dirty = policy_too && !policy_clean();
    if (cached_blocks_ == 0 && deferred_.empty() && !owner_dirty) return;
    refuse_host_wait_under_capture();
    bool uncovered = !deferred_.empty() ||
                     (owner_dirty && (owner_events_.empty() || owner_events_.back().covers_below < policy_seq_));
    for (const auto& [id, s] : streams_) uncovered |= s->uncovered_blocks > 0;
    if (uncovered) {
      wait_all_devices();
    } else {
      for (const auto& [id, s] : streams_)
        for (const pending_event& pe : s->events) {
          count_wait(counters_.event_syncs);
          backend_.wait_host(pe.e);
        }
      if (owner_dirty) {
        count_wait(counters_.event_syncs);
        backend_.wait_host(owner_events_.back().e);
      }
    }
    for (auto& [id, s] : streams_) drain(*s);
    if (owner_dirty || uncovered) mark_safe(policy_seq_);
    for (const set_aside& b : deferred_) policy_.deallocate(b.p, b.sh.request, b.sh.align);
    deferred_.clear();
    deferred_bytes_ = 0;
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
    while (!pools_.empty()) {
      auto* pl = first_unreleased_pool();
      if (pl == nullptr) break;
      try {
        release_pool_blocks(*pl);
      } catch (...) {
        counters_.abandoned_blocks += pl->free_blocks;
        pl->released = true;
      }
    }
    routes_.clear();
    if (streams_.empty() && spare_events_.empty() && deferred_.empty() && owner_events_.empty()) return;
    try {
      wait_for_pending_frees(/*policy_too=*/false);
    } catch (...) {
      counters_.abandoned_blocks += cached_blocks_ + deferred_.size();
      counters_.abandoned_bytes += cached_bytes_ + deferred_bytes_;
    }
    for (auto& [id, s] : streams_)
      for (const pending_event& pe : s->events) backend_.destroy_event(pe.e);
    for (const pending_event& pe : owner_events_) backend_.destroy_event(pe.e);
    for (const spare& sp : spare_events_) backend_.destroy_event(sp.e);
    for (auto& [id, s] : streams_) {
      while (s->oldest != nullptr) {
        node* n = s->oldest;
        s->remove(n);
        nodes_.recycle(n);
      }
    }
    streams_.clear();
    owner_events_.clear();
    spare_events_.clear();
    deferred_.clear();
    devices_.clear();
    cached_bytes_ = cached_blocks_ = deferred_bytes_ = events_pending_ = 0;
    owner_ = nullptr;
    last_state_ = nullptr;
    policy_seq_ = safe_seq_ = 0;
  }

  typename detail::graph_pools<set_aside>::pool* first_unreleased_pool() noexcept
  {
    return pools_.first_where([](const auto& pl) { return !pl.released; });
  }

  void take(stream_ordered& other) noexcept
  {
    pools_ = std::move(other.pools_);
    routes_ = std::move(other.routes_);
    other.routes_.clear();
    inbox_ = std::move(other.inbox_);
    streams_ = std::move(other.streams_);
    nodes_ = std::move(other.nodes_);
    spare_events_ = std::move(other.spare_events_);
    owner_events_ = std::move(other.owner_events_);
    deferred_ = std::move(other.deferred_);
    devices_ = std::move(other.devices_);
    cached_bytes_ = std::exchange(other.cached_bytes_, 0);
    cached_blocks_ = std::exchange(other.cached_blocks_, 0);
    deferred_bytes_ = std::exchange(other.deferred_bytes_, 0);
    events_pending_ = std::exchange(other.events_pending_, 0);
    owner_ = std::exchange(other.owner_, nullptr);
    shared_ = std::exchange(other.shared_, false);
    owner_frees_unneeded_ = std::exchange(other.owner_frees_unneeded_, 0);
    capturing_ = std::exchange(other.capturing_, {});
    watched_ = std::exchange(other.watched_, {});
    policy_seq_ = std::exchange(other.policy_seq_, 0);
    safe_seq_ = std::exchange(other.safe_seq_, 0);
    counters_ = std::exchange(other.counters_, counters{});
    last_state_ = nullptr;
    other.streams_.clear();
    other.spare_events_.clear();
    other.owner_events_.clear();
    other.deferred_.clear();
    other.devices_.clear();
    other.last_state_ = nullptr;
  }

  [[no_unique_address]] Policy policy_;
  [[no_unique_address]] Backend backend_;
  options opts_;
  std::optional<int> policy_device_;  ///< where the policy's memory lives, when it says (device-wide waits)
  detail::graph_pools<set_aside> pools_;
  std::vector<route> routes_;
  std::shared_ptr<detail::graph_release_inbox> inbox_;  ///< made at the first automatic pool
  std::vector<std::uint64_t> watched_;  ///< capture ids whose graphs carry a user object not yet run
  std::unordered_map<std::uint64_t, std::unique_ptr<stream_state>> streams_;
  std::uint64_t last_id_ = 0;
  stream_state* last_state_ = nullptr;
  stream_state* owner_ = nullptr;
  bool shared_ = false;  ///< a second stream has used the layer
  std::size_t owner_frees_unneeded_ = 0;  ///< owner frees since another stream last needed them (owner_cover_window)
  /// A stream seen capturing in a call on it, never asked about again (see refuse_host_wait_under_capture).
  struct seen_capture {
    cuda::stream_ref stream;
    std::uint64_t id = 0;     ///< its capture's id, when the backend could tell
    std::uint64_t route = 0;  ///< the explicit pool its capture was routed to
    bool id_known = false;
    bool routed = false;
  };
  std::vector<seen_capture> capturing_;  ///< captures that may still be going on
  std::uint64_t policy_seq_ = 0;  ///< the owner's frees into the policy, numbered (across owners)
  std::uint64_t safe_seq_ = 0;    ///< policy frees numbered up to this are known complete
  std::deque<pending_event> owner_events_;
  std::vector<set_aside> deferred_;
  std::size_t deferred_bytes_ = 0;
  std::vector<int> devices_;
  detail::object_pool<node> nodes_;
  std::vector<spare> spare_events_;
  std::size_t events_pending_ = 0;
  std::size_t cached_bytes_ = 0;
  std::size_t cached_blocks_ = 0;
  counters counters_;
};

namespace detail::stream_ordered_claims {
using S = stream_ordered<archetype_resource>;
static_assert(stream_resource<S> && !owning_resource<S> && !sized_resource<S>);
static_assert(cccl::stream_resource_with<S, device_accessible> && !has_property<S, host_accessible>);
static_assert(answers_to_cccl31_stream_names<S>);
static_assert(!std::is_copy_constructible_v<S> && std::is_nothrow_move_constructible_v<S>);
} // namespace detail::stream_ordered_claims

} // namespace strata
