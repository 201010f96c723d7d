// core/alignment.hpp: rounding and alignment checks.
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

TEST_CASE("alignment arithmetic")
{
  using namespace strata;
  CHECK(align_up(0, 256) == 0);
  CHECK(align_up(1, 256) == 256);
  CHECK(align_up(256, 256) == 256);
  CHECK(align_up(257, 256) == 512);
  CHECK(effective_alignment(1) == 256);
  CHECK(effective_alignment(4096) == 4096);
  std::size_t out = 0;
  CHECK_FALSE(checked_align_up(SIZE_MAX, 256, out));
  CHECK(checked_align_up(SIZE_MAX - 255, 256, out));
  CHECK(out == SIZE_MAX - 255);
  CHECK_NOTHROW(check_alignment("box", 256, 256));
  CHECK_THROWS_WITH_AS(check_alignment("box", 3, 256), "box: alignment 3 is not a power of two", std::invalid_argument);
  CHECK_THROWS_WITH_AS(check_alignment("box", 0, 256), "box: alignment 0 is not a power of two", std::invalid_argument);
  CHECK_THROWS_AS(check_alignment("box", 512, 256), std::invalid_argument);
}
