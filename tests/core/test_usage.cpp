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
