// detail::graph_pools (private pools' bookkeeping) and detail::graph_release_inbox (where CUDA's user-object
// destructors report a graph's end): reuse only in the same stream order, ownership by pointer, release with
// live blocks, the strong guarantee of adopt, and posts from other threads.
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include <strata/detail/stream/graph_pools.hpp>

using namespace strata::detail;

namespace {
struct blk {
  void* p;
  std::size_t bytes;
};
std::size_t bytes_of(const blk& b) { return b.bytes; }
void* addr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }
} // namespace

TEST_CASE("graph_pools: blocks are reused only in the same stream order, under the same tag and key, and belong to their pool")
{
  graph_pools<blk> pools;
  CHECK(pools.empty());
  auto [a, fresh] = pools.open({1, true});
  CHECK(fresh);
  CHECK_FALSE(pools.open({1, true}).second);
  auto [b, fresh_b] = pools.open({1, false});  // a caller's id 1 is another pool than capture 1
  CHECK(fresh_b);
  CHECK(a != b);
  CHECK(pools.size() == 2);

  pools.prepare_adopt();
  pools.adopt(*a, addr(0x1000), 256);
  pools.prepare_adopt();
  pools.adopt(*b, addr(0x2000), 512);
  CHECK(pools.owner_of(addr(0x1000)) == a);
  CHECK(pools.owner_of(addr(0x2000)) == b);
  CHECK(pools.owner_of(addr(0x3000)) == nullptr);
  CHECK(a->live_blocks == 1);

  const reuse_tag s1{7, 0xA}, s2{7, 0xB};
  pools.put(*a, s1, /*tag=*/0, /*key=*/42, blk{addr(0x1000), 256});
  CHECK(a->free_blocks == 1);
  CHECK(pools.free_blocks() == 1);
  blk out{};
  CHECK_FALSE(pools.take(*a, s2, 0, 42, out));  // another stream of the capture
  CHECK_FALSE(pools.take(*a, s1, 0, 43, out));  // another shape
  CHECK_FALSE(pools.take(*b, s1, 0, 42, out));  // another pool
  CHECK_FALSE(pools.take(*a, s1, 3, 42, out));  // another tag: it may sleep while this one runs
  CHECK(pools.take(*a, s1, 0, 42, out));
  CHECK(out.p == addr(0x1000));
  CHECK(a->live_blocks == 1);
  CHECK(a->free_blocks == 0);
  CHECK(pools.blocks() == 2);
  CHECK(pools.bytes() == 768);
}

TEST_CASE("graph_pools: release drains free blocks at once and live ones as they leave")
{
  graph_pools<blk> pools;
  auto* pl = pools.open({9, false}).first;
  for (std::uintptr_t i = 1; i <= 3; ++i) {
    pools.prepare_adopt();
    pools.adopt(*pl, addr(i << 12), 1000);
  }
  pools.put(*pl, reuse_tag::nowhere(), 0, 1, blk{addr(1 << 12), 1000});
  pools.put(*pl, {0, 5}, 2, 1, blk{addr(2 << 12), 1000});
  std::vector<void*> drained;
  pools.drain(*pl, &bytes_of, [&](const blk& b) noexcept { drained.push_back(b.p); });
  CHECK(drained.size() == 2);
  CHECK(pools.size() == 1);  // one block still live
  CHECK(pl->released);
  CHECK(pools.owner_of(addr(1 << 12)) == nullptr);
  CHECK(pools.owner_of(addr(3 << 12)) == pl);
  CHECK(pools.bytes() == 1000);
  pools.disown(*pl, addr(3 << 12), 1000);  // the last one leaves: the pool is gone
  CHECK(pools.empty());
  CHECK(pools.blocks() == 0);
}

TEST_CASE("graph_pools: an empty new pool can be forgotten; moves leave the source empty")
{
  graph_pools<blk> pools;
  auto* pl = pools.open({3, true}).first;
  pools.erase_if_empty(*pl);
  CHECK(pools.empty());
  pl = pools.open({4, true}).first;
  pools.prepare_adopt();
  pools.adopt(*pl, addr(0x5000), 256);
  graph_pools<blk> moved(std::move(pools));
  CHECK(pools.empty());
  CHECK(pools.blocks() == 0);
  CHECK(moved.owner_of(addr(0x5000)) == moved.find({4, true}));
  pools = std::move(moved);
  CHECK(pools.blocks() == 1);
  pools.prepare_adopt();  // the spare node moved with it; preparing again is harmless
  pools.prepare_adopt();
  pools.adopt(*pools.find({4, true}), addr(0x6000), 256);
  CHECK(pools.blocks() == 2);
  CHECK(pools.first_where([](const auto& p) { return p.live_blocks == 2; }) == pools.find({4, true}));
}

TEST_CASE("graph_release_inbox: posts from other threads reach the layer, in order, with no allocation")
{
  auto inbox = std::make_shared<graph_release_inbox>();
  CHECK_FALSE(inbox->any());
  constexpr int tokens = 64;
  std::vector<graph_release_inbox::token*> out;
  for (int i = 0; i < tokens; ++i) {
    inbox->expect_one();
    out.push_back(new graph_release_inbox::token{inbox, static_cast<std::uint64_t>(i)});
  }
  inbox->expect_one();
  inbox->unexpect_one();  // a token CUDA refused: never posts
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = t; i < tokens; i += 4) graph_release_inbox::on_graph_destroyed(out[static_cast<std::size_t>(i)]);
    });
  for (auto& th : threads) th.join();
  CHECK(inbox->any());
  std::vector<bool> seen(tokens, false);
  std::size_t collected = 0;
  for (std::uint64_t id = 0; inbox->front(id); inbox->pop()) {
    REQUIRE(id < tokens);
    CHECK_FALSE(seen[id]);
    seen[id] = true;
    ++collected;
  }
  CHECK(collected == tokens);
  CHECK_FALSE(inbox->any());
  CHECK(inbox.use_count() == 1);  // every token let go of it
}
