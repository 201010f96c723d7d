#pragma once
// mapped_pool's page table: which pages of its two reserved ranges live blocks use, and so which mappings are
// busy and which idle (what reclaim may take). The mappings themselves, their backend calls and the stale
// ranges relocations leave are page_mappings.hpp's, which this extends.
//
// Live state is kept by runs, not pages: a page wholly inside a block is touched by that block alone, so a
// block's interior pages need no count of their own (each mapping counts its busy pages); only the block's
// first and last pages, which other blocks may share, keep a count of the live blocks ending there. Each range
// also keeps its mapped runs in address order (page_range.hpp), so the unmapped gaps of a span are found by a
// binary search instead of a walk over its pages. Holding, letting go and looking at a span costs O(mappings
// and gaps it covers), never O(pages).
//
// A block within one page or one mapping (nearly every request under mapped_pool's small limit) is served by
// a few inline lines; spans over several pieces are walked in functions kept out of line, so the pool's
// allocation path, which inlines the short ones, stays small enough for the compiler to inline in turn.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <strata/detail/page_mappings.hpp>
#include <strata/detail/page_range.hpp>

namespace strata::detail {

/// Models a count of live blocks over the pages of page_mappings' ranges, and from it each mapping's busy
/// pages, the pool's live pages and its idle bytes.
/// Cost: hold, let_go, census and unmapped_pages O(1) for a span within one mapping, else O(runs the span
/// covers) plus O(log runs) per unmapped gap; pages_ahead O(log runs). Never allocates but in pages_ahead
/// (grow), which changes nothing when it throws.
template <page_backend Backend>
class page_table : public page_mappings<Backend> {
  using base = page_mappings<Backend>;

public:
  using typename base::mapping;
  using typename base::piece;
  using typename base::range;
  using base::no_mapping;
  using base::stale_mapping;
  using base::base;
  using base::address_of;
  using base::bytes_of;
  using base::for_each_piece;
  using base::grow;
  using base::page_of;

  /// Pages of [start, start + size) with nothing behind them.
  std::size_t unmapped_pages(const range& r, std::uintptr_t start, std::size_t size) const noexcept
  {
    const std::size_t first = page_of(r, start);
    if (first < r.pages.size() && r.pages[first].mapping < stale_mapping) [[likely]] {  // within that mapping: no search
      const mapping& m = s_.mappings[r.pages[first].mapping];
      if (address_of(r, m.first + m.count) >= start + size) return 0;
    }
    return unmapped_in(r, first, page_of(r, start + size - 1));
  }

  /// Counts one more live block on pages [first, last], all mapped; their mappings stop being idle.
  void hold(range& r, std::size_t first, std::size_t last) noexcept
  {
    if (first == last) [[likely]] {  // a block within one page
      if (add_edge(r, first, 1)) busy_more(r.pages[first].mapping, 1);
    } else {
      hold_span(r, first, last);
    }
  }

  /// Counts one live block fewer on pages [first, last]; a mapping no live block touches any more goes idle.
  void let_go(range& r, std::size_t first, std::size_t last) noexcept
  {
    if (first == last) [[likely]] {
      if (add_edge(r, first, -1)) busy_less(r.pages[first].mapping, 1);
      return;
    }
    let_go_span(r, first, last);
  }

  struct page_census {
    std::size_t unmapped = 0;    ///< pages with nothing behind them
    std::size_t idle_bytes = 0;  ///< bytes of the idle mappings behind the others
  };
  /// What stands behind pages [first, last] (within the table).
  page_census census(const range& r, std::size_t first, std::size_t last) const noexcept
  {
    if (within_one_mapping(r, first, last)) [[likely]] {
      const mapping& m = s_.mappings[r.pages[first].mapping];
      return {.unmapped = 0, .idle_bytes = m.idle ? bytes_of(m) : 0};
    }
    return census_pieces(r, first, last);
  }

  /// How many free, unmapped pages after the span to map with its last run so that the run reaches `want`
  /// pages. The run stays within `max_run` pages, so the pages ahead share a mapping with live pages (never a
  /// mapping no block touches, which nothing would reclaim). May grow the table (strong guarantee).
  [[gnu::noinline]] std::size_t pages_ahead(range& r, page_span span, std::size_t want, std::size_t max_run)
  {
    if (r.pages[span.last].mapping != no_mapping || span.reach <= span.last) return 0;
    const auto gap = r.gap_at(span.last);
    // The unmapped run ending at the span's last page, split at max_run from its start.
    const std::size_t trailing = span.last + 1 - std::max(span.first, gap.first);
    const std::size_t last_run = (trailing - 1) % max_run + 1;
    if (last_run >= want) return 0;
    const std::size_t extra = std::min(want - last_run, span.reach - span.last);
    if (span.last + extra >= r.pages.size()) grow(r, span.last + extra + 1);
    return std::min(extra, gap.end - span.last - 1);
  }

private:
  friend class mapping_relocation<Backend>;
  using base::s_;

