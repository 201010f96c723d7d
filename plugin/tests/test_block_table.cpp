// The torch backend's block table: live blocks by address, private pools with use counts, parked blocks,
// checkPoolLiveAllocations and checkpoints restored at the same addresses.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include "block_table.hpp"
#include "pool_layout.hpp"

using namespace strata::plugin;

namespace {
using table = block_table<std::string>;
const pool_id graph{1, 0};
const pool_id user{0, 1};

live_block<std::string> in(pool_id p, std::size_t size, std::string ctx = {})
{
  return {size, size, nullptr, p, std::move(ctx)};
}
void* ptr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }
} // namespace

TEST_CASE("block_table: live blocks are found by address, once")
{
  table t;
  t.insert(0x1000, in({}, 512, "here"));
  REQUIRE(t.find(0x1000) != nullptr);
  CHECK(t.find(0x1000)->context == "here");
  CHECK_THROWS_AS(t.insert(0x1000, in({}, 512)), std::logic_error);
  CHECK(t.live_blocks() == 1);
  const auto gone = t.erase(0x1000);
  REQUIRE(gone);
  CHECK(gone->b.size == 512);
  CHECK(!gone->parked);  // no pool: straight back to strata
  CHECK(!t.erase(0x1000));
  CHECK(t.find(0x1000) == nullptr);
}

TEST_CASE("block_table: a pool counts its uses; a block into an unknown pool is refused, table unchanged")
{
  table t;
  CHECK_THROWS_AS(t.insert(0x1000, in(graph, 512)), std::invalid_argument);
  CHECK(t.live_blocks() == 0);
  CHECK_THROWS_AS(t.create_or_incref({}), std::invalid_argument);
  t.create_or_incref(user);
  t.create_or_incref(user);
  CHECK(t.use_count(user) == 2);
  CHECK(t.use_count(graph) == 0);
  t.set_use_on_oom(user, true);
  CHECK(t.use_on_oom(user));
  CHECK_THROWS_AS(t.set_use_on_oom(graph, true), std::invalid_argument);
  CHECK(t.release(user).empty());
  CHECK(t.use_count(user) == 1);
  CHECK(t.release(user).empty());
  CHECK(!t.known(user));
  CHECK_THROWS_AS(t.release(user), std::invalid_argument);
}

TEST_CASE("block_table: a block freed in a live pool is parked, revived by size, returned at the pool's release")
{
  table t;
  t.create_or_incref(graph);
  t.insert(0x1000, in(graph, 4096));
  t.insert(0x3000, in(graph, 8192));
  const auto e = t.erase(0x1000);
  REQUIRE(e);
  CHECK(e->parked);
  CHECK(t.parked(0x1000));
  CHECK(t.parked_bytes() == 4096);
  CHECK(t.parked_blocks() == 1);
  CHECK(!t.revive(graph, 8192, 8000, nullptr));  // no parked block of that size
  CHECK(!t.revive(user, 4096, 4000, nullptr));   // nor in another pool
  const auto again = t.revive(graph, 4096, 4000, nullptr, "second");
  REQUIRE(again);
  CHECK(*again == 0x1000);
  CHECK(t.find(0x1000)->requested == 4000);
  CHECK(t.find(0x1000)->context == "second");
  CHECK(t.parked_bytes() == 0);

  (void)t.erase(0x1000);
  const auto returned = t.release(graph);  // last use: parked blocks go back to strata
  REQUIRE(returned.size() == 1);
  CHECK(returned[0].first == 0x1000);
  CHECK(t.parked_bytes() == 0);
  CHECK(t.known(graph));  // 0x3000 still lives in it
  const auto late = t.erase(0x3000);
  REQUIRE(late);
  CHECK(!late->parked);  // the pool is released: straight back to strata
  CHECK(!t.known(graph));  // and with its last block gone, the pool is forgotten
  CHECK(t.use_count(graph) == 0);
}

TEST_CASE("block_table: pools released with live blocks are forgotten when their last block goes, not before")
{
  table t;
  std::mt19937 rng(3);
  int forgotten = 0;
  for (int round = 0; round < 200; ++round) {
    const pool_id p{static_cast<unsigned long long>(round + 1), 0};
    t.create_or_incref(p);
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n; ++k) t.insert(0x100000u * static_cast<std::uintptr_t>(round + 1) + 0x1000u * static_cast<std::uintptr_t>(k), in(p, 4096));
    (void)t.release(p);
    for (int k = 0; k < n; ++k) {
      CHECK(t.known(p));  // a block of it still lives
      const auto gone = t.erase(0x100000u * static_cast<std::uintptr_t>(round + 1) + 0x1000u * static_cast<std::uintptr_t>(k));
      REQUIRE(gone);
      CHECK(!gone->parked);
    }
    CHECK(!t.known(p));
    ++forgotten;
  }
  CHECK(forgotten == 200);
}

