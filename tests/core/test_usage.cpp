// core/usage.hpp: the usage figures.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <type_traits>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/ref.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/cuda_check.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>

TEST_CASE("usage figures")
{
  strata::usage u{.reserved = 1000, .in_use = 600, .largest_free = 100, .chunks = 1, .used_blocks = 3, .free_blocks = 2};
  CHECK(u.free() == 400);
  CHECK(u.fragmentation() == doctest::Approx(0.75));
  u.largest_free = 400;
  CHECK(u.fragmentation() == doctest::Approx(0.0));
  CHECK(strata::usage{}.fragmentation() == 0.0);
}

TEST_CASE("usage of disjoint pools adds up, and the largest free block is the larger of the two")
{
  const strata::usage a{.reserved = 1000, .in_use = 600, .largest_free = 300, .chunks = 1, .used_blocks = 3, .free_blocks = 2};
  const strata::usage b{.reserved = 4096, .in_use = 96, .largest_free = 4000, .chunks = 2, .used_blocks = 1, .free_blocks = 1};
  const strata::usage sum = a + b;
  CHECK(sum == strata::usage{.reserved = 5096, .in_use = 696, .largest_free = 4000, .chunks = 3, .used_blocks = 4, .free_blocks = 3});
  CHECK(b + a == sum);
  CHECK(a + strata::usage{} == a);
  strata::usage running;
  running += b;
  running += a;
  CHECK(running == sum);
  CHECK(sum.free() == a.free() + b.free());
  static_assert((strata::usage{.reserved = 2, .largest_free = 1} + strata::usage{.reserved = 3, .largest_free = 2}).reserved == 5);
}
