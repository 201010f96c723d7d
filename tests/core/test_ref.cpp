// core/ref.hpp: a reference that shares one box and forwards its capabilities.
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

TEST_CASE("ref shares one box and forwards its capabilities")
{
  strata::simulated_source sim;
  strata::ref a(sim), b(sim);
  CHECK(a == b);
  void* p = a.allocate(1000);
  CHECK(b.owns(p));
  CHECK(sim.allocated_bytes() == 1024);
  b.deallocate(p, 1000);
  CHECK(sim.allocated_bytes() == 0);
  strata::simulated_source other;
  CHECK_FALSE(a == strata::ref(other));
  void* q = a.allocate_sync(10);
  a.deallocate_sync(q, 10);
  CHECK(sim.allocation_count() == 0);
}
