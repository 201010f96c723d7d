// pause and resume through the stream layer (planning_pool: stream_ordered over mapped_pool, simulated pages
// and simulated streams): blocks cached by the stream layer go back to the pool before a tag sleeps, a cached
// block serves only allocations under its own tag, and a sleeping tag's blocks are never served.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <strata/core/errors.hpp>
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

/// Frees on `main` outnumber the side streams' frees, so main keeps owning the pool and a side stream's frees
/// stay cached there.
void churn(planning_pool& pool, cuda::stream_ref main)
{
  for (int i = 0; i < 3; ++i) pool.deallocate_async(pool.allocate_async(mib, 256, main), mib, 256, main);
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

TEST_CASE("default_pool: a block freed on a stream that does not own the pool serves only allocations under its own tag")
{
  simulated_streams world;
  planning_pool pool{mapped_pool<simulated_pages>{simulated_pages{2 * mib, std::size_t{1} << 30}}, {}, simulated_events{world}};
  const cuda::stream_ref main{cudaStreamLegacy};
  const cuda::stream_ref side = world.create();
  churn(pool, main);  // main owns the pool
  void* a = nullptr;
  {
    tag_scope trainer(1);
    a = pool.allocate_async(3 * mib, 256, side);
    world.launch(side);
    pool.deallocate_async(a, 3 * mib, 256, side);
  }
  REQUIRE(pool.cached_blocks() == 1);
  REQUIRE(pool.policy().tag_of(a) == 1);
  std::vector<std::pair<void*, tag_id>> others;
  for (const tag_id t : {tag_id{2}, tag_id{0}, tag_id{2}}) {
    churn(pool, main);
    tag_scope scope(t);
    void* p = pool.allocate_async(3 * mib, 256, side);
    CHECK(p != a);
    CHECK(pool.policy().tag_of(p) == t);
    others.emplace_back(p, t);
  }
  CHECK(pool.cached_blocks() == 1);
  const auto hits = pool.stats().hits;
  {
    tag_scope trainer(1);
    CHECK(pool.allocate_async(3 * mib, 256, side) == a);  // its own tag reuses it at once
  }
  CHECK(pool.stats().hits == hits + 1);
  CHECK(pool.cached_blocks() == 0);
  // Pausing tag 1 leaves the blocks served to tags 0 and 2 mapped.
  for (const auto& [p, t] : others) stamp(pool, p, 3 * mib, t);
  world.finish_all();
  pause(pool, {1});
  for (const auto& [p, t] : others) CHECK(stamped(pool, p, 3 * mib, t));
  CHECK(pool.policy().paused_bytes(1) == 3 * mib);
  resume(pool, {1});
  pool.deallocate_async(a, 3 * mib, 256, main);
  for (const auto& [p, t] : others) pool.deallocate_async(p, 3 * mib, 256, side);
  world.finish_all();
  pool.release();
  CHECK(pool.policy().usage().in_use == 0);
}

TEST_CASE("default_pool: when the device is full, a block of another tag cached on another stream is not handed over")
{
  for (const tag_id taker : {tag_id{1}, tag_id{2}}) {
    CAPTURE(taker);
    simulated_streams world;
    planning_pool::options opts;
    opts.frees_per_event = 1;  // every free on a side stream records an event: its block may be handed over
    planning_pool pool{mapped_pool<simulated_pages>{simulated_pages{2 * mib, 8 * mib}}, opts, simulated_events{world}};
    const cuda::stream_ref main{cudaStreamLegacy};
    const cuda::stream_ref one = world.create();
    const cuda::stream_ref two = world.create();
    pool.deallocate_async(pool.allocate_async(256, 256, main), 256, 256, main);  // main owns the pool
    void* a = nullptr;
    {
      tag_scope scope(1);
      a = pool.allocate_async(4 * mib, 256, one);
      world.launch(one);
      pool.deallocate_async(a, 4 * mib, 256, one);  // cached on `one`, behind work not done yet
    }
    tag_scope scope(taker);
    void* b = pool.allocate_async(4 * mib, 256, two);
    void* c = pool.allocate_async(4 * mib, 256, two);  // the device is full: a hand-over, or a wait for `one`
    CHECK(pool.policy().tag_of(b) == taker);
    CHECK(pool.policy().tag_of(c) == taker);
    if (taker == 1) {
      CHECK(c == a);
      CHECK(pool.stats().handovers == 1);
    } else {
      CHECK(c != a);
      CHECK(pool.stats().handovers == 0);
      CHECK(pool.stats().host_waits >= 1);
      CHECK(pool.policy().physical_bytes(1) == 0);  // tag 1's idle memory went back to make room for tag 2
    }
    world.finish_all();
    pool.deallocate_async(b, 4 * mib, 256, two);
    pool.deallocate_async(c, 4 * mib, 256, two);
  }
}

TEST_CASE("default_pool: a sleeping tag's block freed on a stream that does not own the pool is never served")
{
  simulated_streams world;
  planning_pool pool{mapped_pool<simulated_pages>{simulated_pages{2 * mib, std::size_t{1} << 30}}, {}, simulated_events{world}};
  const cuda::stream_ref main{cudaStreamLegacy};
  const cuda::stream_ref side = world.create();
  churn(pool, main);  // main owns the pool
  void* x = nullptr;
  void* y = nullptr;
  {
    tag_scope trainer(1);
    x = pool.allocate_async(3 * mib, 256, side);
    y = pool.allocate_async(3 * mib, 256, side);
    stamp(pool, y, 3 * mib, 7);
    world.launch(side);
  }
  world.finish_all();
  pause(pool, {1});
  REQUIRE(pool.policy().paused_bytes(1) == 6 * mib);
  pool.deallocate_async(x, 3 * mib, 256, side);  // its tag sleeps: straight back to the pool, dropped from the backup
  CHECK(pool.cached_blocks() == 0);
  CHECK(pool.policy().paused_bytes(1) == 3 * mib);
  CHECK_FALSE(pool.policy().owns(x));
  for (const tag_id t : {tag_id{0}, tag_id{2}}) {
    churn(pool, main);
    tag_scope scope(t);
    void* p = pool.allocate_async(3 * mib, 256, side);
    CHECK(p != x);
    CHECK(pool.policy().tag_of(p) == t);
    pool.deallocate_async(p, 3 * mib, 256, side);
  }
  {
    tag_scope trainer(1);
    CHECK_THROWS_AS((void)pool.allocate_async(3 * mib, 256, side), usage_error);
    CHECK_THROWS_AS((void)pool.allocate(3 * mib), usage_error);
  }
  resume(pool, {1});
  CHECK(stamped(pool, y, 3 * mib, 7));
  CHECK_FALSE(pool.policy().owns(x));
  CHECK(pool.policy().in_use(1) == 3 * mib);
  {
    tag_scope trainer(1);
    void* z = pool.allocate_async(3 * mib, 256, side);
    CHECK(pool.policy().tag_of(z) == 1);
    CHECK(z != y);
    CHECK(pool.policy().in_use(1) == 6 * mib);
    pool.deallocate_async(z, 3 * mib, 256, side);
  }
  pool.deallocate_async(y, 3 * mib, 256, side);
  world.finish_all();
  pool.release();
  CHECK(pool.policy().usage().in_use == 0);
  CHECK(pool.policy().backend().bytes_alive() == pool.policy().physical_bytes());
}

TEST_CASE("default_pool: blocks the stream layer still caches when the policy itself pauses their tag are not served")
{
  simulated_streams world;
  planning_pool pool{mapped_pool<simulated_pages>{simulated_pages{2 * mib, std::size_t{1} << 30}}, {}, simulated_events{world}};
  const cuda::stream_ref main{cudaStreamLegacy};
  const cuda::stream_ref side = world.create();
  churn(pool, main);  // main owns the pool
  tag_scope trainer(1);
  void* a = pool.allocate_async(3 * mib, 256, side);
  void* keep = pool.allocate_async(mib, 256, side);
  world.launch(side);
  pool.deallocate_async(a, 3 * mib, 256, side);
  REQUIRE(pool.cached_blocks() == 1);
  world.finish_all();
  pool.policy().pause({1});  // the policy alone: the stream layer keeps its block, unmapped now
  CHECK_THROWS_AS((void)pool.allocate_async(3 * mib, 256, side), usage_error);
  CHECK(pool.cached_blocks() == 1);
  pool.policy().resume({1});
  CHECK(pool.allocate_async(3 * mib, 256, side) == a);  // mapped again: the policy counted it live
  stamp(pool, a, 3 * mib, 3);
  CHECK(stamped(pool, a, 3 * mib, 3));
  pool.deallocate_async(a, 3 * mib, 256, side);
  pool.deallocate_async(keep, mib, 256, side);
}

TEST_CASE("default_pool sleep: a randomized workload on three streams and three tags")
{
  simulated_streams world;
  planning_pool pool{mapped_pool<simulated_pages>{simulated_pages{2 * mib, std::size_t{2} << 30}}, {}, simulated_events{world}};
  const cuda::stream_ref streams[] = {cuda::stream_ref{cudaStreamLegacy}, world.create(), world.create()};
  constexpr std::size_t usual[] = {64 * 1024, 256 * 1024, 1 * mib, 3 * mib};  // shapes every tag asks for: cached blocks meet other tags
  std::mt19937_64 rnd(7);
  struct live {
    tag_id tag;
    std::size_t bytes;
    std::uint32_t seed;
    int stream;
  };
  std::map<void*, live> blocks;
  std::set<tag_id> asleep;
  std::size_t allocs = 0, frees = 0, sleeping_frees = 0, refused = 0, pauses = 0, resumes = 0, verified = 0, checked = 0;
  std::uint32_t seed = 1;
  for (int step = 0; step < 4000; ++step) {
    const auto r = rnd() % 100;
    const tag_id tag = static_cast<tag_id>(rnd() % 3);
    const int s = static_cast<int>(rnd() % 3);
    if (r < 55) {
      const std::size_t bytes = rnd() % 4 != 0 ? usual[rnd() % 4] : 1 + rnd() % (rnd() % 5 == 0 ? 8 * mib : 200 * 1024);
      tag_scope scope(tag);
      if (asleep.count(tag) != 0) {
        CHECK_THROWS_AS((void)pool.allocate_async(bytes, 256, streams[s]), usage_error);
        ++refused;
        continue;
      }
      void* p = pool.allocate_async(bytes, 256, streams[s]);
      world.launch(streams[s]);
      stamp(pool, p, bytes, seed);
      blocks[p] = {tag, bytes, seed++, s};
      ++allocs;
    } else if (r < 90) {
      if (blocks.size() < 10) continue;
      auto it = blocks.begin();
      std::advance(it, static_cast<long>(rnd() % blocks.size()));
      const bool sleeping = asleep.count(it->second.tag) != 0;
      const std::size_t paused_before = pool.policy().paused_bytes(it->second.tag);
      pool.deallocate_async(it->first, it->second.bytes, 256, streams[s]);
      if (sleeping) {  // dropped from the backup at once, never cached
        REQUIRE(pool.policy().paused_bytes(it->second.tag) < paused_before);
        REQUIRE_FALSE(pool.policy().owns(it->first));
        ++sleeping_frees;
      }
      blocks.erase(it);
      ++frees;
    } else if (r < 92) {
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
    }
    if (step % 20 == 0) world.finish_all();
    REQUIRE(pool.policy().backend().bytes_alive() == pool.policy().physical_bytes());
    for (tag_id t : asleep) REQUIRE(pool.policy().physical_bytes(t) == 0);
    // Every live block lies in its own tag's mappings, and a running tag's blocks hold what was written.
    for (const auto& [p, b] : blocks) {
      REQUIRE(pool.policy().tag_of(p) == b.tag);
      REQUIRE(pool.policy().owns(p));
      if (asleep.count(b.tag) == 0) {
        REQUIRE(stamped(pool, p, b.bytes, b.seed));
        ++verified;
      }
      ++checked;
    }
  }
  MESSAGE("allocations " << allocs << ", frees " << frees << " (" << sleeping_frees << " of sleeping tags), refused " << refused
                         << ", pauses " << pauses << ", resumes " << resumes << ", cache hits " << pool.stats().hits
                         << ", blocks checked " << checked << ", verified " << verified);
  CHECK(allocs > 1400);
  CHECK(frees > 1000);
  CHECK(sleeping_frees > 100);
  CHECK(refused > 200);
  CHECK(pauses > 40);
  CHECK(resumes > 40);
  CHECK(pool.stats().hits > 40);
  CHECK(verified > 300000);
  world.finish_all();
  for (tag_id t : std::set<tag_id>(asleep)) resume(pool, {t});
  for (const auto& [p, b] : blocks) pool.deallocate_async(p, b.bytes, 256, streams[b.stream]);
  world.finish_all();
  pool.release();
  CHECK(pool.policy().usage().in_use == 0);
}

TEST_CASE("default_pool: a sleeping tag's block freed without a stream goes straight back; in_use stays what the policy counts")
{
  simulated_streams world;
  planning_pool pool{mapped_pool<simulated_pages>{simulated_pages{2 * mib, std::size_t{1} << 30}}, {}, simulated_events{world}};
  const cuda::stream_ref main{cudaStreamLegacy};
  void* a = nullptr;
  void* b = nullptr;
  {
    tag_scope trainer(1);
    a = pool.allocate_async(3 * mib, 256, main);
    b = pool.allocate_async(5 * mib, 256, main);
  }
  void* untagged = pool.allocate_async(mib, 256, main);
  stamp(pool, b, 5 * mib, 4);
  world.finish_all();
  pause(pool, {1});
  CHECK(pool.usage().in_use == pool.good_size(mib));  // a sleeping tag's bytes are not in use on the device
  CHECK(pool.usage().in_use == pool.policy().usage().in_use);
  pool.deallocate(a, 3 * mib);  // synchronous: would be set aside until a device-wide wait, were it mapped
  CHECK(pool.set_aside_blocks() == 0);
  CHECK(pool.usage().in_use == pool.good_size(mib));
  CHECK(pool.policy().paused_bytes(1) == 5 * mib);
  resume(pool, {1});
  CHECK_FALSE(pool.owns(a));
  CHECK(stamped(pool, b, 5 * mib, 4));
  CHECK(pool.usage().in_use == pool.good_size(mib) + pool.good_size(5 * mib));
  pool.deallocate(b, 5 * mib);  // mapped again: set aside as usual
  CHECK(pool.set_aside_blocks() == 1);
  CHECK(pool.usage().in_use == pool.good_size(mib));
  pool.deallocate_async(untagged, mib, 256, main);
  pool.release();
  CHECK(pool.usage().in_use == 0);
  CHECK(pool.policy().usage().in_use == 0);
}

TEST_CASE("default_pool pause: the stream layer waits for its streams' events, the pool for the device once; other tags keep their idle memory")
{
  simulated_streams world;
  planning_pool::options opts;
  opts.frees_per_event = 1;  // every free cached on a side stream records an event behind it
  planning_pool pool{mapped_pool<simulated_pages>{simulated_pages{2 * mib, std::size_t{1} << 30}}, opts, simulated_events{world}};
  const cuda::stream_ref main{cudaStreamLegacy};
  const cuda::stream_ref side = world.create();
  churn(pool, main);  // main owns the pool
  std::vector<void*> weights;
  {
    tag_scope trainer(1);
    for (int i = 0; i < 3; ++i) {
      weights.push_back(pool.allocate_async(3 * mib, 256, main));
      stamp(pool, weights.back(), 3 * mib, static_cast<std::uint32_t>(i));
    }
    void* scratch = pool.allocate_async(5 * mib, 256, side);
    world.launch(side);
    pool.deallocate_async(scratch, 5 * mib, 256, side);  // cached on side behind an event not yet complete
  }
  {
    tag_scope engine(2);
    pool.deallocate_async(pool.allocate_async(7 * mib, 256, main), 7 * mib, 256, main);  // idle memory of tag 2
  }
  REQUIRE(pool.cached_blocks() == 1);
  REQUIRE(pool.policy().idle_bytes() > 0);
  const std::size_t held2 = pool.policy().physical_bytes(2);
  REQUIRE(held2 > 0);
  const auto stats = pool.stats();
  const auto calls = world.calls();
  const auto device_waits = pool.policy().page_calls().synchronizes;

  pause(pool, {1});
  CHECK(pool.cached_blocks() == 0);
  CHECK(pool.stats().event_syncs == stats.event_syncs + 1);  // side's event, not the device
  CHECK(pool.stats().device_syncs == stats.device_syncs);
  CHECK(pool.stats().stream_syncs == stats.stream_syncs);
  CHECK(world.calls().device_waits == calls.device_waits);
  CHECK(pool.policy().page_calls().synchronizes == device_waits + 1);  // the pause's one device-wide wait
  CHECK(pool.policy().physical_bytes(1) == 0);
  CHECK(pool.policy().physical_bytes(2) == held2);  // nobody asked for tag 2's idle memory
  CHECK(pool.policy().paused_bytes(1) == 9 * mib);
  resume(pool, {1});
  CHECK(pool.policy().page_calls().synchronizes == device_waits + 1);
  for (std::size_t i = 0; i < weights.size(); ++i) CHECK(stamped(pool, weights[i], 3 * mib, static_cast<std::uint32_t>(i)));
  for (void* p : weights) pool.deallocate_async(p, 3 * mib, 256, main);
  world.finish_all();
  pool.release();
  CHECK(pool.policy().usage().in_use == 0);
}
