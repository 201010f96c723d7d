#pragma once
// The physical allocations ("mappings") behind mapped_pool's two reserved address ranges: reserving the
// ranges, mapping runs of pages, reclaiming idle mappings, and the ranges relocations left mapped ("stale
// ranges"). It owns the backend and everything taken from it: destroyed, or assigned to, it waits for the
// device once and gives every mapping, stale range and address range back; a move leaves the other empty.
//
// Two parts work through its interface, never its state. The page table (page_table.hpp), which holds it,
// counts the live blocks on each page and tells it which mappings they touch (add_busy / remove_busy): that
// is what makes a mapping idle, and so what reclaim takes. Relocation (mapping_relocation.hpp) picks idle
// allocations from idle_queue() and moves them with map_again / record_move, undoes moves with undo_moves and
// gives stale ranges back with tidy_stale; the blocks that hold stale ranges out of use are its, handed back
// to it through a callback.
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <strata/core/snapshot.hpp>
#include <strata/detail/address_range.hpp>
#include <strata/detail/emptied_on_move.hpp>
#include <strata/detail/pages/mapping_slots.hpp>
#include <strata/detail/pages/page_backend.hpp>
#include <strata/detail/pages/page_range.hpp>
#include <strata/detail/pages/spare_allocations.hpp>

namespace strata::detail {

/// Models the owner of a backend's reservations and allocations, with the records (mapping_slots.hpp), page
/// entries (page_range.hpp) and spares (spare_allocations.hpp) that say where each allocation is mapped.
/// Cost: a new mapping three backend calls (two where it takes a spare a reclaim left; runs mapped back to
/// back in one call share their access call), writing its pages' entries once and inserting it in its
/// range's run order; reclaim one device wait and two backend calls per
/// mapping given back (one where it is kept as a spare; a scan of the idle queue); add_busy, remove_busy O(1);
/// a move two backend calls, undoing one one. The backend's page size must be a power of two (a page number is
/// a shift away, kept here: asking the backend at every step would put a load through its handle on the way).
/// Never allocates but in grow, map_unmapped, map_again and reclaim, which change nothing when they throw.
template <page_backend Backend>
class page_mappings {
public:
  static constexpr std::uint32_t no_mapping = page_state::no_mapping;
  static constexpr std::uint32_t stale_mapping = page_state::stale_mapping;
  using page_handle = typename Backend::page;
  using mapping = mapping_record<page_handle>;
  using range = page_range;
  using piece = page_piece;

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

  explicit page_mappings(Backend backend) : backend_(std::move(backend))
  {
    const std::size_t page = backend_.page_size();
    if (!std::has_single_bit(page))
      throw std::invalid_argument("mapped_pool: the page backend's page size " + std::to_string(page) + " is not a power of two");
    page_shift_ = static_cast<unsigned>(std::countr_zero(page));
  }
  page_mappings(page_mappings&&) noexcept = default;
  page_mappings& operator=(page_mappings&& other) noexcept
  {
    if (this != &other) {
      give_back_all();
      backend_ = std::move(other.backend_);
      s_ = std::move(other.s_);
      page_shift_ = other.page_shift_;
    }
    return *this;
  }
  page_mappings(const page_mappings&) = delete;
  page_mappings& operator=(const page_mappings&) = delete;
  ~page_mappings() { give_back_all(); }

  Backend& backend() noexcept { return backend_; }
  const Backend& backend() const noexcept { return backend_; }
  std::size_t page_size() const noexcept { return std::size_t{1} << page_shift_; }

