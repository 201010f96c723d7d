// detail::spare_allocations: allocations a reclaim kept, taken back by exact length.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include <strata/detail/pages/spare_allocations.hpp>

using strata::detail::spare_allocations;

static_assert(std::is_nothrow_default_constructible_v<spare_allocations<int>> && std::is_nothrow_move_constructible_v<spare_allocations<int>>);

TEST_CASE("spare_allocations: take hands back an allocation of exactly the length asked, once")
{
  spare_allocations<int> spares;
  CHECK(spares.empty());
  int out = -1;
  CHECK_FALSE(spares.take(1, out));
  CHECK(out == -1);  // nothing taken, nothing changed
  spares.reserve(3);
  spares.keep(10, 2);
  spares.keep(11, 1);
  spares.keep(12, 2);
  CHECK(spares.size() == 3);
  CHECK_FALSE(spares.take(3, out));
  CHECK(spares.size() == 3);
  REQUIRE(spares.take(1, out));
  CHECK(out == 11);
  CHECK_FALSE(spares.take(1, out));
  std::vector<int> two;
  while (spares.take(2, out)) two.push_back(out);
  std::sort(two.begin(), two.end());
  CHECK(two == std::vector<int>{10, 12});
  CHECK(spares.empty());
}

TEST_CASE("spare_allocations: release_all hands every allocation left to the destroyer")
{
  spare_allocations<int> spares;
  spares.reserve(4);
  for (int i = 0; i < 4; ++i) spares.keep(i, 1 + static_cast<std::size_t>(i % 2));
  int out = 0;
  REQUIRE(spares.take(2, out));
  spares.keep(out, 2);  // a taken allocation given back (as a failed mapping does)
  std::vector<int> destroyed;
  spares.release_all([&](int handle) noexcept { destroyed.push_back(handle); });
  std::sort(destroyed.begin(), destroyed.end());
  CHECK(destroyed == std::vector<int>{0, 1, 2, 3});
  CHECK(spares.empty());
  CHECK_FALSE(spares.take(1, out));
}
