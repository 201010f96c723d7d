#pragma once
// One of mapped_pool's reserved address ranges cut in pages: which mapping (by its slot in mapping_slots.hpp)
// stands behind each page, how many live blocks start or end on it, and the range's mapped runs in address
// order (mapped_runs.hpp). page_mappings keeps two (it reserves them and writes which mapping stands behind
// each page); the page table counts live blocks on their entries.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <strata/detail/pages/mapped_runs.hpp>

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
/// for_each_piece O(log runs + pieces), the pieces after the first read off the runs in order;
/// for_each_mapping_over and unmapped_in O(1) over at most two mappings, else O(log runs + runs over the span); grow amortized O(1) per page (it doubles).
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
    if (on_mapping(p)) return mapping_piece(p, last, mappings);
    return piece_off_mappings(runs.first_after(p), p, last);
  }

  /// Calls f(piece) for each piece of pages [first, last], in order. After the first piece the runs are read
  /// in order: a piece costs the next run and its first page's entry, neither waiting for the piece before
  /// (looking each piece up from its page would chain a page entry and a mapping record per piece).
  template <class Records, class F>
  void for_each_piece(std::size_t first, std::size_t last, const Records& mappings, F&& f) const noexcept
  {
    auto next = runs.first_after(first);
    page_piece pc = on_mapping(first) ? mapping_piece(first, last, mappings) : piece_off_mappings(next, first, last);
    for (;;) {
      f(pc);
      if (pc.last == last) return;  // also where last is the range's final page
      pc = piece_from(next, pc.last + 1, last);
    }
  }

  /// Calls f(slot, lo, hi) for each mapping over pages [first, last], all of them mapped (not stale), in
  /// order: [lo, hi] is the part of the span on it. The first mappings are stepped over by their records (no
  /// search: most spans cover one or two); past those, the runs are read in order, each mapping's start no
  /// longer waiting for the one before.
  template <class Records, class F>
  void for_each_mapping_over(std::size_t first, std::size_t last, const Records& mappings, F&& f) const noexcept
  {
    std::size_t lo = first;
    for (int stepped = 0; stepped < records_stepped; ++stepped) {
      const std::uint32_t slot = pages[lo].mapping;
      const std::size_t hi = std::min(last, mappings[slot].first + mappings[slot].count - 1);
      f(slot, lo, hi);
      if (hi == last) return;
      lo = hi + 1;
    }
    for (auto run = runs.first_after(lo) - 1;; ++run) {
      const std::size_t hi = std::min(last, run->first + run->count - 1);
      f(pages[run->first].mapping, run->first, hi);
      if (hi == last) return;
    }
  }

  /// Pages of [first, last] that no run covers (nothing mapped, not stale). The first mappings are stepped
  /// over by their records; from there, the gaps between the runs are read off the runs alone.
  template <class Records>
  std::size_t unmapped_in(std::size_t first, std::size_t last, const Records& mappings) const noexcept
  {
    std::size_t p = first;  // the first page not yet counted
    for (int stepped = 0; stepped < records_stepped && on_mapping(p); ++stepped) {
      p = mappings[pages[p].mapping].first + mappings[pages[p].mapping].count;
      if (p > last) return 0;
    }
    auto next = runs.first_after(p);
    if (next != runs.begin()) p = std::max(p, std::min(last + 1, (next - 1)->first + (next - 1)->count));
    std::size_t unmapped = 0;
    for (; next != runs.end() && next->first <= last; ++next) {
      unmapped += next->first - p;
      p = std::min(last + 1, next->first + next->count);
    }
    return unmapped + (last + 1 - p);
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

private:
  static constexpr int records_stepped = 2;  ///< mappings stepped over by their records before a span's runs are searched

  bool on_mapping(std::size_t p) const noexcept { return p < pages.size() && pages[p].mapping < stale_mapping; }

  /// The piece at page p, behind a mapping.
  template <class Records>
  page_piece mapping_piece(std::size_t p, std::size_t last, const Records& mappings) const noexcept
  {
    const auto& m = mappings[pages[p].mapping];
    return {p, std::min(last, m.first + m.count - 1), pages[p].mapping};
  }

  /// The piece at page p, in a stale range or a gap; `next` is the first run after p.
  page_piece piece_off_mappings(mapped_runs::const_iterator next, std::size_t p, std::size_t last) const noexcept
  {
    if (p >= pages.size()) return {p, last, no_mapping};  // every run lies within the entries
    if (pages[p].mapping == stale_mapping) {
      const mapped_run& run = *(next - 1);
      return {p, std::min(last, run.first + run.count - 1), stale_mapping};
    }
    return {p, next == runs.end() ? last : std::min(last, next->first - 1), no_mapping};
  }

  /// The piece at page p, where `next` is the first run starting at p or after; `next` moves past it.
  page_piece piece_from(mapped_runs::const_iterator& next, std::size_t p, std::size_t last) const noexcept
  {
    if (next == runs.end()) return {p, last, no_mapping};
    if (next->first != p) return {p, std::min(last, next->first - 1), no_mapping};
    const mapped_run& run = *next++;
    return {p, std::min(last, run.first + run.count - 1), pages[p].mapping};
  }
};

} // namespace strata::detail
