// interop/any_resource.hpp: a stack chosen at run time, behind one non-template type.
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
} // namespace

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
