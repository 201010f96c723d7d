#pragma once
// mapped_pool's page table: its two reserved address ranges cut in pages, which physical allocation
// ("mapping") stands behind each page, the mappings themselves with the queue of idle ones, and the ranges
// relocations left mapped ("stale ranges", mapping_relocation.hpp). It owns the backend and everything taken
// from it: destroyed, or assigned to, it waits for the device once and gives every mapping, stale range and
// address range back; a move leaves the other table empty.
//
// Live state is kept by runs, not pages: a page wholly inside a block is touched by that block alone, so a
// block's interior pages need no count of their own (each mapping counts its busy pages); only the block's
// first and last pages, which other blocks may share, keep a count of the live blocks ending there. Each range
// also keeps its mapped runs (mappings and stale ranges) in address order, so the unmapped gaps of a span are
// found by a binary search instead of a walk over its pages. Holding, letting go and looking at a span costs
// O(mappings and gaps it covers), never O(pages).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <strata/detail/address_range.hpp>
#include <strata/detail/emptied_on_move.hpp>
#include <strata/pages/page_backend.hpp>

namespace strata::detail {

template <class Backend>
class mapping_relocation;

/// The pages of a new block, [first, last], and the first and last pages of the free block it is cut from,
/// [from, reach] (the farthest a new mapping may reach ahead; nothing there may move).
struct page_span {
  std::size_t first;
  std::size_t last;
  std::size_t from;
  std::size_t reach;
};

/// Cost: hold, let_go, census and unmapped_pages O(runs the span covers), plus O(log runs) per unmapped gap;
/// a new mapping three backend calls (two where it takes a spare a reclaim left), writing its pages' entries
/// once and inserting it in its range's run order; reclaim one device wait and two backend calls per mapping
/// given back (one where it is kept as a spare; a scan of the idle queue).
/// Never allocates but in grow, reserve_mapping_slots, reserve_runs and reclaim, which change nothing when
/// they throw.
template <page_backend Backend>
class page_table {
public:
  static constexpr std::uint32_t no_mapping = UINT32_MAX;
  static constexpr std::uint32_t stale_mapping = UINT32_MAX - 1;  ///< a range a relocation left
  using page_handle = typename Backend::page;

  struct page_state {
    std::uint32_t live = 0;              ///< live blocks starting or ending on the page (a block's inner pages count nothing)
    std::uint32_t mapping = no_mapping;  ///< the physical allocation behind it
  };

  /// Pages [first, first + count) of a range mapped (by a mapping or a stale range).
  struct mapped_run {
    std::size_t first = 0;
    std::size_t count = 0;
  };

  /// Pages [first, last] of a span behind one mapping (`slot`), one stale range (stale_mapping) or nothing
  /// (no_mapping).
  struct piece {
    std::size_t first;
    std::size_t last;
    std::uint32_t slot;
  };

  /// One physical allocation mapped at pages [first, first + count) of a range.
  struct mapping {
    page_handle page{};
    std::uint32_t band = 0;
    std::size_t first = 0;
    std::size_t count = 0;
    std::size_t busy = 0;     ///< its pages touched by live blocks
    std::size_t aliases = 0;  ///< stale ranges still mapping it elsewhere: it cannot be released before they are unmapped
    bool idle = false;        ///< counted in idle_bytes()
    bool listed = false;      ///< in the idle queue (entries are re-checked when taken)
  };

  /// One reserved address range; `pages` grows to the highest page touched; `runs` in address order.
  struct range {
    std::uintptr_t base = 0;
    std::size_t size = 0;
    std::vector<page_state> pages;
    std::vector<mapped_run> runs;
  };

  /// Where a relocated allocation was mapped before: still mapped (until `unmapped`), its blocks replaced by
  /// one block that is neither free nor live (`holder`), so nothing lands there while it aliases memory in use.
  struct stale_range {
    std::uint32_t band = 0;
    std::size_t first = 0;
    std::size_t count = 0;
    address_block* holder = nullptr;
    std::uint32_t slot = 0;  ///< the mapping that moved
    bool unmapped = false;
  };

  explicit page_table(Backend backend) : backend_(std::move(backend)) {}
  page_table(page_table&&) noexcept = default;
  page_table& operator=(page_table&& other) noexcept
  {
    if (this != &other) {
      give_back_all();
      backend_ = std::move(other.backend_);
      s_ = std::move(other.s_);
    }
    return *this;
  }
  page_table(const page_table&) = delete;
  page_table& operator=(const page_table&) = delete;
  ~page_table() { give_back_all(); }

