#pragma once
// One tag's share of mapped_pool: two reserved address ranges, the blocks in them and the physical memory
// behind them. mapped_pool keeps one per tag, so a tag's memory never shares a mapping with another tag's and
// can be given back whole (pause) and mapped again at the same addresses (restore).
#include <concepts>
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/address_range.hpp>
#include <strata/detail/emptied_on_move.hpp>
#include <strata/detail/object_pool.hpp>
#include <strata/detail/pages/mapping_relocation.hpp>
#include <strata/detail/pages/page_backend.hpp>
#include <strata/detail/pages/page_mappings.hpp>
#include <strata/detail/pages/page_table.hpp>
#include <strata/detail/pages/reclaim_budget.hpp>
#include <strata/detail/pointer_map.hpp>
#include <strata/detail/tlsf_lists.hpp>

namespace strata::detail {

/// One tag's pool over page-mapped memory (CUDA virtual memory management; docs/architecture.md, "Page-mapped
/// memory"): mapped_pool's body, one per tag, over a backend it borrows from mapped_pool, with the live-block
/// listing and restore() that pause and resume use. Two large address ranges are reserved, for requests up to `small_limit` and for larger ones,
/// each one TLSF pool whose free blocks merge across page boundaries (detail/address_range.hpp). Physical
/// memory stands only behind pages live blocks touch (detail/pages/page_table.hpp): a run of unmapped pages gets one
/// physical allocation. A mapping no live block touches stays mapped ("idle") and is reused in place; it is
/// given back only when a new mapping would lift the memory held above the budget (detail/pages/reclaim_budget.hpp),
/// first by relocating idle allocations to where they are needed (detail/pages/mapping_relocation.hpp), then by
/// one device wait and unmapping those idle longest. release() gives every idle mapping back.
///
/// Its parts are members: the page table (live blocks per page), which holds the mappings (page_mappings.hpp:
/// the backend and everything taken from it); the budget; each range's blocks and their nodes; the live-block
/// map. Relocation is a view made per call over the mappings and the blocks (relocation()).
///
/// Backend: driver_pages (device memory) or simulated_pages (a pretend device, for tests and planning).
/// Models: resource, owning, releasable, sized, usage, snapshot, room-reporting; the backend's properties.
/// Any power-of-two alignment up to 1 GiB. Cost: allocate and free O(1) plus a loop over the mappings the
/// block touches (never its pages: page state is kept by runs) and a bounded placement search, each candidate
/// O(mappings it covers + log mappings); a new mapping three driver calls (two where it takes, at its size,
/// an allocation the reclaim before it unmapped, instead of releasing that one and creating another), a
/// relocation two; the host waits for the device only in a reclaim (once for a batch of mappings), in
/// release(), when stale ranges pass `stale_address_limit`, and when the pool goes. Unsynchronized.
/// Move-only; the ranges are reserved on first use.
template <page_backend Backend>
class mapped_core {
public:
  static constexpr std::size_t max_alignment = std::size_t{1} << 30;
  static constexpr std::size_t reclaims_per_busy_window = reclaim_budget::reclaims_per_busy_window;

