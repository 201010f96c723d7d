#include <doctest/doctest.h>

#include <strata/policy/size_class_pool.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>
#include "support/conformance.hpp"
#include <strata/core/ref.hpp>
#include "support/spy.hpp"

using namespace strata;
using strata::testing::spy;
using pool_over_spy = size_class_pool<ref<spy<simulated_source>>>;

static_assert(resource<size_class_pool<host_source>> && owning_resource<size_class_pool<host_source>>);
static_assert(sized_resource<size_class_pool<host_source>> && releasable_resource<size_class_pool<host_source>>);
static_assert(usage_reporting_resource<size_class_pool<host_source>> && snapshot_resource<size_class_pool<host_source>>);
static_assert(has_property<size_class_pool<host_source>, host_accessible>);
static_assert(!resettable_resource<size_class_pool<host_source>>);

TEST_CASE("size_class_pool conforms")
{
  size_class_pool<host_source> pool;
  testing::check_conformance(pool, {.max_alignment = 1 << 20, .rejects_above = 2 << 20, .host_accessible = true});
}

TEST_CASE("size_class_pool: good_size is the class, and freed blocks are reused at once")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream)};
  CHECK(pool.good_size(1) == 256);
  CHECK(pool.good_size(2049) == 2560);
  CHECK(pool.good_size(3 << 20) == 3 << 20);  // above the largest class: straight to the upstream
  void* a = pool.allocate(3000);
  pool.deallocate(a, 3000);
  CHECK(pool.allocate(2900) == a);  // same class, popped at once
  CHECK(upstream.allocations() == 1);
  void* big = pool.allocate(3 << 20);
  CHECK(upstream.allocations() == 2);
  CHECK(pool.owns(big));
  CHECK(pool.usage().in_use == 3072 + (3 << 20));
  pool.deallocate(big, 3 << 20);
  CHECK(upstream.allocations() == 2);
  CHECK(upstream.outstanding_blocks() == 1);  // the direct block went straight back
  pool.deallocate(a, 2900);
}

TEST_CASE("size_class_pool: randomized invariants over simulated and host memory")
{
  SUBCASE("simulated_source, log-uniform sizes")
  {
    spy<simulated_source> upstream;
    {
      pool_over_spy pool{ref(upstream)};
      testing::run_random_workload(pool, {.operations = 100'000, .max_live = 2000, .max_bytes = 2 << 20});
      CHECK(pool.usage().in_use == 0);
      pool.release();
      CHECK(upstream.outstanding_bytes() == 0);  // everything free: every chunk went back
    }
    CHECK(upstream.mismatches() == 0);
  }
  SUBCASE("host_source, uniform sizes")
  {
    spy<host_source> upstream;
    {
      size_class_pool<ref<spy<host_source>>> pool{ref(upstream)};
      testing::run_random_workload(pool, {.operations = 100'000, .max_live = 500, .max_bytes = 1 << 20, .log_uniform = false});
    }
    CHECK(upstream.outstanding_bytes() == 0);
    CHECK(upstream.mismatches() == 0);
  }
}

TEST_CASE("size_class_pool: release returns exactly the chunks whose slabs are all free")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream)};
  std::vector<void*> small;
  for (int i = 0; i < 2000; ++i) small.push_back(pool.allocate(256));  // 2000 x 256 B: 8 slabs of 64 KiB, one chunk
  void* keep = pool.allocate(512 << 10);
  const std::size_t chunks = pool.usage().chunks;
  CHECK(chunks >= 2);
  for (void* p : small) pool.deallocate(p, 256);
  pool.release();
  const auto u = pool.usage();
  CHECK(u.used_blocks == 1);
  CHECK(pool.owns(keep));
  CHECK(upstream.outstanding_bytes() == u.reserved);
  CHECK(u.chunks < chunks);
  pool.deallocate(keep, 512 << 10);
  pool.release();
  CHECK(upstream.outstanding_bytes() == 0);
  CHECK(pool.usage() == strata::usage{});
}

TEST_CASE("size_class_pool: out of memory leaves it unchanged and usable")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream)};
  void* p = pool.allocate(1000);
  const auto before = pool.usage();
  upstream.refuse_next(1);
  CHECK_THROWS_WITH_AS((void)pool.allocate(5 << 20), doctest::Contains("size_class_pool: out of memory allocating 5242880 bytes"), out_of_memory);
  upstream.refuse_next(1);
  CHECK_THROWS_AS((void)pool.allocate(100'000), out_of_memory);  // needs a new slab in a new chunk
  CHECK(pool.usage() == before);
  pool.deallocate(p, 1000);
  testing::check_still_usable(pool);
}

TEST_CASE("size_class_pool: snapshot shows slabs and their blocks")
{
  size_class_pool<simulated_source> pool;
  void* a = pool.allocate(256);
  void* b = pool.allocate(256);
  pool.deallocate(a, 256);
  const auto s = pool.snapshot();
  REQUIRE(s.segments.size() == 1);
  std::size_t used = 0, free = 0;
  for (const auto& blk : s.segments[0].blocks) (blk.free ? free : used) += 1;
  CHECK(used == 1);
  CHECK(free == 255);
  CHECK(to_json(s).find("\"box\":\"size_class_pool\"") != std::string::npos);
  pool.deallocate(b, 256);
}