  Backend& backend() noexcept { return backend_; }
  const Backend& backend() const noexcept { return backend_; }
  std::size_t page_size() const noexcept { return backend_.page_size(); }

  range& band(std::uint32_t i) noexcept { return s_.ranges[i]; }
  const range& band(std::uint32_t i) const noexcept { return s_.ranges[i]; }
  std::uint32_t index_of(const range& r) const noexcept { return static_cast<std::uint32_t>(&r - s_.ranges.data()); }
  std::uint32_t band_of(std::uintptr_t address) const noexcept { return address - s_.ranges[0].base < s_.ranges[0].size ? 0 : 1; }
  std::size_t page_of(const range& r, std::uintptr_t address) const noexcept { return (address - r.base) / page_size(); }
  std::uintptr_t address_of(const range& r, std::size_t page) const noexcept { return r.base + page * page_size(); }
  std::size_t bytes_of(const mapping& m) const noexcept { return m.count * page_size(); }
  const mapping& slot(std::uint32_t i) const noexcept { return s_.mappings[i]; }

  std::size_t physical() const noexcept { return s_.physical; }
  std::size_t peak_physical() const noexcept { return s_.peak_physical; }
  std::size_t idle_bytes() const noexcept { return s_.idle_bytes; }
  std::size_t live_pages() const noexcept { return s_.live_pages; }
  std::size_t peak_live_pages() const noexcept { return s_.peak_live_pages; }
  std::size_t mappings_live() const noexcept { return s_.mappings_live; }
  std::size_t stale_bytes() const noexcept { return s_.stale_bytes; }
  bool has_stale() const noexcept { return !s_.stale.empty(); }
  std::size_t stale_count() const noexcept { return s_.stale.size(); }
  /// How many of the oldest stale ranges a device wait has covered (they can be given back without one).
  std::size_t stale_covered() const noexcept { return s_.stale_safe; }
  std::uint64_t relocations() const noexcept { return s_.relocations; }
  /// Per-page entries written so far (live counts and the mapping behind a page): what a block's size would
  /// cost if page state were kept page by page.
  std::uint64_t page_state_updates() const noexcept { return s_.page_state_updates; }
  void reset_peak() noexcept
  {
    s_.peak_physical = s_.physical;
    s_.peak_live_pages = s_.live_pages;
  }

  /// Reserves `bytes` of address space (aligned to `alignment`) as range `i`.
  std::uintptr_t reserve(std::uint32_t i, std::size_t bytes, std::size_t alignment)
  {
    const std::uintptr_t base = backend_.reserve(bytes, alignment);
    s_.ranges[i] = range{.base = base, .size = bytes, .pages = {}, .runs = {}};
    return base;
  }
  void unreserve(std::uint32_t i) noexcept
  {
    backend_.unreserve(s_.ranges[i].base, s_.ranges[i].size);
    s_.ranges[i] = range{};
  }

  /// Makes the table reach at least `pages` pages, doubling (strong guarantee: new pages have nothing behind them).
  void grow(range& r, std::size_t pages) { r.pages.resize(std::max(pages, std::min(r.size / page_size(), r.pages.size() * 2))); }

  /// The piece of [p, last] that starts at p: up to the end of the run behind p or of the gap before the next
  /// run. O(1) on a mapping's page, O(log runs) otherwise.
  piece piece_at(const range& r, std::size_t p, std::size_t last) const noexcept
  {
    if (p >= r.pages.size()) return {p, last, no_mapping};  // every run lies within the table
    const std::uint32_t slot = r.pages[p].mapping;
    if (slot < stale_mapping) {
      const mapping& m = s_.mappings[slot];
      return {p, std::min(last, m.first + m.count - 1), slot};
    }
    const auto next = first_run_after(r, p);
    if (slot == stale_mapping) {
      const mapped_run& run = *(next - 1);
      return {p, std::min(last, run.first + run.count - 1), slot};
    }
    return {p, next == r.runs.end() ? last : std::min(last, next->first - 1), no_mapping};
  }

