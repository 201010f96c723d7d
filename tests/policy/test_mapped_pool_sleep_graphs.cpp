// pause and resume of tags whose blocks CUDA graphs hold (planning_pool: stream_ordered over mapped_pool,
// simulated pages and simulated streams with simulated capture): a private pool's blocks, live and free in
// the pool, carry the tag current when they were taken from the policy, sleep and wake with it at the same
// addresses and contents, and the stream layer's pool bookkeeping is the same after a pause and resume.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include <strata/core/errors.hpp>
#include <strata/default_pool.hpp>
#include <strata/stream/simulated_streams.hpp>

using namespace strata;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

void stamp(planning_pool& pool, void* p, std::size_t bytes, std::uint32_t seed)
{
  std::vector<unsigned char> v(std::min<std::size_t>(bytes, 64));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<unsigned char>(seed * 37 + i * 3 + 1);
  pool.policy().backend().write(addr(p), v.data(), v.size());
  pool.policy().backend().write(addr(p) + bytes - v.size(), v.data(), v.size());
}

bool stamped(planning_pool& pool, const void* p, std::size_t bytes, std::uint32_t seed)
{
  std::vector<unsigned char> want(std::min<std::size_t>(bytes, 64)), got(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<unsigned char>(seed * 37 + i * 3 + 1);
  pool.policy().backend().read(addr(p), got.data(), got.size());
  if (got != want) return false;
  pool.policy().backend().read(addr(p) + bytes - got.size(), got.data(), got.size());
  return got == want;
}

bool usable(planning_pool& pool, const void* p, std::size_t bytes) { return pool.policy().backend().is_usable(addr(p), bytes); }

/// What the stream layer keeps about its private pools: a pause and resume must leave all of it alone.
struct pool_books {
  std::size_t pools, blocks, free_blocks, bytes;
  std::uint64_t hits, misses, released;
  bool operator==(const pool_books&) const = default;
};
pool_books books(const planning_pool& pool)
{
  return {pool.private_pools(), pool.private_pool_blocks(), pool.private_pool_free_blocks(), pool.private_pool_bytes(),
          pool.stats().pool_hits, pool.stats().pool_misses, pool.stats().pools_released};
}

planning_pool make_pool(simulated_streams& world, std::size_t capacity = std::size_t{1} << 30)
{
  return planning_pool{mapped_pool<simulated_pages>{simulated_pages{2 * mib, capacity}}, {}, simulated_events{world}};
}

/// A step captured on `s` into an automatic private pool: `kept` stays live (the graph's output), `temp` is
/// freed inside the capture (free in the pool, reused at every replay).
struct captured_step {
  std::uint64_t capture = 0;
  void* graph = nullptr;
  std::uint64_t exec = 0;
  void* kept = nullptr;
  void* temp = nullptr;
  static constexpr std::size_t kept_bytes = 3 * mib, temp_bytes = 5 * mib + 256;
};

captured_step capture_step(simulated_streams& world, planning_pool& pool, cuda::stream_ref s)
{
  captured_step c;
  c.capture = world.begin_capture(s);
  c.kept = pool.allocate_async(captured_step::kept_bytes, 256, s);
  c.temp = pool.allocate_async(captured_step::temp_bytes, 256, s);
  world.launch(s);
  pool.deallocate_async(c.temp, captured_step::temp_bytes, 256, s);
  c.graph = world.end_capture(s);
  c.exec = world.instantiate(c.graph);
  world.launch_graph(c.exec, s);
  world.finish_all();
  pool.deallocate_async(pool.allocate_async(256, 256, s), 256, 256, s);  // a call on s: the layer sees the capture over
  return c;
}

} // namespace

