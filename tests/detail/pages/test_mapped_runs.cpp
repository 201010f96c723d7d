// detail::mapped_runs: a range's mapped runs in address order. Checked against std::map over random adds and
// removes; lookups between, on and past runs.
#include <doctest/doctest.h>

#include <cstddef>
#include <iterator>
#include <map>
#include <random>
#include <type_traits>

#include <strata/detail/pages/mapped_runs.hpp>

using strata::detail::mapped_run;
using strata::detail::mapped_runs;

static_assert(std::is_nothrow_default_constructible_v<mapped_runs> && std::is_nothrow_move_constructible_v<mapped_runs>);

TEST_CASE("mapped_runs: runs filed in any order are kept by first page; lookups find the gap around a page")
{
  mapped_runs runs;
  CHECK(runs.empty());
  CHECK(runs.first_after(0) == runs.end());
  CHECK(runs.gap_before(runs.first_after(7)) == 0);
  runs.reserve_more(3);
  runs.add(10, 2);  // pages 10-11
  runs.add(2, 3);   // pages 2-4
  runs.add(20, 1);  // page 20
  REQUIRE(runs.size() == 3);
  CHECK(runs.begin()->first == 2);
  CHECK(std::next(runs.begin())->first == 10);
  CHECK(runs.first_after(1)->first == 2);
  CHECK(runs.first_after(2)->first == 10);  // starting after: the run at page 2 is not after it
  CHECK(runs.first_after(7)->first == 10);
  CHECK(runs.first_after(20) == runs.end());
  CHECK(runs.gap_before(runs.first_after(1)) == 0);   // before the first run
  CHECK(runs.gap_before(runs.first_after(7)) == 5);   // pages 5-9
  CHECK(runs.gap_before(runs.first_after(15)) == 12); // pages 12-19
  CHECK(runs.gap_before(runs.first_after(30)) == 21); // past the last run
  runs.remove(10);
  CHECK(runs.size() == 2);
  CHECK(runs.first_after(7)->first == 20);
  CHECK(runs.gap_before(runs.first_after(7)) == 5);
}

TEST_CASE("mapped_runs: random adds and removes agree with an ordered map")
{
  std::mt19937_64 rng(41);
  mapped_runs runs;
  std::map<std::size_t, std::size_t> truth;  // first -> count, every run on its own 16-page slot
  for (int step = 0; step < 5000; ++step) {
    const std::size_t first = (rng() % 256) * 16 + rng() % 4;
    const std::size_t slot_first = first / 16 * 16;
    const auto there = truth.lower_bound(slot_first);
    if (there != truth.end() && there->first < slot_first + 16) {
      runs.remove(there->first);
      truth.erase(there);
    } else {
      const std::size_t count = 1 + rng() % 12;
      runs.reserve_more(1);
      runs.add(first, count);
      truth.emplace(first, count);
    }
    REQUIRE(runs.size() == truth.size());
    const std::size_t probe = rng() % 4200;
    const auto expected = truth.upper_bound(probe);
    const auto found = runs.first_after(probe);
    if (expected == truth.end()) {
      REQUIRE(found == runs.end());
    } else {
      REQUIRE(found != runs.end());
      REQUIRE(found->first == expected->first);
      REQUIRE(found->count == expected->second);
    }
    const std::size_t gap = expected == truth.begin() ? 0 : std::prev(expected)->first + std::prev(expected)->second;
    REQUIRE(runs.gap_before(found) == gap);
  }
  std::size_t previous = 0;
  bool first_run = true;
  for (const mapped_run& run : runs) {  // in address order, never overlapping
    CHECK((first_run || run.first >= previous));
    previous = run.first + run.count;
    first_run = false;
  }
}
