#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

#include <strata/detail/tlsf_index.hpp>

namespace {

struct node {
  std::size_t size = 0;
  node* free_prev = nullptr;
  node* free_next = nullptr;
  std::size_t cost = 0;
};

} // namespace

using strata::detail::tlsf_index;

TEST_CASE("tlsf_index finds a block of exactly the requested size before rounding up")
{
  tlsf_index<node> index;
  // 300 KiB and 310 KiB fall in one TLSF list; plain TLSF would skip both for a request of 300 KiB.
  node exact{.size = 300 << 10}, larger{.size = 310 << 10}, far{.size = 8 << 20};
  index.insert(&far);
  index.insert(&larger);
  index.insert(&exact);
  CHECK(index.count() == 3);
  CHECK(index.find(300 << 10) == &exact);
  index.remove(&exact);
  CHECK(index.find(300 << 10) == &larger);  // still in the request's own list
  index.remove(&larger);
  CHECK(index.find(300 << 10) == &far);
  CHECK(index.find(16 << 20) == nullptr);
  CHECK(index.largest() == (8u << 20));
  index.remove(&far);
  CHECK(index.count() == 0);
  CHECK(index.find(256) == nullptr);
  CHECK(index.largest() == 0);
}

TEST_CASE("tlsf_index::find never returns a block too small")
{
  tlsf_index<node> index;
  std::vector<node> nodes(64);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    nodes[i].size = (i + 1) * 4096;
    index.insert(&nodes[i]);
  }
  for (std::size_t want = 256; want <= 64 * 4096; want += 256) {
    const node* n = index.find(want);
    REQUIRE(n != nullptr);
    CHECK(n->size >= want);
  }
  CHECK(index.find(64 * 4096 + 256) == nullptr);
}

TEST_CASE("tlsf_index::find_cheapest prefers the lowest cost within its budget")
{
  tlsf_index<node> index;
  node a{.size = 1 << 20, .cost = 3}, b{.size = 2 << 20, .cost = 1}, c{.size = 4 << 20, .cost = 0}, tiny{.size = 4096, .cost = 0};
  for (node* n : {&a, &b, &c, &tiny}) index.insert(n);
  const auto cost = [](const node* n) { return n->cost; };
  CHECK(index.find_cheapest(1 << 20, 16, cost) == &c);  // walks up to the free one
  CHECK(index.find_cheapest(1 << 20, 2, cost) == &b);   // budget of two: a, then b
  CHECK(index.find_cheapest(1 << 20, 1, cost) == &a);
  CHECK(index.find_cheapest(8 << 20, 16, cost) == nullptr);
  // Blocks of the request's own list that are too small use up the budget but never stop the search empty.
  node small_same_list{.size = (1 << 20) - 4096, .cost = 0};
  index.remove(&a);
  index.insert(&small_same_list);
  CHECK(index.find_cheapest((1 << 20) - 256, 1, cost) != nullptr);
}
