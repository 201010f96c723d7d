// The compile-time claims of every public box against both CCCL generations, and cuda::mr references over
// strata boxes. (Thrust runs in tests/gpu.)
#include <doctest/doctest.h>

#include <map>
#include <memory_resource>
#include <string>
#include <unordered_map>
#include <vector>

#include <strata/strata.hpp>
#include <strata/interop/any_resource.hpp>
#include <strata/interop/pmr_adaptor.hpp>
#include <strata/interop/thrust_allocator.hpp>
#include <strata/interop/thrust_resource.hpp>
#include <strata/interop/thrust_temp_allocator.hpp>
#include "support/conformance.hpp"
#include "support/spy.hpp"

using namespace strata;
using strata::testing::spy;

namespace {
using host_pool = coalescing_pool<host_source>;
using so_host = stream_ordered<host_pool>;

/// Every box claims the concepts of the CCCL it is compiled against with its properties, and the 3.1 names
/// (under 3.0 too: strata::cccl's concepts ask for them there).
template <class R, class... Properties>
constexpr bool cccl_both_generations = cccl::synchronous_resource_with<R, Properties...> && answers_to_cccl31_names<R>;
template <class R, class... Properties>
constexpr bool cccl_async_both_generations =
  cccl::stream_resource_with<R, Properties...> && answers_to_cccl31_stream_names<R>;
} // namespace

// Sources, policies, layers and adaptors: positive claims, and the properties they must not have.
static_assert(cccl_both_generations<host_source, host_accessible> && !has_property<host_source, device_accessible>);
static_assert(cccl_both_generations<device_source, device_accessible> && !has_property<device_source, host_accessible>);
static_assert(cccl_both_generations<managed_source, device_accessible, host_accessible>);
static_assert(cccl_both_generations<pinned_source, device_accessible, host_accessible>);
static_assert(cccl_async_both_generations<async_source, device_accessible>);
static_assert(cccl_both_generations<arena<device_source>, device_accessible>);
static_assert(cccl_both_generations<size_class_pool<pinned_source>, device_accessible, host_accessible>);
static_assert(cccl_both_generations<buddy_pool<managed_source>, device_accessible, host_accessible>);
static_assert(cccl_both_generations<coalescing_pool<device_source>, device_accessible>);
static_assert(cccl_both_generations<pinned_host_pool<>, host_accessible, device_accessible>);
static_assert(!cccl::synchronous_resource_with<coalescing_pool<device_source>, host_accessible>);
static_assert(cccl_async_both_generations<stream_ordered<coalescing_pool<device_source>>, device_accessible>);
static_assert(!cccl::stream_resource<coalescing_pool<device_source>>);
static_assert(cccl_both_generations<limit<coalescing_pool<device_source>>, device_accessible>);
static_assert(cccl_async_both_generations<statistics<stream_ordered<coalescing_pool<device_source>>>, device_accessible>);
static_assert(cccl_both_generations<fallback<coalescing_pool<device_source>, coalescing_pool<pinned_source>>, device_accessible>);
static_assert(!has_property<fallback<coalescing_pool<device_source>, coalescing_pool<pinned_source>>, host_accessible>);
static_assert(cccl_both_generations<thread_cached<coalescing_pool<pinned_source>>, device_accessible, host_accessible>);
static_assert(cccl_both_generations<synchronized<size_class_pool<device_source>>, device_accessible>);
// checked's frees throw on misuse: deliberately no resource (it keeps its properties).
static_assert(!resource<checked<coalescing_pool<device_source>>> && has_property<checked<coalescing_pool<device_source>>, device_accessible>);
// The wrappers the CCCL gives users take strata boxes: through a strata::ref in every generation, and the
// move-only boxes themselves before 3.2 (whose wrappers hold copyable resources only).
static_assert(std::is_constructible_v<cccl::synchronous_resource_ref<device_accessible>, ref<coalescing_pool<device_source>>&>);
static_assert(!std::is_constructible_v<cccl::synchronous_resource_ref<device_accessible>, ref<host_pool>&>);
static_assert(std::is_constructible_v<cccl::stream_resource_ref<device_accessible>, ref<stream_ordered<coalescing_pool<device_source>>>&>);
static_assert(!std::is_constructible_v<cccl::stream_resource_ref<device_accessible>, ref<coalescing_pool<device_source>>&>);
#if !STRATA_CCCL_WRAPPERS_NEED_COPYABLE
static_assert(std::is_constructible_v<cccl::synchronous_resource_ref<device_accessible>, coalescing_pool<device_source>&>);
static_assert(!std::is_constructible_v<cccl::synchronous_resource_ref<device_accessible>, host_pool&>);
static_assert(std::is_constructible_v<cccl::stream_resource_ref<device_accessible>, stream_ordered<coalescing_pool<device_source>>&>);
static_assert(!std::is_constructible_v<cccl::stream_resource_ref<device_accessible>, coalescing_pool<device_source>&>);
#endif
// any_resource takes only boxes with the properties it promises.
static_assert(std::is_constructible_v<any_resource<device_accessible>, coalescing_pool<device_source>>);
static_assert(!std::is_constructible_v<any_resource<device_accessible>, host_pool>);
static_assert(!std::is_constructible_v<any_stream_resource<device_accessible>, coalescing_pool<device_source>>);
static_assert(!std::is_copy_constructible_v<any_resource<>>);
// Thrust allocators: device_ptr for device stacks, universal_ptr for stacks both sides may touch.
static_assert(std::is_same_v<thrust_allocator<int, coalescing_pool<device_source>>::pointer, thrust::device_ptr<int>>);
static_assert(std::is_same_v<thrust_universal_allocator<int, coalescing_pool<managed_source>>::pointer, thrust::universal_ptr<int>>);
static_assert(std::is_same_v<thrust_allocator<int, coalescing_pool<device_source>>::rebind<double>::other,
                             thrust_allocator<double, coalescing_pool<device_source>>>);
