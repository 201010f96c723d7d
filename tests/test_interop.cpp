// Interop on the host: std::pmr containers over strata stacks, any_resource, cuda::mr references, and the
// compile-time claims of every public box against both CCCL generations. (Thrust runs in tests/gpu.)
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

TEST_CASE("pmr_adaptor: std::pmr containers on a strata pool")
{
  spy<host_source> upstream;
  {
    pmr_adaptor<coalescing_pool<ref<spy<host_source>>>> adaptor{coalescing_pool<ref<spy<host_source>>>{ref(upstream)}};
    std::pmr::vector<int> numbers(&adaptor);
    for (int i = 0; i < 100'000; ++i) numbers.push_back(i);
    std::pmr::unordered_map<int, std::pmr::string> names(&adaptor);
    for (int i = 0; i < 1000; ++i) names.emplace(i, std::pmr::string(std::to_string(i) + " is a number long enough to allocate", &adaptor));
    long long sum = 0;
    for (int x : numbers) sum += x;
    CHECK(sum == 4'999'950'000LL);
    CHECK(names.at(999).starts_with("999 is"));
    CHECK(adaptor.resource().usage().in_use > 400'000);
    // 0 bytes: a valid pointer, freed like any other.
    void* zero = adaptor.allocate(0, 8);
    CHECK(zero != nullptr);
    adaptor.deallocate(zero, 0, 8);
  }
  CHECK(upstream.outstanding_bytes() == 0);
  CHECK(upstream.mismatches() == 0);
}

TEST_CASE("pmr_adaptor: is_equal is true only when memory from one may be freed by the other")
{
  host_pool a, b;
  pmr_adaptor<ref<host_pool>> over_a{ref(a)}, also_over_a{ref(a)}, over_b{ref(b)};
  pmr_adaptor<host_source> plain;
  CHECK(over_a.is_equal(also_over_a));
  CHECK(!over_a.is_equal(over_b));
  CHECK(!over_a.is_equal(plain));
  CHECK(!over_a.is_equal(*std::pmr::new_delete_resource()));
  // A vector move-assigned between unequal resources must copy, and does: the element survives.
  std::pmr::vector<int> x({1, 2, 3}, &over_a), y(&over_b);
  y = std::move(x);
  CHECK(y == std::pmr::vector<int>({1, 2, 3}));
  CHECK(y.get_allocator().resource() == &over_b);
  CHECK(b.owns(y.data()));  // copied into b's pool, not adopted from a's
  CHECK(!a.owns(y.data()));
}

TEST_CASE("any_resource: a stack chosen at run time, passed across a non-template boundary")
{
  auto make = [](int choice) -> any_resource<host_accessible> {
    if (choice == 0) return coalescing_pool<host_source>{};
    if (choice == 1) return size_class_pool<host_source>{};
    return statistics<host_source>{};
  };
  for (int choice = 0; choice < 3; ++choice) {
    CAPTURE(choice);
    any_resource<host_accessible> r = make(choice);
    testing::check_conformance(r, {.max_alignment = 1 << 12, .rejects_above = 0, .host_accessible = true});
    testing::run_random_workload(r, {.operations = 10'000, .max_live = 200, .max_alignment = 1 << 12});
  }
  any_resource<host_accessible> pool = coalescing_pool<host_source>{};
  REQUIRE(pool.target<coalescing_pool<host_source>>() != nullptr);
  CHECK(pool.target<size_class_pool<host_source>>() == nullptr);
  void* p = pool.allocate(5000);
  CHECK(pool.target<coalescing_pool<host_source>>()->usage().in_use == 5120);
  any_resource<host_accessible> moved = std::move(pool);
  CHECK(!pool);
  // A moved-from any_resource is empty: frees ignored, allocate a usage_error, no null dereference.
  CHECK(pool.type() == typeid(void));
  CHECK(pool.target<coalescing_pool<host_source>>() == nullptr);
  pool.deallocate(nullptr, 0);
  CHECK_THROWS_WITH_AS(pool.allocate(256), doctest::Contains("any_resource: empty"), usage_error);
  CHECK(moved.target<coalescing_pool<host_source>>()->owns(p));
  moved.deallocate(p, 5000);
  // Equal only when the held boxes are equal (identity for pools; all host_sources are equal).
  any_resource<host_accessible> h1 = host_source{}, h2 = host_source{};
  CHECK(h1 == h2);
  CHECK(!(moved == h1));
  // Move-assignment drops the held box and takes the other's; the source is then empty.
  h1 = std::move(moved);
  CHECK(h1.target<coalescing_pool<host_source>>() != nullptr);
  CHECK(!moved);
  CHECK_THROWS_AS(moved.allocate(1), usage_error);
  moved = host_source{};
  void* q = moved.allocate(100);
  CHECK(q != nullptr);
  moved.deallocate(q, 100);
}

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
