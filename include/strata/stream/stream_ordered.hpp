#pragma once
// strata::stream_ordered, the public face of the stream layer; its state and rules are one class,
// detail::stream_ordered_impl (detail/stream/stream_ordered_impl.hpp).
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/event_backend.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/stream/stream_ordered_impl.hpp>
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
/// pop) and a few comparisons, plus the stream's lookup (detail::stream_ordered_impl, "The stream of a
/// call"): with `check_capture` a capture query (none without it, when
/// captures are announced); for a plain handle the id lookup besides (both in one backend call where the
/// backend answers them together: capture_then_id_backend); a capture query for every stream
/// while a capture is announced or seen. On another stream, a cached allocate or free is a
/// hash lookup, O(1), plus a tag check for a tagging policy; a miss costs the policy's allocate, an event
/// query per pending event and at most one event record and cudaStreamWaitEvent per batch of frees.
/// Unsynchronized. Move-only: a move hands every block, event and pool over.
template <resource Policy, event_backend Backend = cuda_events>
class stream_ordered : public forward_properties<stream_ordered<Policy, Backend>, Policy>,
                       public stream_names<stream_ordered<Policy, Backend>> {
  using impl = detail::stream_ordered_impl<Policy, Backend>;

public:
  using stream_names<stream_ordered>::allocate;
  using stream_names<stream_ordered>::deallocate;
  using event = typename Backend::event;
  /// How often streams record events, which captures are looked for, and what the lone owner keeps
  /// (detail::stream_ordered_impl::options documents each field).
  using options = typename impl::options;
  /// What the layer did, for tuning and tests (detail::stream_ordered_impl::counters).
  using counters = typename impl::counters;

  stream_ordered() requires std::default_initializable<Policy> && std::default_initializable<Backend> : stream_ordered(Policy{}) {}
  explicit stream_ordered(Policy policy, options opts = options{}) requires std::default_initializable<Backend>
      : stream_ordered(std::move(policy), opts, Backend{}) {}
  /// Throws std::invalid_argument, before anything is built, for options that cannot work.
  explicit stream_ordered(Policy policy, options opts, Backend backend) : impl_(std::move(policy), opts, std::move(backend)) {}

  /// A move hands every block, event and pool over; the moved-from layer is empty. Assigning to a layer
  /// first returns everything it held, as destroying it does (waiting for its pending frees).
  stream_ordered(stream_ordered&&) noexcept = default;
  stream_ordered& operator=(stream_ordered&&) noexcept = default;
  stream_ordered(const stream_ordered&) = delete;
  stream_ordered& operator=(const stream_ordered&) = delete;
  ~stream_ordered() = default;

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
  {
    return impl_.allocate_ordered(bytes, alignment, stream, nullptr);
  }
  /// The same, with the stream's id known: no backend call on a hit.
  void* allocate_async(std::size_t bytes, std::size_t alignment, const identified_stream& stream)
  {
    const std::uint64_t id = stream.id();
    return impl_.allocate_ordered(bytes, alignment, stream.stream(), stream.valid_here() ? &id : nullptr);
  }

  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
  {
    impl_.free_ordered(p, bytes, alignment, stream, nullptr);
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, const identified_stream& stream) noexcept
  {
    const std::uint64_t id = stream.id();
    impl_.free_ordered(p, bytes, alignment, stream.stream(), stream.valid_here() ? &id : nullptr);
  }

  /// Tells the layer that `stream` will share it: from now on the owner's frees carry events, so that this
  /// stream waits for them on the GPU. (A stream first seen later makes its first request wait for the device
  /// once instead: the owner's earlier frees have no event, and its handle is never touched from another
  /// stream's call.) A driver call; no memory. Nothing on a capturing stream (asking its id would invalidate
  /// the capture; what it allocates is its graph's private pool's, which nobody else gets anyway).
  void share(cuda::stream_ref stream) { impl_.share(stream); }

  /// On the legacy default stream; the block is ready for the host and any stream when this returns.
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment) { return impl_.allocate_sync(bytes, alignment); }

  /// Safe for any prior work on any stream, as cudaFree is: set aside until a device-wide wait (docs/architecture.md).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    impl_.free_sync(p, bytes, alignment);
  }

  /// Waits (on the host) for every pending free and returns every cached block to the policy; with `policy_too`
  /// also for the owner's frees, then releases the policy's free chunks when it can (strata::pause: without).
  void release(bool policy_too = true) { impl_.release(policy_too); }

  /// From now on, allocations on streams for which `filter(cudaStream_t)` is true (checked newest route
  /// first) are served from private pool `pool` (PyTorch's beginAllocateToPool). Called before the capture
  /// begins, it waits (on the host, once) for this layer's pending frees, so nothing freed before it is still
  /// in use when the graph first runs. Throws (nothing changed) if that wait fails.
  template <class Filter>
    requires std::predicate<Filter&, cudaStream_t> && graph_backend<Backend>
  void begin_allocate_to_pool(std::uint64_t pool, Filter filter)
  {
    impl_.add_route(pool, std::function<bool(cudaStream_t)>(std::move(filter)));
  }
  /// The same, for every stream being captured.
  void begin_allocate_to_pool(std::uint64_t pool)
    requires graph_backend<Backend>
  {
    impl_.add_route(pool, {});
  }
  /// Stops routing to `pool` (its newest route); the pool keeps its blocks for its graphs.
  void end_allocate_to_pool(std::uint64_t pool) { impl_.end_route(pool); }
  /// The graphs using `pool` are gone: its free blocks go back (as synchronous frees: after a device-wide
  /// wait), its live blocks as they are freed. Routing to it stops. An unknown pool is ignored (PyTorch
  /// releases pools nothing was allocated in). Throws (nothing changed) only on host memory exhaustion.
  void release_pool(std::uint64_t pool) { impl_.release_pool(pool); }
  /// Releases the pools whose graphs CUDA reported destroyed (every allocate and free does this first).
  void collect_released_pools() { impl_.collect_released_pools(); }
  /// Private pools held (live graphs', and released ones whose blocks are not all freed yet).
  std::size_t private_pools() const noexcept { return impl_.private_pools().size(); }
  /// Blocks held by private pools, live and free, and their bytes (as the policy counts them).
  std::size_t private_pool_blocks() const noexcept { return impl_.private_pools().blocks(); }
  std::size_t private_pool_free_blocks() const noexcept { return impl_.private_pools().free_blocks(); }
  std::size_t private_pool_bytes() const noexcept { return impl_.private_pools().bytes(); }
  /// Blocks and bytes in one pool (an explicit pool's id, or a capture's id with `automatic`); 0 if none.
  std::size_t pool_blocks(std::uint64_t pool, bool automatic = false) const noexcept
  {
    return impl_.pool_blocks(pool, automatic);
  }

  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const
    requires sized_resource<Policy>
  {
    return impl_.policy().good_size(bytes, alignment);
  }

  bool owns(const void* p) const noexcept
    requires owning_resource<Policy>
  {
    return impl_.policy().owns(p);
  }

  /// The policy's figures, with cached and set-aside blocks counted as free (a private pool's free blocks are
  /// in use: its graph uses them at every replay).
  strata::usage usage() const noexcept
    requires usage_reporting_resource<Policy>
  {
    return impl_.usage();
  }

  /// Bytes and blocks freed by streams and not yet back in the policy (the lone owner's recent frees included).
  std::size_t cached_bytes() const noexcept { return impl_.cached_bytes(); }
  std::size_t cached_blocks() const noexcept { return impl_.cached_blocks(); }
  /// Synchronous frees waiting for a device-wide wait.
  std::size_t set_aside_blocks() const noexcept { return impl_.set_aside_blocks(); }
  /// Events recorded and not yet seen complete.
  std::size_t pending_events() const noexcept { return impl_.pending_events(); }
  /// Streams with cached blocks or pending events, and the owner.
  std::size_t streams_tracked() const noexcept { return impl_.streams_tracked(); }
  /// The id of the stream whose frees go straight to the policy (none before the first free).
  std::optional<std::uint64_t> owner() const noexcept { return impl_.owner(); }
  /// The id this layer files a stream under (what checked<> compares). A capturing stream cannot be asked
  /// (that would invalidate its capture): it is the id last seen with its handle, else one made from the
  /// capture's id (top bit set, so it is no stream's id).
  std::uint64_t stream_id(cuda::stream_ref stream) const { return impl_.stream_id(stream); }
  const counters& stats() const noexcept { return impl_.stats(); }

  Policy& policy() noexcept { return impl_.policy(); }
  const Policy& policy() const noexcept { return impl_.policy(); }
  Backend& backend() noexcept { return impl_.backend(); }

  friend bool operator==(const stream_ordered& a, const stream_ordered& b) noexcept { return &a == &b; }

private:
  impl impl_;  ///< the layer's state and rules (detail/stream/stream_ordered_impl.hpp)
};

namespace detail::stream_ordered_claims {
using S = stream_ordered<archetype_resource>;
static_assert(stream_resource<S> && !owning_resource<S> && !sized_resource<S>);
static_assert(cccl::stream_resource_with<S, device_accessible> && !has_property<S, host_accessible>);
static_assert(answers_to_cccl31_stream_names<S>);
static_assert(!std::is_copy_constructible_v<S> && std::is_nothrow_move_constructible_v<S>);
} // namespace detail::stream_ordered_claims

} // namespace strata
