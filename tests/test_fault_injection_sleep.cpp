// Fault injection for pause and resume: the N-th host allocation inside them fails, for every N a clean cycle
// makes. After each failure the pool agrees with the device, the tag is running or paused (never half), a
// paused tag wakes once memory is there again, and every byte of its backup comes back; through default_pool,
// a CUDA graph's private pool keeps its blocks and their contents.
#include <doctest/doctest.h>

#include <cstdint>
#include <new>
#include <utility>
#include <vector>

#include <strata/default_pool.hpp>
#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/stream/simulated_streams.hpp>
#include "support/fault_injection.hpp"

using namespace strata;
namespace hf = strata::testing::host_faults;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
using pool_t = mapped_pool<simulated_pages>;

void stamp(pool_t& pool, void* p, std::uint32_t seed)
{
  std::vector<unsigned char> v(64);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<unsigned char>(seed + i * 3);
  pool.backend().write(reinterpret_cast<std::uintptr_t>(p), v.data(), v.size());
}

bool stamped(const pool_t& pool, const void* p, std::uint32_t seed)
{
  std::vector<unsigned char> v(64);
  pool.backend().read(reinterpret_cast<std::uintptr_t>(p), v.data(), v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] != static_cast<unsigned char>(seed + i * 3)) return false;
  return true;
}

} // namespace

TEST_CASE("fault injection: pause and resume when a host allocation fails at every point")
{
  std::size_t failures = 0, clean_at = 0;
  for (std::size_t n = 1; n < 10'000; ++n) {
    pool_t pool;
    std::vector<std::pair<void*, std::size_t>> blocks;
    for (std::uint32_t i = 0; i < 12; ++i) {
      const std::size_t bytes = i % 3 == 0 ? 5 * mib : 3000 * (i + 1);
      blocks.emplace_back(pool.allocate_tagged(1, bytes), bytes);
      stamp(pool, blocks.back().first, i);
    }
    void* other = pool.allocate(mib);
    bool failed = false;
    {
      hf::counted_section counting;
      hf::arm(n);
      try {
        pool.pause({1});
        pool.resume({1});
      } catch (const std::bad_alloc&) {
        failed = true;
      }
      hf::disarm();
    }
    REQUIRE(pool.physical_bytes() == pool.backend().bytes_alive());
    REQUIRE(pool.backup_bytes() == pool.backend().pinned_bytes());
    if (pool.paused(1)) {
      pool.resume({1});
    }
    (void)pool.release();
    REQUIRE(pool.physical_bytes() == pool.backend().bytes_alive());
    for (std::uint32_t i = 0; i < blocks.size(); ++i) {
      REQUIRE(pool.owns(blocks[i].first));
      REQUIRE(pool.backend().is_usable(reinterpret_cast<std::uintptr_t>(blocks[i].first), blocks[i].second));
      REQUIRE(stamped(pool, blocks[i].first, i));
    }
    for (auto [p, bytes] : blocks) pool.deallocate(p, bytes);
    pool.deallocate(other, mib);
    if (!failed) {
      clean_at = n;
      break;
    }
    ++failures;
  }
  MESSAGE("host allocations failed at " << failures << " points of a pause and resume; a clean cycle at allocation " << clean_at);
  CHECK(failures > 10);
  CHECK(clean_at == failures + 1);
}

TEST_CASE("fault injection: default_pool pause and resume of two tags, one holding a graph's private pool, when a host allocation fails at every point")
{
  std::size_t failures = 0, clean_at = 0;
  for (std::size_t n = 1; n < 10'000; ++n) {
    simulated_streams world;
    planning_pool pool{mapped_pool<simulated_pages>{simulated_pages{2 * mib, std::size_t{1} << 30}}, {}, simulated_events{world}};
    const cuda::stream_ref s = world.create();
    pool.deallocate_async(pool.allocate_async(mib, 256, s), mib, 256, s);
    std::vector<std::pair<void*, std::size_t>> blocks;
    void* graph = nullptr;
    {
      tag_scope engine(1);
      (void)world.begin_capture(s);
      blocks.emplace_back(pool.allocate_async(3 * mib, 256, s), 3 * mib);  // the graph's output: live
      void* temp = pool.allocate_async(5 * mib, 256, s);
      pool.deallocate_async(temp, 5 * mib, 256, s);  // free in the graph's pool
      blocks.emplace_back(temp, 5 * mib);
      graph = world.end_capture(s);
      pool.deallocate_async(pool.allocate_async(256, 256, s), 256, 256, s);  // the layer sees the capture over
    }
    blocks.emplace_back(pool.policy().allocate_tagged(2, 7 * mib), 7 * mib);
    for (std::uint32_t i = 0; i < blocks.size(); ++i) stamp(pool.policy(), blocks[i].first, i);
    const std::size_t pool_blocks = pool.private_pool_blocks(), free_blocks = pool.private_pool_free_blocks();
    world.finish_all();
    bool failed = false;
    {
      hf::counted_section counting;
      hf::arm(n);
      try {
        pause(pool, {1, 2});
        resume(pool, {1, 2});
      } catch (const std::bad_alloc&) {
        failed = true;
      }
      hf::disarm();
    }
    REQUIRE(pool.policy().physical_bytes() == pool.policy().backend().bytes_alive());
    REQUIRE(pool.policy().backup_bytes() == pool.policy().backend().pinned_bytes());
    REQUIRE(pool.private_pool_blocks() == pool_blocks);
    REQUIRE(pool.private_pool_free_blocks() == free_blocks);
    for (const tag_id t : {tag_id{1}, tag_id{2}})
      if (pool.policy().paused(t)) resume(pool, {t});
    for (std::uint32_t i = 0; i < blocks.size(); ++i) {
      REQUIRE(pool.owns(blocks[i].first));
      REQUIRE(pool.policy().backend().is_usable(reinterpret_cast<std::uintptr_t>(blocks[i].first), blocks[i].second));
      REQUIRE(stamped(pool.policy(), blocks[i].first, i));
    }
    world.destroy_graph(graph);
    pool.deallocate_async(blocks[0].first, blocks[0].second, 256, s);
    pool.policy().deallocate(blocks[2].first, blocks[2].second);
    world.finish_all();
    pool.release();
    REQUIRE(pool.private_pools() == 0);
    REQUIRE(pool.policy().usage().in_use == 0);
    if (!failed) {
      clean_at = n;
      break;
    }
    ++failures;
  }
  MESSAGE("host allocations failed at " << failures << " points of a default_pool pause and resume; a clean cycle at allocation " << clean_at);
  CHECK(failures > 10);
  CHECK(clean_at == failures + 1);
}
