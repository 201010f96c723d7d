#pragma once
// mapped_pool's page table: which pages of its two reserved ranges live blocks use, and so which mappings are
// busy and which idle (what reclaim may take). It holds the mappings (page_mappings.hpp: the backend, its
// allocations, the ranges' page entries and the stale ranges relocations leave) as a member and tells them,
// through add_busy / remove_busy, which of them live blocks touch; callers reach them through mappings().
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
#include <utility>

#include <strata/detail/emptied_on_move.hpp>
#include <strata/detail/pages/page_backend.hpp>
#include <strata/detail/pages/page_mappings.hpp>
#include <strata/detail/pages/page_range.hpp>

namespace strata::detail {

/// Models a count of live blocks over the pages of its mappings' ranges, and from it each mapping's busy
/// pages, the pool's live pages and its idle bytes. Owns its page_mappings (and through it the backend and
/// everything taken from it) and the live-page counts; moves are the members' (a moved-from table is empty).
/// Cost: hold, let_go, census and unmapped_pages O(1) for a span within one mapping, else O(runs the span
/// covers + log runs); pages_ahead O(log runs). No backend call. Never allocates but in pages_ahead
/// (grow), which changes nothing when it throws.
template <page_backend Backend>
class page_table {
public:
  using mappings_type = page_mappings<Backend>;
  using mapping = typename mappings_type::mapping;
  using piece = typename mappings_type::piece;
  using range = typename mappings_type::range;
  static constexpr std::uint32_t no_mapping = mappings_type::no_mapping;
  static constexpr std::uint32_t stale_mapping = mappings_type::stale_mapping;

  explicit page_table(Backend backend) : mappings_(std::move(backend)) {}

  /// The mappings behind the pages: reserving, mapping, reclaiming and relocating go through them.
  mappings_type& mappings() noexcept { return mappings_; }
  const mappings_type& mappings() const noexcept { return mappings_; }

  /// Pages some live block touches now, and at most since reset_peak.
  std::size_t live_pages() const noexcept { return c_.live_pages; }
  std::size_t peak_live_pages() const noexcept { return c_.peak_live_pages; }
  /// Per-page entries written so far, the live counts here and the mappings' entries: what a block's size
  /// would cost if page state were kept page by page.
  std::uint64_t page_state_updates() const noexcept { return c_.edge_updates + mappings_.page_state_updates(); }
  void reset_peak() noexcept
  {
    mappings_.reset_peak();
    c_.peak_live_pages = c_.live_pages;
  }

  /// Pages of [start, start + size) with nothing behind them.
  std::size_t unmapped_pages(const range& r, std::uintptr_t start, std::size_t size) const noexcept
  {
    const std::size_t first = mappings_.page_of(r, start);
    if (first < r.pages.size() && r.pages[first].mapping < stale_mapping) [[likely]] {  // within that mapping: no search
      const mapping& m = mappings_.slot(r.pages[first].mapping);
      if (mappings_.address_of(r, m.first + m.count) >= start + size) return 0;
    }
    return unmapped_in(r, first, mappings_.page_of(r, start + size - 1));
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
      const mapping& m = mappings_.slot(r.pages[first].mapping);
      return {.unmapped = 0, .idle_bytes = m.idle ? mappings_.bytes_of(m) : 0};
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
    if (span.last + extra >= r.pages.size()) mappings_.grow(r, span.last + extra + 1);
    return std::min(extra, gap.end - span.last - 1);
  }

private:
  struct counts {
    std::size_t live_pages = 0;
    std::size_t peak_live_pages = 0;
    std::uint64_t edge_updates = 0;  ///< live counts of blocks' first and last pages written
  };

