#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include <strata/detail/pages/reclaim_budget.hpp>

using strata::detail::reclaim_budget;

namespace {
constexpr std::size_t mib = std::size_t{1} << 20;
} // namespace

TEST_CASE("reclaim_budget: the limit is the high-water mark, or the live bytes with their slack, under the cap")
{
  reclaim_budget budget({.max_physical = 100 * mib, .reclaim_slack = 4 * mib, .reclaim_slack_fraction = 0.5});
  CHECK(budget.limit(0) == 4 * mib);           // the slack alone
  CHECK(budget.limit(10 * mib) == 15 * mib);   // half the live bytes is more than 4 MiB
  budget.held(40 * mib);
  budget.held(30 * mib);  // the mark stays at the most held
  CHECK(budget.high_water() == 40 * mib);
  CHECK(budget.limit(10 * mib) == 40 * mib);
  CHECK(budget.limit(90 * mib) == 100 * mib);  // never above the cap
  CHECK(budget.limit(SIZE_MAX - mib) == 100 * mib);  // no overflow
  budget.restart(12 * mib);
  CHECK(budget.high_water() == 12 * mib);
}

TEST_CASE("reclaim_budget: a cap lowered by what others hold bounds the limit and the mark until it is restored")
{
  reclaim_budget budget({.max_physical = 100 * mib, .reclaim_headroom_fraction = 1.0});
  CHECK(budget.cap() == 100 * mib);
  budget.held(50 * mib);
  budget.set_cap(30 * mib);  // other pools on the device hold 70 MiB
  CHECK(budget.cap() == 30 * mib);
  CHECK(budget.limit(10 * mib) == 30 * mib);
  budget.reclaimed_under_mark();
  CHECK(budget.high_water() == 30 * mib);
  budget.set_cap(100 * mib);
  CHECK(budget.limit(10 * mib) == 30 * mib);  // the mark, no longer clipped
  CHECK(budget.limit(90 * mib) == 90 * mib);
}

TEST_CASE("reclaim_budget: a reclaim under the mark raises it by the headroom, up to the cap")
{
  reclaim_budget budget({.max_physical = 110 * mib, .reclaim_headroom_fraction = 0.25});
  budget.held(64 * mib);
  budget.reclaimed_under_mark();
  CHECK(budget.high_water() == 80 * mib);
  budget.reclaimed_under_mark();
  CHECK(budget.high_water() == 100 * mib);
  budget.reclaimed_under_mark();
  CHECK(budget.high_water() == 110 * mib);
}

TEST_CASE("reclaim_budget: reclaims at a steady rate switch relocation on until restart")
{
  reclaim_budget off({.persistent_reclaim_window = 0});
  reclaim_budget told({.relocate_idle = true});
  CHECK_FALSE(off.relocating());
  CHECK(told.relocating());

  reclaim_budget budget({.persistent_reclaim_window = 256});  // busy: 2 reclaims per 256 allocations
  int switched_at = -1;
  for (int window = 0; window < 3 && switched_at < 0; ++window) {
    for (int i = 0; i < 256; ++i) {
      budget.tick();
      if (i % 128 == 0) budget.reclaimed_under_mark();
      if (budget.relocating() && switched_at < 0) switched_at = window;
    }
  }
  CHECK(switched_at == 1);  // the second busy window in a row
  budget.restart(0);
  CHECK_FALSE(budget.relocating());

  reclaim_budget bursts({.persistent_reclaim_window = 256});
  for (int window = 0; window < 8; ++window)
    for (int i = 0; i < 256; ++i) {
      bursts.tick();
      if (window % 2 == 0 && i % 128 == 0) bursts.reclaimed_under_mark();  // busy windows never two in a row
    }
  CHECK_FALSE(bursts.relocating());
}

TEST_CASE("reclaim_budget: a move hands the mark over and leaves a budget starting afresh")
{
  reclaim_budget a({.max_physical = 64 * mib, .persistent_reclaim_window = 256});
  a.held(32 * mib);
  for (int i = 0; i < 512; ++i) {
    a.tick();
    if (i % 128 == 0) a.reclaimed_under_mark();
  }
  REQUIRE(a.relocating());
  reclaim_budget b(std::move(a));
  CHECK(b.high_water() == 32 * mib);
  CHECK(b.relocating());
  CHECK(a.high_water() == 0);  // NOLINT(bugprone-use-after-move): specified
  CHECK_FALSE(a.relocating());
  CHECK(a.limit(0) == 0);
  a = std::move(b);
  CHECK(a.high_water() == 32 * mib);
  CHECK(a.limit(100 * mib) == 64 * mib);  // the settings came along
}
