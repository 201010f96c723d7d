#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include <strata/detail/tlsf_lists.hpp>

using strata::detail::tlsf_lists;
namespace tlsf = strata::detail::tlsf;

namespace {
struct node {
  std::size_t size = 0;
  node* free_prev = nullptr;
  node* free_next = nullptr;
};
constexpr std::size_t MiB = std::size_t{1} << 20;
} // namespace

TEST_CASE("tlsf_lists: a block of exactly the requested size is found in the request's own list")
{
  // 1 MiB + 4 KiB is not a list boundary: plain TLSF searches from the next list up and misses it.
  const std::size_t odd = MiB + 4096;
  REQUIRE(tlsf::list_floor(tlsf::mapping_insert(odd / tlsf::granule)) != odd / tlsf::granule);
  tlsf_lists<node> lists;
  node exact{odd};
  lists.insert(&exact);
  CHECK(lists.find(odd, 16) == &exact);
  CHECK(lists.find(odd, 0) == nullptr);  // no scan: only the lists above, which are empty
  CHECK(lists.find(odd + tlsf::granule, 16) == nullptr);  // too small for one granule more
  lists.remove(&exact);
  CHECK(lists.count() == 0);
  CHECK(lists.find(odd, 16) == nullptr);
}

TEST_CASE("tlsf_lists: the own list is scanned for the best fit, at most scan_limit blocks")
{
  const std::size_t odd = MiB + 4096;
  tlsf_lists<node> lists;
  node exact{odd}, larger{odd + 2 * tlsf::granule}, smaller{odd - tlsf::granule};
  lists.insert(&exact);
  lists.insert(&larger);
  lists.insert(&smaller);  // filed last: the list's head
  CHECK(lists.count() == 3);
  CHECK(lists.find(odd, 16) == &exact);            // best fit, though not the first that fits
  CHECK(lists.find(odd, 2) == &larger);            // the scan stops after two: the best of those
  CHECK(lists.find(odd + 1 * tlsf::granule, 16) == &larger);
  CHECK(lists.find(odd - tlsf::granule, 16) == &smaller);
}

TEST_CASE("tlsf_lists: above the own list, the first non-empty list is taken in O(1)")
{
  tlsf_lists<node> lists;
  node big{64 * MiB}, huge{1024 * MiB};
  lists.insert(&huge);
  lists.insert(&big);
  CHECK(lists.find(MiB + 4096, 16) == &big);
  CHECK(lists.find(65 * MiB, 16) == &huge);
  CHECK(lists.find(2048 * MiB, 16) == nullptr);
  CHECK(lists.largest() == 1024 * MiB);
  lists.remove(&huge);
  CHECK(lists.largest() == 64 * MiB);
  lists.clear();
  CHECK(lists.count() == 0);
  CHECK(lists.largest() == 0);
  CHECK(lists.find(256, 16) == nullptr);
}

TEST_CASE("tlsf_lists: every size small and large, filed and found again")
{
  tlsf_lists<node> lists;
  std::vector<node> nodes;
  for (std::size_t granules = 1; granules < 5000; granules += 7) nodes.push_back({granules * tlsf::granule});
  for (auto& n : nodes) lists.insert(&n);
  CHECK(lists.count() == nodes.size());
  for (auto& n : nodes) {
    node* found = lists.find(n.size, 64);
    REQUIRE(found != nullptr);
    CHECK(found->size >= n.size);
    CHECK(found->size < n.size + n.size / 16 + tlsf::granule);  // a good fit, never a far larger block
  }
  for (auto& n : nodes) lists.remove(&n);
  CHECK(lists.count() == 0);
  CHECK(lists.find(tlsf::granule, 64) == nullptr);
}

namespace {
struct cheap_node {
  std::size_t size = 0;
  cheap_node* free_prev = nullptr;
  cheap_node* free_next = nullptr;
  std::size_t cost = 0;
};
} // namespace

