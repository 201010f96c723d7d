#include <doctest/doctest.h>

#include <random>

#include <strata/policy/arena.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>
#include "support/conformance.hpp"
#include <strata/core/ref.hpp>
#include "support/spy.hpp"

using namespace strata;
using strata::testing::spy;

static_assert(resource<arena<host_source>> && owning_resource<arena<host_source>>);
static_assert(resettable_resource<arena<host_source>> && releasable_resource<arena<host_source>>);
static_assert(usage_reporting_resource<arena<host_source>> && snapshot_resource<arena<host_source>>);
static_assert(has_property<arena<host_source>, host_accessible>);
static_assert(!has_property<arena<simulated_source>, host_accessible>);
static_assert(!stream_resource<arena<host_source>>);

TEST_CASE("arena conforms")
{
  arena<host_source> a;
  testing::check_conformance(a, {.max_alignment = 1 << 20, .rejects_above = 1 << 30, .host_accessible = true});
}

TEST_CASE("arena: bump, LIFO roll-back, reset and release")
{
  spy<host_source> upstream;
  {
    arena<ref<spy<host_source>>> a{ref(upstream), {.initial_chunk = 1 << 16, .max_chunk = 1 << 20}};
    char* x = static_cast<char*>(a.allocate(1000));
    char* y = static_cast<char*>(a.allocate(1000));
    CHECK(y == x + 1024);
    CHECK(upstream.allocations() == 1);
    a.deallocate(y, 1000);  // the top block: rolled back
    CHECK(a.allocate(1000) == y);
    a.deallocate(x, 1000);  // not the top: counted free, reusable only after reset()
    CHECK(a.usage().in_use == 1024);
    CHECK(a.usage().largest_free == (1 << 16) - 2048);
    CHECK(a.usage().used_blocks == 1);

    // A request too large for the current chunk moves on to a new, larger chunk.
    void* big = a.allocate(100'000);
    CHECK(upstream.allocations() == 2);
    CHECK(a.owns(big));
    a.reset();
    CHECK(a.usage().in_use == 0);
    CHECK(a.allocate(1000) == x);  // the first chunk again, nothing returned
    CHECK(upstream.allocations() == 2);
    CHECK(a.usage().reserved == upstream.outstanding_bytes());

    auto m = a.checkpoint();
    (void)a.allocate(5000);
    (void)a.allocate(200'000);
    a.rewind(m);
    CHECK(a.usage().in_use == 1024);
    CHECK(a.allocate(256) == x + 1024);
    a.release();
    CHECK(upstream.outstanding_bytes() == 0);
    CHECK(a.usage().reserved == 0);
  }
  CHECK(upstream.outstanding_blocks() == 0);
  CHECK(upstream.mismatches() == 0);
}

TEST_CASE("arena: every alignment up to the chunk size, with padding counted")
{
  arena<simulated_source> a(simulated_source{}, {.initial_chunk = 1 << 20});
  for (std::size_t align = 1; align <= (1 << 20); align *= 2) {
    void* p = a.allocate(300, align);
    CHECK(is_aligned(p, effective_alignment(align)));
  }
  CHECK_THROWS_AS((void)a.allocate(1, std::size_t{1} << 31), std::invalid_argument);
}

TEST_CASE("arena: out of memory upstream leaves it unchanged and usable")
{
  spy<host_source> upstream;
  arena<ref<spy<host_source>>> a{ref(upstream), {.initial_chunk = 1 << 16}};
  void* p = a.allocate(1000);
  const auto before = a.usage();
  upstream.refuse_above(1 << 17);
  CHECK_THROWS_AS((void)a.allocate(1 << 18), out_of_memory);
  CHECK(a.usage() == before);
  upstream.refuse_next(1);  // the geometric chunk is refused; the smallest that fits is tried next
  void* q = a.allocate(70'000);
  CHECK(q != nullptr);
  a.deallocate(q, 70'000);
  a.deallocate(p, 1000);
}

TEST_CASE("arena: randomized scratch loops never overlap and account exactly")
{
  spy<host_source> upstream;
  {
    arena<ref<spy<host_source>>> a{ref(upstream), {.initial_chunk = 1 << 16, .max_chunk = 1 << 22}};
    std::mt19937 rng(7);
    testing::live_set live;
    std::size_t consumed = 0;
    for (int step = 0; step < 100'000; ++step) {
      if (step % 500 == 0) {  // a loop iteration ends
        while (live.size() > 0) live.take(0);
        a.reset();
        consumed = 0;
      }
      const bool nested_free = live.size() > 0 && rng() % 4 == 0;
      if (nested_free) {
        const auto b = live.take(live.size() - 1);  // LIFO
        const auto before = a.usage().in_use;
        a.deallocate(b.p, b.bytes, b.alignment);
        CHECK(a.usage().in_use <= before);
        consumed = a.usage().in_use;
        continue;
      }
      const std::size_t bytes = 1 + rng() % 20'000;
      const std::size_t align = std::size_t{1} << (rng() % 13);
      void* p = a.allocate(bytes, align);
      REQUIRE(is_aligned(p, effective_alignment(align)));
      REQUIRE(live.add({p, bytes, align}));
      const auto u = a.usage();
      REQUIRE(u.in_use >= consumed + align_up(bytes, 256));
      REQUIRE(u.in_use <= u.reserved);
      REQUIRE(u.reserved == upstream.outstanding_bytes());
      consumed = u.in_use;
    }
  }
  CHECK(upstream.outstanding_bytes() == 0);
  CHECK(upstream.mismatches() == 0);
}

TEST_CASE("arena: moves hand over the chunks")
{
  spy<host_source> upstream;
  arena<ref<spy<host_source>>> a{ref(upstream)};
  void* p = a.allocate(100);
  arena<ref<spy<host_source>>> b(std::move(a));
  CHECK(b.owns(p));
  CHECK_FALSE(a.owns(p));
  CHECK(a.usage().reserved == 0);
  b.release();
  CHECK(upstream.outstanding_bytes() == 0);
}

TEST_CASE("arena: a request above the chunk cap gets a chunk of its own size")
{
  spy<simulated_source> upstream;
  arena<ref<spy<simulated_source>>> a{ref(upstream), {.initial_chunk = 1 << 16, .max_chunk = 1 << 20}};
  const std::size_t big = (std::size_t{5} << 20) + 1000;  // above 4x the cap, which it used to refuse
  void* p = a.allocate(big);
  CHECK(a.owns(p));
  CHECK(upstream.allocations() == 1);
  CHECK(upstream.outstanding_bytes() == align_up(big, 256));  // exactly the request: no doubling past the cap
  void* q = a.allocate(1000);  // the next small one gets the next chunk of the geometric series
  CHECK(upstream.outstanding_bytes() == align_up(big, 256) + (1 << 17));
  a.deallocate(q, 1000);
  a.deallocate(p, big);
}

TEST_CASE("arena: the default arena serves 5 GiB from a 141 GiB card")
{
  arena<simulated_source> a{simulated_source(std::size_t{141} << 30)};
  const std::size_t five_gib = std::size_t{5} << 30;
  void* p = a.allocate(five_gib);
  CHECK(a.usage().in_use == five_gib);
  CHECK(a.upstream().allocated_bytes() == five_gib);
  a.deallocate(p, five_gib);
  CHECK_THROWS_AS((void)a.allocate(std::size_t{142} << 30), out_of_memory);  // more than the card
}

TEST_CASE("arena: sizes near SIZE_MAX are refused without wrapping, even with room in the current chunk")
{
  arena<simulated_source> a;
  void* p = a.allocate(1000);  // a current chunk with room: a wrapped end would seem to fit
  for (std::size_t bytes : {SIZE_MAX, SIZE_MAX - 255, SIZE_MAX - 4096, SIZE_MAX / 2 + 1}) {
    CAPTURE(bytes);
    CHECK_THROWS_AS((void)a.allocate(bytes), out_of_memory);
    CHECK_THROWS_AS((void)a.allocate(bytes, 1 << 20), out_of_memory);
  }
  CHECK(a.usage().used_blocks == 1);
  a.deallocate(p, 1000);
}

TEST_CASE("arena: a moved-from arena is empty and usable")
{
  arena<simulated_source> a;
  void* p = a.allocate(1000);
  arena<simulated_source> b(std::move(a));
  void* q = a.allocate(1000);  // NOLINT(bugprone-use-after-move): the rule under test
  CHECK(a.owns(q));
  CHECK_FALSE(b.owns(q));
  a.deallocate(q, 1000);
  b.deallocate(p, 1000);
}

TEST_CASE("arena: refusals in a random workload come only from the upstream")
{
  // Frees other than the latest are no-ops until reset(): the arena fills its 128 MiB and then only refuses.
  spy<simulated_source> upstream{simulated_source(std::size_t{128} << 20)};
  arena<ref<spy<simulated_source>>> a{ref(upstream), {.initial_chunk = 1 << 16, .max_chunk = 4 << 20}};
  const auto result = testing::run_random_workload(a, {.operations = 5'000, .max_live = 100, .max_bytes = 1 << 20, .min_allocations = 1'000},
                                                   true, testing::refused_by(upstream));
  CHECK(result.refusals > 0);
}
