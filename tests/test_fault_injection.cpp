// Every box under the fault injector (support/fault_injection.hpp): its small random workload replayed once
// for every upstream call it makes, with that call refused, and once for every host allocation it makes inside
// allocate, with that one throwing std::bad_alloc. After each exception the box's usage() and its upstream's
// outstanding count are exactly what they were, and the box goes on working; at the end nothing is left over.
// Built into strata_fault_tests only: it replaces the global operator new.
#include <doctest/doctest.h>

#include <memory>

#include <strata/adaptor/fallback.hpp>
#include <strata/adaptor/limit.hpp>
#include <strata/adaptor/segregator.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/adaptor/thread_cached.hpp>
#include <strata/adaptor/tracking.hpp>
#include <strata/core/ref.hpp>
#include <strata/policy/arena.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "support/fault_injection.hpp"
#include "support/spy.hpp"

using namespace strata;
using testing::spy;

namespace {
using host_spy = spy<host_source>;
using simulated_spy = spy<simulated_source>;
// The adaptors and stream_ordered sit on a size_class_pool, which passes the sweep on its own, so a failure
// in their cases is theirs. Small chunks so the few dozen operations of a sweep reach the upstream often.
using host_pool = size_class_pool<ref<host_spy>>;
host_pool small_pool(host_spy& up) { return host_pool{ref(up), {.chunk_size = 1 << 20}}; }

/// Expects the sweep to have reached the caller with host faults (every box keeps host bookkeeping).
void check_faults_reached(const testing::sweep_result& r)
{
  CHECK(r.host_allocations > 0);
  CHECK(r.host_exceptions > 0);
}
} // namespace

TEST_CASE("fault injection: arena")
{
  const auto r = testing::sweep_faults<host_spy>([](host_spy& up) {
    return std::make_unique<arena<ref<host_spy>>>(ref(up), arena<ref<host_spy>>::options{.initial_chunk = 64 << 10, .max_chunk = 1 << 20});
  });
  CHECK(r.upstream_calls > 3);
  check_faults_reached(r);
}

TEST_CASE("fault injection: size_class_pool")
{
  using pool = size_class_pool<ref<simulated_spy>>;
  const auto r = testing::sweep_faults<simulated_spy>([](simulated_spy& up) { return std::make_unique<pool>(ref(up), pool::options{.chunk_size = 1 << 20}); },
                                                      {.operations = 80, .max_bytes = 2 << 20});
  CHECK(r.upstream_calls > 3);
  check_faults_reached(r);
}

TEST_CASE("fault injection: buddy_pool")
{
  using pool = buddy_pool<ref<simulated_spy>>;
  const auto r = testing::sweep_faults<simulated_spy>([](simulated_spy& up) { return std::make_unique<pool>(ref(up), pool::options{.region_size = 256 << 10}); });
  CHECK(r.upstream_calls > 1);
  check_faults_reached(r);
}

TEST_CASE("fault injection: coalescing_pool")
{
  using pool = coalescing_pool<ref<simulated_spy>>;
  const auto r = testing::sweep_faults<simulated_spy>([](simulated_spy& up) {
    return std::make_unique<pool>(ref(up), pool::options{.initial_chunk = 256 << 10, .max_chunk = 1 << 20});
  });
  CHECK(r.upstream_calls > 1);
  check_faults_reached(r);
}

namespace {
/// stream_ordered over simulated streams: blocks alternate between two streams, and a stream has work
/// pending when one of its blocks is freed, so frees wait on events.
struct two_streams {
  static constexpr bool free_may_merge = true;  // stream_ordered: see check_unchanged
  std::shared_ptr<simulated_streams> world = std::make_shared<simulated_streams>();  // shared by the sweep's copies
  cuda::stream_ref streams[2] = {world->create(), world->create()};

  void start_run() {}
  template <class Box>
  void* allocate(Box& box, std::size_t bytes, std::size_t alignment, std::size_t step)
  {
    return box.allocate_async(bytes, alignment, streams[step % 2]);
  }
  template <class Box>
  void deallocate(Box& box, void* p, std::size_t bytes, std::size_t alignment, std::size_t allocated_at)
  {
    const cuda::stream_ref s = streams[allocated_at % 2];
    world->launch(s);
    box.deallocate_async(p, bytes, alignment, s);
    if (allocated_at % 3 == 0) world->finish(s);
  }
  template <class Box>
  std::array<std::size_t, 2> extra(const Box&) const
  {
    return {};
  }
};
} // namespace

TEST_CASE("fault injection: stream_ordered over simulated streams")
{
  using layer = stream_ordered<host_pool, simulated_events>;
  two_streams calls;
  const auto r = testing::sweep_faults<host_spy>(
    [&calls](host_spy& up) { return std::make_unique<layer>(small_pool(up), layer::options{}, simulated_events(*calls.world)); }, {}, calls);
  CHECK(r.upstream_calls > 3);
  check_faults_reached(r);
}

