#include <doctest/doctest.h>

#include <strata/policy/buddy_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>
#include "support/conformance.hpp"
#include <strata/core/ref.hpp>
#include "support/spy.hpp"

using namespace strata;
using strata::testing::spy;
using pool_over_spy = buddy_pool<ref<spy<simulated_source>>>;

namespace {
/// Host memory from a source that promises no more than 256-byte alignment, like cudaMalloc.
struct small_alignment_host : host_source {
  static constexpr std::size_t max_alignment = 256;
};
} // namespace

static_assert(resource<buddy_pool<host_source>> && owning_resource<buddy_pool<host_source>>);
static_assert(sized_resource<buddy_pool<host_source>> && releasable_resource<buddy_pool<host_source>>);
static_assert(usage_reporting_resource<buddy_pool<host_source>> && snapshot_resource<buddy_pool<host_source>>);
static_assert(cccl::synchronous_resource_with<buddy_pool<device_source>, device_accessible>);

TEST_CASE("buddy_pool conforms")
{
  buddy_pool<host_source> pool(host_source{}, {.region_size = 64 << 20});
  testing::check_conformance(pool, {.max_alignment = 1 << 20, .rejects_above = 64 << 20, .host_accessible = true});
}

TEST_CASE("buddy_pool: power-of-two blocks, naturally aligned, buddies found by XOR")
{
  buddy_pool<simulated_source> pool(simulated_source{}, {.region_size = 1 << 20});
  CHECK(pool.good_size(1) == 256);
  CHECK(pool.good_size(257) == 512);
  CHECK(pool.good_size(33 << 10) == 64 << 10);
  char* a = static_cast<char*>(pool.allocate(256));
  char* b = static_cast<char*>(pool.allocate(256));
  CHECK((reinterpret_cast<std::uintptr_t>(a) ^ reinterpret_cast<std::uintptr_t>(b)) == 256);  // buddies
  char* c = static_cast<char*>(pool.allocate(100 << 10));
  CHECK(is_aligned(c, 128 << 10));  // naturally aligned to its block size
  // Splitting left one free upper half at each of orders 1..8, 10 and 11 (c took order 9's). Freeing a
  // cannot merge (its buddy b is in use): one more free block.
  pool.deallocate(a, 256);
  CHECK(pool.usage().free_blocks == 11);
  pool.deallocate(b, 256);
  auto s = pool.snapshot();
  REQUIRE(s.segments.size() == 1);
  CHECK(s.segments[0].blocks.front() == block_info{0, 128 << 10, true, -1});  // a and b merged back to 128 KiB
  pool.deallocate(c, 100 << 10);
  s = pool.snapshot();
  CHECK(s.segments[0].blocks.size() == 1);  // the whole region is one free block again
  CHECK(s.segments[0].blocks[0].free);
}

TEST_CASE("buddy_pool: a 33 MiB request takes a 64 MiB block")
{
  buddy_pool<simulated_source> pool;
  void* p = pool.allocate(33 << 20);
  CHECK(pool.usage().in_use == 64 << 20);
  CHECK(pool.usage().largest_free == 512 << 20);
  pool.deallocate(p, 33 << 20);
}

