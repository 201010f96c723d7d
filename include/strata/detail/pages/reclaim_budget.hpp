#pragma once
// How much physical memory mapped_pool may hold before it gives idle memory back: only the peak counts
// against a program, so the budget is the most held since the last release() (the high-water mark), or the
// live bytes plus their slack when that is more, never above the physical cap. It also tells when the pool
// relocates idle memory rather than reclaiming it: when asked to, or once reclaims under the mark go on at a
// steady rate (detail::persistent_rate), which growth to a new peak never does and a loop does for ever.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include <strata/detail/pages/persistent_rate.hpp>

namespace strata::detail {

/// O(1), no allocation, no lock. A move hands the mark and the reclaim count over and leaves the other budget
/// at a mark of zero with its count started over (its settings kept).
class reclaim_budget {
public:
  static constexpr std::size_t reclaims_per_busy_window = 128;  ///< a busy window: one reclaim per this many allocations

  struct settings {
    std::size_t max_physical = SIZE_MAX;
    std::size_t reclaim_slack = 0;
    double reclaim_slack_fraction = 0.0;
    double reclaim_headroom_fraction = 0.0;
    bool relocate_idle = false;
    std::size_t persistent_reclaim_window = 0;  ///< 0: reclaims never switch relocation on
  };

  reclaim_budget() = default;
  explicit reclaim_budget(settings s) : settings_(s)
  {
    if (s.persistent_reclaim_window != 0)
      reclaims_ = persistent_rate{s.persistent_reclaim_window, s.persistent_reclaim_window / reclaims_per_busy_window, 2};
  }
  reclaim_budget(reclaim_budget&& other) noexcept
      : settings_(other.settings_), high_water_(std::exchange(other.high_water_, 0)), reclaims_(other.reclaims_)
  {
    other.reclaims_.reset();
  }
  reclaim_budget& operator=(reclaim_budget&& other) noexcept
  {
    if (this != &other) {
      settings_ = other.settings_;
      high_water_ = std::exchange(other.high_water_, 0);
      reclaims_ = other.reclaims_;
      other.reclaims_.reset();
    }
    return *this;
  }
  reclaim_budget(const reclaim_budget&) = delete;
  reclaim_budget& operator=(const reclaim_budget&) = delete;
  ~reclaim_budget() = default;

  /// The cap now: max_physical, or less where other pools share it (set_cap).
  std::size_t cap() const noexcept { return settings_.max_physical; }
  /// Lowers (or restores) the cap: mapped_pool's tags share one max_physical, so each tag's pool may hold
  /// only what the others leave. The mark never rises above it.
  void set_cap(std::size_t bytes) noexcept { settings_.max_physical = bytes; }

  /// The most the pool may hold once `live_after` bytes are live: the cap, and below it the high-water mark
  /// unless the live bytes with their slack are above it.
  std::size_t limit(std::size_t live_after) const noexcept
  {
    return std::min(settings_.max_physical, std::max(high_water_, with_slack(live_after)));
  }
  std::size_t high_water() const noexcept { return high_water_; }
  bool relocating() const noexcept { return settings_.relocate_idle || reclaims_.persistent(); }

  /// The pool holds `physical` bytes now.
  void held(std::size_t physical) noexcept { high_water_ = std::max(high_water_, physical); }
  /// An allocation was served.
  void tick() noexcept { reclaims_.tick(); }
  /// A reclaim kept the pool at its mark (not one the cap forced): the mark rises by the headroom, and the
  /// reclaim counts toward a persistent rate.
  void reclaimed_under_mark() noexcept
  {
    const double more = settings_.reclaim_headroom_fraction * static_cast<double>(high_water_);
    const std::size_t step = more >= 1.8e19 ? SIZE_MAX : static_cast<std::size_t>(more);
    high_water_ = std::min(settings_.max_physical, high_water_ > SIZE_MAX - step ? SIZE_MAX : high_water_ + step);
    reclaims_.note();
  }
  /// The pool gave memory back on request and holds `physical` bytes: growing again is growth.
  void restart(std::size_t physical) noexcept
  {
    high_water_ = physical;
    reclaims_.reset();
  }

private:
  std::size_t with_slack(std::size_t live) const noexcept
  {
    const double share = settings_.reclaim_slack_fraction * static_cast<double>(live);
    const std::size_t slack = std::max(settings_.reclaim_slack, share >= 1.8e19 ? SIZE_MAX : static_cast<std::size_t>(share));
    return live > SIZE_MAX - slack ? SIZE_MAX : live + slack;
  }

  settings settings_{};
  std::size_t high_water_ = 0;  ///< the most held since the last restart: reclaiming below it gains nothing
  persistent_rate reclaims_{};  ///< reclaims under the mark, per window of allocations
};

} // namespace strata::detail
