// The four policies over real device memory: randomized invariants (host bookkeeping, never touching the
// blocks), then kernels writing and reading blocks, and everything back at cudaFree at the end.
#include <doctest/doctest.h>

#include <strata/core/ref.hpp>
#include <strata/policy/arena.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/device_source.hpp>
#include "../support/conformance.hpp"
#include "../support/spy.hpp"
#include "kernels.cuh"

using namespace strata;
using strata::testing::spy;

namespace {

/// Allocates blocks of many sizes, has a kernel fill each with its own pattern, then checks every one:
/// overlapping blocks would overwrite each other's patterns.
template <class Pool>
void check_blocks_hold_their_data(Pool& pool)
{
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t i = 0; i < 64; ++i) {
    const std::size_t bytes = 1024 + (i * 7919 % 64) * 8192;
    blocks.emplace_back(pool.allocate(bytes), bytes);
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) strata::testing::fill(blocks[i].first, blocks[i].second, static_cast<std::uint32_t>(i));
  for (std::size_t i = 0; i < blocks.size(); ++i)
    CHECK(strata::testing::mismatches(blocks[i].first, blocks[i].second, static_cast<std::uint32_t>(i)) == 0);
  for (auto [p, n] : blocks) pool.deallocate(p, n);
}

template <class Pool>
void check_policy_on_device(Pool& pool, spy<device_source>& upstream)
{
  testing::run_random_workload(pool, {.operations = 100'000, .max_live = 1000, .max_bytes = 4 << 20, .max_alignment = 1 << 16});
  check_blocks_hold_their_data(pool);
  testing::check_conformance(pool, {.max_alignment = 1 << 16, .rejects_above = 0, .device_accessible = true});
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(upstream.mismatches() == 0);
}

} // namespace

TEST_SUITE("gpu")
{
TEST_CASE("coalescing_pool over device_source")
{
  spy<device_source> upstream;
  {
    coalescing_pool<ref<spy<device_source>>> pool{ref(upstream)};
    check_policy_on_device(pool, upstream);
  }
  CHECK(upstream.outstanding_bytes() == 0);
}

TEST_CASE("size_class_pool over device_source")
{
  spy<device_source> upstream;
  {
    size_class_pool<ref<spy<device_source>>> pool{ref(upstream)};
    check_policy_on_device(pool, upstream);
  }
  CHECK(upstream.outstanding_bytes() == 0);
}

TEST_CASE("buddy_pool over device_source")
{
  spy<device_source> upstream;
  {
    buddy_pool<ref<spy<device_source>>> pool{ref(upstream), {.region_size = 256 << 20}};
    check_policy_on_device(pool, upstream);
  }
  CHECK(upstream.outstanding_bytes() == 0);
}

TEST_CASE("arena over device_source: scratch loops with kernels")
{
  spy<device_source> upstream;
  {
    arena<ref<spy<device_source>>> scratch{ref(upstream)};
    check_blocks_hold_their_data(scratch);
    scratch.reset();
    const std::size_t chunks_after_first_iteration = upstream.allocations();
    for (int iteration = 1; iteration < 20; ++iteration) {
      check_blocks_hold_their_data(scratch);
      scratch.reset();
    }
    CHECK(upstream.allocations() == chunks_after_first_iteration);  // chunks are reused, never re-allocated
    testing::check_conformance(scratch, {.max_alignment = 1 << 16, .rejects_above = 1 << 30, .device_accessible = true});
  }
  CHECK(upstream.outstanding_bytes() == 0);
  CHECK(upstream.mismatches() == 0);
}

TEST_CASE("a pool's out_of_memory on the device names the pool and leaves no CUDA error")
{
  std::size_t free_bytes = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess);
  coalescing_pool<device_source> pool;
  void* p = pool.allocate(1 << 20);
  try {
    (void)pool.allocate(total + (std::size_t{1} << 30));
    FAIL("allocated more than the device has");
  } catch (const out_of_memory& e) {
    CHECK(std::string(e.what()).find("coalescing_pool: out of memory allocating") == 0);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  strata::testing::check_device_round_trip(p, 1 << 20);
  pool.deallocate(p, 1 << 20);
}
}