  struct options {
    std::size_t max_physical = SIZE_MAX;                ///< never hold more physical memory than this
    std::size_t small_limit = std::size_t{1} << 20;     ///< requests up to this share one address range
    std::size_t address_space = std::size_t{1} << 38;   ///< bytes reserved for each of the two ranges
    std::size_t reclaim_slack = 0;                      ///< held bytes allowed above the live bytes before idle memory goes back (SIZE_MAX: never)...
    double reclaim_slack_fraction = 0.0;                ///< ... or this share of the live bytes, if more
    std::size_t max_mapping = std::size_t{128} << 20;   ///< the largest physical allocation (a multiple of the page)
    std::size_t min_mapping = std::size_t{8} << 20;     ///< a mapping at the edge of mapped memory takes free pages after it up to this...
    double min_mapping_fraction = 1.0 / 256;            ///< ... but no more than this share of the memory held
    /// A mapping that would take the memory held above the high-water mark (idle memory elsewhere counted as
    /// held: a reclaim may yet cover it) takes free pages after it up to this share of the memory held (at most
    /// max_mapping), where that is more than the line above allows: growth to a new peak then costs fewer
    /// physical allocations, each a create, a map and an access call, for at most that share held ahead of
    /// the need. 0: such mappings map ahead as any mapping does.
    double growth_ahead_fraction = 0.0;
    int placement_candidates = 16;                      ///< free blocks compared to find one already mapped
    /// After a reclaim that kept the pool at its high-water mark (not one the cap forced), the mark rises by
    /// this share of itself. Every such reclaim is a device-wide wait on the host, which drains the GPU's
    /// queue: a loop that needs one new mapping at its peak every step would wait once per step. With
    /// headroom the loop settles after a few reclaims, holding at most that much more. 0: never raised.
    double reclaim_headroom_fraction = 0.0;
    /// At the high-water mark, move idle physical memory to where it is needed before waiting for the device
    /// to give it back: no device wait where idle allocations cover the need, for more memory (whole
    /// allocations move, so the pool follows the live set less closely; docs/memory.md). Off: every such growth
    /// is a reclaim (one device-wide wait).
    bool relocate_idle = false;
    /// A pool that keeps reclaiming at a steady rate is not growing to a new peak (growth reclaims in bursts
    /// that end: no shared trace reaches the rate below, docs/memory.md) but running a loop whose blocks land on
    /// other pages each round, and it would wait for the device every few rounds for as long as the loop runs.
    /// Once two windows of this many allocations in a row each reclaimed at least once per 128 allocations,
    /// the pool relocates from then on, as with relocate_idle (until release()). 0: never switches.
    std::size_t persistent_reclaim_window = 4096;
    /// Address space that relocations may leave mapped and out of use before the pool waits for the device
    /// once to unmap it all (sooner when it waits anyway). Costs no physical memory.
    std::size_t stale_address_limit = std::size_t{16} << 30;
  };
  // The defaults are the trade chosen by replaying bench/traces (docs/memory.md, bench/mapped_variants): reclaiming
  // only at the high-water mark, mappings of 8-128 MiB. Smaller mappings follow the live set more closely at
  // more driver calls; larger ones the reverse.

  mapped_core() requires std::default_initializable<Backend> : mapped_core(Backend{}, options{}) {}
  explicit mapped_core(Backend backend) : mapped_core(std::move(backend), options{}) {}
  mapped_core(Backend backend, options opts)
      : table_(std::move(backend)), opts_(checked(opts, maps().page_size())),
        budget_({.max_physical = opts.max_physical, .reclaim_slack = opts.reclaim_slack, .reclaim_slack_fraction = opts.reclaim_slack_fraction,
                 .reclaim_headroom_fraction = opts.reclaim_headroom_fraction, .relocate_idle = opts.relocate_idle,
                 .persistent_reclaim_window = opts.persistent_reclaim_window})
  {}

  // Everything taken from the backend goes back with table_ (on destruction, and before a move assignment
  // takes the other pool's); every other member is left empty by a move.
  mapped_core(mapped_core&&) noexcept = default;
  mapped_core& operator=(mapped_core&&) noexcept = default;
  mapped_core(const mapped_core&) = delete;
  mapped_core& operator=(const mapped_core&) = delete;
  ~mapped_core() = default;

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("mapped_pool", alignment, max_alignment);
    if (bytes == 0) return nullptr;
    if (bytes > opts_.address_space / 2) throw_oom(bytes, "larger than the pool's address range");
    const std::size_t size = align_up(bytes, granule);
    const std::uint32_t band = band_for(size);
    if (maps().stale_covered() != 0 || maps().stale_bytes() > opts_.stale_address_limit) [[unlikely]]
      relocation().tidy(maps().stale_bytes() > opts_.stale_address_limit);
    if (maps().band(band).size != 0) return allocate_in(band, bytes, size, effective_alignment(alignment));
    reserve_band(band, bytes);
    try {
      return allocate_in(band, bytes, size, effective_alignment(alignment));
    } catch (...) {
      unreserve_band(band);  // the first request failed: as if it had never come
      throw;
    }
  }

  void deallocate(void* p, std::size_t, std::size_t = default_alignment) noexcept { (void)take_back(p); }

