// interop/pmr_adaptor.hpp: std::pmr containers over strata stacks.
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
