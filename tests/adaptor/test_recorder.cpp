// recorder: a trace of every call, in the format bench/replay reads.
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

static_assert(sized_resource<recorder<host_pool>>);

TEST_CASE("recorder conforms")
{
  std::ostringstream trace;
  recorder<host_pool> r{host_pool{}, trace};
  testing::check_conformance(r, host_limits);
  testing::run_random_workload(r, small_workload);
}

TEST_CASE("recorder: writes the trace format of bench/traces/README.md, which replays to the same peak")
{
  std::ostringstream out;
  simulated_streams world;
  using so = stream_ordered<host_pool, simulated_events>;
  std::size_t live = 0, peak = 0;
  {
    recorder<so> r{so{host_pool{}, {}, simulated_events(world)}, out};
    const cuda::stream_ref s1 = world.create(), s2 = world.create();
    std::vector<std::pair<void*, std::size_t>> blocks;
    for (int i = 0; i < 50; ++i) {
      const std::size_t bytes = 1000 + 37 * i;
      blocks.emplace_back(i % 3 == 0 ? r.allocate(bytes) : r.allocate_async(bytes, 256, i % 3 == 1 ? s1 : s2), bytes);
      live += bytes;
      peak = std::max(peak, live);
      if (i % 4 == 3) {
        r.deallocate(blocks.front().first, blocks.front().second);
        live -= blocks.front().second;
        blocks.erase(blocks.begin());
      }
    }
    for (auto [p, n] : blocks) r.deallocate(p, n);
    CHECK(r.events() == 100);
  }
  std::istringstream in(out.str());
  std::string line;
  std::getline(in, line);
  CHECK(line == "op,id,bytes,stream");
  std::map<std::uint64_t, std::size_t> open;
  std::size_t replay_live = 0, replay_peak = 0, lines = 0;
  std::set<std::uint64_t> streams;
  while (std::getline(in, line)) {
    ++lines;
    char op = 0;
    std::uint64_t id = 0, stream = 0;
    std::size_t bytes = 0;
    REQUIRE(std::sscanf(line.c_str(), "%c,%lu,%zu,%lu", &op, &id, &bytes, &stream) == 4);
    streams.insert(stream);
    if (op == 'a') {
      CHECK(open.emplace(id, bytes).second);
      replay_live += bytes;
      replay_peak = std::max(replay_peak, replay_live);
    } else {
      REQUIRE(op == 'f');
      REQUIRE(open.count(id) == 1);
      CHECK(open[id] == bytes);
      replay_live -= bytes;
      open.erase(id);
    }
  }
  CHECK(lines == 100);
  CHECK(open.empty());
  CHECK(replay_peak == peak);
  CHECK(streams == std::set<std::uint64_t>{0, 1, 2});
  CHECK_THROWS_AS((recorder<host_source>{host_source{}, std::string("/nonexistent-dir/trace.csv")}), std::invalid_argument);
}
