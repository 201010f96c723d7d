#pragma once
// mapped_pool's page table: its two reserved address ranges cut in pages, which physical allocation
// ("mapping") stands behind each page and how many live blocks touch it, the mappings themselves with the
// queue of idle ones, and the ranges relocations left mapped ("stale ranges", mapping_relocation.hpp). It owns
// the backend and everything taken from it: destroyed, or assigned to, it waits for the device once and gives
// every mapping, stale range and address range back; a move leaves the other table empty.
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

/// Cost: page lookups O(1); hold and let_go O(pages); a new mapping three backend calls; reclaim one device
/// wait and two backend calls per mapping given back (a scan of the idle queue). Never allocates but in grow,
/// reserve_mapping_slots and reclaim, which change nothing when they throw.
template <page_backend Backend>
class page_table {
public:
  static constexpr std::uint32_t no_mapping = UINT32_MAX;
  static constexpr std::uint32_t stale_mapping = UINT32_MAX - 1;  ///< a range a relocation left
  using page_handle = typename Backend::page;

  struct page_state {
    std::uint32_t live = 0;              ///< live blocks touching the page
    std::uint32_t mapping = no_mapping;  ///< the physical allocation behind it
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

  /// One reserved address range; `pages` grows to the highest page touched.
  struct range {
    std::uintptr_t base = 0;
    std::size_t size = 0;
    std::vector<page_state> pages;
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
  void reset_peak() noexcept
  {
    s_.peak_physical = s_.physical;
    s_.peak_live_pages = s_.live_pages;
  }

  /// Reserves `bytes` of address space (aligned to `alignment`) as range `i`.
  std::uintptr_t reserve(std::uint32_t i, std::size_t bytes, std::size_t alignment)
  {
    const std::uintptr_t base = backend_.reserve(bytes, alignment);
    s_.ranges[i] = range{.base = base, .size = bytes, .pages = {}};
    return base;
  }
  void unreserve(std::uint32_t i) noexcept
  {
    backend_.unreserve(s_.ranges[i].base, s_.ranges[i].size);
    s_.ranges[i] = range{};
  }

  /// Makes the table reach at least `pages` pages, doubling (strong guarantee: new pages have nothing behind them).
  void grow(range& r, std::size_t pages) { r.pages.resize(std::max(pages, std::min(r.size / page_size(), r.pages.size() * 2))); }

  std::size_t unmapped_pages(const range& r, std::uintptr_t start, std::size_t size) const noexcept
  {
    std::size_t unmapped = 0;
    for (std::size_t p = page_of(r, start), last = page_of(r, start + size - 1); p <= last; ++p)
      unmapped += p >= r.pages.size() || r.pages[p].mapping == no_mapping;
    return unmapped;
  }

  /// Counts one more live block on pages [first, last], all mapped; their mappings stop being idle.
  void hold(range& r, std::size_t first, std::size_t last) noexcept
  {
    for (std::size_t p = first; p <= last; ++p) {
      if (r.pages[p].live++ != 0) continue;
      s_.peak_live_pages = std::max(s_.peak_live_pages, ++s_.live_pages);
      mapping& m = s_.mappings[r.pages[p].mapping];
      if (m.busy++ == 0 && m.idle) {
        m.idle = false;
        s_.idle_bytes -= bytes_of(m);
      }
    }
  }

  /// Counts one live block fewer on pages [first, last]; a mapping no live block touches any more goes idle.
  void let_go(range& r, std::size_t first, std::size_t last) noexcept
  {
    for (std::size_t p = first; p <= last; ++p) {
      if (--r.pages[p].live != 0) continue;
      --s_.live_pages;
      const std::uint32_t slot = r.pages[p].mapping;
      mapping& m = s_.mappings[slot];
      if (--m.busy != 0) continue;
      m.idle = true;
      s_.idle_bytes += bytes_of(m);
      if (!m.listed) list_idle(slot);
    }
  }

  struct page_census {
    std::size_t unmapped = 0;    ///< pages with nothing behind them
    std::size_t idle_bytes = 0;  ///< bytes of the idle mappings behind the others
  };
  /// What stands behind pages [first, last] (within the table).
  page_census census(const range& r, std::size_t first, std::size_t last) const noexcept
  {
    page_census c;
    std::uint32_t previous = no_mapping;
    for (std::size_t p = first; p <= last; ++p) {
      const std::uint32_t m = r.pages[p].mapping;
      if (m == no_mapping) ++c.unmapped;
      else if (m != previous && s_.mappings[m].idle) c.idle_bytes += bytes_of(s_.mappings[m]);
      previous = m;
    }
    return c;
  }