TEST_CASE("block_table: out of memory may take a parked block of a use_on_oom pool, which keeps it")
{
  table t;
  t.create_or_incref(graph);
  t.create_or_incref(user);
  t.insert(0x1000, in(graph, 4096));
  t.insert(0x2000, in(user, 4096));
  (void)t.erase(0x1000);
  (void)t.erase(0x2000);
  t.set_use_on_oom(user, true);
  const auto taken = t.revive_on_oom(4096, 4000, nullptr, "oom");
  REQUIRE(taken);
  CHECK(*taken == 0x2000);  // the use_on_oom pool's, not the graph's
  CHECK(t.find(0x2000)->pool == user);
  CHECK(t.find(0x2000)->context == "oom");
  CHECK(!t.revive_on_oom(4096, 4096, nullptr));  // the graph pool's block is not offered
  CHECK(t.parked(0x1000));
  const auto freed = t.erase(0x2000);
  REQUIRE(freed);
  CHECK(freed->parked);  // parked back in its pool
}

TEST_CASE("block_table: checkPoolLiveAllocations compares the pool's live blocks with PyTorch's set")
{
  table t;
  t.create_or_incref(graph);
  t.insert(0x1000, in(graph, 512));
  t.insert(0x2000, in(graph, 512));
  t.insert(0x9000, in({}, 512));  // not in the pool
  CHECK(t.pool_live_matches(graph, {ptr(0x1000), ptr(0x2000)}));
  CHECK(!t.pool_live_matches(graph, {ptr(0x1000)}));
  CHECK(!t.pool_live_matches(graph, {ptr(0x1000), ptr(0x2000), ptr(0x9000)}));
  CHECK(!t.pool_live_matches(graph, {ptr(0x1000), ptr(0x4000)}));
  (void)t.erase(0x2000);
  CHECK(t.pool_live_matches(graph, {ptr(0x1000)}));
}

TEST_CASE("block_table: a checkpoint is restored at the same addresses; the delta names what changed")
{
  table t;
  t.create_or_incref(graph);
  t.insert(0x1000, in(graph, 4096, "a"));
  t.insert(0x2000, in(graph, 4096, "b"));
  const auto c = t.checkpoint(0, graph);
  REQUIRE(c.blocks.size() == 2);
  CHECK(c.blocks[0].first == 0x1000);

  (void)t.erase(0x1000);          // parked
  t.insert(0x5000, in(graph, 1024));  // a new block after the checkpoint
  const auto d = t.restore(c);
  CHECK(std::set<std::uintptr_t>(d.freed.begin(), d.freed.end()) == std::set<std::uintptr_t>{0x2000, 0x5000});
  REQUIRE(d.revived.size() == 2);
  CHECK(d.revived[0].first == 0x1000);
  CHECK(d.revived[0].second.context == "a");
  CHECK(t.pool_live_matches(graph, {ptr(0x1000), ptr(0x2000)}));
  CHECK(t.parked(0x5000));
  CHECK(t.parked_bytes() == 1024);
}

TEST_CASE("block_table: a checkpoint whose memory went back to strata is refused, table unchanged")
{
  table t;
  t.create_or_incref(graph);
  t.create_or_incref(graph);
  t.insert(0x1000, in(graph, 4096));
  const auto c = t.checkpoint(0, graph);
  (void)t.erase(0x1000);
  (void)t.release(graph);
  CHECK(t.parked(0x1000));  // one use left: still parked
  (void)t.release(graph);   // the last: returned
  t.create_or_incref(graph);
  t.insert(0x7000, in(graph, 4096));
  CHECK_THROWS_AS(t.restore(c), std::invalid_argument);
  CHECK(t.pool_live_matches(graph, {ptr(0x7000)}));
  CHECK(t.parked_bytes() == 0);
}

TEST_CASE("block_table: random pool traffic with checkpoints keeps parked bytes and live sets consistent")
{
  std::mt19937_64 rng(11);
  table t;
  t.create_or_incref(graph);
  std::uintptr_t next = 0x100000;
  std::set<std::uintptr_t> live;
  std::size_t ops = 0;
  pool_checkpoint<std::string> saved = t.checkpoint(0, graph);
  for (int i = 0; i < 3000; ++i) {
    const auto r = rng() % 10;
    if (r < 4) {
      const std::size_t size = 512 * (1 + rng() % 4);
      if (const auto a = t.revive(graph, size, size, nullptr)) {
        live.insert(*a);
      } else {
        t.insert(next, in(graph, size));
        live.insert(next);
        next += 4096;
      }
    } else if (r < 8 && !live.empty()) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      const auto e = t.erase(*it);
      if (!e || !e->parked) break;
      live.erase(it);
    } else if (r == 8) {
      saved = t.checkpoint(0, graph);
    } else {
      const auto d = t.restore(saved);
      live.clear();
      for (const auto& [a, b] : saved.blocks) live.insert(a);
      if (d.revived.size() != saved.blocks.size()) break;
    }
    std::unordered_set<void*> expected;
    for (auto a : live) expected.insert(ptr(a));
    if (t.pool_live_matches(graph, expected)) ++ops;
  }
  CHECK(ops == 3000);
}