  range& band(std::uint32_t i) noexcept { return s_.ranges[i]; }
  const range& band(std::uint32_t i) const noexcept { return s_.ranges[i]; }
  std::uint32_t index_of(const range& r) const noexcept { return static_cast<std::uint32_t>(&r - s_.ranges.data()); }
  std::uint32_t band_of(std::uintptr_t address) const noexcept { return address - s_.ranges[0].base < s_.ranges[0].size ? 0 : 1; }
  std::size_t page_of(const range& r, std::uintptr_t address) const noexcept { return (address - r.base) >> page_shift_; }
  std::uintptr_t address_of(const range& r, std::size_t page) const noexcept { return r.base + (page << page_shift_); }
  std::size_t bytes_of(const mapping& m) const noexcept { return m.count << page_shift_; }
  const mapping& slot(std::uint32_t i) const noexcept { return s_.mappings[i]; }
  /// Every record by slot (removed ones empty): what page_range's lookups take.
  const std::vector<mapping>& records() const noexcept { return s_.mappings; }

  std::size_t physical() const noexcept { return s_.physical; }
  std::size_t peak_physical() const noexcept { return s_.peak_physical; }
  std::size_t idle_bytes() const noexcept { return s_.idle_bytes; }
  std::size_t mappings_live() const noexcept { return s_.mappings_live; }
  std::size_t stale_bytes() const noexcept { return s_.stale_bytes; }
  bool has_stale() const noexcept { return !s_.stale.empty(); }
  std::size_t stale_count() const noexcept { return s_.stale.size(); }
  /// How many of the oldest stale ranges a device wait has covered (they can be given back without one).
  std::size_t stale_covered() const noexcept { return s_.stale_safe; }
  std::uint64_t relocations() const noexcept { return s_.relocations; }
  /// What is mapped into band `band` now, one entry per mapping made, as offsets from the band's base in
  /// address order: every live record where it is mapped, and a relocated allocation also where a stale range
  /// still maps it. Allocations are mapped whole, so each later unmap names a range listed here (what
  /// PyTorch's trace trackers need: Note [Segments and mapped ranges] in the plug-in). O(m log m), m mappings.
  std::vector<mapped_range> mapped_in(std::uint32_t band) const
  {
    std::vector<mapped_range> out;
    for (const mapping& m : s_.mappings)
      if (m.count != 0 && m.band == band) out.push_back({m.first << page_shift_, m.count << page_shift_});
    for (const stale_range& g : s_.stale)
      if (!g.unmapped && g.band == band) out.push_back({g.first << page_shift_, g.count << page_shift_});
    std::sort(out.begin(), out.end(), [](const mapped_range& a, const mapped_range& b) { return a.offset < b.offset; });
    return out;
  }
  /// Sets access again, with the backend's devices as they are now, over everything mapped: each live
  /// allocation where it is mapped and each stale range still mapped (work queued before a relocation may use
  /// one). What granting a peer after the fact takes (mapped_pool::add_peer). A backend call per mapping;
  /// changes nothing of these books, and a failure leaves the mappings passed so far granted.
  void reapply_access()
  {
    for (const mapping& m : s_.mappings)
      if (m.count != 0) backend_.set_access(address_of(s_.ranges[m.band], m.first), bytes_of(m));
    for (const stale_range& g : s_.stale)
      if (!g.unmapped) backend_.set_access(address_of(s_.ranges[g.band], g.first), g.count << page_shift_);
  }
  /// Per-page entries naming the mapping behind a page written so far (the page table counts the live counts
  /// it writes): what a mapping's size would cost if page state were kept page by page.
  std::uint64_t page_state_updates() const noexcept { return s_.page_state_updates; }
  void reset_peak() noexcept { s_.peak_physical = s_.physical; }

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

  // page_range's lookups, with this table's page size and mapping records.
  void grow(range& r, std::size_t pages) { r.grow(pages, page_size()); }
  piece piece_at(const range& r, std::size_t p, std::size_t last) const noexcept { return r.piece_at(p, last, s_.mappings); }
  template <class F>
  void for_each_piece(const range& r, std::size_t first, std::size_t last, F&& f) const noexcept
  {
    r.for_each_piece(first, last, s_.mappings, std::forward<F>(f));
  }