  /// Frees the block starting at p; false (nothing done) when p starts no live block of this pool.
  bool take_back(void* p) noexcept
  {
    if (p == nullptr) return false;
    block* b = nullptr;
    if (!used_.take(p, &b)) return false;
    const std::uint32_t band = maps().band_of(b->address);
    auto& r = maps().band(band);
    in_use_.bytes -= b->size;
    table_.let_go(r, maps().page_of(r, b->address), maps().page_of(r, b->address + b->size - 1));
    blocks_[band].release(b, nodes_);
    return true;
  }

  /// Whether p lies in one of this pool's reserved ranges (live, free or never used).
  bool in_ranges(const void* p) const noexcept
  {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    for (std::uint32_t band = 0; band < 2; ++band)
      if (maps().band(band).size != 0 && a - maps().band(band).base < maps().band(band).size) return true;
    return false;
  }

  /// Every live block as (address, size), in address order. O(blocks log blocks); allocates the result.
  std::vector<std::pair<std::uintptr_t, std::size_t>> live_blocks() const
  {
    std::vector<std::pair<std::uintptr_t, std::size_t>> out;
    out.reserve(used_.size());
    used_.for_each([&](void* p, const block* b) { out.emplace_back(reinterpret_cast<std::uintptr_t>(p), b->size); });
    std::sort(out.begin(), out.end());
    return out;
  }

  /// Hands out again blocks that live_blocks() listed, at their addresses (ascending; each must lie in free
  /// space), mapping physical memory behind them. All or nothing: on failure every block made here is freed
  /// and the idle memory it left given back where the device wait for that succeeds.
  void restore(const std::vector<std::pair<std::uintptr_t, std::size_t>>& blocks)
  {
    std::size_t made = 0;
    try {
      std::array<block*, 2> cursor{blocks_[0].first, blocks_[1].first};
      for (const auto& [address, size] : blocks) {
        const std::uint32_t band = maps().band_of(address);
        block*& b = cursor[band];
        while (b != nullptr && b->address + b->size <= address) b = b->next;
        if (b == nullptr || !b->free || b->address > address || b->address + b->size < address + size)
          throw std::logic_error("mapped_pool: restoring a block at an address that is not free");
        b = hand_out(band, b, address, size, size, /*mapped=*/false);
        ++made;
      }
    } catch (...) {
      for (std::size_t i = 0; i < made; ++i) (void)take_back(reinterpret_cast<void*>(blocks[i].first));
      try {
        (void)release();
      } catch (...) {  // the memory stays idle: given back at the next release()
      }
      throw;
    }
  }

  /// What a request consumes: rounded up to 256 bytes (SIZE_MAX for a size no pool can serve).
  std::size_t good_size(std::size_t bytes, std::size_t = default_alignment) const noexcept
  {
    std::size_t size = 0;
    return bytes == 0 ? 0 : checked_align_up(bytes, granule, size) ? size : SIZE_MAX;
  }

  /// Whether the request would land on pages already mapped (no physical memory created).
  bool has_room_for(std::size_t bytes, std::size_t alignment = default_alignment) const noexcept
  {
    if (bytes == 0) return true;
    if (bytes > opts_.address_space / 2 || !is_power_of_two(alignment) || alignment > max_alignment) return false;
    const std::size_t size = align_up(bytes, granule);
    const std::size_t align = effective_alignment(alignment);
    const std::uint32_t band = band_for(size);
    if (maps().band(band).size == 0) return false;
    const auto found = place(band, size, align);
    return found.block != nullptr && found.cost == 0;
  }

  /// True when p is the start of a block this pool handed out and has not taken back.
  bool owns(const void* p) const noexcept { return used_.contains(p); }

  /// Whether release() would give anything back (and so wait for the device).
  bool holds_idle() const noexcept { return maps().idle_bytes() > 0 || maps().has_stale(); }
  /// max_physical counts `elsewhere` bytes held by other pools on the backend (mapped_pool's other tags): until
  /// the next call, this pool maps only what they leave under it, room mapped ahead included. O(1).
  void share_cap(std::size_t elsewhere) noexcept { budget_.set_cap(opts_.max_physical - std::min(opts_.max_physical, elsewhere)); }
  /// Moves max_physical while the pool lives (a per-process memory fraction set late). Mappings already above
  /// a lowered cap stay until their blocks are free and the pool reclaims them; no new mapping lifts the pool
  /// over it. O(1), no CUDA call.
  void set_max_physical(std::size_t bytes) noexcept
  {
    opts_.max_physical = bytes;
    budget_.set_cap(bytes);
  }

