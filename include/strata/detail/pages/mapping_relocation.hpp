#pragma once
// How mapped_pool moves idle physical memory to where a new block needs it instead of waiting for the device
// to give it back: an idle allocation is mapped a second time at the new place (reusing freed memory at
// another address is as safe as reusing it in place), and the range it leaves ("stale") stays mapped, out of
// use under a holder block, until a device wait covers it; then it is unmapped and its address space freed.
// This part is the choice of what moves and the block surgery around it; the mapping records, the stale
// ranges and every backend call are page_mappings.hpp's, reached through its interface.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include <strata/detail/address_range.hpp>
#include <strata/detail/object_pool.hpp>
#include <strata/detail/pages/page_backend.hpp>
#include <strata/detail/pages/page_mappings.hpp>
#include <strata/detail/pages/page_range.hpp>

namespace strata::detail {

/// Models moving idle allocations to runs of unmapped pages, and undoing and tidying the moves, as a view
/// made per call over the pool's mappings, its two ranges' block lists and their nodes: it owns nothing and
/// holds nothing between calls.
/// Cost: a relocation is two backend calls (map, set access) per allocation moved, a scan of the idle queue
/// per run, a walk of the blocks before the range it leaves and a write of the pages it moves between; undo
/// one backend call (unmap) per move undone; tidy waits for the device only when told to.
template <page_backend Backend>
class mapping_relocation {
public:
  using mappings_type = page_mappings<Backend>;
  using range = typename mappings_type::range;
  using stale_range = typename mappings_type::stale_range;
  using block = address_block;

  struct relocated {
    std::size_t covered = 0;  ///< bytes of [first, last] now mapped
    std::size_t bytes = 0;    ///< bytes of the allocations moved (more where one reaches past last)
  };

  mapping_relocation(mappings_type& mappings, std::array<block_range, 2>& blocks, object_pool<block>& nodes) noexcept
      : m_(mappings), blocks_(blocks), nodes_(nodes)
  {}

  /// Covers the runs of unmapped pages in [first, last] of `bd` with idle allocations from elsewhere, each
  /// mapped again at the run (reaching past `last` over free unmapped pages, up to `max_run` pages, where it
  /// is longer than the rest of the run). Stops at the first run part no idle allocation fits.
  relocated relocate(range& bd, std::size_t first, std::size_t last, page_span keep, std::size_t max_run)
  {
    relocated done;
    const std::size_t page = m_.page_size();
    const std::size_t band_pages = bd.size / page;
    for (std::size_t p = first; p <= last;) {
      const auto gap = m_.piece_at(bd, p, band_pages - 1);  // looked up again: each move adds a run
      if (gap.slot != mappings_type::no_mapping) {
        p = gap.last + 1;
        continue;
      }
      std::size_t run = std::min(gap.last, last) - p + 1;
      // Past `last`, unmapped pages are free address space.
      std::size_t room = gap.last > last ? std::max(run, std::min(max_run, gap.last - p + 1)) : run;
      while (run > 0) {
        const std::uint32_t slot = idle_to_move(bd, run, room, keep);
        if (slot == mappings_type::no_mapping) break;
        const std::size_t count = m_.slot(slot).count;
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
  /// were never used), newest first, freeing their holders; one whose alias the driver keeps stays moved (a
  /// valid state).
  void undo(std::size_t keep) noexcept
  {
    m_.undo_moves(keep, [&](const stale_range& g) noexcept { blocks_[g.band].release(g.holder, nodes_); });
  }

  /// Gives back stale ranges the device is known done with (after a wait for them all first when `wait`, or
  /// when an earlier wait already covered them), freeing their holders. Only between calls' block surgery:
  /// freeing a holder merges its neighbours. A failed wait or unmap leaves the rest for later.
  void tidy(bool wait) noexcept
  {
    m_.tidy_stale(wait, [&](const stale_range& g) noexcept { blocks_[g.band].release(g.holder, nodes_); });
  }

private:
  /// The idle allocation to map at a run of `run` unmapped pages with `room` pages free from its start: the
  /// largest that fits in the run, else the smallest that covers it; never one in [keep.from, keep.reach] of
  /// `bd` (the free block being carved, whose nodes must not change). no_mapping: none fits.
  std::uint32_t idle_to_move(const range& bd, std::size_t run, std::size_t room, page_span keep) const noexcept
  {
    std::uint32_t best = mappings_type::no_mapping;
    std::size_t best_cost = SIZE_MAX;
    for (const std::uint32_t slot : m_.idle_queue()) {
      const auto& m = m_.slot(slot);
      if (!m.idle || m.count > room) continue;
      if (&m_.band(m.band) == &bd && m.first <= keep.reach && m.first + m.count > keep.from) continue;
      const std::size_t cost = m.count <= run ? run - m.count : room + (m.count - run);
      if (cost < best_cost) {
        best_cost = cost;
        best = slot;
        if (cost == 0) break;
      }
    }
    return best;
  }

  /// Maps idle allocation `slot` again at page `at` of `to`; its old range becomes a stale range, held out of
  /// use by a block carved over it. Throws with nothing changed.
  void move_mapping(std::uint32_t slot, range& to, std::size_t at)
  {
    const auto& m = m_.slot(slot);
    const std::size_t bytes = m_.bytes_of(m);
    const std::uintptr_t old_address = m_.address_of(m_.band(m.band), m.first);
    block_range& blocks = blocks_[m.band];
    block* holder = address_range::block_over(blocks.first, old_address);  // free: no live block touches idle pages
    block* rest = holder->address < old_address ? nodes_.make() : nullptr;
    block* tail = nullptr;
    try {
      if (old_address + bytes < holder->address + holder->size) tail = nodes_.make();
      m_.map_again(slot, to, at);
    } catch (...) {
      if (rest != nullptr) nodes_.recycle(rest);
      if (tail != nullptr) nodes_.recycle(tail);
      throw;
    }
    holder = blocks.carve(holder, old_address, bytes, rest, tail);  // the holder: neither free nor live
    m_.record_move(slot, to, at, holder);
  }

  mappings_type& m_;
  std::array<block_range, 2>& blocks_;
  object_pool<block>& nodes_;
};

} // namespace strata::detail
