// pause and resume through the stream layer (planning_pool: stream_ordered over mapped_pool, simulated pages
// and simulated streams): blocks cached by the stream layer go back to the pool before a tag sleeps.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <strata/default_pool.hpp>
#include <strata/stream/simulated_streams.hpp>

using namespace strata;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

void stamp(planning_pool& pool, void* p, std::size_t bytes, std::uint32_t seed)
{
  std::vector<unsigned char> v(std::min<std::size_t>(bytes, 64));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<unsigned char>(seed * 29 + i);
  pool.policy().backend().write(reinterpret_cast<std::uintptr_t>(p), v.data(), v.size());
}

bool stamped(planning_pool& pool, void* p, std::size_t bytes, std::uint32_t seed)
{
  std::vector<unsigned char> want(std::min<std::size_t>(bytes, 64)), got(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<unsigned char>(seed * 29 + i);
  pool.policy().backend().read(reinterpret_cast<std::uintptr_t>(p), got.data(), got.size());
  return got == want;
}

} // namespace

TEST_CASE("default_pool pause: blocks the stream layer caches go back to the pool first; resume brings the live ones back")
{
  simulated_streams world;
  planning_pool pool{mapped_pool<simulated_pages>{simulated_pages{2 * mib, std::size_t{1} << 30}}, {}, simulated_events{world}};
  const cuda::stream_ref main{cudaStreamLegacy};
  const cuda::stream_ref side = world.create();
  std::vector<void*> weights;
  {
    tag_scope trainer(1);
    for (int i = 0; i < 10; ++i) {
      weights.push_back(pool.allocate_async(3 * mib, 256, main));
      stamp(pool, weights.back(), 3 * mib, static_cast<std::uint32_t>(i));
    }
    void* scratch = pool.allocate_async(5 * mib, 256, side);  // freed on a stream that does not own the pool: cached
    world.launch(side);
    pool.deallocate_async(scratch, 5 * mib, 256, side);
  }
  REQUIRE(pool.cached_blocks() + pool.set_aside_blocks() > 0);
  world.finish_all();
  pause(pool, {1});
  CHECK(pool.cached_blocks() == 0);
  CHECK(pool.policy().paused(1));
  CHECK(pool.policy().physical_bytes(1) == 0);
  CHECK(pool.policy().paused_bytes(1) == 30 * mib);  // the live weights only: the cached block is not backed up
  CHECK(pool.policy().backend().bytes_alive() == pool.policy().physical_bytes());
  resume(pool, {1});
  for (std::size_t i = 0; i < weights.size(); ++i) CHECK(stamped(pool, weights[i], 3 * mib, static_cast<std::uint32_t>(i)));
  for (void* p : weights) pool.deallocate_async(p, 3 * mib, 256, main);
}

TEST_CASE("default_pool sleep: a randomized workload on three streams and three tags")
{
  simulated_streams world;
  planning_pool pool{mapped_pool<simulated_pages>{simulated_pages{2 * mib, std::size_t{2} << 30}}, {}, simulated_events{world}};
  const cuda::stream_ref streams[] = {cuda::stream_ref{cudaStreamLegacy}, world.create(), world.create()};
  std::mt19937_64 rnd(7);
  struct live {
    tag_id tag;
    std::size_t bytes;
    std::uint32_t seed;
    int stream;
  };
  std::map<void*, live> blocks;
  std::set<tag_id> asleep;
  std::size_t allocs = 0, frees = 0, pauses = 0, resumes = 0, verified = 0;
  std::uint32_t seed = 1;
  for (int step = 0; step < 4000; ++step) {
    const auto r = rnd() % 100;
    const tag_id tag = static_cast<tag_id>(rnd() % 3);
    const int s = static_cast<int>(rnd() % 3);
    if (r < 55) {
      if (asleep.count(tag) != 0) continue;
      const std::size_t bytes = 1 + rnd() % (rnd() % 5 == 0 ? 8 * mib : 200 * 1024);
      tag_scope scope(tag);
      void* p = pool.allocate_async(bytes, 256, streams[s]);
      world.launch(streams[s]);
      stamp(pool, p, bytes, seed);
      blocks[p] = {tag, bytes, seed++, s};
      ++allocs;
    } else if (r < 90) {
      if (blocks.size() < 10) continue;
      auto it = blocks.begin();
      std::advance(it, static_cast<long>(rnd() % blocks.size()));
      if (asleep.count(it->second.tag) != 0) continue;  // a sleeping block freed on a stream could be cached and handed out unmapped
      pool.deallocate_async(it->first, it->second.bytes, 256, streams[s]);
      blocks.erase(it);
      ++frees;
    } else if (r < 95) {
      if (asleep.count(tag) != 0 || pool.policy().in_use(tag) == 0) continue;
      world.finish_all();
      pause(pool, {tag});
      asleep.insert(tag);
      ++pauses;
      REQUIRE(pool.policy().physical_bytes(tag) == 0);
    } else {
      if (asleep.count(tag) == 0) continue;
      resume(pool, {tag});
      asleep.erase(tag);
      ++resumes;
      for (const auto& [p, b] : blocks)
        if (b.tag == tag) {
          REQUIRE(stamped(pool, p, b.bytes, b.seed));
          ++verified;
        }
    }
    if (step % 20 == 0) world.finish_all();
    REQUIRE(pool.policy().backend().bytes_alive() == pool.policy().physical_bytes());
    for (tag_id t : asleep) REQUIRE(pool.policy().physical_bytes(t) == 0);
  }
  MESSAGE("allocations " << allocs << ", frees " << frees << ", pauses " << pauses << ", resumes " << resumes << ", blocks verified " << verified);
  CHECK(allocs > 1200);
  CHECK(frees > 700);
  CHECK(pauses > 40);
  CHECK(resumes > 40);
  CHECK(verified > 500);
  world.finish_all();
  for (tag_id t : std::set<tag_id>(asleep)) resume(pool, {t});
  for (const auto& [p, b] : blocks) pool.deallocate_async(p, b.bytes, 256, streams[b.stream]);
}
