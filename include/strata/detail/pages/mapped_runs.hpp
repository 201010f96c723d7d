#pragma once
// The mapped runs of one of mapped_pool's address ranges, in address order: the page table looks up the
// unmapped gap around a page by a binary search here instead of walking the gap's pages.
#include <algorithm>
#include <cstddef>
#include <vector>

namespace strata::detail {

/// Pages [first, first + count) of a range with something mapped behind them.
struct mapped_run {
  std::size_t first = 0;
  std::size_t count = 0;
};

/// Models an ordered set of runs that never overlap, keyed by their first page.
/// Cost: first_after O(log runs), gap_before O(1); add and remove O(log runs) to find the place plus moving
/// the runs after it (one memmove). Only reserve_more allocates (strong guarantee), so adding within the room it
/// made cannot throw.
class mapped_runs {
public:
  using const_iterator = std::vector<mapped_run>::const_iterator;

  const_iterator begin() const noexcept { return runs_.begin(); }
  const_iterator end() const noexcept { return runs_.end(); }
  std::size_t size() const noexcept { return runs_.size(); }
  bool empty() const noexcept { return runs_.empty(); }

  /// Room for `more` runs beyond those filed.
  void reserve_more(std::size_t more)
  {
    if (runs_.size() + more > runs_.capacity()) runs_.reserve(std::max(runs_.size() + more, 2 * runs_.capacity()));
  }

  /// Files pages [first, first + count), overlapping no filed run (room reserved).
  void add(std::size_t first, std::size_t count) noexcept { runs_.insert(first_after(first), mapped_run{first, count}); }

  /// Takes out the run starting at page `first` (one is filed there).
  void remove(std::size_t first) noexcept
  {
    const auto at = std::lower_bound(runs_.begin(), runs_.end(), first, [](const mapped_run& run, std::size_t page) { return run.first < page; });
    runs_.erase(at);
  }

  /// The first run starting after page `page` (end() if none).
  const_iterator first_after(std::size_t page) const noexcept
  {
    return std::upper_bound(runs_.begin(), runs_.end(), page, [](std::size_t p, const mapped_run& run) { return p < run.first; });
  }

  /// The first page past the run before `next` (0 when `next` is the first run): where the gap before `next`
  /// starts, when no run covers that page.
  std::size_t gap_before(const_iterator next) const noexcept
  {
    if (next == runs_.begin()) return 0;
    const mapped_run& before = *(next - 1);
    return before.first + before.count;
  }

private:
  std::vector<mapped_run> runs_;
};

} // namespace strata::detail