  /// Calls f(piece) for each piece of pages [first, last], in order.
  template <class F>
  void for_each_piece(const range& r, std::size_t first, std::size_t last, F&& f) const noexcept
  {
    for (std::size_t p = first; p <= last;) {
      const piece pc = piece_at(r, p, last);
      f(pc);
      if (pc.last == last) return;  // also where last is the range's final page
      p = pc.last + 1;
    }
  }

  std::size_t unmapped_pages(const range& r, std::uintptr_t start, std::size_t size) const noexcept
  {
    const std::size_t first = page_of(r, start);
    if (first < r.pages.size() && r.pages[first].mapping < stale_mapping) [[likely]] {  // within that mapping: no division
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
      hold_pieces(r, first, last);
    }
    s_.peak_live_pages = std::max(s_.peak_live_pages, s_.live_pages);
  }

  /// Counts one live block fewer on pages [first, last]; a mapping no live block touches any more goes idle.
  void let_go(range& r, std::size_t first, std::size_t last) noexcept
  {
    if (first == last) [[likely]] {
      if (add_edge(r, first, -1)) busy_less(r.pages[first].mapping, 1);
      return;
    }
    let_go_pieces(r, first, last);
  }

  struct page_census {
    std::size_t unmapped = 0;    ///< pages with nothing behind them
    std::size_t idle_bytes = 0;  ///< bytes of the idle mappings behind the others
  };
  /// What stands behind pages [first, last] (within the table).
  page_census census(const range& r, std::size_t first, std::size_t last) const noexcept
  {
    page_census c;
    if (within_one_mapping(r, first, last)) [[likely]] {
      const mapping& m = s_.mappings[r.pages[first].mapping];
      c.idle_bytes = m.idle ? bytes_of(m) : 0;
      return c;
    }
    for_each_piece(r, first, last, [&](const piece& pc) {
      if (pc.slot == no_mapping) c.unmapped += pc.last - pc.first + 1;
      else if (pc.slot != stale_mapping && s_.mappings[pc.slot].idle) c.idle_bytes += bytes_of(s_.mappings[pc.slot]);
    });
    return c;
  }

  /// How many free, unmapped pages after the span to map with its last run so that the run reaches `want`
  /// pages. The run stays within `max_run` pages, so the pages ahead share a mapping with live pages (never a
  /// mapping no block touches, which nothing would reclaim). May grow the table (strong guarantee).
  std::size_t pages_ahead(range& r, page_span span, std::size_t want, std::size_t max_run)
  {
    if (r.pages[span.last].mapping != no_mapping || span.reach <= span.last) return 0;
    const auto next = first_run_after(r, span.last);
    const std::size_t gap_start = next == r.runs.begin() ? 0 : (next - 1)->first + (next - 1)->count;
    // The unmapped run ending at the span's last page, split at max_run from its start.
    const std::size_t trailing = span.last + 1 - std::max(span.first, gap_start);
    const std::size_t last_run = (trailing - 1) % max_run + 1;
    if (last_run >= want) return 0;
    const std::size_t extra = std::min(want - last_run, span.reach - span.last);
    if (span.last + extra >= r.pages.size()) grow(r, span.last + extra + 1);
    return next == r.runs.end() ? extra : std::min(extra, next->first - span.last - 1);
  }

  /// One physical allocation per run of unmapped pages in [first, last] (`needed` bytes in all, runs split at
  /// `max_run` pages); all or none. `mapped()` is called after each allocation made.
  template <class Mapped>
  void map_unmapped(range& r, std::size_t first, std::size_t last, std::size_t needed, std::size_t max_run, Mapped&& mapped)
  {
    reserve_mapping_slots(needed / page_size());
    reserve_runs(r, needed / page_size());
    std::vector<std::uint32_t> made;
    made.reserve(needed / page_size());
    try {
      for (std::size_t p = first; p <= last;) {
        const piece pc = piece_at(r, p, last);  // looked up again: each mapping made adds a run
        if (pc.slot != no_mapping) {
          p = pc.last + 1;
          continue;
        }
        const std::size_t run = std::min(pc.last - p + 1, max_run);
        made.push_back(map_one(r, p, run));
        mapped();
        p += run;
      }
    } catch (...) {
      for (std::uint32_t slot : made) drop_mapping(slot);
      throw;
    }
  }