  /// One physical allocation per run of unmapped pages in [first, last] (`needed` bytes in all, runs split at
  /// `max_run` pages); all or none. Access is set once per stretch of runs that follow one another (a gap
  /// longer than `max_run`), not per allocation: the driver charges per call. `mapped()` is called once per
  /// allocation made, when its access is set (a failed access call leaves the peak and the caller's mark as
  /// the stretches before it in this call left them).
  template <class Mapped>
  void map_unmapped(range& r, std::size_t first, std::size_t last, std::size_t needed, std::size_t max_run, Mapped&& mapped)
  {
    s_.reserve(needed / page_size());
    reserve_runs(r, needed / page_size());
    std::vector<std::uint32_t> made;
    made.reserve(needed / page_size());
    std::size_t usable = 0;  // made[usable..] are mapped back to back, their access not yet set
    try {
      for (std::size_t p = first; p <= last;) {
        const piece pc = piece_at(r, p, last);  // looked up again: each mapping made adds a run
        if (pc.slot != no_mapping) {
          grant_access(r, made, usable, mapped);
          p = pc.last + 1;
          continue;
        }
        const std::size_t run = std::min(pc.last - p + 1, max_run);
        made.push_back(map_one(r, p, run));
        p += run;
      }
      grant_access(r, made, usable, mapped);
    } catch (...) {
      for (std::size_t i = made.size(); i-- > 0;) {
        if (i < usable) drop_mapping(made[i]);
        else drop_unusable(made[i]);
      }
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
      while (s_.has_queued() && done < want) {
        const std::uint32_t slot = s_.next_queued();
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
          if (keep_spares) s_.spares.keep(m.page, m.count);  // room reserved
          release_unmapped(slot, /*destroy=*/!keep_spares);
        }
        s_.pop_queued();
      }
    } catch (...) {
      s_.list_idle(kept);
      throw;
    }
    s_.list_idle(kept);
  }

  /// Releases the spares no new mapping took.
  void drop_spares() noexcept
  {
    s_.spares.release_all([&](page_handle page) noexcept { backend_.destroy(page); });
  }
  std::size_t spare_count() const noexcept { return s_.spares.size(); }

  // What the page table tells of live blocks: how many pages of each mapping they touch. A mapping they touch
  // none of is idle (counted in idle_bytes(), queued for reclaim). The idle total is changed apart, once per
  // block: changed per mapping, each change would wait for the one before.

  /// `pages` more pages of mapping `slot` touched by live blocks; returns the bytes that stop being idle (for
  /// less_idle).
  std::size_t add_busy(std::uint32_t slot, std::size_t pages) noexcept
  {
    if (pages == 0) return 0;
    mapping& m = s_.mappings[slot];
    std::size_t woken = 0;
    if (m.busy == 0 && m.idle) {
      m.idle = false;
      woken = bytes_of(m);
    }
    m.busy += pages;
    return woken;
  }

  /// `pages` pages of mapping `slot` no longer touched by live blocks; with none left it goes idle and is
  /// queued. Returns the bytes that went idle (for more_idle).
  std::size_t remove_busy(std::uint32_t slot, std::size_t pages) noexcept
  {
    if (pages == 0) return 0;
    mapping& m = s_.mappings[slot];
    m.busy -= pages;
    if (m.busy != 0) return 0;
    m.idle = true;
    if (!m.listed) s_.list_idle(slot);
    return bytes_of(m);
  }

  void less_idle(std::size_t bytes) noexcept { s_.idle_bytes -= bytes; }
  void more_idle(std::size_t bytes) noexcept { s_.idle_bytes += bytes; }

  // Relocation: an idle allocation mapped a second time where a new block needs memory; the pages it leaves
  // stay mapped, as a stale range under a holder block (the caller's), until a device wait covers them.

  /// The queued slots, idle longest first. An entry may be stale (busy again since it was queued): read its
  /// record's `idle`.
  std::span<const std::uint32_t> idle_queue() const noexcept { return {s_.idle.data() + s_.idle_head, s_.idle.size() - s_.idle_head}; }