  /// Waits for the device once, then unmaps and releases every idle mapping and every range relocations
  /// left; returns the bytes given back.
  std::size_t release()
  {
    const std::size_t before = maps().physical();
    if (maps().idle_bytes() > 0 || maps().has_stale()) maps().reclaim(nullptr, 0, 0, SIZE_MAX, maps().stale_count());
    relocation().tidy(false);
    budget_.restart(maps().physical());  // asked to give memory back: growing to the old peak again is growth
    return before - maps().physical();
  }

  strata::usage usage() const noexcept
  {
    const std::size_t largest = std::max(blocks_[0].free.largest(), blocks_[1].free.largest());
    return {.reserved = maps().physical(), .in_use = in_use_.bytes, .largest_free = std::min(largest, maps().physical() - in_use_.bytes),
            .chunks = maps().mappings_live(), .used_blocks = used_.size(), .free_blocks = blocks_[0].free.count() + blocks_[1].free.count()};
  }

  /// Each address range up to the end of its page table (the highest page touched, rounded up as the table
  /// doubles), with its blocks (the last free block clipped there).
  strata::snapshot snapshot() const
  {
    strata::snapshot s{.box = "mapped_pool", .segments = {}};
    for (std::uint32_t band = 0; band < 2; ++band) {
      const auto& r = maps().band(band);
      if (r.size == 0 || r.pages.empty()) continue;
      const std::size_t extent = r.pages.size() * page_size();
      segment_info seg{.address = r.base, .size = extent, .blocks = {}, .mapped = maps().mapped_in(band)};
      for (const block* b = blocks_[band].first; b != nullptr && b->address < r.base + extent; b = b->next)
        seg.blocks.push_back({b->address - r.base, std::min(b->size, r.base + extent - b->address), b->free, -1});
      s.segments.push_back(std::move(seg));
    }
    return s;
  }

  std::size_t page_size() const noexcept { return maps().page_size(); }
  /// Physical memory held now, and the most ever held.
  std::size_t physical_bytes() const noexcept { return maps().physical(); }
  std::size_t peak_physical_bytes() const noexcept { return maps().peak_physical(); }
  /// Physical memory mapped behind no live block (reused in place, or reclaimed).
  std::size_t idle_bytes() const noexcept { return maps().idle_bytes(); }
  /// The pages live blocks touch now, and at most: what page-granular memory would hold at the least, the
  /// floor under physical_bytes() whatever the mapping sizes.
  std::size_t live_page_bytes() const noexcept { return table_.live_pages() * page_size(); }
  std::size_t peak_live_page_bytes() const noexcept { return table_.peak_live_pages() * page_size(); }
  std::size_t mappings() const noexcept { return maps().mappings_live(); }
  /// Idle physical allocations moved to where new blocks needed memory (instead of waiting to give them back).
  std::uint64_t relocations() const noexcept { return maps().relocations(); }
  /// Whether idle memory is relocated before the pool waits to reclaim it: relocate_idle, or a persistent
  /// reclaim rate seen since the last release() (options::persistent_reclaim_window).
  bool relocating() const noexcept { return budget_.relocating(); }
  /// Address space left mapped by relocations and not yet unmapped (aliases of memory held: no physical cost).
  std::size_t stale_bytes() const noexcept { return maps().stale_bytes(); }
  /// Per-page entries of the page table written so far: a block's first and last pages per allocation and
  /// free, every page of a mapping made, moved or dropped.
  std::uint64_t page_state_updates() const noexcept { return table_.page_state_updates(); }
  /// Driver calls made so far (creates, maps, unmaps, device waits...).
  const page_counters& page_calls() const noexcept { return maps().backend().counts(); }
  void reset_peak() noexcept { table_.reset_peak(); }

