#pragma once
// One of mapped_pool's reserved address ranges cut in pages: which mapping (by its slot in mapping_slots.hpp)
// stands behind each page, how many live blocks start or end on it, and the range's mapped runs in address
// order (mapped_runs.hpp). The page table keeps two and does the accounting; this is what it looks up.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <strata/detail/mapped_runs.hpp>

namespace strata::detail {

/// One page's entry.
struct page_state {
  static constexpr std::uint32_t no_mapping = UINT32_MAX;
  static constexpr std::uint32_t stale_mapping = UINT32_MAX - 1;  ///< a range a relocation left
  std::uint32_t live = 0;                  ///< live blocks starting or ending on the page (a block's inner pages count nothing)
  std::uint32_t mapping = no_mapping;      ///< the slot of the physical allocation behind it
};

/// Pages [first, last] of a span behind one mapping (`slot`), one stale range (stale_mapping) or nothing
/// (no_mapping).
struct page_piece {
  std::size_t first;
  std::size_t last;
  std::uint32_t slot;
};

/// The pages of a new block, [first, last], and the first and last pages of the free block it is cut from,
/// [from, reach] (the farthest a new mapping may reach ahead; nothing there may move).
struct page_span {
  std::size_t first;
  std::size_t last;
  std::size_t from;
  std::size_t reach;
};

/// Models an array of page entries, grown on demand up to the range's size (entries past its end have
/// nothing behind them), with the ordered set of the runs mapped in it. Lookups take the mapping records:
/// anything indexed by slot whose elements have `first` and `count` (pages).
/// Cost: within_one_mapping O(1); piece_at O(1) on a mapping's page, O(log runs) elsewhere, as gap_at;
/// for_each_piece O(pieces) of those; grow amortized O(1) per page (it doubles).
struct page_range {
  static constexpr std::uint32_t no_mapping = page_state::no_mapping;
  static constexpr std::uint32_t stale_mapping = page_state::stale_mapping;

  std::uintptr_t base = 0;
  std::size_t size = 0;
  std::vector<page_state> pages;  ///< up to the highest page touched
  mapped_runs runs;               ///< mappings and stale ranges

  /// Makes the entries reach at least `count` pages, doubling (strong guarantee: new pages have nothing
  /// behind them).
  void grow(std::size_t count, std::size_t page_size) { pages.resize(std::max(count, std::min(size / page_size, pages.size() * 2))); }

  /// The piece of [p, last] that starts at p: up to the end of the run behind p or of the gap before the
  /// next run.
  template <class Records>
  page_piece piece_at(std::size_t p, std::size_t last, const Records& mappings) const noexcept
  {
    if (p >= pages.size()) return {p, last, no_mapping};  // every run lies within the entries
    const std::uint32_t slot = pages[p].mapping;
    if (slot < stale_mapping) {
      const auto& m = mappings[slot];
      return {p, std::min(last, m.first + m.count - 1), slot};
    }
    const auto next = runs.first_after(p);
    if (slot == stale_mapping) {
      const mapped_run& run = *(next - 1);
      return {p, std::min(last, run.first + run.count - 1), slot};
    }
    return {p, next == runs.end() ? last : std::min(last, next->first - 1), no_mapping};
  }

  /// Calls f(piece) for each piece of pages [first, last], in order.
  template <class Records, class F>
  void for_each_piece(std::size_t first, std::size_t last, const Records& mappings, F&& f) const noexcept
  {
    for (std::size_t p = first; p <= last;) {
      const page_piece pc = piece_at(p, last, mappings);
      f(pc);
      if (pc.last == last) return;  // also where last is the range's final page
      p = pc.last + 1;
    }
  }

  /// Whether pages [first, last] all lie in one mapping: the common case, answered without a search.
  template <class Records>
  bool within_one_mapping(std::size_t first, std::size_t last, const Records& mappings) const noexcept
  {
    if (first >= pages.size()) return false;
    const std::uint32_t slot = pages[first].mapping;
    return slot < stale_mapping && mappings[slot].first + mappings[slot].count > last;
  }

  /// Pages [first, end) with nothing mapped; `end` is SIZE_MAX past the last run.
  struct gap {
    std::size_t first;
    std::size_t end;
  };
  /// The unmapped gap around page p (no run covers it).
  gap gap_at(std::size_t p) const noexcept
  {
    const auto next = runs.first_after(p);
    return {runs.gap_before(next), next == runs.end() ? SIZE_MAX : next->first};
  }
};

} // namespace strata::detail