static_assert(std::is_nothrow_constructible_v<thrust_allocator<double, coalescing_pool<device_source>>,
                                              const thrust_allocator<int, coalescing_pool<device_source>>&>);  // rebinding
static_assert(!std::is_constructible_v<thrust_universal_allocator<int, coalescing_pool<managed_source>>,
                                       const thrust_allocator<int, coalescing_pool<managed_source>>&>);  // not across pointer kinds

TEST_CASE("cuda::mr references wrap strata boxes")
{
  host_pool pool;
  ref<host_pool> handle{pool};  // CCCL 3.2+ wrappers hold copyable resources; the pool is move-only
  cccl::synchronous_resource_ref<host_accessible> r{handle};
  void* p = cccl::allocate_sync(r, 1000, 256);
  CHECK(pool.owns(p));
  cccl::deallocate_sync(r, p, 1000, 256);
  CHECK(pool.usage().in_use == 0);
#if STRATA_CCCL_WRAPPERS_NEED_COPYABLE
  // CCCL's owning wrapper (3.2+) holds a copy of the handle; the pool stays where it is.
  cuda::mr::any_synchronous_resource<host_accessible> held{handle};
  void* w = held.allocate_sync(500, 256);
  CHECK(pool.owns(w));
  held.deallocate_sync(w, 500, 256);
  CHECK(pool.usage().in_use == 0);
#endif

  simulated_streams world;
  stream_ordered<host_pool, simulated_events> layer{host_pool{}, {}, simulated_events(world)};
  ref<stream_ordered<host_pool, simulated_events>> layer_handle{layer};
  cccl::stream_resource_ref<host_accessible> ar{layer_handle};
  const cuda::stream_ref s = world.create();
  void* q = cccl::allocate(ar, s, 2000, 256);
  cccl::deallocate(ar, s, q, 2000, 256);
  CHECK(layer.owner() == world.id_of(s));  // the free went through the layer, on that stream
  any_stream_resource<host_accessible> owned = stream_ordered<host_pool, simulated_events>{host_pool{}, {}, simulated_events(world)};
  void* z = owned.allocate_async(100, 256, s);
  owned.deallocate_async(z, 100, 256, s);
}