  /// One physical allocation behind part of a live block: where it is mapped, its size, the backend's handle.
  struct backing {
    std::uintptr_t address = 0;
    std::size_t bytes = 0;
    typename Backend::page page{};
  };
  /// The physical allocations behind the live block starting at p, in address order (they are contiguous and
  /// cover the block): what sharing the block with another process exports (ipc/). Empty for a pointer that
  /// does not start a live block. O(mappings of the block); allocates the result.
  std::vector<backing> backing_of(const void* p) const
  {
    std::vector<backing> out;
    const block* const* found = used_.find(p);
    if (found == nullptr) return out;
    const block& b = **found;
    const auto& r = maps().band(maps().band_of(b.address));
    const std::uintptr_t start = reinterpret_cast<std::uintptr_t>(p);
    maps().for_each_piece(r, maps().page_of(r, start), maps().page_of(r, b.address + b.size - 1), [&](const typename table::piece& pc) {
      const auto& mp = maps().slot(pc.slot);
      out.push_back({maps().address_of(r, mp.first), maps().bytes_of(mp), mp.page});
    });
    return out;
  }

  /// Access set again over everything mapped, with the backend's devices as they are now (page_mappings).
  void reapply_access() { maps().reapply_access(); }

  Backend& backend() noexcept { return maps().backend(); }
  const Backend& backend() const noexcept { return maps().backend(); }
  const options& settings() const noexcept { return opts_; }

private:
  static constexpr std::size_t granule = tlsf::granule;
  using block = address_block;
  using table = page_table<Backend>;
  using range = typename table::range;
  struct live_bytes {
    std::size_t bytes = 0;
  };

  static options checked(const options& opts, std::size_t page)
  {
    if (opts.address_space == 0 || opts.address_space % page != 0 || opts.address_space % max_alignment != 0)
      throw std::invalid_argument("mapped_pool: address_space " + std::to_string(opts.address_space) +
                                  " must be a positive multiple of 1 GiB and of the page size " + std::to_string(page));
    if (opts.max_physical < page)
      throw std::invalid_argument("mapped_pool: max_physical " + std::to_string(opts.max_physical) + " is less than one page of " +
                                  std::to_string(page) + " bytes");
    if (opts.max_mapping < page || opts.placement_candidates < 1 || !(opts.reclaim_slack_fraction >= 0.0 && opts.reclaim_slack_fraction <= 1.0) ||
        !(opts.reclaim_headroom_fraction >= 0.0 && opts.reclaim_headroom_fraction <= 1.0) ||
        !(opts.min_mapping_fraction >= 0.0 && opts.min_mapping_fraction <= 1.0) ||
        (opts.persistent_reclaim_window != 0 && opts.persistent_reclaim_window < reclaims_per_busy_window))
      throw std::invalid_argument("mapped_pool: max_mapping must be at least a page, placement_candidates positive, "
                                  "reclaim_slack_fraction, reclaim_headroom_fraction and min_mapping_fraction within [0, 1], "
                                  "persistent_reclaim_window 0 or at least 128");
    if (!(opts.growth_ahead_fraction >= 0.0 && opts.growth_ahead_fraction <= 1.0))
      throw std::invalid_argument("mapped_pool: growth_ahead_fraction " + std::to_string(opts.growth_ahead_fraction) +
                                  " is not within [0, 1]");
    return opts;
  }

  [[noreturn]] void throw_oom(std::size_t bytes, const std::string& why) const
  {
    throw out_of_memory("mapped_pool", bytes, why + "; physical " + std::to_string(maps().physical()) + " bytes, in use " +
                                                std::to_string(in_use_.bytes) + " bytes");
  }

  std::uint32_t band_for(std::size_t size) const noexcept { return size <= opts_.small_limit ? 0 : 1; }
  std::size_t max_run() const noexcept { return std::max<std::size_t>(1, opts_.max_mapping / page_size()); }
  /// The mappings behind the pages (the table's member): reserving, mapping, reclaiming, the counts.
  page_mappings<Backend>& maps() noexcept { return table_.mappings(); }
  const page_mappings<Backend>& maps() const noexcept { return table_.mappings(); }
  /// Relocation, given the mappings and this pool's blocks to work on.
  mapping_relocation<Backend> relocation() noexcept { return {table_.mappings(), blocks_, nodes_}; }