TEST_CASE("address_table: random inserts and takes agree with a std::map, across growth and wrapped probe runs")
{
  std::mt19937_64 rng(5);
  address_table<std::string> t;
  std::map<std::uintptr_t, std::string> model;
  std::size_t mismatches = 0;
  for (int i = 0; i < 200000; ++i) {
    // Up to 1020 entries in 2048 slots: near half full (the most the table allows), where probe runs are long
    // and some wrap past the array's end.
    const std::uintptr_t a = 256 * (1 + rng() % 1100);
    if (model.count(a) == 0) {
      if (model.size() == 1020) continue;
      t.insert(a, std::to_string(a));
      model.emplace(a, std::to_string(a));
    } else if (rng() % 8 == 0) {
      const auto taken = t.take(a);
      const auto it = model.find(a);
      if (taken.has_value() != (it != model.end()) || (taken && *taken != it->second)) ++mismatches;
      if (it != model.end()) model.erase(it);
    }
    if (t.size() != model.size()) ++mismatches;
  }
  CHECK(mismatches == 0);
  for (const auto& [a, text] : model) {
    const std::string* found = t.find(a);
    REQUIRE(found != nullptr);
    CHECK(*found == text);
  }
  std::size_t visited = 0;
  t.for_each([&](std::uintptr_t a, const std::string& text) {
    ++visited;
    CHECK(model.at(a) == text);
  });
  CHECK(visited == model.size());
  CHECK(t.find(0) == nullptr);
  CHECK(!t.take(0));
}

TEST_CASE("address_table: a taken entry's value is released at once, and an absent key is not found")
{
  address_table<std::shared_ptr<int>> t;
  auto held = std::make_shared<int>(7);
  t.insert(0x1000, held);
  CHECK(held.use_count() == 2);
  CHECK(t.find(0x2000) == nullptr);
  {
    const auto taken = t.take(0x1000);
    REQUIRE(taken);
    CHECK(**taken == 7);
  }
  CHECK(held.use_count() == 1);
  CHECK(t.size() == 0);
  CHECK(!t.take(0x1000));
}

TEST_CASE("address_table: taking from a probe run that wraps past the end keeps every other key found")
{
  address_table<int> t;
  t.insert(256, 0);  // allocates the slots, so homes are known
  (void)t.take(256);
  const std::size_t last = t.capacity() - 1;
  // Keys whose probes start at the last two slots and at the first: one run, last - 1 .. 0.
  auto key_at = [&](std::size_t home, std::uintptr_t after) {
    std::uintptr_t k = after + 256;
    while (t.home_of(k) != home) k += 256;
    return k;
  };
  const std::uintptr_t a = key_at(last - 1, 0), b = key_at(last, 0), c = key_at(0, 0), d = key_at(last, b);
  t.insert(a, 1);
  t.insert(b, 2);
  t.insert(c, 3);  // its home is taken by nothing yet: it sits at slot 0
  t.insert(d, 4);  // home `last`, pushed round to slot 1
  REQUIRE(t.take(a) == std::optional<int>{1});
  CHECK(t.find(b) != nullptr);
  CHECK(t.find(c) != nullptr);
  CHECK(t.find(d) != nullptr);
  REQUIRE(t.take(b) == std::optional<int>{2});
  CHECK(t.find(c) != nullptr);
  CHECK(t.find(d) != nullptr);
  CHECK(t.take(d) == std::optional<int>{4});
  CHECK(t.take(c) == std::optional<int>{3});
  CHECK(t.size() == 0);
}

namespace {
void* stream_a() { return reinterpret_cast<void*>(0xa0); }
void* stream_b() { return reinterpret_cast<void*>(0xb0); }
live_block<std::string> on(pool_id p, std::size_t size, void* stream) { return {size, size, stream, p, {}, {}}; }
constexpr std::size_t MiB = std::size_t{1} << 20;
} // namespace

