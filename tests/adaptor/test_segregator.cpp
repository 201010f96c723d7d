// segregator: sizes routed by a threshold, frees by the same test.
// It passes the conformance suite and the randomized checker; spy upstreams see every call it makes.
#include <doctest/doctest.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <type_traits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <strata/adaptor/fallback.hpp>
#include <strata/adaptor/limit.hpp>
#include <strata/adaptor/prefetch.hpp>
#include <strata/adaptor/recorder.hpp>
#include <strata/adaptor/retry_on_oom.hpp>
#include <strata/adaptor/segregator.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/adaptor/synchronized.hpp>
#include <strata/adaptor/thread_cached.hpp>
#include <strata/adaptor/tracking.hpp>
#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "support/conformance.hpp"
#include "support/spy.hpp"
#include "adaptor/adaptor_fixtures.hpp"

using namespace strata;
using strata::testing::spy;

using namespace strata::testing::adaptor_fixtures;

static_assert(sized_resource<segregator<4096, size_class_pool<host_source>, host_pool>>);
static_assert(!sized_resource<segregator<4096, host_source, host_pool>>);

TEST_CASE("segregator conforms")
{
  segregator<4096, size_class_pool<host_source>, host_pool> r;
  testing::check_conformance(r, host_limits);
  testing::run_random_workload(r, small_workload);
}

TEST_CASE("segregator: sizes route by the threshold, frees by the same test")
{
  spy<host_source> small_up, large_up;
  segregator<4096, ref<spy<host_source>>, ref<spy<host_source>>> r{ref(small_up), ref(large_up)};
  void* a = r.allocate(4096);
  void* b = r.allocate(4097);
  CHECK(small_up.holds(a));
  CHECK(large_up.holds(b));
  r.deallocate(a, 4096);
  r.deallocate(b, 4097);
  CHECK(small_up.outstanding_blocks() + large_up.outstanding_blocks() == 0);
  CHECK(small_up.mismatches() + large_up.mismatches() == 0);
}
