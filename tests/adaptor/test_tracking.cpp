// tracking: the live allocations, with tags and streams, and a leak report.
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

static_assert(releasable_resource<tracking<host_pool>>);

TEST_CASE("tracking conforms")
{
  tracking<host_pool> r;
  testing::check_conformance(r, host_limits);
  testing::run_random_workload(r, small_workload);
  CHECK(r.live_blocks() == 0);
}

TEST_CASE("tracking: live allocations with tags and streams; a leak report on demand and at destruction")
{
  std::ostringstream at_exit;
  simulated_streams world;
  {
    using so = stream_ordered<host_pool, simulated_events>;
    tracking<so> r{so{host_pool{}, {}, simulated_events(world)}, {.report_at_destruction = true, .report_to = &at_exit}};
    const cuda::stream_ref s = world.create();
    void* a = r.allocate(100);
    void* b = nullptr;
    {
      auto phase = r.tag("forward");
      b = r.allocate_async(2000, 256, s);
    }
    void* c = r.allocate(300);
    const auto live = r.live();
    REQUIRE(live.size() == 3);
    CHECK(live[0].pointer == a);
    CHECK(live[1].tag == "forward");
    CHECK(live[1].stream == reinterpret_cast<std::uintptr_t>(s.get()));
    CHECK(live[2].tag.empty());
    r.deallocate(a, 100);
    const std::string report = r.report();
    CHECK(report.find("2 live allocation(s), 2300 bytes") != std::string::npos);
    CHECK(report.find("tag forward: 1 allocation(s), 2000 bytes") != std::string::npos);
    r.deallocate(c, 300);
    (void)b;  // left live on purpose: reported at destruction
  }
  CHECK(at_exit.str().find("1 live allocation(s), 2000 bytes") != std::string::npos);
}