/// A private pool's allocation as the backend makes it: a parked piece, else a new segment at PyTorch's size.
struct pool_allocator {
  table& t;
  pool_id pool;
  std::uintptr_t next = 0x100000000;
  std::size_t segments = 0;
  std::vector<std::uintptr_t> bases{};
  std::uintptr_t operator()(std::size_t size, void* stream, std::string ctx = {})
  {
    if (const auto a = t.revive(pool, size, size, stream, ctx)) return *a;
    const std::size_t block = pool_layout::block_bytes(size);
    const std::uintptr_t base = next;
    next += 1024 * MiB;
    ++segments;
    bases.push_back(base);
    (void)t.insert_segment(base, pool_layout::segment_bytes(block), {block, size, stream, pool, std::move(ctx), {}});
    return base;
  }
};

TEST_CASE("pool_layout: PyTorch's block and segment sizes and its split rule")
{
  CHECK(pool_layout::block_bytes(1) == 512);
  CHECK(pool_layout::block_bytes(512) == 512);
  CHECK(pool_layout::block_bytes(1000) == 1024);
  CHECK(pool_layout::segment_bytes(512) == 2 * MiB);
  CHECK(pool_layout::segment_bytes(MiB) == 2 * MiB);
  CHECK(pool_layout::segment_bytes(MiB + 512) == 20 * MiB);
  CHECK(pool_layout::segment_bytes(10 * MiB - 512) == 20 * MiB);
  CHECK(pool_layout::segment_bytes(10 * MiB + 512) == 12 * MiB);
  CHECK(pool_layout::segment_bytes(20 * MiB) == 20 * MiB);
  CHECK(pool_layout::splits(2 * MiB, 2 * MiB - 512, true));
  CHECK(!pool_layout::splits(1024, 1024, true));
  CHECK(pool_layout::splits(20 * MiB, 10 * MiB - 512, false));        // the rest, 10 MiB + 512, is kept apart
  CHECK(!pool_layout::splits(10 * MiB + 512, 10 * MiB - 512, false));  // a rest of 1 KiB goes with the block
  CHECK(!pool_layout::splits(3 * MiB, 2 * MiB, false));                // nor a rest of exactly 1 MiB
}

TEST_CASE("block_table: a pool's new segment is PyTorch's size, its rest parked where PyTorch splits")
{
  table t;
  t.create_or_incref(graph);
  pool_allocator alloc{t, graph};
  const auto a = alloc(512, stream_a());
  CHECK(t.find(a)->size == 512);
  CHECK(t.pool_segment_bytes() == 2 * MiB);
  CHECK(t.parked_bytes() == 2 * MiB - 512);
  // Ten more small blocks come out of the same segment, end to end.
  for (int i = 1; i <= 10; ++i) CHECK(alloc(512, stream_a()) == a + 512 * static_cast<std::uintptr_t>(i));
  CHECK(alloc.segments == 1);
  // A large block never comes from a small segment: a 20 MiB segment, 10 MiB + 512 left parked.
  const auto big = alloc(10 * MiB - 512, stream_a());
  CHECK(alloc.segments == 2);
  CHECK(t.figures().segment_bytes[pool_figures::index(false)] == 20 * MiB);
  CHECK(t.figures().parked_bytes[pool_figures::index(false)] == 10 * MiB + 512);
  // The next takes the rest whole: cutting it would leave 1 KiB, which PyTorch does not keep apart.
  const auto second = alloc(10 * MiB - 512, stream_a());
  CHECK(second == big + 10 * MiB - 512);
  CHECK(t.find(second)->size == 10 * MiB + 512);
  CHECK(t.figures().parked_bytes[pool_figures::index(false)] == 0);
  CHECK(t.figures().live_bytes[pool_figures::index(false)] == 20 * MiB);
  CHECK(t.figures().live_bytes[pool_figures::index(true)] == 11 * 512);
  // A block from 10 MiB up gets a segment of its own size rounded up to 2 MiB; a rest over 1 MiB is parked.
  const auto own = alloc(10 * MiB + 512, stream_a());
  CHECK(t.find(own)->size == 10 * MiB + 512);
  CHECK(t.figures().parked_bytes[pool_figures::index(false)] == 2 * MiB - 512);
  const auto whole = alloc(16 * MiB - 512, stream_a());
  CHECK(t.find(whole)->size == 16 * MiB);
  CHECK(t.pool_segments() == 4);
  CHECK_THROWS_AS(t.insert_segment(0x9000000, 512, {1024, 1024, stream_a(), graph, {}, {}}), std::invalid_argument);
  CHECK_THROWS_AS(t.insert_segment(own, 2 * MiB, {512, 512, stream_a(), graph, {}, {}}), std::logic_error);
  CHECK(t.pool_segments() == 4);
}

