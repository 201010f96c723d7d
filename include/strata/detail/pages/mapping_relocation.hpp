#pragma once
// How mapped_pool moves idle physical memory to where a new block needs it instead of waiting for the device
// to give it back: an idle allocation is mapped a second time at the new place (reusing freed memory at
// another address is as safe as reusing it in place), and the range it leaves ("stale") stays mapped, out of
// use under a holder block, until a device wait covers it; then it is unmapped and its address space freed.
// A view over the pool's page table, block lists and nodes, made per call.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include <strata/detail/address_range.hpp>
#include <strata/detail/object_pool.hpp>
#include <strata/detail/pages/page_table.hpp>

namespace strata::detail {

/// Cost: a relocation is two backend calls (map, set access) per allocation moved, a scan of the idle queue
/// per run, a walk of the blocks before the range it leaves and a write of the pages it moves between; tidy
/// waits for the device only when told to.
template <class Backend>
class mapping_relocation {
public:
  using table = page_table<Backend>;
  using range = typename table::range;
  using block = address_block;

  struct relocated {
    std::size_t covered = 0;  ///< bytes of [first, last] now mapped
    std::size_t bytes = 0;    ///< bytes of the allocations moved (more where one reaches past last)
  };

  mapping_relocation(table& pages, std::array<block_range, 2>& blocks, object_pool<block>& nodes) noexcept
      : t_(pages), s_(pages.s_), blocks_(blocks), nodes_(nodes)
  {}

  /// Covers the runs of unmapped pages in [first, last] of `bd` with idle allocations from elsewhere, each
  /// mapped again at the run (reaching past `last` over free unmapped pages, up to `max_run` pages, where it
  /// is longer than the rest of the run). Stops at the first run part no idle allocation fits.
  relocated relocate(range& bd, std::size_t first, std::size_t last, page_span keep, std::size_t max_run)
  {
    relocated done;
    const std::size_t page = t_.page_size();
    const std::size_t band_pages = bd.size / page;
    for (std::size_t p = first; p <= last;) {
      const auto gap = t_.piece_at(bd, p, band_pages - 1);  // looked up again: each move adds a run
      if (gap.slot != table::no_mapping) {
        p = gap.last + 1;
        continue;
      }
      std::size_t run = std::min(gap.last, last) - p + 1;
      // Past `last`, unmapped pages are free address space.
      std::size_t room = gap.last > last ? std::max(run, std::min(max_run, gap.last - p + 1)) : run;
      while (run > 0) {
        const std::uint32_t slot = idle_to_move(bd, run, room, keep);
        if (slot == table::no_mapping) break;
        const std::size_t count = s_.mappings[slot].count;
        move_mapping(slot, bd, p);
        done.covered += std::min(count, run) * page;
        done.bytes += count * page;
        p += count;
        room -= count;
        run -= std::min(count, run);
      }
      p += run;
    }
    return done;
  }

  /// Moves the relocations made since there were `keep` stale ranges back where they were (their new ranges
  /// were never used), newest first; one whose alias the driver keeps stays moved (a valid state).
  void undo(std::size_t keep) noexcept
  {
    while (s_.stale.size() > keep) {
      const auto g = s_.stale.back();
      auto& m = s_.mappings[g.slot];
      range& now = s_.ranges[m.band];
      try {
        t_.backend_.unmap(t_.address_of(now, m.first), t_.bytes_of(m));
      } catch (...) {
        break;
      }
      t_.set_mapping(now, m.first, m.count, table::no_mapping);
      table::remove_run(now, m.first);
      range& back = s_.ranges[g.band];
      m.band = g.band;
      m.first = g.first;
      --m.aliases;
      t_.set_mapping(back, g.first, g.count, g.slot);  // its run stayed filed while stale
      s_.stale_bytes -= t_.bytes_of(m);
      blocks_[g.band].release(g.holder, nodes_);
      s_.stale.pop_back();
      --s_.relocations;
    }
    s_.stale_safe = std::min(s_.stale_safe, s_.stale.size());
  }