  /// One device wait, then idle mappings, those idle longest first, are unmapped and released until `want`
  /// bytes are gone; mappings of range `keep` touching pages [first, last] (the request being served) stay, as
  /// do those still aliased by a stale range. The wait covers every stale range: the first `stale_limit` are
  /// unmapped now (those made by the call under way may yet be undone). With `keep_spares`, the physical
  /// allocations unmapped are not released but kept as spares: the next mappings of the same size take them
  /// instead of new ones (the wait made them as safe to reuse anywhere), and drop_spares releases the rest.
  void reclaim(const range* keep, std::size_t first, std::size_t last, std::size_t want, std::size_t stale_limit, bool keep_spares = false)
  {
    std::vector<std::uint32_t> kept;
    kept.reserve(s_.mappings_live);
    if (keep_spares) s_.spares.reserve(s_.mappings_live);
    backend_.synchronize();
    s_.stale_safe = s_.stale.size();
    unmap_safe_stale(stale_limit);
    std::size_t done = 0;
    try {
      while (s_.idle_head < s_.idle.size() && done < want) {
        const std::uint32_t slot = s_.idle[s_.idle_head];
        mapping& m = s_.mappings[slot];
        if (!m.idle) {
          m.listed = false;  // stale: reused since it went idle
        } else if ((keep != nullptr && &s_.ranges[m.band] == keep && m.first <= last && m.first + m.count > first) || m.aliases != 0) {
          kept.push_back(slot);
        } else {
          backend_.unmap(address_of(s_.ranges[m.band], m.first), bytes_of(m));  // throws before anything changed
          m.listed = false;
          m.idle = false;
          s_.idle_bytes -= bytes_of(m);
          done += bytes_of(m);
          if (keep_spares) s_.spares.push_back({m.page, m.count});  // capacity reserved
          release_unmapped(slot, /*destroy=*/!keep_spares);
        }
        ++s_.idle_head;
      }
    } catch (...) {
      requeue(kept);
      throw;
    }
    requeue(kept);
    if (s_.idle_head == s_.idle.size()) {
      s_.idle.clear();
      s_.idle_head = 0;
    }
  }

  /// Releases the spares no new mapping took.
  void drop_spares() noexcept
  {
    for (const spare& sp : s_.spares) backend_.destroy(sp.page);
    s_.spares.clear();
  }
  std::size_t spare_count() const noexcept { return s_.spares.size(); }

  /// Unmaps the first `limit` stale ranges (a device wait since they were made), so their allocations can be
  /// released; their holders stay until mapping_relocation::tidy. Stops at a failed unmap.
  void unmap_safe_stale(std::size_t limit) noexcept
  {
    for (std::size_t i = 0; i < std::min(limit, s_.stale_safe); ++i)
      if (!s_.stale[i].unmapped && !unmap_stale(s_.stale[i])) return;
  }

private:
  friend class mapping_relocation<Backend>;

  /// A physical allocation a reclaim unmapped, kept for a mapping of its size made in the same call.
  struct spare {
    page_handle page{};
    std::size_t count = 0;
  };

  struct state {
    std::array<range, 2> ranges{};
    std::vector<spare> spares;               ///< unmapped, not counted in physical; empty between calls
    std::vector<mapping> mappings;           ///< slots, recycled through free_slots
    std::vector<std::uint32_t> free_slots;
    std::vector<std::uint32_t> idle;         ///< idle mappings, oldest first from idle_head
    std::size_t idle_head = 0;
    std::vector<stale_range> stale;          ///< oldest first
    std::size_t stale_safe = 0;              ///< how many of the oldest stale ranges a device wait has covered
    std::size_t stale_bytes = 0;             ///< address space of stale ranges still mapped
    std::uint64_t relocations = 0;
    std::uint64_t page_state_updates = 0;
    std::size_t physical = 0;
    std::size_t peak_physical = 0;
    std::size_t idle_bytes = 0;
    std::size_t live_pages = 0;              ///< pages some live block touches
    std::size_t peak_live_pages = 0;
    std::size_t mappings_live = 0;
  };