TEST_CASE("block_table: a pool serves a smaller request from a larger parked piece, best fit, the rest parked")
{
  table t;
  t.create_or_incref(graph);
  t.insert(0x1000000, on(graph, 4 * MiB, stream_a()));
  t.insert(0x2000000, on(graph, MiB, stream_a()));
  t.insert(0x3000000, on(graph, 2 * MiB, stream_a()));
  (void)t.erase(0x1000000);
  (void)t.erase(0x2000000);
  (void)t.erase(0x3000000);
  CHECK(t.parked_blocks() == 3);
  const auto small = t.revive(graph, 1000, 1000, stream_a(), "small");
  REQUIRE(small);
  CHECK(*small == 0x2000000);  // the smallest small piece that fits, not the first
  CHECK(t.find(*small)->size == 1024);  // cut at 512 bytes
  CHECK(t.find(*small)->requested == 1000);
  CHECK(t.parked_bytes() == 7 * MiB - 1024);
  CHECK(t.parked_blocks() == 3);  // the 1 MiB piece's rest is parked in its place
  const auto big = t.revive(graph, MiB + 512, MiB + 512, stream_a());
  REQUIRE(big);
  CHECK(*big == 0x3000000);  // the 2 MiB large piece: best fit among the large ones
  CHECK(t.find(*big)->size == 2 * MiB);  // a rest under 1 MiB stays with it
  const auto next = t.revive(graph, MiB - 1024, MiB - 1024, stream_a());
  REQUIRE(next);
  CHECK(*next == 0x2000000 + 1024);  // the rest of the small segment fits exactly
  const auto cut = t.revive(graph, 2 * MiB, 2 * MiB, stream_a());
  REQUIRE(cut);
  CHECK(*cut == 0x1000000);
  CHECK(t.find(*cut)->size == 2 * MiB);  // a rest of 2 MiB is kept apart
  CHECK(t.parked_bytes() == 2 * MiB);
  CHECK(t.pool_segments() == 3);
}

TEST_CASE("block_table: small blocks come only from small segments, large ones only from large segments")
{
  table t;
  t.create_or_incref(graph);
  pool_allocator alloc{t, graph};
  const auto large = alloc(4 * MiB, stream_a());  // a 20 MiB segment
  (void)t.erase(large);
  const auto small = alloc(4096, stream_a());
  CHECK(alloc.segments == 2);  // not cut from the parked 20 MiB
  (void)t.erase(small);
  (void)alloc(2 * MiB, stream_a());
  CHECK(alloc.segments == 2);  // the large piece serves a large block
  CHECK(t.figures().segments[pool_figures::index(true)] == 1);
  CHECK(t.figures().segments[pool_figures::index(false)] == 1);
  CHECK(t.figures().parked_bytes[pool_figures::index(true)] == 2 * MiB);
  CHECK(t.figures().parked_bytes[pool_figures::index(false)] == 18 * MiB);
}

TEST_CASE("block_table: parked neighbours merge, so a request as large as the segment is served again")
{
  table t;
  t.create_or_incref(graph);
  t.insert(0x1000000, on(graph, 8 * MiB, stream_a()));
  (void)t.erase(0x1000000);
  std::vector<std::uintptr_t> pieces;
  for (int i = 0; i < 3; ++i) pieces.push_back(*t.revive(graph, 2 * MiB, 2 * MiB, stream_a()));
  pieces.push_back(*t.revive(graph, 2 * MiB, 2 * MiB, stream_a()));
  CHECK(t.parked_bytes() == 0);
  for (std::uintptr_t a : {pieces[1], pieces[3], pieces[0], pieces[2]}) (void)t.erase(a);  // out of order
  CHECK(t.parked_blocks() == 1);
  CHECK(t.parked_bytes() == 8 * MiB);
  CHECK(t.revive(graph, 8 * MiB, 8 * MiB, stream_a()) == std::optional<std::uintptr_t>{0x1000000});
}

TEST_CASE("block_table: no reuse across streams; a segment serves the stream it was allocated on")
{
  table t;
  t.create_or_incref(graph);
  t.insert(0x1000000, on(graph, 8 * MiB, stream_a()));
  (void)t.erase(0x1000000);
  CHECK(!t.revive(graph, 2 * MiB, 2 * MiB, stream_b()));
  t.insert(0x3000000, on(graph, 6 * MiB, stream_b()));
  (void)t.erase(0x3000000);
  CHECK(t.revive(graph, 2 * MiB, 2 * MiB, stream_b()) == std::optional<std::uintptr_t>{0x3000000});
  CHECK(t.revive(graph, 2 * MiB, 2 * MiB, stream_b()) == std::optional<std::uintptr_t>{0x3000000 + 2 * MiB});
  CHECK(t.revive(graph, 2 * MiB, 2 * MiB, stream_b()) == std::optional<std::uintptr_t>{0x3000000 + 4 * MiB});
  CHECK(!t.revive(graph, 2 * MiB, 2 * MiB, stream_b()));  // b's segment is used up; a's is not b's
  CHECK(t.revive(graph, 2 * MiB, 2 * MiB, stream_a()) == std::optional<std::uintptr_t>{0x1000000});
}

