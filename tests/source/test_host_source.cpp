#include <doctest/doctest.h>

#include <strata/source/host_source.hpp>
#include "support/conformance.hpp"

TEST_CASE("host_source conforms")
{
  strata::host_source r;
  strata::testing::check_conformance(r, {.max_alignment = std::size_t{1} << 20, .rejects_above = strata::host_source::max_alignment, .host_accessible = true});
}

TEST_CASE("host_source survives a random workload")
{
  strata::host_source r;
  strata::testing::run_random_workload(r, {.operations = 20'000, .max_alignment = 1 << 16});
}