TEST_CASE("buddy_pool: randomized invariants")
{
  SUBCASE("simulated_source")
  {
    spy<simulated_source> upstream;
    {
      pool_over_spy pool{ref(upstream), {.region_size = 256 << 20}};
      const auto result = testing::run_random_workload(pool, {.operations = 100'000, .max_live = 2000, .max_bytes = 16 << 20, .max_alignment = 1 << 20});
      CHECK(result.allocations > 45'000);  // about half the operations; none refused
      const auto u = pool.usage();
      CHECK(u.free_blocks == u.chunks);  // everything merged back into whole regions
      pool.release();
      CHECK(upstream.outstanding_bytes() == 0);
    }
    CHECK(upstream.mismatches() == 0);
  }
  SUBCASE("host_source with 256-byte-aligned regions: over-aligned requests are aligned inside their block")
  {
    spy<small_alignment_host> upstream;
    {
      buddy_pool<ref<spy<small_alignment_host>>> pool{ref(upstream), {.region_size = 64 << 20}};
      const auto result = testing::run_random_workload(pool, {.operations = 30'000, .max_live = 500, .max_bytes = 1 << 20, .max_alignment = 1 << 16});
      CHECK(result.allocations > 13'000);
    }
    CHECK(upstream.outstanding_bytes() == 0);
    CHECK(upstream.mismatches() == 0);
  }
}

TEST_CASE("buddy_pool: a region can be smaller when the upstream has less")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream), {.region_size = 64 << 20}};
  upstream.refuse_above(16 << 20);
  void* p = pool.allocate(1 << 20);
  CHECK(pool.usage().reserved == 16 << 20);
  const auto before = pool.usage();
  CHECK_THROWS_WITH_AS((void)pool.allocate(32 << 20), doctest::Contains("buddy_pool: out of memory allocating 33554432 bytes"), out_of_memory);
  CHECK(pool.usage() == before);
  pool.deallocate(p, 1 << 20);
  CHECK(pool.release() == 16 << 20);
  CHECK(upstream.outstanding_bytes() == 0);
}

TEST_CASE("buddy_pool: release returns exactly the wholly free regions")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream), {.region_size = 1 << 20}};
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(pool.allocate(512 << 10));  // two a region: 4 regions
  CHECK(pool.usage().chunks == 4);
  pool.deallocate(blocks[0], 512 << 10);
  pool.deallocate(blocks[1], 512 << 10);  // region 0 wholly free
  pool.deallocate(blocks[2], 512 << 10);  // region 1 half free
  CHECK(pool.release() == 1 << 20);
  CHECK(pool.usage().chunks == 3);
  CHECK(upstream.outstanding_bytes() == 3 << 20);
  for (int i = 3; i < 8; ++i) pool.deallocate(blocks[i], 512 << 10);
  CHECK(pool.release() == 3 << 20);
  // A new region may land where an old one was: stale list entries must not confuse it.
  void* p = pool.allocate(256);
  pool.deallocate(p, 256);
  CHECK(pool.usage().free_blocks == 1);
}

TEST_CASE("buddy_pool: sizes no block can hold are out_of_memory, computed without overflow")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream), {.region_size = 1 << 20}};
  const std::size_t largest = std::size_t{1} << 56;
  CHECK(pool.good_size(SIZE_MAX) == SIZE_MAX);  // used to shift by 64
  CHECK(pool.good_size(largest + 1) == SIZE_MAX);
  CHECK(pool.good_size(largest) == largest);
  CHECK(pool.good_size(largest, 1 << 20) == largest);
  CHECK(pool.good_size(1000, 1 << 20) == 1 << 20);
  for (std::size_t bytes : {SIZE_MAX, SIZE_MAX - 255, largest + 1}) {
    CAPTURE(bytes);
    CHECK_THROWS_WITH_AS((void)pool.allocate(bytes), doctest::Contains(std::to_string(bytes).c_str()), out_of_memory);
  }
  CHECK_THROWS_AS((void)pool.allocate(largest), out_of_memory);  // a valid size the upstream cannot give
  CHECK(upstream.outstanding_blocks() == 0);
  // Over a source that aligns only 256 bytes, a block makes room to align inside: that room must not wrap either.
  buddy_pool<small_alignment_host> small{small_alignment_host{}, {.region_size = std::size_t{1} << 62}};
  CHECK(small.good_size(largest, std::size_t{1} << 60) == SIZE_MAX);
  CHECK_THROWS_AS((void)small.allocate(largest, std::size_t{1} << 60), out_of_memory);
  testing::check_still_usable(pool);
}

TEST_CASE("buddy_pool: a moved-from pool is empty and usable")
{
  spy<simulated_source> upstream;
  testing::check_move_leaves_empty_usable(pool_over_spy{ref(upstream), {.region_size = 1 << 20}});
  buddy_pool<simulated_source> c{simulated_source{}, {.region_size = 1 << 20}};
  buddy_pool<simulated_source> d(std::move(c));
  testing::check_still_usable(c);  // NOLINT(bugprone-use-after-move)
}

TEST_CASE("buddy_pool: refusals in a random workload come only from the upstream")
{
  spy<simulated_source> upstream{simulated_source(std::size_t{16} << 20)};
  pool_over_spy pool{ref(upstream), {.region_size = 4 << 20}};
  const auto result = testing::run_random_workload(pool, {.operations = 20'000, .max_live = 1'000, .max_bytes = 2 << 20}, true,
                                                   testing::refused_by(upstream));
  CHECK(result.refusals > 0);
  CHECK(result.allocations > 8'000);
}