  /// Maps allocation `slot` a second time at page `at` of `to`, with its access set, and makes room to record
  /// the move. Throws with nothing mapped. The caller then records it (record_move), which cannot fail.
  void map_again(std::uint32_t slot, range& to, std::size_t at)
  {
    const mapping& m = s_.mappings[slot];
    const std::size_t bytes = bytes_of(m);
    const std::uintptr_t address = address_of(to, at);
    s_.stale.reserve(s_.stale.size() + 1);
    reserve_runs(to, 1);
    if (at + m.count > to.pages.size()) grow(to, at + m.count);
    backend_.map(address, m.page, bytes);
    try {
      backend_.set_access(address, bytes);
    } catch (...) {
      try {
        backend_.unmap(address, bytes);
      } catch (...) {
        // The driver keeps the alias: that address range fails later maps rather than corrupting memory.
      }
      throw;
    }
  }

  /// Allocation `slot`, mapped again at page `at` of `to` (map_again), lives there from now on; the pages it
  /// leaves become a stale range under `holder`, a block neither free nor live.
  void record_move(std::uint32_t slot, range& to, std::size_t at, address_block* holder) noexcept
  {
    mapping& m = s_.mappings[slot];
    set_mapping(s_.ranges[m.band], m.first, m.count, stale_mapping);  // its run stays filed: the stale range's
    s_.stale.push_back({.band = m.band, .first = m.first, .count = m.count, .holder = holder, .slot = slot});
    s_.stale_bytes += bytes_of(m);
    ++m.aliases;
    m.band = index_of(to);
    m.first = at;
    set_mapping(to, at, m.count, slot);
    add_run(to, at, m.count);
    ++s_.relocations;
  }

  /// Moves the allocations relocated since there were `keep` stale ranges back where they were (their new
  /// pages were never used), newest first, handing each stale range to `release_holder` once its allocation
  /// is back. One whose alias the driver keeps stays moved (a valid state), and the older ones with it.
  template <class ReleaseHolder>
  void undo_moves(std::size_t keep, ReleaseHolder&& release_holder) noexcept
  {
    while (s_.stale.size() > keep) {
      const stale_range g = s_.stale.back();
      mapping& m = s_.mappings[g.slot];
      range& now = s_.ranges[m.band];
      try {
        backend_.unmap(address_of(now, m.first), bytes_of(m));
      } catch (...) {
        break;
      }
      set_mapping(now, m.first, m.count, no_mapping);
      remove_run(now, m.first);
      m.band = g.band;
      m.first = g.first;
      --m.aliases;
      set_mapping(s_.ranges[g.band], g.first, g.count, g.slot);  // its run stayed filed while stale
      s_.stale_bytes -= bytes_of(m);
      release_holder(g);
      s_.stale.pop_back();
      --s_.relocations;
    }
    s_.stale_safe = std::min(s_.stale_safe, s_.stale.size());
  }

  /// Gives back the stale ranges the device is known done with (after one wait for them all first when
  /// `wait`, or when an earlier wait already covered them), handing each to `release_holder` once its pages
  /// are free address space. A failed wait or unmap leaves the rest for later.
  template <class ReleaseHolder>
  void tidy_stale(bool wait, ReleaseHolder&& release_holder) noexcept
  {
    if (wait && s_.stale_safe < s_.stale.size()) {
      try {
        backend_.synchronize();
        s_.stale_safe = s_.stale.size();
      } catch (...) {
        // Under capture, or a broken device: the ranges stay until a later wait.
      }
    }
    unmap_safe_stale(s_.stale_safe);
    std::size_t gone = 0;
    while (gone < s_.stale.size() && s_.stale[gone].unmapped) {
      const stale_range& g = s_.stale[gone];
      range& r = s_.ranges[g.band];
      set_mapping(r, g.first, g.count, no_mapping);
      remove_run(r, g.first);
      release_holder(g);
      ++gone;
    }
    s_.stale.erase(s_.stale.begin(), s_.stale.begin() + static_cast<std::ptrdiff_t>(gone));
    s_.stale_safe -= gone;
  }

private:
  /// The mappings' records and idle queue (mapping_slots), and everything else kept about them.
  struct state : mapping_slots<page_handle> {
    std::array<range, 2> ranges{};
    spare_allocations<page_handle> spares;   ///< unmapped, not counted in physical; empty between calls
    std::vector<stale_range> stale;          ///< oldest first
    std::size_t stale_safe = 0;              ///< how many of the oldest stale ranges a device wait has covered
    std::size_t stale_bytes = 0;             ///< address space of stale ranges still mapped
    std::uint64_t relocations = 0;
    std::uint64_t page_state_updates = 0;
    std::size_t physical = 0;
    std::size_t peak_physical = 0;
    std::size_t idle_bytes = 0;
  };

