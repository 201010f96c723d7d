#include <doctest/doctest.h>

#include <stdexcept>

#include <strata/detail/pages/persistent_rate.hpp>

using strata::detail::persistent_rate;

namespace {

/// Ticks `ticks` times, noting an event every `every` ticks; the tick at which persistent() turned true, or -1.
long run(persistent_rate& rate, long ticks, long every)
{
  long turned = -1;
  for (long t = 0; t < ticks; ++t) {
    rate.tick();
    if (t % every == 0 && rate.note()) turned = t;
  }
  return turned;
}

} // namespace

TEST_CASE("persistent_rate: a steady rate turns persistent at the event that fills the last busy window")
{
  persistent_rate rate{100, 10, 2};  // busy: 10 events in 100 ticks; two busy windows in a row
  // One event every 5 ticks: window 0 (ticks 1-99 after the first tick) gets its 10th event at tick 45,
  // window 1 its 10th at tick 145: that event turns it.
  CHECK(run(rate, 300, 5) == 145);
  CHECK(rate.persistent());
  CHECK_FALSE(rate.note());  // only the turning event says so
}

TEST_CASE("persistent_rate: bursts that fill one window, or windows that are not adjacent, are not persistent")
{
  persistent_rate rate{100, 10, 2};
  for (int burst = 0; burst < 5; ++burst) {
    for (int k = 0; k < 50; ++k) {  // 50 events in one window...
      rate.tick();
      CHECK_FALSE(rate.note());
    }
    for (int k = 0; k < 200; ++k) rate.tick();  // ...then two quiet windows
  }
  CHECK_FALSE(rate.persistent());
  // Busy, quiet, busy: the streak starts over.
  persistent_rate gaps{100, 10, 2};
  CHECK(run(gaps, 100, 5) == -1);
  CHECK(run(gaps, 100, 1000) == -1);  // one event in the quiet window: below 10
  CHECK(run(gaps, 100, 5) == -1);
  CHECK_FALSE(gaps.persistent());
}

TEST_CASE("persistent_rate: a rate just under the threshold never turns; reset() forgets the windows")
{
  persistent_rate rate{100, 10, 2};
  CHECK(run(rate, 10'000, 11) == -1);  // 9 or 10 events per window...
  persistent_rate under{100, 10, 2};
  CHECK(run(under, 10'000, 12) == -1);  // ...and 8 or 9
  persistent_rate turned{100, 10, 3};
  CHECK(run(turned, 1000, 5) == 245);  // three windows: the third's tenth event
  turned.reset();
  CHECK_FALSE(turned.persistent());
  CHECK(run(turned, 1000, 5) == 245);  // three busy windows again, counted afresh (ticks went on from 1000: same phase)
}

TEST_CASE("persistent_rate: a default one never turns; bad parameters are std::invalid_argument")
{
  persistent_rate never;
  CHECK(run(never, 10'000, 1) == -1);
  CHECK_THROWS_AS(persistent_rate(0, 1, 1), std::invalid_argument);
  CHECK_THROWS_AS(persistent_rate(10, 0, 1), std::invalid_argument);
  CHECK_THROWS_AS(persistent_rate(10, 1, 0), std::invalid_argument);
}