  /// One physical allocation behind pages [first, first + count): a spare of that size or a new one, mapped,
  /// access set; all or nothing (a spare taken goes back to the spares).
  std::uint32_t map_one(range& r, std::size_t first, std::size_t count)
  {
    const std::size_t bytes = count * page_size();
    const std::uintptr_t address = address_of(r, first);
    const auto reused = std::find_if(s_.spares.begin(), s_.spares.end(), [&](const spare& sp) { return sp.count == count; });
    const bool from_spare = reused != s_.spares.end();
    const page_handle page = from_spare ? reused->page : backend_.create(bytes);
    if (from_spare) {
      *reused = s_.spares.back();
      s_.spares.pop_back();
    }
    const auto give_up = [&]() noexcept {
      if (from_spare) s_.spares.push_back({page, count});  // the slot it left: no allocation
      else backend_.destroy(page);
    };
    try {
      backend_.map(address, page, bytes);
    } catch (...) {
      give_up();
      throw;
    }
    try {
      backend_.set_access(address, bytes);
    } catch (...) {
      try {
        backend_.unmap(address, bytes);
        give_up();
      } catch (...) {
        // The driver keeps the range mapped: the allocation is leaked rather than released under a mapping.
      }
      throw;
    }
    std::uint32_t slot = 0;
    if (!s_.free_slots.empty()) {
      slot = s_.free_slots.back();
      s_.free_slots.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(s_.mappings.size());
      s_.mappings.emplace_back();  // capacity reserved
    }
    s_.mappings[slot] = mapping{.page = page, .band = index_of(r), .first = first, .count = count};
    set_mapping(r, first, count, slot);
    add_run(r, first, count);
    ++s_.mappings_live;
    s_.physical += bytes;
    s_.peak_physical = std::max(s_.peak_physical, s_.physical);
    return slot;
  }

  /// Unmaps and releases a mapping no live block touches.
  void drop_mapping(std::uint32_t slot) noexcept
  {
    mapping& m = s_.mappings[slot];
    try {
      backend_.unmap(address_of(s_.ranges[m.band], m.first), bytes_of(m));
    } catch (...) {
      // The driver kept it: it becomes an idle mapping (no live block touches it), retried by a later reclaim.
      if (!m.idle) {
        m.idle = true;
        s_.idle_bytes += bytes_of(m);
      }
      if (!m.listed) list_idle(slot);
      return;
    }
    if (m.idle) s_.idle_bytes -= bytes_of(m);
    release_unmapped(slot);
  }

  /// The second half of dropping a mapping, once it is unmapped; without `destroy` its allocation is the
  /// caller's.
  void release_unmapped(std::uint32_t slot, bool destroy = true) noexcept
  {
    mapping& m = s_.mappings[slot];
    range& r = s_.ranges[m.band];
    if (destroy) backend_.destroy(m.page);
    set_mapping(r, m.first, m.count, no_mapping);
    remove_run(r, m.first);
    s_.physical -= bytes_of(m);
    --s_.mappings_live;
    m = mapping{};
    s_.free_slots.push_back(slot);  // capacity reserved for every slot
  }

  /// The first run starting after page p.
  typename std::vector<mapped_run>::const_iterator first_run_after(const range& r, std::size_t p) const noexcept
  {
    return std::upper_bound(r.runs.begin(), r.runs.end(), p, [](std::size_t page, const mapped_run& run) { return page < run.first; });
  }

  // Spans over several pages.
  std::size_t unmapped_in(const range& r, std::size_t first, std::size_t last) const noexcept
  {
    std::size_t unmapped = 0;
    for_each_piece(r, first, last, [&](const piece& pc) {
      if (pc.slot == no_mapping) unmapped += pc.last - pc.first + 1;
    });
    return unmapped;
  }
  void hold_pieces(range& r, std::size_t first, std::size_t last) noexcept
  {
    for_each_piece(r, first, last, [&](const piece& pc) {
      busy_more(pc.slot, inner_pages(pc, first, last) + (pc.first == first && add_edge(r, first, 1)) + (pc.last == last && add_edge(r, last, 1)));
    });
  }
  void let_go_pieces(range& r, std::size_t first, std::size_t last) noexcept
  {
    for_each_piece(r, first, last, [&](const piece& pc) {
      busy_less(pc.slot, inner_pages(pc, first, last) + (pc.first == first && add_edge(r, first, -1)) + (pc.last == last && add_edge(r, last, -1)));
    });
  }

  /// Whether pages [first, last] all lie in one mapping: the common case, answered in O(1).
  bool within_one_mapping(const range& r, std::size_t first, std::size_t last) const noexcept
  {
    if (first >= r.pages.size()) return false;
    const std::uint32_t slot = r.pages[first].mapping;
    return slot < stale_mapping && s_.mappings[slot].first + s_.mappings[slot].count > last;
  }

