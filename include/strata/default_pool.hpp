#pragma once
// The stack strata recommends on a GPU, under one name, and its twin for planning on a machine without one.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include <strata/adaptor/per_device.hpp>
#include <strata/core/cccl_claims.hpp>

#include <strata/pages/driver_pages.hpp>
#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/sleep/tag_scope.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>

namespace strata {

/// The recommended stack: stream-ordered reuse over page-mapped device memory. Blocks freed on a stream are
/// reused at once by that stream and by others once its work is done; physical memory stands behind live
/// blocks, and idle memory is kept only below the most the pool ever held, so the pool holds little more than
/// the program's live peak (docs/memory.md compares it with PyTorch's caching allocator). It pays in driver
/// calls when the live set outgrows what is mapped (each mapping and unmapping is a round trip through the
/// driver): slower per operation than chunked pools while it grows, not once it is warm.
/// Models stream_resource; device_accessible. Costs: see stream_ordered and mapped_pool.
using default_pool = stream_ordered<mapped_pool<driver_pages>>;

/// The same policy over a pretend device and pretend streams: capacity planning and replay without a GPU.
using planning_pool = stream_ordered<mapped_pool<simulated_pages>, simulated_events>;

struct default_pool_options {
  int device = -1;                     ///< -1: the current device
  double max_fraction = 1.0;           ///< hold at most this share of the device's memory...
  std::size_t max_physical = SIZE_MAX; ///< ...and at most this many bytes
  std::vector<int> peers{};            ///< other devices that may read and write the memory
  CUmemAllocationHandleType handle_types = CU_MEM_HANDLE_TYPE_NONE;  ///< POSIX_FILE_DESCRIPTOR: blocks shareable through ipc/
  mapped_pool<driver_pages>::options pool{};  ///< max_physical here is replaced by the two caps above
  default_pool::options stream{};             ///< the stream layer's (stream_ordered's) options
};

/// Builds the recommended stack for a device (a CUDA call to size the cap, none to reserve: the address ranges
/// are reserved on first use). std::invalid_argument for a fraction outside (0, 1] or peers that cannot reach
/// the device.
inline default_pool make_default_pool(const default_pool_options& o = {})
{
  if (!(o.max_fraction > 0.0 && o.max_fraction <= 1.0))
    throw std::invalid_argument("make_default_pool: max_fraction " + std::to_string(o.max_fraction) + " is not in (0, 1]");
  const int device = o.device < 0 ? detail::current_device() : o.device;
  std::size_t free_bytes = 0, total_bytes = 0;
  {
    detail::scoped_device on(device);
    detail::cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  }
  auto opts = o.pool;
  opts.max_physical = std::min(o.max_physical, static_cast<std::size_t>(o.max_fraction * static_cast<double>(total_bytes)));
  return default_pool{mapped_pool<driver_pages>{driver_pages{device, 0, o.peers, o.handle_types}, opts}, o.stream};
}

/// per_device's factory for the recommended stack: the same options on every device, `device` replaced by the
/// one asked for (and `peers` left as given: name the devices that should reach each device's memory).
struct default_pool_factory {
  default_pool_options options{};
  default_pool operator()(int device) const
  {
    default_pool_options o = options;
    o.device = device;
    return make_default_pool(o);
  }
};

/// The recommended stack on every device, each built when a thread first allocates with its device current
/// (or asks for_device): `default_pools pools;` then allocate as from one pool. See per_device.
using default_pools = per_device<default_pool, default_pool_factory>;

/// Puts tags of a stream-ordered mapped_pool (default_pool, planning_pool) to sleep (docs/sleep_wake.md). First
/// every block the stream layer holds for reuse goes back to the pool (stream_ordered::release(false): a host
/// wait for the frees still pending on other streams, an event each, or the devices for frees no event
/// covers), so the tags' cached blocks are free, not backed up; then mapped_pool::pause, whose one
/// device-wide wait covers the rest (a live block may be in use on any stream, seen by the layer or not).
/// Other tags' idle memory stays. Errors as mapped_pool::pause; usage_error under a CUDA graph capture the
/// layer has seen.
template <page_backend Pages, class Events>
  requires copying_page_backend<Pages>
void pause(stream_ordered<mapped_pool<Pages>, Events>& pool, std::span<const tag_id> tags, bool backup = true)
{
  pool.release(/*policy_too=*/false);
  pool.policy().pause(tags, backup);
}
template <page_backend Pages, class Events>
  requires copying_page_backend<Pages>
void pause(stream_ordered<mapped_pool<Pages>, Events>& pool, std::initializer_list<tag_id> tags, bool backup = true)
{
  pause(pool, std::span<const tag_id>(tags.begin(), tags.size()), backup);
}

/// Wakes tags that pause put to sleep: mapped_pool::resume (the stream layer holds none of their blocks).
template <page_backend Pages, class Events>
  requires copying_page_backend<Pages>
void resume(stream_ordered<mapped_pool<Pages>, Events>& pool, std::span<const tag_id> tags)
{
  pool.policy().resume(tags);
}
template <page_backend Pages, class Events>
  requires copying_page_backend<Pages>
void resume(stream_ordered<mapped_pool<Pages>, Events>& pool, std::initializer_list<tag_id> tags)
{
  resume(pool, std::span<const tag_id>(tags.begin(), tags.size()));
}

static_assert(stream_resource<default_pool> && cccl::stream_resource_with<default_pool, device_accessible>);
static_assert(!has_property<default_pool, host_accessible> && !has_property<planning_pool, device_accessible>);

} // namespace strata
