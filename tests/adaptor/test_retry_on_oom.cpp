// retry_on_oom: a callback on out-of-memory, then the request retried.
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

static_assert(stream_resource<retry_on_oom<stream_ordered<host_pool>>>);

TEST_CASE("retry_on_oom conforms")
{
  retry_on_oom<host_pool> r{host_pool{}, [](std::size_t, int) { return false; }};
  testing::check_conformance(r, host_limits);
  testing::run_random_workload(r, small_workload);
}

TEST_CASE("retry_on_oom: the callback runs on out-of-memory and the request is retried")
{
  spy<host_source> up;
  std::vector<std::pair<std::size_t, int>> calls;
  retry_on_oom<ref<spy<host_source>>> r{ref(up), [&](std::size_t bytes, int attempt) {
                                          calls.emplace_back(bytes, attempt);
                                          return true;
                                        },
                                        2};
  up.refuse_next(2);
  void* p = r.allocate(777);
  CHECK(p != nullptr);
  CHECK(calls == std::vector<std::pair<std::size_t, int>>{{777, 1}, {777, 2}});
  CHECK(r.rescued() == 1);
  r.deallocate(p, 777);
  up.refuse_next(3);  // more failures than retries: the last one propagates
  CHECK_THROWS_AS(r.allocate(777), out_of_memory);
  up.refuse_next(0);
  retry_on_oom<ref<spy<host_source>>> gives_up{ref(up), [](std::size_t, int) { return false; }, 5};
  up.refuse_next(1);
  CHECK_THROWS_AS(gives_up.allocate(1), out_of_memory);
  CHECK(up.outstanding_blocks() == 0);
  CHECK_THROWS_AS((retry_on_oom<host_source>{host_source{}, {}}), std::invalid_argument);
}