  /// `pages` more pages of mapping `slot` touched by a live block; it stops being idle.
  void busy_more(std::uint32_t slot, std::size_t pages) noexcept
  {
    if (pages == 0) return;
    s_.live_pages += pages;
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
    if (!m.listed) list_idle(slot);
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

  /// Writes the mapping behind pages [first, first + count).
  void set_mapping(range& r, std::size_t first, std::size_t count, std::uint32_t slot) noexcept
  {
    for (std::size_t p = first; p < first + count; ++p) r.pages[p].mapping = slot;
    s_.page_state_updates += count;
  }

  /// Room for `more` runs in r's order, so adding them cannot throw.
  static void reserve_runs(range& r, std::size_t more)
  {
    if (r.runs.size() + more > r.runs.capacity()) r.runs.reserve(std::max(r.runs.size() + more, 2 * r.runs.capacity()));
  }

  /// Files pages [first, first + count), just mapped, in r's run order (room reserved).
  static void add_run(range& r, std::size_t first, std::size_t count) noexcept
  {
    const auto at = std::upper_bound(r.runs.begin(), r.runs.end(), first, [](std::size_t page, const mapped_run& run) { return page < run.first; });
    r.runs.insert(at, mapped_run{first, count});
  }

  /// Takes the run starting at page `first`, just unmapped, out of r's order.
  static void remove_run(range& r, std::size_t first) noexcept
  {
    const auto at = std::lower_bound(r.runs.begin(), r.runs.end(), first, [](const mapped_run& run, std::size_t page) { return run.first < page; });
    r.runs.erase(at);
  }

  /// Files an idle mapping. Never allocates: the queue's capacity covers every mapping slot, each listed at
  /// most once, and the taken entries at its head are dropped when it is full.
  void list_idle(std::uint32_t slot) noexcept
  {
    if (s_.idle.size() == s_.idle.capacity()) {
      s_.idle.erase(s_.idle.begin(), s_.idle.begin() + static_cast<std::ptrdiff_t>(s_.idle_head));
      s_.idle_head = 0;
    }
    s_.mappings[slot].listed = true;
    s_.idle.push_back(slot);
  }

  void requeue(const std::vector<std::uint32_t>& slots) noexcept
  {
    for (std::uint32_t slot : slots) list_idle(slot);
  }

  /// Room for `more` mapping records, so recording them and later listing or freeing them cannot throw.
  void reserve_mapping_slots(std::size_t more)
  {
    const std::size_t total = s_.mappings_live + more;
    if (total <= s_.mappings.capacity() && total <= s_.idle.capacity() && total <= s_.free_slots.capacity()) return;
    const std::size_t want = std::max(total, 2 * s_.mappings.capacity());
    s_.mappings.reserve(want);
    s_.idle.reserve(want);
    s_.free_slots.reserve(want);
  }

  /// Unmaps one stale range (its allocation then has one alias fewer); false when the driver refuses.
  bool unmap_stale(stale_range& g) noexcept
  {
    try {
      backend_.unmap(address_of(s_.ranges[g.band], g.first), g.count * page_size());
    } catch (...) {
      return false;
    }
    g.unmapped = true;
    --s_.mappings[g.slot].aliases;
    s_.stale_bytes -= g.count * page_size();
    return true;
  }

  void give_back_all() noexcept
  {
    if (s_.mappings_live > 0) {
      try {
        backend_.synchronize();  // work submitted before the pool goes may still use its memory
      } catch (...) {
        // The runtime may be gone at exit, or the device broken: nothing more can be done than unmapping.
      }
    }
    drop_spares();
    for (stale_range& g : s_.stale)
      if (!g.unmapped) (void)unmap_stale(g);  // a refusal: as below, the process's mappings go with it
    for (mapping& m : s_.mappings) {
      if (m.count == 0) continue;
      try {
        backend_.unmap(address_of(s_.ranges[m.band], m.first), bytes_of(m));
      } catch (...) {
        // The driver may be gone at exit; the process's mappings go with it.
      }
      backend_.destroy(m.page);
    }
    for (range& r : s_.ranges)
      if (r.size != 0) backend_.unreserve(r.base, r.size);
    s_ = emptied_on_move<state>{};
  }

  [[no_unique_address]] Backend backend_;
  emptied_on_move<state> s_;
};

} // namespace strata::detail
