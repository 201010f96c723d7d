// detail::stream_cache: each stream's free blocks, binned by shape and ordered by age, with the totals.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/detail/stream/stream_cache.hpp>
#include <strata/stream/simulated_streams.hpp>

using namespace strata;

namespace {

using cache_t = detail::stream_cache<simulated_events::event>;

detail::block_shape shape(std::size_t bytes) { return {bytes, bytes, 256, (std::uint64_t{bytes} << 6) | 8}; }
void* at(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

/// A sized policy whose good size is `good(bytes)`, counting how often it is asked.
template <std::size_t (*Good)(std::size_t)>
struct sized_stub {
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
  std::size_t good_size(std::size_t bytes, std::size_t) const noexcept { return ++asked, Good(bytes); }
  friend bool operator==(const sized_stub&, const sized_stub&) noexcept { return true; }
  mutable int asked = 0;
};
std::size_t power_of_two(std::size_t bytes) { return std::bit_ceil(std::max<std::size_t>(bytes, 256)); }
std::size_t with_slack(std::size_t bytes) { return align_up(bytes, 256) + 256; }
struct unsized_stub {
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
  friend bool operator==(const unsized_stub&, const unsized_stub&) noexcept { return true; }
};

} // namespace

TEST_CASE("stream_cache: a stream takes back its newest block of a shape; the totals follow every block")
{
  cache_t cache;
  int devices_asked = 0;
  const auto device_of = [&] { return ++devices_asked, 0; };
  auto [s, added] = cache.find_or_add(11, cuda::stream_ref{cudaStreamLegacy}, device_of);
  CHECK(added);
  cache.file(*s, at(0x1000), shape(512));
  cache.file(*s, at(0x2000), shape(512));
  cache.file(*s, at(0x3000), shape(1024));
  CHECK(cache.blocks() == 3);
  CHECK(cache.bytes() == 2048);
  detail::cached_block* n = s->take(shape(512).key);
  REQUIRE(n != nullptr);
  CHECK(n->p == at(0x2000));  // newest first
  CHECK(cache.release(n).p == at(0x2000));
  CHECK(cache.blocks() == 2);
  CHECK(cache.bytes() == 1536);
  CHECK(s->take(shape(256).key) == nullptr);
  CHECK(s->oldest->p == at(0x1000));  // the age list keeps the order events cover blocks in
  const auto again = cache.find_or_add(11, cuda::stream_ref{cudaStreamLegacy}, device_of);
  CHECK_FALSE(again.second);
  CHECK(devices_asked == 1);
  cache.clear();
  CHECK(cache.blocks() == 0);
  CHECK(cache.no_streams());
}

TEST_CASE("stream_cache: a stream wants an event past the batch size or twice what it held at its last event")
{
  cache_t cache;
  auto* s = cache.find_or_add(1, cuda::stream_ref{cudaStreamLegacy}, [] { return 0; }).first;
  for (std::uintptr_t i = 1; i <= 3; ++i) cache.file(*s, at(i << 12), shape(256));
  CHECK_FALSE(s->wants_event(4, 1 << 20));
  cache.file(*s, at(4 << 12), shape(256));
  CHECK(s->wants_event(4, 1 << 20));
  s->mark_covered();
  CHECK(s->uncovered_blocks == 0);
  for (std::uintptr_t i = 5; i <= 11; ++i) cache.file(*s, at(i << 12), shape(256));
  CHECK_FALSE(s->wants_event(4, 1 << 20));  // 7 uncovered, fewer than twice the 4 held at the last event
  cache.file(*s, at(12 << 12), shape(256));
  CHECK(s->wants_event(4, 1 << 20));
  cache.clear();
}

TEST_CASE("stream_cache: empty streams are forgotten but the kept one and the owner; a move leaves the cache empty")
{
  cache_t cache;
  auto* a = cache.find_or_add(1, cuda::stream_ref{cudaStreamLegacy}, [] { return 0; }).first;
  auto* b = cache.find_or_add(2, cuda::stream_ref{cudaStreamLegacy}, [] { return 1; }).first;
  cache.find_or_add(3, cuda::stream_ref{cudaStreamLegacy}, [] { return 1; });
  cache.file(*b, at(0x1000), shape(256));
  CHECK(cache.streams() == 3);
  CHECK(cache.devices().size() == 2);
  cache.forget_empty(*a, nullptr);
  CHECK(cache.streams() == 2);  // a kept, b holds a block, 3 forgotten
  cache_t moved(std::move(cache));
  CHECK(cache.no_streams());
  CHECK(cache.blocks() == 0);
  CHECK(moved.blocks() == 1);
  CHECK(moved.find_or_add(2, cuda::stream_ref{cudaStreamLegacy}, [] { return 1; }).first == b);
  moved.clear();
}

TEST_CASE("stream_cache: a block serves only its own tag; removing one leaves the other tags' blocks of its key")
{
  cache_t cache;
  auto* s = cache.find_or_add(3, cuda::stream_ref{cudaStreamLegacy}, [] { return 0; }).first;
  detail::block_shape tagged = shape(512);
  tagged.tag = 1;
  cache.file(*s, at(0x1000), tagged);
  CHECK(s->take(tagged.key) == nullptr);     // tag 0
  CHECK(s->take(tagged.key, 2) == nullptr);  // tag 2
  cache.file(*s, at(0x2000), shape(512));
  detail::cached_block* untagged = s->take(tagged.key);
  REQUIRE(untagged != nullptr);
  CHECK(untagged->p == at(0x2000));
  CHECK(cache.release(untagged).p == at(0x2000));
  cache.file(*s, at(0x3000), shape(512));
  detail::cached_block* oldest = s->oldest;
  REQUIRE(oldest->p == at(0x1000));
  s->remove(oldest);  // the reclaim path: its bin is its tag's
  CHECK(oldest->tag == 1);
  CHECK(cache.release(oldest).p == at(0x1000));
  CHECK(s->take(tagged.key, 1) == nullptr);
  detail::cached_block* left = s->take(tagged.key, 0);
  REQUIRE(left != nullptr);
  CHECK(left->p == at(0x3000));
  (void)cache.release(left);
  CHECK(cache.blocks() == 0);
  CHECK(s->oldest == nullptr);
}

TEST_CASE("stream_cache: a shape asks the policy's good size once when it is the request rounded to 256 bytes")
{
  sized_stub<power_of_two> classes;
  const detail::block_shape exact = detail::shape_for(classes, 4000, 256, 3);
  CHECK(classes.asked == 1);  // 4096 both ways: nothing to ask again
  CHECK(exact.request == 4096);
  CHECK(exact.footprint == 4096);
  CHECK(exact.key == ((std::uint64_t{4096} << 6) | 8));
  CHECK(exact.tag == 3);

  classes.asked = 0;
  const detail::block_shape rounded = detail::shape_for(classes, 5000, 512);
  CHECK(classes.asked == 2);  // 8192 is its own good size: every request of the class shares one key
  CHECK(rounded.request == 8192);
  CHECK(rounded.footprint == 8192);
  CHECK(rounded.align == 512);
  CHECK(rounded.key == ((std::uint64_t{8192} << 6) | 9));
  CHECK(detail::shape_for(classes, 6000, 512).key == rounded.key);

  sized_stub<with_slack> slack;
  const detail::block_shape padded = detail::shape_for(slack, 5000, 1);
  CHECK(slack.asked == 2);  // the good size is not its own good size: keyed by the rounded request
  CHECK(padded.request == 5120);
  CHECK(padded.footprint == 5376);
  CHECK(padded.align == 256);
  CHECK(padded.key == ((std::uint64_t{5120} << 6) | 8));

  const detail::block_shape plain = detail::shape_for(unsized_stub{}, 1000, 256);
  CHECK(plain.request == 1024);
  CHECK(plain.footprint == 1024);
}

TEST_CASE("stream_cache: the shape memo remembers several sizes at once, so interleaved requests ask the policy once each")
{
  sized_stub<power_of_two> classes;
  detail::shape_memo memo;
  const std::size_t sizes[] = {256, 512, 1000, 2048, 8192, 131072};  // a few tensor sizes, in slots of their own
  std::uint64_t keys[6] = {};
  for (int i = 0; i < 6; ++i) keys[i] = memo.of(classes, sizes[i], 256).key;
  const auto asked = classes.asked;
  CHECK(asked >= 6);
  for (int round = 0; round < 10; ++round)
    for (int i = 0; i < 6; ++i) CHECK(memo.of(classes, sizes[i], 256, static_cast<tag_id>(round)).key == keys[i]);
  CHECK(classes.asked == asked);  // alloc, free, alloc of other sizes in between: none asked again
  CHECK(memo.of(classes, 1000, 512).align == 512);  // another alignment in a size's slot: asked, then kept
  CHECK(classes.asked > asked);
}

TEST_CASE("stream_cache: the shape memo asks the policy again only for another size or alignment, and never keeps a tag")
{
  sized_stub<power_of_two> classes;
  detail::shape_memo memo;
  const detail::block_shape first = memo.of(classes, 5000, 256, 2);
  CHECK(classes.asked == 2);
  CHECK(first.request == 8192);
  CHECK(first.tag == 2);
  const detail::block_shape again = memo.of(classes, 5000, 256);
  CHECK(classes.asked == 2);  // the pair's free: nothing asked
  CHECK(again.key == first.key);
  CHECK(again.tag == 0);
  CHECK(memo.of(classes, 5000, 512).align == 512);
  CHECK(classes.asked == 4);
  CHECK(memo.of(classes, 4096, 512).request == 4096);
  CHECK(classes.asked == 5);
  detail::shape_memo fresh;
  const detail::block_shape zero = fresh.of(classes, 0, 0);  // a fresh memo knows no shape, not even the one of (0, 0)
  CHECK(zero.align == 256);
  CHECK(classes.asked == 7);  // asked, twice: the stub's good size of 0 is not 0 rounded
}