  void reserve_band(std::uint32_t band, std::size_t bytes)
  {
    block* whole = nodes_.make();
    std::uintptr_t base = 0;
    try {
      base = maps().reserve(band, opts_.address_space, max_alignment);
    } catch (const out_of_memory&) {
      nodes_.recycle(whole);
      throw_oom(bytes, "cannot reserve an address range");
    } catch (...) {
      nodes_.recycle(whole);
      throw;
    }
    *whole = block{.address = base, .size = opts_.address_space, .free = true};
    blocks_[band].first = whole;
    blocks_[band].free.insert(whole);
  }

  void unreserve_band(std::uint32_t band) noexcept
  {
    nodes_.recycle(blocks_[band].first);
    maps().unreserve(band);
    blocks_[band] = block_range{};
  }

  void* allocate_in(std::uint32_t band, std::size_t bytes, std::size_t size, std::size_t align)
  {
    auto found = place(band, size, align);
    if (found.block == nullptr && maps().has_stale()) {  // address space held by stale ranges: wait, give it back, try again
      relocation().tidy(true);
      found = place(band, size, align);
    }
    if (found.block == nullptr) throw_oom(bytes, "no free address range of that size left");
    block* b = found.block;
    return reinterpret_cast<void*>(hand_out(band, b, align_address(b->address, align), size, bytes, found.cost == 0)->address);
  }

  /// Carves [start, start + size) out of free block b and puts physical memory behind it; returns the live block.
  /// `mapped`: every page of the block is known to have memory behind it (the placement counted none missing),
  /// so there is nothing to look up or map.
  block* hand_out(std::uint32_t band, block* b, std::uintptr_t start, std::size_t size, std::size_t bytes, bool mapped)
  {
    range& r = maps().band(band);
    const page_span span{maps().page_of(r, start), maps().page_of(r, start + size - 1), maps().page_of(r, b->address),
                         maps().page_of(r, b->address + b->size - 1)};
    block* rest = start > b->address ? nodes_.make() : nullptr;
    block* tail = nullptr;
    try {
      if (start + size < b->address + b->size) tail = nodes_.make();
      used_.insert(reinterpret_cast<void*>(start), rest != nullptr ? rest : b);
      if (!mapped) [[unlikely]] {
        try {
          map_missing(band, span, bytes, in_use_.bytes + size);
        } catch (...) {
          used_.erase(reinterpret_cast<void*>(start));
          throw;
        }
      }
    } catch (...) {
      if (rest != nullptr) nodes_.recycle(rest);
      if (tail != nullptr) nodes_.recycle(tail);
      throw;
    }
    table_.hold(r, span.first, span.last);
    block* live = blocks_[band].carve(b, start, size, rest, tail);
    in_use_.bytes += size;
    budget_.tick();  // allocations served: a failed one leaves the count as it was
    return live;
  }

  using placement = typename tlsf_lists<block>::cheapest;

  /// A free block for the request, preferring one whose pages are already mapped (no driver call, no
  /// physical memory added) among the first few that fit, with the number of its pages not mapped.
  placement place(std::uint32_t band, std::size_t size, std::size_t align) const noexcept
  {
    const auto& r = maps().band(band);
    return blocks_[band].free.find_cheapest(size + (align - granule), opts_.placement_candidates,
                                            [&](const block* b) { return table_.unmapped_pages(r, align_address(b->address, align), size); });
  }

