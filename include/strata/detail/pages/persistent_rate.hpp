#pragma once
// Tells events that go on for ever apart from events that come in bursts. A pool that reclaims memory while
// it grows to a new peak reclaims in bursts that end (on the project's traces no two windows in a row reach
// mapped_pool's rate: their replays are the same with and without it); a loop whose blocks land on other
// pages every round reclaims at a steady rate for as long as it runs. Counting per fixed window of ticks and
// asking for several busy windows in a row separates the two with a few counters and no history.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace strata::detail {

/// Counts events per window of `window` ticks; a window is busy when it holds at least `per_window` events.
/// persistent() turns true at the event that makes `windows` busy windows in a row (the current one
/// included) and stays true until reset(). O(1), no allocation; not synchronized.
class persistent_rate {
public:
  persistent_rate() = default;
  persistent_rate(std::uint64_t window, std::uint64_t per_window, unsigned windows) : window_(window), per_window_(per_window), windows_(windows)
  {
    if (window == 0 || per_window == 0 || windows == 0)
      throw std::invalid_argument("persistent_rate: window " + std::to_string(window) + ", events per window " +
                                  std::to_string(per_window) + " and windows " + std::to_string(windows) + " must all be positive");
  }

  /// One tick (an allocation) passes.
  void tick() noexcept { ++ticks_; }

  /// Counts one event at the current tick; true when it is the one that makes the rate persistent.
  bool note() noexcept
  {
    if (window_ == 0 || persistent_) return false;
    const std::uint64_t w = ticks_ / window_;
    if (w != current_) {
      const bool previous_busy = w == current_ + 1 && in_current_ >= per_window_;
      busy_before_ = previous_busy ? busy_before_ + 1 : 0;
      current_ = w;
      in_current_ = 0;
    }
    if (++in_current_ == per_window_ && busy_before_ + 1 >= windows_) persistent_ = true;
    return persistent_;
  }

  bool persistent() const noexcept { return persistent_; }

  /// Forgets every window (after the owner gave its memory back, growth starts over).
  void reset() noexcept
  {
    current_ = ticks_ / (window_ == 0 ? 1 : window_);
    in_current_ = 0;
    busy_before_ = 0;
    persistent_ = false;
  }

private:
  std::uint64_t window_ = 0;  // 0: never persistent
  std::uint64_t per_window_ = 0;
  unsigned windows_ = 0;
  std::uint64_t ticks_ = 0;
  std::uint64_t current_ = 0;      // the window the last event fell in
  std::uint64_t in_current_ = 0;   // events in it
  unsigned busy_before_ = 0;       // busy windows in a row just before it
  bool persistent_ = false;
};

} // namespace strata::detail