TEST_CASE("block_table: a released pool gives a segment back whole, once none of its pieces is live")
{
  table t;
  t.create_or_incref(user);
  t.insert(0x1000000, on(user, 2 * MiB, stream_a()));
  t.insert(0x4000000, on(user, MiB, stream_a()));
  (void)t.erase(0x1000000);
  (void)t.erase(0x4000000);
  const auto a = *t.revive(user, 512 * 1024, 512 * 1024, stream_a());  // in the 1 MiB segment (best fit)
  const auto b = *t.revive(user, 3 * MiB / 2, 3 * MiB / 2, stream_a());  // the 2 MiB large one, whole
  CHECK(a == 0x4000000);
  CHECK(b == 0x1000000);
  const auto first = t.release(user);  // a's segment and b's have live pieces: nothing yet
  CHECK(first.empty());
  const auto gone_b = t.erase(b);
  REQUIRE(gone_b);
  CHECK(!gone_b->parked);
  REQUIRE(gone_b->to_strata);
  CHECK(gone_b->to_strata->first == 0x1000000);
  CHECK(gone_b->to_strata->second.size == 2 * MiB);
  CHECK(gone_b->to_strata->second.stream == stream_a());
  CHECK(t.known(user));
  const auto gone_a = t.erase(a);
  REQUIRE(gone_a->to_strata);
  CHECK(gone_a->to_strata->second.size == MiB);  // the segment, not the piece
  CHECK(!t.known(user));
  CHECK(t.parked_bytes() == 0);
  CHECK(t.parked_blocks() == 0);
  CHECK(t.pool_segments() == 0);
  CHECK(t.pool_segment_bytes() == 0);
}

TEST_CASE("block_table: a backward pass reuses the forward's frees whatever their sizes")
{
  table t;
  t.create_or_incref(graph);
  pool_allocator alloc{t, graph};
  std::vector<std::uintptr_t> activations;
  for (std::size_t mib : {24, 16, 16, 12, 40}) activations.push_back(alloc(mib * MiB, stream_a()));
  CHECK(alloc.segments == 5);
  // Backward: each activation freed after its gradients are made; gradients of other sizes.
  for (int i = 4; i >= 0; --i) {
    (void)t.erase(activations[static_cast<std::size_t>(i)]);
    for (std::size_t kib : {3000, 5000, 1700}) (void)alloc(kib * 1024, stream_a());
  }
  CHECK(alloc.segments == 5);  // every gradient came out of a freed activation
  CHECK(t.pool_segment_bytes() == 108 * MiB);
}

TEST_CASE("block_table: a checkpoint of cut pieces is restored by cutting the segments again")
{
  table t;
  t.create_or_incref(graph);
  t.insert(0x1000000, on(graph, 8 * MiB, stream_a()));
  (void)t.erase(0x1000000);
  const auto p1 = *t.revive(graph, 2 * MiB, 2 * MiB, stream_a(), "one");
  const auto p2 = *t.revive(graph, 4 * MiB, 4 * MiB, stream_a(), "two");
  const auto saved = t.checkpoint(0, graph);
  (void)t.erase(p1);
  (void)t.erase(p2);
  const auto other = *t.revive(graph, 5 * MiB, 100, stream_a());
  CHECK(other == 0x1000000);
  const auto d = t.restore(saved);
  REQUIRE(d.freed.size() == 1);
  CHECK(d.freed[0] == other);
  REQUIRE(d.revived.size() == 2);
  CHECK(t.find(p1)->size == 2 * MiB);
  CHECK(t.find(p2)->size == 4 * MiB);
  CHECK(t.find(p2)->context == "two");
  CHECK(t.parked_bytes() == 2 * MiB);  // the segment's last 2 MiB
  CHECK(t.figures().live_bytes[pool_figures::index(false)] == 6 * MiB);
  CHECK(t.revive(graph, 2 * MiB, 2 * MiB, stream_a()) == std::optional<std::uintptr_t>{0x1000000 + 6 * MiB});
  (void)t.release(graph);
  pool_checkpoint<std::string> stale = saved;
  CHECK_THROWS_AS(t.restore(stale), std::invalid_argument);
}