  /// Puts physical memory behind the span's pages that have none. `live_after`: the pool's live bytes once the
  /// block is handed out. On failure every page is as it was, except that idle memory reclaimed to make room
  /// stays reclaimed (no live block moves; only `reserved` can be lower).
  void map_missing(std::uint32_t band, page_span span, std::size_t bytes, std::size_t live_after)
  {
    range& r = maps().band(band);
    if (span.last >= r.pages.size()) maps().grow(r, span.last + 1);
    const auto census = table_.census(r, span.first, span.last);
    if (census.unmapped == 0) return;
    // The last run reaches min(min_mapping, min_mapping_fraction of the memory held) over the free pages after
    // it, or growth_ahead_fraction of it where the mapping lifts the high-water mark: growing a page at a time
    // costs a driver round trip per page, and those pages are where the next blocks land.
    const auto share = static_cast<std::size_t>(opts_.min_mapping_fraction * static_cast<double>(maps().physical()));
    std::size_t reach = std::min({opts_.min_mapping, share, opts_.max_mapping});
    if (maps().physical() + census.unmapped * page_size() > budget_.high_water()) {
      const auto growth = static_cast<std::size_t>(opts_.growth_ahead_fraction * static_cast<double>(maps().physical()));
      reach = std::max(reach, std::min(growth, opts_.max_mapping));
    }
    std::size_t ahead = table_.pages_ahead(r, span, reach / page_size(), max_run());
    if (maps().physical() + (census.unmapped + ahead) * page_size() > budget_.cap()) ahead = 0;  // never refuse for pages not asked for
    map_runs(r, span, span.last + ahead, (census.unmapped + ahead) * page_size(), census.idle_bytes, bytes, live_after);
  }

  /// Maps every run of unmapped pages in [span.first, last], one physical allocation per run (split at
  /// max_mapping). First, when the new memory would lift the pool above its budget, idle memory elsewhere is
  /// relocated there, then, for what is still missing, reclaimed to make room. On failure every relocation
  /// made here is undone (what was reclaimed stays reclaimed).
  void map_runs(range& r, page_span span, std::size_t last, std::size_t needed, std::size_t idle_in_range, std::size_t bytes,
                std::size_t live_after, bool may_relocate = true)
  {
    const std::size_t first = span.first;
    const std::size_t needed_at_first = needed;
    std::size_t idle_elsewhere = maps().idle_bytes() - idle_in_range;
    const std::size_t budget = budget_.limit(live_after);
    const std::size_t stale_before = maps().stale_count();
    try {
      if (maps().physical() + needed > budget && idle_elsewhere > 0 && budget_.relocating() && may_relocate) {
        const auto moved = relocation().relocate(r, first, last, span, max_run());
        needed -= moved.covered;
        idle_elsewhere -= moved.bytes;
        // A relocated allocation longer than what it covers holds its spare pages where they may not help:
        // where that leaves the request over the cap, reclaiming alone may still fit it.
        if (maps().physical() + needed > budget_.cap() && maps().physical() + needed - budget_.cap() > idle_elsewhere &&
            maps().stale_count() > stale_before) {
          relocation().undo(stale_before);
          if (maps().stale_count() == stale_before)
            return map_runs(r, span, last, needed_at_first, idle_in_range, bytes, live_after, false);
        }
      }
      if (maps().physical() + needed > budget && idle_elsewhere > 0) {
        // Reclaiming under the cap only keeps memory low: if it fails (its device wait, say, under capture or
        // on a sticky error), the allocation still fits, so it goes on and the idle memory stays for a later
        // reclaim. Only a reclaim that the cap needs makes the allocation fail.
        const bool for_cap = maps().physical() + needed > budget_.cap();
        try {
          maps().reclaim(&r, first, last, maps().physical() + needed - budget, stale_before, /*keep_spares=*/true);
        } catch (...) {
          if (for_cap) throw;
        }
        if (!for_cap) budget_.reclaimed_under_mark();
      }
      if (maps().physical() + needed > budget_.cap())
        throw_oom(bytes, "the physical cap of " + std::to_string(opts_.max_physical) + " bytes is reached" +
                             (budget_.cap() < opts_.max_physical ? " by all tags together" : ""));
      if (needed > 0) maps().map_unmapped(r, first, last, needed, max_run(), [this] { budget_.held(maps().physical()); });
    } catch (...) {
      maps().drop_spares();
      relocation().undo(stale_before);
      throw;
    }
    maps().drop_spares();  // the memory reclaimed that no new mapping of its size took
  }

  table table_;  // owns the mappings, and through them the backend and everything taken from it
  options opts_;
  reclaim_budget budget_;
  emptied_on_move<object_pool<block>> nodes_;
  pointer_map<block*> used_;
  emptied_on_move<std::array<block_range, 2>> blocks_;  // small and large requests, never mixed
  emptied_on_move<live_bytes> in_use_;
};

} // namespace strata::detail