TEST_CASE("default_pool pause: a graph's private pool sleeps with its tag, live and free blocks alike, and wakes at the same addresses")
{
  simulated_streams world;
  planning_pool pool = make_pool(world);
  const cuda::stream_ref s = world.create();
  pool.deallocate_async(pool.allocate_async(mib, 256, s), mib, 256, s);  // s owns the pool
  captured_step c;
  {
    tag_scope engine(1);
    c = capture_step(world, pool, s);
  }
  REQUIRE(pool.pool_blocks(c.capture, /*automatic=*/true) == 2);
  REQUIRE(pool.private_pool_free_blocks() == 1);
  CHECK(pool.policy().tag_of(c.kept) == 1);  // the tag of the thread that captured
  CHECK(pool.policy().tag_of(c.temp) == 1);
  stamp(pool, c.kept, c.kept_bytes, 1);  // what replays wrote
  stamp(pool, c.temp, c.temp_bytes, 2);
  const pool_books before = books(pool);
  const std::size_t held = pool.policy().physical_bytes(1), in_use = pool.usage().in_use;
  const std::size_t asleep = pool.good_size(c.kept_bytes) + pool.good_size(c.temp_bytes);
  REQUIRE(held > 0);

  pause(pool, {1});
  CHECK(books(pool) == before);  // the pool keeps its blocks, free one included
  CHECK(pool.policy().physical_bytes(1) == 0);
  CHECK(pool.policy().paused_bytes(1) == asleep);
  CHECK(pool.usage().in_use == in_use - asleep);  // nothing of a sleeping tag is in use on the device
  CHECK_FALSE(usable(pool, c.kept, c.kept_bytes));
  CHECK_FALSE(usable(pool, c.temp, c.temp_bytes));
  CHECK(pool.policy().backend().bytes_alive() == pool.policy().physical_bytes());

  resume(pool, {1});
  CHECK(books(pool) == before);
  CHECK(pool.usage().in_use == in_use);
  CHECK(pool.policy().physical_bytes(1) > 0);
  CHECK(pool.policy().physical_bytes(1) <= held);  // the pages the blocks touch, without the room mapped ahead before
  CHECK(usable(pool, c.kept, c.kept_bytes));
  CHECK(usable(pool, c.temp, c.temp_bytes));
  CHECK(stamped(pool, c.kept, c.kept_bytes, 1));
  CHECK(stamped(pool, c.temp, c.temp_bytes, 2));
  world.launch_graph(c.exec, s);  // the graph's addresses are mapped again

  // The graph's end hands its blocks back as before.
  world.destroy_exec(c.exec);
  world.destroy_graph(c.graph);
  pool.deallocate_async(c.kept, c.kept_bytes, 256, s);
  pool.deallocate_async(pool.allocate_async(256, 256, s), 256, 256, s);
  CHECK(pool.private_pools() == 0);
  world.finish_all();
  pool.release();
  CHECK(pool.policy().usage().in_use == 0);
  CHECK(pool.usage().in_use == 0);
}

TEST_CASE("default_pool: a private pool's free block serves only allocations under its own tag, and never while that tag sleeps")
{
  simulated_streams world;
  planning_pool pool = make_pool(world);
  const cuda::stream_ref s = world.create();
  pool.deallocate_async(pool.allocate_async(mib, 256, s), mib, 256, s);
  // Pool 7 serves s outside capture (a filter may ask for it): its frees stay in the pool, reused in s's order.
  pool.begin_allocate_to_pool(7, [s](cudaStream_t h) { return h == s.get(); });
  void* a = nullptr;
  {
    tag_scope engine(1);
    a = pool.allocate_async(4 * mib, 256, s);
    stamp(pool, a, 4 * mib, 5);
    pool.deallocate_async(a, 4 * mib, 256, s);
  }
  REQUIRE(pool.private_pool_free_blocks() == 1);
  void* b = pool.allocate_async(4 * mib, 256, s);  // tag 0: not tag 1's block
  CHECK(b != a);
  CHECK(pool.policy().tag_of(b) == 0);
  CHECK(pool.private_pool_free_blocks() == 1);

  world.finish_all();
  pause(pool, {1});
  CHECK_FALSE(usable(pool, a, 4 * mib));
  const pool_books asleep = books(pool);
  void* c = pool.allocate_async(4 * mib, 256, s);  // tag 0 again, with tag 1's block asleep in the pool
  CHECK(c != a);
  CHECK(usable(pool, c, 4 * mib));
  const pool_books with_c = books(pool);
  {
    tag_scope engine(1);
    CHECK_THROWS_AS(pool.allocate_async(4 * mib, 256, s), usage_error);  // the sleeping tag refuses
  }
  CHECK(books(pool) == with_c);
  CHECK(asleep.free_blocks == with_c.free_blocks);

  resume(pool, {1});
  {
    tag_scope engine(1);
    CHECK(pool.allocate_async(4 * mib, 256, s) == a);  // its own tag, its own stream order: the pool's block
  }
  CHECK(stamped(pool, a, 4 * mib, 5));
  pool.end_allocate_to_pool(7);
  for (void* p : {a, b, c}) pool.deallocate_async(p, 4 * mib, 256, s);
  pool.release_pool(7);
  world.finish_all();
  pool.release();
  CHECK(pool.private_pools() == 0);
  CHECK(pool.policy().usage().in_use == 0);
}

