// Adaptors over real device memory: the recipes of the examples, checked by kernels.
#include <doctest/doctest.h>

#include <strata/adaptor/fallback.hpp>
#include <strata/adaptor/limit.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/adaptor/thread_cached.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/pinned_source.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "../support/conformance.hpp"
#include "kernels.cuh"

using namespace strata;

TEST_SUITE("gpu")
{
TEST_CASE("limit::fraction_of_device caps at that fraction of the card's memory")
{
  std::size_t free_bytes = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess);
  auto capped = limit<coalescing_pool<device_source>>::fraction_of_device(coalescing_pool<device_source>{}, 0.5);
  CHECK(capped.max_bytes() == static_cast<std::size_t>(static_cast<double>(total) * 0.5));
  CHECK_THROWS_AS(capped.allocate(capped.max_bytes() + 1), out_of_memory);  // refused before cudaMalloc
  void* p = capped.allocate(64 << 20);
  strata::testing::check_device_round_trip(p, 64 << 20);
  capped.deallocate(p, 64 << 20);
  CHECK(capped.bytes_in_use() == 0);
}

TEST_CASE("fallback: device pool first, pinned pool when it is full; kernels use both tiers")
{
  using fast = coalescing_pool<device_source>;
  using slow = coalescing_pool<pinned_source>;
  fallback<fast, slow> tiers{fast{device_source{}, {.initial_chunk = 32 << 20, .max_chunk = 32 << 20, .max_reserved = 32 << 20}},
                             slow{pinned_source{}, {.initial_chunk = 32 << 20}}};
  static_assert(has_property<decltype(tiers), device_accessible> && !has_property<decltype(tiers), host_accessible>);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(tiers.allocate(12 << 20));
  CHECK(tiers.served_by_primary() == 2);
  CHECK(tiers.served_by_secondary() == 2);
  for (std::size_t i = 0; i < blocks.size(); ++i) strata::testing::fill(blocks[i], 12 << 20, 40 + i);
  for (std::size_t i = 0; i < blocks.size(); ++i) CHECK(strata::testing::mismatches(blocks[i], 12 << 20, 40 + i) == 0);
  for (void* p : blocks) tiers.deallocate(p, 12 << 20);
  CHECK(tiers.primary().usage().in_use == 0);
  CHECK(tiers.secondary().usage().in_use == 0);
}

TEST_CASE("statistics over stream_ordered device memory counts stream-ordered calls")
{
  statistics<stream_ordered<coalescing_pool<device_source>>> counted;
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  void* p = counted.allocate_async(1 << 20, 256, s);
  strata::testing::check_device_round_trip(p, 1 << 20, 3, s);
  counted.deallocate_async(p, 1 << 20, 256, s);
  CHECK(counted.snapshot_counts().total_bytes == 1 << 20);
  CHECK(counted.snapshot_counts().current_bytes == 0);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("thread_cached over device memory conforms")
{
  thread_cached<coalescing_pool<device_source>> pool;
  testing::check_conformance(pool, {.max_alignment = 1 << 16, .rejects_above = 0, .device_accessible = true});
  testing::run_random_workload(pool, {.operations = 20'000, .max_live = 300, .max_alignment = 1 << 12});
  pool.release();
}
}