TEST_CASE("block_table: random pool traffic over two streams keeps pieces tiling their segments and the figures exact")
{
  std::mt19937_64 rng(77);
  table t;
  t.create_or_incref(graph);
  pool_allocator alloc{t, graph};
  std::map<std::uintptr_t, std::pair<std::size_t, void*>> live;  // address -> size, stream
  std::size_t ok = 0, reused = 0;
  for (int i = 0; i < 20000; ++i) {
    void* s = rng() % 2 ? stream_a() : stream_b();
    if (rng() % 2 == 0 || live.empty()) {
      const std::size_t size = rng() % 3 == 0 ? 1 + rng() % (16 * MiB) : 1 + rng() % (MiB + MiB / 4);
      const std::size_t before = alloc.segments;
      const auto a = alloc(size, s);
      reused += alloc.segments == before ? 1 : 0;
      live[a] = {t.find(a)->size, s};
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      (void)t.erase(it->first);
      live.erase(it);
    }
    // Live pieces lie end to end without overlap; a piece's kind is its size's; the figures add up.
    bool good = true;
    std::array<std::size_t, 2> live_bytes{};
    std::uintptr_t end_of_last = 0;
    for (const auto& [a, piece] : live) {
      good = good && a >= end_of_last && piece.first >= 512 && piece.first % 512 == 0;
      end_of_last = a + piece.first;
      live_bytes[pool_figures::index(pool_layout::is_small(piece.first))] += piece.first;
    }
    const pool_figures& f = t.figures();
    for (std::size_t k = 0; k < 2; ++k) good = good && f.live_bytes[k] == live_bytes[k] && f.live_bytes[k] + f.parked_bytes[k] == f.segment_bytes[k];
    if (good && t.pool_segments() == alloc.segments) ++ok;
  }
  CHECK(ok == 20000);
  CHECK(reused > 5000);
}

TEST_CASE("block_table: a no-split pool hands parked pieces out whole, the best fitting first")
{
  table t;
  t.create_or_incref(user);
  CHECK_THROWS_AS(t.set_no_split(graph), std::invalid_argument);
  t.set_no_split(user);
  t.insert(0x1000000, on(user, 8 * MiB, stream_a()));
  t.insert(0x2000000, on(user, 4 * MiB, stream_a()));
  (void)t.erase(0x1000000);
  (void)t.erase(0x2000000);
  const auto a = t.revive(user, 2 * MiB, 2 * MiB, stream_a());
  REQUIRE(a);
  CHECK(*a == 0x2000000);
  CHECK(t.find(*a)->size == 4 * MiB);  // whole
  CHECK(t.parked_blocks() == 1);
  CHECK(t.revive(user, 2 * MiB, 2 * MiB, stream_a()) == std::optional<std::uintptr_t>{0x1000000});
  CHECK(!t.revive(user, 2 * MiB, 2 * MiB, stream_a()));
  pool_allocator alloc{t, user};
  const auto first = alloc(512, stream_a());
  CHECK(t.find(first)->size == 2 * MiB);  // a new segment is handed out whole too
  CHECK(pool_layout::is_small(pool_layout::block_bytes(t.find(first)->requested)));  // and counts in its request's kind, its segment's, not its size's
  CHECK(!pool_layout::is_small(pool_layout::block_bytes(t.find(0x1000000)->requested)));
  CHECK(t.find(0x7777) == nullptr);  // not live
  t.insert(0x9000000, in({}, 4096));
  CHECK(pool_layout::is_small(pool_layout::block_bytes(t.find(0x9000000)->requested)));
  (void)t.erase(0x1000000);  // parked: its segment stays the pool's
  const std::size_t parked = t.parked_bytes();
  CHECK_THROWS_AS(t.insert_segment(0x1000000, 8 * MiB, {4 * MiB, 4 * MiB, stream_a(), user, {}, {}}), std::logic_error);
  CHECK(t.parked_bytes() == parked);  // the table as it was
  CHECK(t.revive(user, 8 * MiB, 8 * MiB, stream_a()) == std::optional<std::uintptr_t>{0x1000000});
}