TEST_CASE("default_pool: a graph released while its tag sleeps drops its blocks, as for any block freed asleep")
{
  simulated_streams world;
  planning_pool pool = make_pool(world);
  const cuda::stream_ref s = world.create();
  pool.deallocate_async(pool.allocate_async(mib, 256, s), mib, 256, s);
  void* weights = nullptr;
  captured_step c;
  {
    tag_scope engine(1);
    weights = pool.allocate_async(7 * mib, 256, s);
    c = capture_step(world, pool, s);
  }
  stamp(pool, weights, 7 * mib, 9);
  pause(pool, {1});
  REQUIRE(pool.policy().paused_bytes(1) == pool.good_size(7 * mib) + pool.good_size(c.kept_bytes) + pool.good_size(c.temp_bytes));

  world.destroy_exec(c.exec);
  world.destroy_graph(c.graph);
  pool.deallocate_async(pool.allocate_async(256, 256, s), 256, 256, s);  // collects the graph's end: the free block is set aside
  CHECK(pool.stats().pools_released == 1);
  CHECK(pool.set_aside_blocks() == 0);  // asleep: straight back to the policy, which drops it
  CHECK(pool.usage().in_use == pool.policy().usage().in_use);
  pool.deallocate_async(c.kept, c.kept_bytes, 256, s);  // the live one, freed after its pool's release
  CHECK(pool.private_pools() == 0);
  CHECK(pool.policy().paused_bytes(1) == pool.good_size(7 * mib));
  CHECK(pool.usage().in_use == pool.policy().usage().in_use);

  resume(pool, {1});
  CHECK(stamped(pool, weights, 7 * mib, 9));
  CHECK_FALSE(pool.owns(c.kept));
  CHECK_FALSE(pool.owns(c.temp));
  CHECK(pool.policy().in_use(1) == pool.good_size(7 * mib));
  pool.deallocate_async(weights, 7 * mib, 256, s);
  world.finish_all();
  pool.release();
  CHECK(pool.policy().usage().in_use == 0);
  CHECK(pool.policy().physical_bytes() == 0);
}

TEST_CASE("default_pool: a graph captured under tag 0 is untouched while another tag sleeps and wakes")
{
  simulated_streams world;
  planning_pool pool = make_pool(world);
  const cuda::stream_ref s = world.create();
  pool.deallocate_async(pool.allocate_async(mib, 256, s), mib, 256, s);
  void* other = pool.policy().allocate_tagged(2, 6 * mib);
  stamp(pool, other, 6 * mib, 3);
  const captured_step c = capture_step(world, pool, s);
  CHECK(pool.policy().tag_of(c.kept) == 0);
  CHECK(pool.policy().tag_of(c.temp) == 0);
  stamp(pool, c.kept, c.kept_bytes, 1);
  stamp(pool, c.temp, c.temp_bytes, 2);
  pool.release();  // tag 0's idle memory goes now, so that whatever the pause changes shows
  const pool_books before = books(pool);
  const std::size_t held0 = pool.policy().physical_bytes(0), in_use = pool.usage().in_use;
  const auto backing = [&](const void* p) {
    std::vector<simulated_pages::page> pages;
    for (const auto& b : pool.policy().backing_of(p)) pages.push_back(b.page);
    return pages;
  };
  const auto kept_pages = backing(c.kept), temp_pages = backing(c.temp);
  REQUIRE_FALSE(kept_pages.empty());

  pause(pool, {2});
  CHECK(books(pool) == before);
  CHECK(pool.usage().in_use == in_use - pool.good_size(6 * mib));
  CHECK(pool.policy().physical_bytes(0) == held0);
  CHECK(stamped(pool, c.kept, c.kept_bytes, 1));
  CHECK(stamped(pool, c.temp, c.temp_bytes, 2));
  world.launch_graph(c.exec, s);
  resume(pool, {2});
  CHECK(books(pool) == before);
  CHECK(pool.policy().physical_bytes(0) == held0);
  CHECK(stamped(pool, other, 6 * mib, 3));
  CHECK(stamped(pool, c.temp, c.temp_bytes, 2));
  CHECK(backing(c.kept) == kept_pages);  // the same physical memory throughout
  CHECK(backing(c.temp) == temp_pages);

  world.destroy_exec(c.exec);
  world.destroy_graph(c.graph);
  pool.deallocate_async(c.kept, c.kept_bytes, 256, s);
  pool.policy().deallocate(other, 6 * mib);
  world.finish_all();
  pool.release();
  CHECK(pool.private_pools() == 0);
  CHECK(pool.policy().usage().in_use == 0);
}
