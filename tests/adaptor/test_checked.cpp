// checked: every misuse (double free, foreign and interior pointers, wrong size or alignment, cross-stream
// frees, leaks) is a usage_error that says what happened, and the box below stays intact.
#include <doctest/doctest.h>

#include <string>

#include <strata/adaptor/checked.hpp>
#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/host_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "support/invariants.hpp"
#include "support/spy.hpp"

using namespace strata;
using strata::testing::spy;

TEST_CASE("checked: every misuse is a usage_error that says what happened, and the pool stays intact")
{
  spy<host_source> upstream;
  std::string leaks;
  {
    checked<coalescing_pool<ref<spy<host_source>>>> r{coalescing_pool<ref<spy<host_source>>>{ref(upstream)},
                                                      {.on_leaks = [&](const std::string& report) { leaks = report; }}};
    char* a = static_cast<char*>(r.allocate(1000));
    void* b = r.allocate(5000, 4096);
    const auto before = r.upstream().usage();

    CHECK_THROWS_WITH_AS(r.deallocate(a, 999), doctest::Contains("freed with 999 bytes, but allocated with 1000"), usage_error);
    CHECK_THROWS_WITH_AS(r.deallocate(b, 5000, 256), doctest::Contains("freed with alignment 256, but allocated with 4096"), usage_error);
    CHECK_THROWS_WITH_AS(r.deallocate(a + 256, 100), doctest::Contains("interior pointer: 256 bytes into the live block of 1000 bytes"), usage_error);
    int local = 0;
    CHECK_THROWS_WITH_AS(r.deallocate(&local, 4), doctest::Contains("never handed out"), usage_error);
    CHECK(r.upstream().usage() == before);  // nothing reached the pool

    r.deallocate(a, 1000);
    CHECK_THROWS_WITH_AS(r.deallocate(a, 1000), doctest::Contains("double free"), usage_error);
    CHECK_THROWS_AS(r.record_use(a, cuda::stream_ref{cudaStreamLegacy}), usage_error);
    CHECK(r.outstanding() == 1);
    CHECK_THROWS_WITH_AS(r.check_no_leaks(), doctest::Contains("1 allocation(s) outstanding, 5000 bytes"), usage_error);
    // After all that, the pool still works and its accounting is exact.
    testing::run_random_workload(r, {.operations = 5'000, .max_live = 100, .max_alignment = 1 << 12});
    // The same address handed out again is a live block once more, not a double free.
    void* again = r.allocate(1000);
    r.deallocate(again, 1000);
  }
  CHECK(leaks.find("1 allocation(s) outstanding, 5000 bytes") != std::string::npos);
  CHECK(upstream.outstanding_bytes() == 0);
  CHECK(upstream.mismatches() == 0);
}

TEST_CASE("checked: a stream-ordered free on a stream the block was not used on is reported")
{
  simulated_streams world;
  using so = stream_ordered<coalescing_pool<host_source>, simulated_events>;
  checked<so> r{so{coalescing_pool<host_source>{}, {}, simulated_events(world)}};
  const cuda::stream_ref s1 = world.create(), s2 = world.create();
  void* p = r.allocate_async(4096, 256, s1);
  CHECK_THROWS_WITH_AS(r.deallocate_async(p, 4096, 256, s2), doctest::Contains("never recorded as used there"), usage_error);
  r.record_use(p, s2);  // the program ordered s2 after s1's use
  r.deallocate_async(p, 4096, 256, s2);
  CHECK(r.outstanding() == 0);
  checked<so> lenient{so{coalescing_pool<host_source>{}, {}, simulated_events(world)}, {.cross_stream_frees_are_errors = false}};
  void* q = lenient.allocate_async(4096, 256, s1);
  lenient.deallocate_async(q, 4096, 256, s2);
  CHECK(lenient.outstanding() == 0);
}
