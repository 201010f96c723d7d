#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include <strata/detail/pages/tag_sleep.hpp>

using namespace strata::detail;

TEST_CASE("sleeping_tag: frees while asleep are found by address and leave the others' backup offsets alone")
{
  sleeping_tag t;
  t.blocks = {{0x1000, 256}, {0x2000, 512}, {0x9000, 1024}};
  t.freed.assign(3, 0);
  CHECK(t.bytes() == 1792);
  CHECK(t.holds(reinterpret_cast<void*>(0x2000)));
  CHECK_FALSE(t.holds(reinterpret_cast<void*>(0x2100)));
  CHECK(t.forget(reinterpret_cast<void*>(0x2000)));
  CHECK_FALSE(t.forget(reinterpret_cast<void*>(0x2000)));  // once
  CHECK_FALSE(t.forget(reinterpret_cast<void*>(0x5000)));
  CHECK(t.bytes() == 1280);
  std::vector<std::size_t> offsets;
  const auto waking = t.waking(offsets);
  REQUIRE(waking.size() == 2);
  CHECK(waking[1].first == 0x9000);
  CHECK(offsets == std::vector<std::size_t>{0, 768});  // where each was copied, freed neighbour skipped
}

TEST_CASE("pages_touched: a page shared by neighbouring blocks counts once")
{
  constexpr std::size_t page = 1 << 20;
  CHECK(pages_touched({}, page) == 0);
  CHECK(pages_touched({{0, 100}, {200, 100}}, page) == 1);
  CHECK(pages_touched({{0, page + 1}, {page + 256, 100}, {5 * page, 3 * page}}, page) == 5);
  CHECK(pages_touched({{page - 256, 512}}, page) == 2);
}
