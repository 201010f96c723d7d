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

namespace {
/// Addresses from a source that promises no more than 256-byte alignment, like cudaMalloc.
struct aligns_256 : simulated_source {
  static constexpr std::size_t max_alignment = 256;
  aligns_256() {}  // NOLINT(modernize-use-equals-default): value-initialised by the pool, through the explicit base
};
} // namespace

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
      const auto result = testing::run_random_workload(pool, {.operations = 100'000, .max_live = 2000, .max_bytes = 2 << 20});
      CHECK(result.allocations > 45'000);  // about half the operations; none refused
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
      const auto result = testing::run_random_workload(pool, {.operations = 100'000, .max_live = 500, .max_bytes = 1 << 20, .log_uniform = false});
      CHECK(result.allocations > 45'000);
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

TEST_CASE("size_class_pool: chunks below 64 KiB are supported (a slab is then one chunk)")
{
  using tiny = size_class_pool<simulated_source, 4096>;
  {
    tiny pool{simulated_source{}, {.chunk_size = 8192}};
    testing::check_conformance(pool, {.max_alignment = 8192, .rejects_above = 8192});
  }
  spy<simulated_source> upstream;
  {
    size_class_pool<ref<spy<simulated_source>>, 4096> pool{ref(upstream), {.chunk_size = 8192}};
    void* a = pool.allocate(4096);
    void* b = pool.allocate(4096);
    CHECK(pool.usage().chunks == 1);  // two 4 KiB blocks in one 8 KiB slab
    CHECK(pool.usage().reserved == 8192);
    void* c = pool.allocate(256);  // another class: its own slab, its own chunk
    CHECK(pool.usage().chunks == 2);
    pool.deallocate(a, 4096);
    pool.deallocate(b, 4096);
    pool.deallocate(c, 256);
    const auto result = testing::run_random_workload(pool, {.operations = 20'000, .max_live = 300, .max_bytes = 16 << 10});
    CHECK(result.allocations > 9'000);
    pool.release();
    CHECK(upstream.outstanding_bytes() == 0);
  }
  CHECK(upstream.mismatches() == 0);
  CHECK_THROWS_WITH_AS(tiny(simulated_source{}, {.chunk_size = 2048}), doctest::Contains("2048"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(tiny(simulated_source{}, {.chunk_size = 12288}), doctest::Contains("12288"), std::invalid_argument);
}

TEST_CASE("size_class_pool: sizes no block can hold are out_of_memory, computed without overflow")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream)};
  CHECK(pool.good_size(SIZE_MAX) == SIZE_MAX);
  CHECK(pool.good_size(SIZE_MAX - 100) == SIZE_MAX);
  CHECK(pool.good_size(5 << 20) == 5 << 20);
  // Over a source that aligns only 256 bytes, a direct block has room to align inside: that must not wrap.
  size_class_pool<aligns_256> small;
  CHECK(small.good_size(SIZE_MAX - 300, 1 << 20) == SIZE_MAX);
  CHECK(small.good_size(1 << 21, 1 << 20) == (1 << 21) + (1 << 20) - 256);
  CHECK_THROWS_AS((void)small.allocate(SIZE_MAX - 300, 1 << 20), out_of_memory);
  for (std::size_t bytes : {SIZE_MAX, SIZE_MAX - 255, SIZE_MAX - 300}) {
    CAPTURE(bytes);
    CHECK_THROWS_AS((void)pool.allocate(bytes), out_of_memory);
    CHECK_THROWS_AS((void)pool.allocate(bytes, 1 << 20), out_of_memory);
  }
  CHECK(upstream.outstanding_blocks() == 0);
  testing::check_still_usable(pool);
}

TEST_CASE("size_class_pool: release with a live block in every chunk returns nothing and changes nothing")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream)};
  void* a = pool.allocate(256);
  void* b = pool.allocate(300'000);
  const auto before = pool.usage();
  pool.release();
  CHECK(pool.usage() == before);
  CHECK(upstream.frees() == 0);
  pool.deallocate(a, 256);
  pool.deallocate(b, 300'000);
  pool.release();
  CHECK(upstream.outstanding_bytes() == 0);
}

TEST_CASE("size_class_pool: a moved-from pool is empty and usable")
{
  pool_over_spy::options opts{.chunk_size = 4 << 20};
  spy<simulated_source> upstream;
  testing::check_move_leaves_empty_usable(pool_over_spy{ref(upstream), opts});
  // Over a source held by value, the moved-from source reserves afresh.
  size_class_pool<simulated_source> c;
  size_class_pool<simulated_source> d(std::move(c));
  testing::check_still_usable(c);  // NOLINT(bugprone-use-after-move)
}

TEST_CASE("size_class_pool: refusals in a random workload come only from the upstream")
{
  spy<simulated_source> upstream{simulated_source(std::size_t{64} << 20)};
  pool_over_spy pool{ref(upstream)};
  const auto result = testing::run_random_workload(pool, {.operations = 20'000, .max_live = 400, .max_bytes = 2 << 20}, true,
                                                   testing::refused_by(upstream));
  CHECK(result.refusals > 0);
  CHECK(result.allocations > 8'000);
}