TEST_CASE("tlsf_lists::find_cheapest prefers the lowest cost within its budget")
{
  tlsf_lists<cheap_node> index;
  cheap_node a{.size = 1 << 20, .cost = 3}, b{.size = 2 << 20, .cost = 1}, c{.size = 4 << 20, .cost = 0}, tiny{.size = 4096, .cost = 0};
  for (cheap_node* n : {&a, &b, &c, &tiny}) index.insert(n);
  const auto cost = [](const cheap_node* n) { return n->cost; };
  CHECK(index.find_cheapest(1 << 20, 16, cost).block == &c);  // walks up to the free one
  CHECK(index.find_cheapest(1 << 20, 2, cost).block == &b);   // budget of two: a, then b
  CHECK(index.find_cheapest(1 << 20, 1, cost).block == &a);
  CHECK(index.find_cheapest(8 << 20, 16, cost).block == nullptr);
  // Blocks of the request's own list that are too small use up the budget but never stop the search empty.
  cheap_node small_same_list{.size = (1 << 20) - 4096, .cost = 0};
  index.remove(&a);
  index.insert(&small_same_list);
  CHECK(index.find_cheapest((1 << 20) - 256, 1, cost).block != nullptr);
}

namespace {
/// The lists as plain containers, each newest first, walked list by list over every index: what
/// find_cheapest must choose, whatever it skips.
struct reference_lists {
  std::map<std::pair<unsigned, unsigned>, std::deque<cheap_node*>> lists;

  static std::pair<unsigned, unsigned> key(tlsf::list_index i) { return {i.first, i.second}; }
  void insert(cheap_node* n) { lists[key(tlsf::mapping_insert(n->size / tlsf::granule))].push_front(n); }
  void remove(cheap_node* n)
  {
    auto& list = lists[key(tlsf::mapping_insert(n->size / tlsf::granule))];
    list.erase(std::find(list.begin(), list.end(), n));
  }

  cheap_node* cheapest(std::size_t bytes, int budget) const
  {
    cheap_node* best = nullptr;
    std::size_t best_cost = SIZE_MAX;
    const auto consider = [&](cheap_node* b) {
      if (b->cost < best_cost) {
        best = b;
        best_cost = b->cost;
      }
      return b->cost == 0 || --budget <= 0;
    };
    const auto own = key(tlsf::mapping_insert(bytes / tlsf::granule));
    if (auto it = lists.find(own); it != lists.end()) {
      int walk = budget;
      for (cheap_node* b : it->second) {
        if (walk-- <= 0) break;
        if (b->size >= bytes && consider(b)) return best;
      }
    }
    for (auto it = lists.lower_bound(key(tlsf::mapping_search(bytes / tlsf::granule))); it != lists.end(); ++it) {
      if (it->first == own) continue;
      for (cheap_node* b : it->second)
        if (consider(b)) return best;
    }
    return best;
  }
};
} // namespace

TEST_CASE("tlsf_lists::find_cheapest chooses what a walk over every list chooses, over sparse random lists")
{
  std::mt19937_64 rng(7);
  const auto pick = [&](std::size_t below) { return std::uniform_int_distribution<std::size_t>(0, below - 1)(rng); };
  const auto random_size = [&] {  // log-uniform from one granule to 2^40 bytes: most lists empty, blocks far apart
    const auto bits = static_cast<unsigned>(pick(33));
    return (std::uint64_t{1} << bits) * tlsf::granule + pick(std::size_t{1} << bits) * tlsf::granule;
  };
  std::vector<cheap_node> nodes(400);
  std::vector<bool> filed(nodes.size(), false);
  tlsf_lists<cheap_node> index;
  reference_lists reference;
  const auto file = [&](std::size_t k) {
    nodes[k].size = random_size();
    nodes[k].cost = pick(7);
    index.insert(&nodes[k]);
    reference.insert(&nodes[k]);
    filed[k] = true;
  };
  int agreed = 0, found = 0;
  constexpr int rounds = 6000;
  for (int round = 0; round < rounds; ++round) {
    const std::size_t k = pick(nodes.size());
    if (filed[k]) {
      index.remove(&nodes[k]);
      reference.remove(&nodes[k]);
      filed[k] = false;
    } else {
      file(k);
    }
    const std::size_t bytes = random_size();
    const int budget = static_cast<int>(pick(20)) + 1;
    const auto chosen = index.find_cheapest(bytes, budget, [](const cheap_node* n) { return n->cost; });
    cheap_node* expected = reference.cheapest(bytes, budget);
    agreed += chosen.block == expected && chosen.cost == (expected != nullptr ? expected->cost : SIZE_MAX);
    found += expected != nullptr;
  }
  CHECK(agreed == rounds);
  CHECK(found > rounds / 4);  // the searches were not all empty
  CHECK(index.count() == static_cast<std::size_t>(std::count(filed.begin(), filed.end(), true)));
}