  // Spans over several pages, out of line (see the top of the file). Within one mapping a span is one piece.
  [[gnu::noinline]] std::size_t unmapped_in(const range& r, std::size_t first, std::size_t last) const noexcept
  {
    std::size_t unmapped = 0;
    for_each_piece(r, first, last, [&](const piece& pc) {
      if (pc.slot == no_mapping) unmapped += pc.last - pc.first + 1;
    });
    return unmapped;
  }
  [[gnu::noinline]] page_census census_pieces(const range& r, std::size_t first, std::size_t last) const noexcept
  {
    page_census c;
    for_each_piece(r, first, last, [&](const piece& pc) {
      if (pc.slot == no_mapping) c.unmapped += pc.last - pc.first + 1;
      else if (pc.slot != stale_mapping && s_.mappings[pc.slot].idle) c.idle_bytes += bytes_of(s_.mappings[pc.slot]);
    });
    return c;
  }
  [[gnu::noinline]] void hold_span(range& r, std::size_t first, std::size_t last) noexcept
  {
    if (within_one_mapping(r, first, last)) {
      const std::uint32_t slot = r.pages[first].mapping;
      busy_more(slot, last - first - 1 + add_edge(r, first, 1) + add_edge(r, last, 1));
      return;
    }
    for_each_piece(r, first, last, [&](const piece& pc) {
      busy_more(pc.slot, inner_pages(pc, first, last) + (pc.first == first && add_edge(r, first, 1)) + (pc.last == last && add_edge(r, last, 1)));
    });
  }
  [[gnu::noinline]] void let_go_span(range& r, std::size_t first, std::size_t last) noexcept
  {
    if (within_one_mapping(r, first, last)) {
      const std::uint32_t slot = r.pages[first].mapping;
      busy_less(slot, last - first - 1 + add_edge(r, first, -1) + add_edge(r, last, -1));
      return;
    }
    for_each_piece(r, first, last, [&](const piece& pc) {
      busy_less(pc.slot, inner_pages(pc, first, last) + (pc.first == first && add_edge(r, first, -1)) + (pc.last == last && add_edge(r, last, -1)));
    });
  }

  bool within_one_mapping(const range& r, std::size_t first, std::size_t last) const noexcept
  {
    return r.within_one_mapping(first, last, s_.mappings);
  }

  /// `pages` more pages of mapping `slot` touched by a live block; it stops being idle.
  void busy_more(std::uint32_t slot, std::size_t pages) noexcept
  {
    if (pages == 0) return;
    s_.live_pages += pages;
    s_.peak_live_pages = std::max(s_.peak_live_pages, s_.live_pages);
    mapping& m = s_.mappings[slot];
    if (m.busy == 0 && m.idle) {
      m.idle = false;
      s_.idle_bytes -= bytes_of(m);
    }
    m.busy += pages;
  }

  /// `pages` pages of mapping `slot` no longer touched by a live block; with none left, it goes idle.
  void busy_less(std::uint32_t slot, std::size_t pages) noexcept
  {
    if (pages == 0) return;
    s_.live_pages -= pages;
    mapping& m = s_.mappings[slot];
    m.busy -= pages;
    if (m.busy != 0) return;
    m.idle = true;
    s_.idle_bytes += bytes_of(m);
    if (!m.listed) s_.list_idle(slot);
  }

  /// Pages of the piece strictly inside the block [first, last]: touched by that block alone.
  static std::size_t inner_pages(const piece& pc, std::size_t first, std::size_t last) noexcept
  {
    const std::size_t lo = std::max(pc.first, first + 1);
    const std::size_t hi = last == 0 ? 0 : std::min(pc.last, last - 1);
    return lo <= hi && last > first + 1 ? hi - lo + 1 : 0;
  }

  /// Adds `delta` (+1 or -1) to the live count of a block's first or last page; true when the page goes from
  /// no live block to one, or back.
  bool add_edge(range& r, std::size_t p, int delta) noexcept
  {
    ++s_.page_state_updates;
    std::uint32_t& live = r.pages[p].live;
    if (delta > 0) return live++ == 0;
    return --live == 0;
  }
};

} // namespace strata::detail
