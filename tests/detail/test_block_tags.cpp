// detail/block_tags.hpp: stream_ordered asks a policy that tags its blocks (mapped_pool) for tags, and treats
// every other policy's blocks as tag 0 at no cost.
#include <doctest/doctest.h>

#include <cstddef>

#include <strata/default_pool.hpp>
#include <strata/detail/block_tags.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/simulated_source.hpp>
#include <strata/stream/simulated_streams.hpp>

using namespace strata;

namespace {
constexpr std::size_t mib = std::size_t{1} << 20;
} // namespace

static_assert(detail::tagging_policy<mapped_pool<simulated_pages>>);
static_assert(!detail::tagging_policy<coalescing_pool<simulated_source>>);

TEST_CASE("block_tags: mapped_pool's blocks carry the allocating thread's tag; other policies' carry tag 0")
{
  mapped_pool<simulated_pages> pool{simulated_pages{2 * mib, std::size_t{1} << 30}};
  coalescing_pool<simulated_source> plain;
  void* untagged = pool.allocate(mib);
  CHECK(detail::block_tag(pool, untagged) == 0);
  {
    tag_scope scope(5);
    CHECK(detail::allocation_tag(pool) == 5);
    CHECK(detail::allocation_tag(plain) == 0);
    void* p = pool.allocate(mib);
    CHECK(detail::block_tag(pool, p) == 5);
    CHECK(detail::block_tag(pool, untagged) == 0);
    void* q = plain.allocate(mib);
    CHECK(detail::block_tag(plain, q) == 0);
    CHECK_FALSE(detail::tag_sleeps(plain, 5));
    plain.deallocate(q, mib);
    CHECK_FALSE(detail::tag_sleeps(pool, 5));
    pool.pause({5});
    CHECK(detail::tag_sleeps(pool, 5));
    CHECK(detail::block_tag(pool, p) == 5);  // its range stays reserved while the tag sleeps
    CHECK_FALSE(detail::tag_sleeps(pool, 0));
    pool.resume({5});
    pool.deallocate(p, mib);
  }
  CHECK(pool.tag_of(nullptr) == 0);
  pool.deallocate(untagged, mib);
}

TEST_CASE("block_tags: over an untagged policy the stream layer reuses a block whatever the thread's tag")
{
  simulated_streams world;
  stream_ordered<coalescing_pool<simulated_source>, simulated_events> pool{coalescing_pool<simulated_source>{}, {}, simulated_events{world}};
  const cuda::stream_ref main{cudaStreamLegacy};
  const cuda::stream_ref side = world.create();
  for (int i = 0; i < 3; ++i) pool.deallocate_async(pool.allocate_async(mib, 256, main), mib, 256, main);  // main owns it
  void* a = nullptr;
  {
    tag_scope scope(1);
    a = pool.allocate_async(mib, 256, side);
    world.launch(side);
    pool.deallocate_async(a, mib, 256, side);
  }
  REQUIRE(pool.cached_blocks() == 1);
  tag_scope scope(2);
  CHECK(pool.allocate_async(mib, 256, side) == a);
  CHECK(pool.stats().hits == 1);
  pool.deallocate_async(a, mib, 256, side);
}