  /// Unmaps the first `limit` stale ranges (a device wait since they were made), so their allocations can be
  /// released; their holders stay until tidy_stale. Stops at a failed unmap.
  void unmap_safe_stale(std::size_t limit) noexcept
  {
    for (std::size_t i = 0; i < std::min(limit, s_.stale_safe); ++i)
      if (!s_.stale[i].unmapped && !unmap_stale(s_.stale[i])) return;
  }

  /// One physical allocation behind pages [first, first + count): a spare of that size or a new one, mapped,
  /// its access not yet set (grant_access); all or nothing (a spare taken goes back to the spares when the map
  /// fails; once mapped, a failed access call drops it with the rest of its stretch).
  std::uint32_t map_one(range& r, std::size_t first, std::size_t count)
  {
    const std::size_t bytes = count * page_size();
    const std::uintptr_t address = address_of(r, first);
    page_handle page{};
    const bool from_spare = s_.spares.take(count, page);
    if (!from_spare) page = backend_.create(bytes);
    try {
      backend_.map(address, page, bytes);
    } catch (...) {
      if (from_spare) s_.spares.keep(page, count);  // the room it left: no allocation
      else backend_.destroy(page);
      throw;
    }
    const std::uint32_t slot = s_.add(mapping{.page = page, .band = index_of(r), .first = first, .count = count});  // room reserved
    set_mapping(r, first, count, slot);
    add_run(r, first, count);
    s_.physical += bytes;
    return slot;
  }

  /// Sets access, in one call, over the mappings made[from..], which lie back to back; then they are usable,
  /// count toward the peak, and `mapped()` is told of each.
  template <class Mapped>
  void grant_access(const range& r, const std::vector<std::uint32_t>& made, std::size_t& from, Mapped& mapped)
  {
    if (from == made.size()) return;
    const mapping& front = s_.mappings[made[from]];
    const mapping& back = s_.mappings[made.back()];
    backend_.set_access(address_of(r, front.first), (back.first + back.count - front.first) * page_size());
    s_.peak_physical = std::max(s_.peak_physical, s_.physical);
    for (; from < made.size(); ++from) mapped();
  }

  /// Unmaps and releases a mapping whose access was never set. Where the driver keeps it mapped, the
  /// allocation is leaked and the pages recorded as unmapped: a later map there fails rather than handing out
  /// memory no device may touch.
  void drop_unusable(std::uint32_t slot) noexcept
  {
    mapping& m = s_.mappings[slot];
    bool unmapped = true;
    try {
      backend_.unmap(address_of(s_.ranges[m.band], m.first), bytes_of(m));
    } catch (...) {
      unmapped = false;
    }
    release_unmapped(slot, unmapped);
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
      if (!m.listed) s_.list_idle(slot);
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
    s_.remove(slot);
  }

  /// Writes the mapping behind pages [first, first + count).
  void set_mapping(range& r, std::size_t first, std::size_t count, std::uint32_t slot) noexcept
  {
    for (std::size_t p = first; p < first + count; ++p) r.pages[p].mapping = slot;
    s_.page_state_updates += count;
  }

  // A range's run order: room first, so filing cannot throw.
  static void reserve_runs(range& r, std::size_t more) { r.runs.reserve_more(more); }
  static void add_run(range& r, std::size_t first, std::size_t count) noexcept { r.runs.add(first, count); }
  static void remove_run(range& r, std::size_t first) noexcept { r.runs.remove(first); }

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
  unsigned page_shift_ = 0;
};

} // namespace strata::detail
