// limit: a cap on the bytes in use, counted in good sizes.
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

static_assert(stream_resource<limit<stream_ordered<host_pool>>> && !stream_resource<limit<host_pool>>);

TEST_CASE("limit conforms")
{
  limit<host_pool> r{host_pool{}, std::size_t{1} << 30};
  testing::check_conformance(r, host_limits);
  testing::run_random_workload(r, small_workload);
  CHECK(r.bytes_in_use() == 0);
}

TEST_CASE("limit: refuses past the cap, naming it; counts good sizes; gives the bytes back on free")
{
  spy<host_source> up;
  limit<coalescing_pool<ref<spy<host_source>>>> r{spied_pool{ref(up)}, 1 << 20};
  void* a = r.allocate(1000);  // counts as 1024, the pool's good size
  CHECK(r.bytes_in_use() == 1024);
  void* b = r.allocate((1 << 20) - 1024);
  CHECK_THROWS_WITH_AS(r.allocate(1), doctest::Contains("limit 1048576 bytes"), out_of_memory);
  CHECK(r.bytes_in_use() == 1 << 20);
  r.deallocate(a, 1000);
  void* c = r.allocate(1000);
  r.deallocate(b, (1 << 20) - 1024);
  r.deallocate(c, 1000);
  CHECK(r.bytes_in_use() == 0);
  // An upstream failure refunds the charge.
  up.refuse_next(1);
  CHECK_THROWS_AS(r.allocate(8 << 20), out_of_memory);
  CHECK(r.bytes_in_use() == 0);
  CHECK_THROWS_AS((limit<host_source>::fraction_of_device(host_source{}, 1.5)), std::invalid_argument);
  CHECK_THROWS_AS((limit<host_source>::fraction_of_device(host_source{}, 0.0)), std::invalid_argument);
}
