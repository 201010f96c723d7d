// statistics: current, peak and total counts of what passes through.
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

static_assert(owning_resource<statistics<host_pool>> && usage_reporting_resource<statistics<host_pool>>);
static_assert(!owning_resource<statistics<host_source>>);
static_assert(cccl::stream_resource<statistics<stream_ordered<host_pool>>>);

TEST_CASE("statistics conforms")
{
  statistics<host_pool> r;
  testing::check_conformance(r, host_limits);
  testing::run_random_workload(r, small_workload);
  CHECK(r.snapshot_counts().current_bytes == 0);
}

TEST_CASE("statistics: current, peak and total counts; resettable peaks; nested scopes")
{
  statistics<host_source> r;
  void* a = r.allocate(1000);
  void* b = r.allocate(3000);
  r.deallocate(a, 1000);
  auto c = r.snapshot_counts();
  CHECK(c == statistics<host_source>::counts{.current_bytes = 3000, .current_blocks = 1, .peak_bytes = 4000, .peak_blocks = 2,
                                             .total_bytes = 4000, .total_blocks = 2});
  r.reset_peaks();
  CHECK(r.snapshot_counts().peak_bytes == 3000);
  {
    auto outer = r.open_scope();
    void* d = r.allocate(500);
    {
      auto inner = r.open_scope();
      void* e = r.allocate(10'000);
      r.deallocate(e, 10'000);
      const auto in = inner.so_far();
      CHECK(in.allocated_bytes == 10'000);
      CHECK(in.freed_blocks == 1);
      CHECK(in.peak_bytes == 13'500);  // what was in use when it opened, plus its own
    }
    r.deallocate(d, 500);
    const auto out = outer.so_far();
    CHECK(out.allocated_bytes == 10'500);
    CHECK(out.allocated_blocks == 2);
    CHECK(out.freed_bytes == 10'500);
    CHECK(out.peak_bytes == 13'500);  // the inner phase's peak counts for the outer one
  }
  r.deallocate(b, 3000);
  CHECK(r.snapshot_counts().current_bytes == 0);
  CHECK(r.snapshot_counts().total_blocks == 4);
}