  // Spans over several pages, out of line (see the top of the file). Within one mapping a span is one piece.
  [[gnu::noinline]] std::size_t unmapped_in(const range& r, std::size_t first, std::size_t last) const noexcept
  {
    return r.unmapped_in(first, last, mappings_.records());
  }
  [[gnu::noinline]] page_census census_pieces(const range& r, std::size_t first, std::size_t last) const noexcept
  {
    page_census c;
    mappings_.for_each_piece(r, first, last, [&](const piece& pc) {
      if (pc.slot == no_mapping) c.unmapped += pc.last - pc.first + 1;
      else if (pc.slot != stale_mapping && mappings_.slot(pc.slot).idle) c.idle_bytes += mappings_.bytes_of(mappings_.slot(pc.slot));
    });
    return c;
  }
  void hold_span(range& r, std::size_t first, std::size_t last) noexcept { change_span<+1>(r, first, last); }
  void let_go_span(range& r, std::size_t first, std::size_t last) noexcept { change_span<-1>(r, first, last); }
  /// One live block more (Delta +1) or fewer (-1) on every page of the span.
  template <int Delta>
  [[gnu::noinline]] void change_span(range& r, std::size_t first, std::size_t last) noexcept
  {
    if (within_one_mapping(r, first, last)) {
      const std::uint32_t slot = r.pages[first].mapping;
      const std::size_t n = last - first - 1 + add_edge(r, first, Delta) + add_edge(r, last, Delta);
      if constexpr (Delta > 0) busy_more(slot, n);
      else busy_less(slot, n);
      return;
    }
    // The pool's totals change once for the span: changed per mapping, each change would wait for the one before.
    const shared_edges shared{first, last, !add_edge(r, first, Delta), !add_edge(r, last, Delta)};
    std::size_t pages = 0;
    std::size_t flipped = 0;  // mappings woken (held) or idled (let go)
    r.for_each_mapping_over(first, last, mappings_.records(), [&](std::uint32_t slot, std::size_t lo, std::size_t hi) {
      const std::size_t n = hi - lo + 1 - shared.on(lo, hi);
      pages += n;
      if constexpr (Delta > 0) flipped += mappings_.add_busy(slot, n);
      else flipped += mappings_.remove_busy(slot, n);
    });
    if constexpr (Delta > 0) count_busier(pages, flipped);
    else count_idler(pages, flipped);
  }

  bool within_one_mapping(const range& r, std::size_t first, std::size_t last) const noexcept
  {
    return r.within_one_mapping(first, last, mappings_.records());
  }

  /// `pages` more pages of mapping `slot` touched by a live block; it stops being idle.
  void busy_more(std::uint32_t slot, std::size_t pages) noexcept { count_busier(pages, mappings_.add_busy(slot, pages)); }

  /// `pages` pages of mapping `slot` no longer touched by a live block; with none left, it goes idle.
  void busy_less(std::uint32_t slot, std::size_t pages) noexcept { count_idler(pages, mappings_.remove_busy(slot, pages)); }

  /// The pool's totals after `pages` more pages touched, `woken` bytes of them no longer idle.
  void count_busier(std::size_t pages, std::size_t woken) noexcept
  {
    c_.live_pages += pages;
    c_.peak_live_pages = std::max(c_.peak_live_pages, c_.live_pages);
    mappings_.less_idle(woken);
  }

  /// The pool's totals after `pages` pages fewer touched, `idled` bytes of them gone idle.
  void count_idler(std::size_t pages, std::size_t idled) noexcept
  {
    c_.live_pages -= pages;
    mappings_.more_idle(idled);
  }

  /// A span's first and last pages where another live block touches them too: there they count for their
  /// mapping already, and every other page of the span is the span's block's alone.
  struct shared_edges {
    std::size_t first;
    std::size_t last;
    bool at_first;
    bool at_last;
    /// How many of [lo, hi]'s pages (a part of the span) are shared edges.
    std::size_t on(std::size_t lo, std::size_t hi) const noexcept { return std::size_t{lo == first && at_first} + std::size_t{hi == last && at_last}; }
  };

  /// Adds `delta` (+1 or -1) to the live count of a block's first or last page; true when the page goes from
  /// no live block to one, or back.
  bool add_edge(range& r, std::size_t p, int delta) noexcept
  {
    ++c_.edge_updates;
    std::uint32_t& live = r.pages[p].live;
    if (delta > 0) return live++ == 0;
    return --live == 0;
  }

  page_mappings<Backend> mappings_;
  emptied_on_move<counts> c_;
};

} // namespace strata::detail
