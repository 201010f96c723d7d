// detail::recent_frees: the lone owner's recent frees by shape and tag, newest first, bounded, never lost.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include <strata/detail/stream/recent_frees.hpp>

using namespace strata;

namespace {

detail::block_shape shape(std::size_t bytes, tag_id tag = 0) { return {bytes, bytes + 256, 256, (std::uint64_t{bytes} << 6) | 8, tag}; }
void* at(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

struct returned {
  std::vector<std::pair<void*, std::size_t>> blocks;  // (block, request)
  auto sink()
  {
    return [this](void* p, std::size_t request, std::size_t align) {
      CHECK(align == 256);
      blocks.emplace_back(p, request);
    };
  }
};

} // namespace

TEST_CASE("recent_frees: a block comes back only for its own shape and tag, newest first")
{
  detail::recent_frees r;
  returned back;
  CHECK(r.keep(at(0x1000), shape(4096), back.sink()));
  CHECK(r.keep(at(0x2000), shape(4096), back.sink()));
  CHECK(r.blocks() == 2);
  CHECK(r.bytes() == 2 * (4096 + 256));  // what the blocks cost the policy
  CHECK(r.take(shape(4096).key, 1) == nullptr);      // another tag
  CHECK(r.take(shape(8192).key, 0) == nullptr);      // another shape
  CHECK(r.take(shape(4096).key, 0) == at(0x2000));   // the newest: warm in the caches, on the stream's latest work
  CHECK(r.take(shape(4096).key, 0) == at(0x1000));
  CHECK(r.take(shape(4096).key, 0) == nullptr);
  CHECK(r.empty());
  CHECK(r.bytes() == 0);
  CHECK(back.blocks.empty());
}

TEST_CASE("recent_frees: a full slot refuses, and another shape in the slot sends the old blocks back")
{
  detail::recent_frees r;
  returned back;
  for (unsigned i = 0; i < detail::recent_frees::per_slot; ++i) CHECK(r.keep(at(0x1000 * (i + 1)), shape(4096), back.sink()));
  CHECK_FALSE(r.keep(at(0x9000), shape(4096), back.sink()));  // the caller gives this one back itself
  CHECK(r.blocks() == detail::recent_frees::per_slot);
  // The same shape under another tag lands in the same slot: the blocks kept there go back first.
  CHECK(r.keep(at(0xa000), shape(4096, 3), back.sink()));
  CHECK(back.blocks.size() == detail::recent_frees::per_slot);
  CHECK(r.blocks() == 1);
  CHECK(r.take(shape(4096).key, 3) == at(0xa000));
}

TEST_CASE("recent_frees: randomized, every block kept comes back exactly once, by take or by give_back_all")
{
  std::mt19937_64 rng(5);
  detail::recent_frees r;
  returned back;
  std::multiset<void*> kept;             // what the table should hold
  std::map<void*, std::size_t> request;  // each block's shape
  std::uintptr_t next = 0x10000;
  std::size_t taken = 0, refused = 0;
  for (int step = 0; step < 200'000; ++step) {
    const std::size_t bytes = std::size_t{256} << (rng() % 40);  // more shapes than slots: collisions
    const tag_id tag = static_cast<tag_id>(rng() % 3);
    if (rng() % 2 == 0) {
      void* p = at(next += 0x1000);
      request[p] = bytes;
      if (r.keep(p, shape(bytes, tag), back.sink())) kept.insert(p);
      else ++refused;
    } else if (void* p = r.take(shape(bytes, tag).key, tag)) {
      REQUIRE(kept.count(p) == 1);
      CHECK(request[p] == bytes);
      kept.erase(p);
      ++taken;
    }
    for (auto [p, req] : back.blocks) {
      REQUIRE(kept.count(p) == 1);
      CHECK(request[p] == req);
      kept.erase(p);
    }
    back.blocks.clear();
    REQUIRE(r.blocks() == kept.size());
    REQUIRE(r.blocks() <= detail::recent_frees::slot_count * detail::recent_frees::per_slot);
  }
  r.give_back_all(back.sink());
  for (auto [p, req] : back.blocks) {
    REQUIRE(kept.count(p) == 1);
    kept.erase(p);
  }
  CHECK(kept.empty());
  CHECK(r.empty());
  CHECK(r.bytes() == 0);
  CHECK(taken > 1000);
  CHECK(refused > 0);
  MESSAGE("taken " << taken << ", refused " << refused);
}