  /// Gives back stale ranges the device is known done with (after a wait for them all first when `wait`, or
  /// when an earlier wait already covered them). Only between calls' block surgery: freeing a holder merges
  /// its neighbours. A failed wait or unmap leaves the rest for later.
  void tidy(bool wait) noexcept
  {
    if (wait && s_.stale_safe < s_.stale.size()) {
      try {
        t_.backend_.synchronize();
        s_.stale_safe = s_.stale.size();
      } catch (...) {
        // Under capture, or a broken device: the ranges stay until a later wait.
      }
    }
    t_.unmap_safe_stale(s_.stale_safe);
    std::size_t gone = 0;
    while (gone < s_.stale.size() && s_.stale[gone].unmapped) {
      const auto& g = s_.stale[gone];
      range& bd = s_.ranges[g.band];
      t_.set_mapping(bd, g.first, g.count, table::no_mapping);
      table::remove_run(bd, g.first);
      blocks_[g.band].release(g.holder, nodes_);
      ++gone;
    }
    s_.stale.erase(s_.stale.begin(), s_.stale.begin() + static_cast<std::ptrdiff_t>(gone));
    s_.stale_safe -= gone;
  }

private:
  /// The idle allocation to map at a run of `run` unmapped pages with `room` pages free from its start: the
  /// largest that fits in the run, else the smallest that covers it; never one in [keep.from, keep.reach] of
  /// `bd` (the free block being carved, whose nodes must not change). no_mapping: none fits.
  std::uint32_t idle_to_move(const range& bd, std::size_t run, std::size_t room, page_span keep) const noexcept
  {
    std::uint32_t best = table::no_mapping;
    std::size_t best_cost = SIZE_MAX;
    for (std::size_t i = s_.idle_head; i < s_.idle.size(); ++i) {
      const std::uint32_t slot = s_.idle[i];
      const auto& m = s_.mappings[slot];
      if (!m.idle || m.count > room) continue;
      if (&s_.ranges[m.band] == &bd && m.first <= keep.reach && m.first + m.count > keep.from) continue;
      const std::size_t cost = m.count <= run ? run - m.count : room + (m.count - run);
      if (cost < best_cost) {
        best_cost = cost;
        best = slot;
        if (cost == 0) break;
      }
    }
    return best;
  }

  /// Maps idle allocation `slot` again at page `at` of `to`; its old range becomes a stale range. Throws with
  /// nothing changed.
  void move_mapping(std::uint32_t slot, range& to, std::size_t at)
  {
    auto& m = s_.mappings[slot];
    range& from = s_.ranges[m.band];
    const std::size_t bytes = t_.bytes_of(m);
    const std::uintptr_t old_address = t_.address_of(from, m.first), new_address = t_.address_of(to, at);
    block* holder = address_range::block_over(blocks_[m.band].first, old_address);  // free: no live block touches idle pages
    block* rest = holder->address < old_address ? nodes_.make() : nullptr;
    block* tail = nullptr;
    try {
      if (old_address + bytes < holder->address + holder->size) tail = nodes_.make();
      s_.stale.reserve(s_.stale.size() + 1);
      table::reserve_runs(to, 1);
      if (at + m.count > to.pages.size()) t_.grow(to, at + m.count);
      t_.backend_.map(new_address, m.page, bytes);
      try {
        t_.backend_.set_access(new_address, bytes);
      } catch (...) {
        try {
          t_.backend_.unmap(new_address, bytes);
        } catch (...) {
          // The driver keeps the alias: that address range fails later maps rather than corrupting memory.
        }
        throw;
      }
    } catch (...) {
      if (rest != nullptr) nodes_.recycle(rest);
      if (tail != nullptr) nodes_.recycle(tail);
      throw;
    }
    holder = blocks_[m.band].carve(holder, old_address, bytes, rest, tail);  // the holder: neither free nor live
    t_.set_mapping(from, m.first, m.count, table::stale_mapping);  // its run stays filed: the stale range's
    s_.stale.push_back({.band = m.band, .first = m.first, .count = m.count, .holder = holder, .slot = slot});
    s_.stale_bytes += bytes;
    ++m.aliases;
    m.band = t_.index_of(to);
    m.first = at;
    t_.set_mapping(to, at, m.count, slot);
    table::add_run(to, at, m.count);
    ++s_.relocations;
  }

  table& t_;
  typename table::state& s_;
  std::array<block_range, 2>& blocks_;
  object_pool<block>& nodes_;
};

} // namespace strata::detail