namespace {
/// Counts a source's own figures, for a source under test (it has no upstream to watch).
struct simulated_figures : testing::plain_calls {
  std::array<std::size_t, 2> extra(const simulated_source& s) const { return {s.allocated_bytes(), s.allocation_count()}; }
};
struct host_figures : testing::plain_calls {
  std::array<std::size_t, 2> extra(const host_source&) const { return {testing::host_faults::live_blocks.load(), 0}; }
};
} // namespace

TEST_CASE("fault injection: simulated_source")
{
  const auto r = testing::sweep_faults<testing::no_upstream>([](testing::no_upstream&) { return std::make_unique<simulated_source>(); }, {},
                                                             simulated_figures{});
  check_faults_reached(r);
}

TEST_CASE("fault injection: host_source")
{
  const auto r = testing::sweep_faults<testing::no_upstream>([](testing::no_upstream&) { return std::make_unique<host_source>(); }, {},
                                                             host_figures{});
  check_faults_reached(r);
}

namespace {
template <class Figures>
struct adaptor_figures : testing::plain_calls {
  Figures figures;
  template <class Box>
  std::array<std::size_t, 2> extra(const Box& box) const
  {
    return figures(box);
  }
};
template <class Figures>
adaptor_figures<Figures> watching(Figures f)
{
  return {{}, f};
}
} // namespace

TEST_CASE("fault injection: limit")
{
  using box = limit<host_pool>;
  const auto r = testing::sweep_faults<host_spy>([](host_spy& up) { return std::make_unique<box>(small_pool(up), std::size_t{64} << 20); }, {},
                                                 watching([](const box& b) { return std::array<std::size_t, 2>{b.bytes_in_use(), 0}; }));
  check_faults_reached(r);
}

TEST_CASE("fault injection: statistics")
{
  using box = statistics<host_pool>;
  const auto r = testing::sweep_faults<host_spy>([](host_spy& up) { return std::make_unique<box>(small_pool(up)); }, {},
                                                 watching([](const box& b) {
                                                   const auto c = b.snapshot_counts();
                                                   return std::array<std::size_t, 2>{c.current_bytes, c.current_blocks};
                                                 }));
  check_faults_reached(r);
}

TEST_CASE("fault injection: tracking")
{
  using box = tracking<host_pool>;
  const auto r = testing::sweep_faults<host_spy>([](host_spy& up) { return std::make_unique<box>(small_pool(up)); }, {},
                                                 watching([](const box& b) { return std::array<std::size_t, 2>{b.live_blocks(), 0}; }));
  check_faults_reached(r);
}

TEST_CASE("fault injection: fallback")
{
  // The primary may hand out 2 MiB at most, so the secondary serves the rest; both take from the same upstream.
  using box = fallback<limit<host_pool>, host_pool>;
  const auto r = testing::sweep_faults<host_spy>(
    [](host_spy& up) { return std::make_unique<box>(limit<host_pool>{small_pool(up), std::size_t{2} << 20}, small_pool(up)); });
  // One fault at a time, two tiers: when one tier fails, the other serves, so no exception need reach the caller.
  CHECK(r.host_allocations > 0);
  CHECK(r.upstream_calls > 1);
}

TEST_CASE("fault injection: segregator")
{
  using box = segregator<4096, host_pool, arena<ref<host_spy>>>;
  const auto r = testing::sweep_faults<host_spy>([](host_spy& up) {
    return std::make_unique<box>(small_pool(up), arena<ref<host_spy>>{ref(up), {.initial_chunk = 64 << 10, .max_chunk = 1 << 20}});
  });
  check_faults_reached(r);
}

TEST_CASE("fault injection: thread_cached")
{
  using box = thread_cached<host_pool>;
  const auto r = testing::sweep_faults<host_spy>([](host_spy& up) { return std::make_unique<box>(small_pool(up)); });
  check_faults_reached(r);
}

namespace {
struct device_figures : testing::plain_calls {
  template <class Pool>
  std::array<std::size_t, 2> extra(const Pool& pool) const
  {
    return {pool.backend().bytes_alive(), pool.physical_bytes()};
  }
};
} // namespace

// Host faults only: its upstream is a page backend, which the refusing spy cannot stand in for.
TEST_CASE("fault injection: mapped_pool over simulated pages (host allocations)")
{
  using pool = mapped_pool<simulated_pages>;
  const auto r = testing::sweep_faults<testing::no_upstream>([](testing::no_upstream&) { return std::make_unique<pool>(); },
                                                             {.max_bytes = 8 << 20}, device_figures{});
  check_faults_reached(r);
}
