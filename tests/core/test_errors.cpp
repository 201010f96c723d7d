// core/errors.hpp: the exceptions say what went wrong, and where.
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

TEST_CASE("errors name what went wrong")
{
  const strata::out_of_memory oom("coalescing_pool", 12345, strata::figures(100, 50));
  CHECK(std::string(oom.what()) == "coalescing_pool: out of memory allocating 12345 bytes (reserved 100 bytes, in use 50 bytes)");
  CHECK(oom.requested() == 12345);
  try {
    strata::detail::cuda_check(cudaErrorInvalidValue, "cudaMemcpy");
    FAIL("no exception");
  } catch (const strata::cuda_error& e) {
    CHECK(e.code() == cudaErrorInvalidValue);
    const std::string what = e.what();
    CHECK(what.find("cudaMemcpy") == 0);
    CHECK(what.find("cudaErrorInvalidValue") != std::string::npos);
    CHECK(what.find("test_errors.cpp:") != std::string::npos);
  }
  CHECK_NOTHROW(strata::detail::cuda_check(cudaSuccess, "anything"));
}
