// detail::pointer_map: the flat open-addressing map of the pools' hot paths. Checked against std::map over
// a random sequence; construction and moves are noexcept and leave an empty, usable map behind (whether they
// allocate is checked in the fault-injection program, which counts host allocations).
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <random>
#include <type_traits>

#include <strata/detail/pointer_map.hpp>

using strata::detail::pointer_map;

static_assert(std::is_nothrow_default_constructible_v<pointer_map<int>>);
static_assert(std::is_nothrow_move_constructible_v<pointer_map<int>> && std::is_nothrow_move_assignable_v<pointer_map<int>>);

namespace {
const void* address(std::uint64_t k) { return reinterpret_cast<const void*>(k << 8); }  // 256-byte aligned, never 0
} // namespace

TEST_CASE("pointer_map: an empty map answers every query")
{
  pointer_map<int> m;
  CHECK(m.empty());
  CHECK(m.find(address(1)) == nullptr);
  CHECK_FALSE(m.contains(address(1)));
  CHECK_FALSE(m.erase(address(1)));
  int out = 0;
  CHECK_FALSE(m.take(address(1), &out));
  int visited = 0;
  m.for_each([&](void*, int) { ++visited; });
  CHECK(visited == 0);
  m.clear();
  CHECK(m.size() == 0);
}

TEST_CASE("pointer_map: agrees with std::map over random inserts, overwrites and erases")
{
  pointer_map<std::uint64_t> m;
  std::map<std::uint64_t, std::uint64_t> expected;
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<std::uint64_t> key(1, 3000);  // collisions and overwrites are common
  for (int step = 0; step < 50'000; ++step) {
    const std::uint64_t k = key(rng);
    if (rng() % 3 != 0) {
      m.insert(address(k), step);
      expected[k] = step;
    } else {
      std::uint64_t out = 0;
      const bool had = expected.erase(k) != 0;
      REQUIRE(m.take(address(k), &out) == had);
    }
    REQUIRE(m.size() == expected.size());
  }
  for (const auto& [k, v] : expected) {
    const auto* found = m.find(address(k));
    REQUIRE(found != nullptr);
    CHECK(*found == v);
  }
  std::size_t visited = 0;
  m.for_each([&](void* p, std::uint64_t v) {
    ++visited;
    CHECK(expected.at(reinterpret_cast<std::uintptr_t>(p) >> 8) == v);
  });
  CHECK(visited == expected.size());
}

TEST_CASE("pointer_map: a moved-from map is empty and usable")
{
  pointer_map<int> a;
  for (int i = 1; i <= 100; ++i) a.insert(address(i), i);
  pointer_map<int> b(std::move(a));
  CHECK(b.size() == 100);
  CHECK(*b.find(address(42)) == 42);
  CHECK(a.empty());  // NOLINT(bugprone-use-after-move): the rule under test
  CHECK(a.find(address(42)) == nullptr);
  a.insert(address(7), 7);
  CHECK(*a.find(address(7)) == 7);
  pointer_map<int> c;
  c.insert(address(1000), 1000);
  c = std::move(b);
  CHECK(c.size() == 100);
  CHECK_FALSE(c.contains(address(1000)));
  CHECK(b.empty());  // NOLINT(bugprone-use-after-move)
  b.insert(address(3), 3);
  CHECK(b.size() == 1);
}