  /// How many free, unmapped pages after the span to map with its last run so that the run reaches `want`
  /// pages. The run stays within `max_run` pages, so the pages ahead share a mapping with live pages (never a
  /// mapping no block touches, which nothing would reclaim). May grow the table (strong guarantee).
  std::size_t pages_ahead(range& r, page_span span, std::size_t want, std::size_t max_run)
  {
    if (r.pages[span.last].mapping != no_mapping || span.reach <= span.last) return 0;
    std::size_t trailing = 0;  // the unmapped run ending at the span's last page, split at max_run from its start
    for (std::size_t p = span.last + 1; p-- > span.first && r.pages[p].mapping == no_mapping;) ++trailing;
    const std::size_t last_run = (trailing - 1) % max_run + 1;
    if (last_run >= want) return 0;
    const std::size_t extra = std::min(want - last_run, span.reach - span.last);
    if (span.last + extra >= r.pages.size()) grow(r, span.last + extra + 1);
    std::size_t n = 0;
    while (n < extra && r.pages[span.last + 1 + n].mapping == no_mapping) ++n;
    return n;
  }

  /// One physical allocation per run of unmapped pages in [first, last] (`needed` bytes in all, runs split at
  /// `max_run` pages); all or none. `mapped()` is called after each allocation made.
  template <class Mapped>
  void map_unmapped(range& r, std::size_t first, std::size_t last, std::size_t needed, std::size_t max_run, Mapped&& mapped)
  {
    reserve_mapping_slots(needed / page_size());
    std::vector<std::uint32_t> made;
    made.reserve(needed / page_size());
    try {
      for (std::size_t p = first; p <= last;) {
        if (r.pages[p].mapping != no_mapping) {
          ++p;
          continue;
        }
        std::size_t run = 0;
        while (p + run <= last && run < max_run && r.pages[p + run].mapping == no_mapping) ++run;
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
  /// unmapped now (those made by the call under way may yet be undone).
  void reclaim(const range* keep, std::size_t first, std::size_t last, std::size_t want, std::size_t stale_limit)
  {
    std::vector<std::uint32_t> kept;
    kept.reserve(s_.mappings_live);
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
          release_unmapped(slot);
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

  /// Unmaps the first `limit` stale ranges (a device wait since they were made), so their allocations can be
  /// released; their holders stay until mapping_relocation::tidy. Stops at a failed unmap.
  void unmap_safe_stale(std::size_t limit) noexcept
  {
    for (std::size_t i = 0; i < std::min(limit, s_.stale_safe); ++i)
      if (!s_.stale[i].unmapped && !unmap_stale(s_.stale[i])) return;
  }

private:
  friend class mapping_relocation<Backend>;

  struct state {
    std::array<range, 2> ranges{};
    std::vector<mapping> mappings;           ///< slots, recycled through free_slots
    std::vector<std::uint32_t> free_slots;
    std::vector<std::uint32_t> idle;         ///< idle mappings, oldest first from idle_head
    std::size_t idle_head = 0;
    std::vector<stale_range> stale;          ///< oldest first
    std::size_t stale_safe = 0;              ///< how many of the oldest stale ranges a device wait has covered
    std::size_t stale_bytes = 0;             ///< address space of stale ranges still mapped
    std::uint64_t relocations = 0;
    std::size_t physical = 0;
    std::size_t peak_physical = 0;
    std::size_t idle_bytes = 0;
    std::size_t live_pages = 0;              ///< pages some live block touches
    std::size_t peak_live_pages = 0;
    std::size_t mappings_live = 0;
  };

  /// One physical allocation behind pages [first, first + count): create, map, set access; all or nothing.
  std::uint32_t map_one(range& r, std::size_t first, std::size_t count)
  {
    const std::size_t bytes = count * page_size();
    const std::uintptr_t address = address_of(r, first);
    const page_handle page = backend_.create(bytes);
    try {
      backend_.map(address, page, bytes);
    } catch (...) {
      backend_.destroy(page);
      throw;
    }
    try {
      backend_.set_access(address, bytes);
    } catch (...) {
      try {
        backend_.unmap(address, bytes);
        backend_.destroy(page);
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
    for (std::size_t p = first; p < first + count; ++p) r.pages[p].mapping = slot;
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

  /// The second half of dropping a mapping, once it is unmapped.
  void release_unmapped(std::uint32_t slot) noexcept
  {
    mapping& m = s_.mappings[slot];
    range& r = s_.ranges[m.band];
    backend_.destroy(m.page);
    for (std::size_t p = m.first; p < m.first + m.count; ++p) r.pages[p].mapping = no_mapping;
    s_.physical -= bytes_of(m);
    --s_.mappings_live;
    m = mapping{};
    s_.free_slots.push_back(slot);  // capacity reserved for every slot
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