TEST_CASE("block_table: the small pool's pages are the 2 MiB pages holding live small blocks outside the pools")
{
  table t;
  t.insert(0x40000000, in({}, 512));
  t.insert(0x40000000 + 4096, in({}, 1000));
  CHECK(t.small_pages() == 1);  // two small blocks, one page
  t.insert(0x40000000 + 2 * MiB - 512, in({}, 1024));  // across the page's end: two pages
  CHECK(t.small_pages() == 2);
  t.insert(0x50000000, in({}, 4 * MiB));  // large: no page of the small pool
  CHECK(t.small_pages() == 2);
  t.create_or_incref(graph);
  t.insert(0x60000000, in(graph, 512));  // in a private pool: its segment counts, not a page
  CHECK(t.small_pages() == 2);
  (void)t.erase(0x40000000 + 2 * MiB - 512);
  CHECK(t.small_pages() == 1);
  (void)t.erase(0x40000000);
  CHECK(t.small_pages() == 1);  // the 1000-byte block still lives there
  (void)t.erase(0x40000000 + 4096);
  (void)t.erase(0x50000000);
  CHECK(t.small_pages() == 0);
  // Random traffic agrees with a recount.
  std::mt19937_64 rng(9);
  std::map<std::uintptr_t, std::size_t> live;
  std::size_t agreed = 0, checks = 0;
  for (int i = 0; i < 5000; ++i) {
    if (live.empty() || rng() % 2) {
      const std::uintptr_t a = 0x100000000 + 512 * (rng() % 40000);
      const std::size_t n = rng() % 4 ? 512 * (1 + rng() % 2048) : 2 * MiB;
      bool overlaps = false;
      for (const auto& [b, m] : live) overlaps = overlaps || (a < b + m && b < a + n);
      if (overlaps) continue;
      t.insert(a, in({}, n));
      live[a] = n;
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      (void)t.erase(it->first);
      live.erase(it);
    }
    std::set<std::uintptr_t> pages;
    for (const auto& [a, n] : live)
      if (n <= MiB)
        for (std::uintptr_t p = a / (2 * MiB); p <= (a + n - 1) / (2 * MiB); ++p) pages.insert(p);
    agreed += pages.size() == t.small_pages() ? 1 : 0;
    ++checks;
  }
  CHECK(agreed == checks);
  CHECK(checks > 4000);
}

TEST_CASE("block_table: random traffic with record_stream, settling, checkpoints and a release keeps the figures a recount gives")
{
  std::mt19937_64 rng(31);
  table t;
  t.create_or_incref(graph);
  pool_allocator alloc{t, graph};
  std::map<std::uintptr_t, std::uint64_t> unsettled;  // address -> ticket
  std::vector<std::uintptr_t> live;
  pool_checkpoint<std::string> saved = t.checkpoint(0, graph);
  const auto recount_matches = [&] {
    pool_figures f{};
    for (std::uintptr_t base : alloc.bases) {
      const auto seg = t.segment_at(base);
      if (!seg) continue;
      const std::size_t k = pool_figures::index(seg->small);
      ++f.segments[k];
      f.segment_bytes[k] += seg->size;
      (void)t.for_each_piece(base, [&](const pool_piece& pc) {
        if (pc.live) {
          f.live_bytes[k] += pc.size;
        } else {
          f.parked_bytes[k] += pc.size;
          ++f.parked_blocks[k];
        }
      });
    }
    const pool_figures& g = t.figures();
    return f.segments == g.segments && f.segment_bytes == g.segment_bytes && f.live_bytes == g.live_bytes &&
           f.parked_bytes == g.parked_bytes && f.parked_blocks == g.parked_blocks;
  };
  std::size_t matched = 0, steps = 0, settled = 0, restored = 0;
  for (int i = 0; i < 6000; ++i) {
    const auto r = rng() % 20;
    if (r < 8 || live.empty()) {
      const std::size_t size = rng() % 3 == 0 ? 1 + rng() % (12 * MiB) : 1 + rng() % MiB;
      live.push_back(alloc(size, stream_a()));
    } else if (r < 15) {
      const std::size_t k = rng() % live.size();
      const std::uintptr_t a = live[k];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      if (rng() % 3 == 0) (void)t.record_use(a, stream_b());
      const auto e = t.erase(a, rng() % 4 == 0);
      if (e && e->ticket != 0) unsettled[a] = e->ticket;
    } else if (r < 17 && !unsettled.empty()) {
      auto it = unsettled.begin();
      std::advance(it, static_cast<long>(rng() % unsettled.size()));
      settled += t.settle(it->first, it->second) ? 1 : 0;
      unsettled.erase(it);
    } else if (r == 17) {
      saved = t.checkpoint(0, graph);
    } else if (r == 18) {
      (void)t.restore(saved);
      live.clear();
      for (const auto& [a, b] : saved.blocks) live.push_back(a);
      unsettled.clear();  // a restore retickets what it parks
      ++restored;
    } else {
      (void)t.take_deferred();
    }
    matched += recount_matches() ? 1 : 0;
    ++steps;
  }
  CHECK(matched == steps);
  CHECK(settled > 50);
  CHECK(restored > 50);
  // Released with live pieces: segments go back as their last piece is freed; the figures follow to zero.
  (void)t.release(graph);
  CHECK(recount_matches());
  for (std::uintptr_t a : live) (void)t.erase(a);
  for (const auto& [a, ticket] : unsettled) (void)t.settle(a, ticket);
  CHECK(t.pool_segments() == 0);
  CHECK(t.parked_bytes() == 0);
  CHECK(t.figures().live_bytes[0] + t.figures().live_bytes[1] == 0);
  CHECK(!t.known(graph));
}
