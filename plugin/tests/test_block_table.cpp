// The torch backend's block table: live blocks by address, private pools with use counts, parked blocks,
// checkPoolLiveAllocations and checkpoints restored at the same addresses.
#include <doctest/doctest.h>

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
  CHECK(gone->first.size == 512);
  CHECK(!gone->second);  // no pool: straight back to strata
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
  CHECK(e->second);  // parked
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
  CHECK(!late->second);  // the pool is released: straight back to strata
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
      CHECK(!gone->second);
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
  CHECK(freed->second);  // parked back in its pool
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
      if (!e || !e->second) break;
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
