#pragma once
#include <algorithm>
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
#include <strata/detail/object_pool.hpp>
#include <strata/detail/persistent_rate.hpp>
#include <strata/detail/pointer_map.hpp>
#include <strata/detail/tlsf_lists.hpp>
#include <strata/pages/page_backend.hpp>

namespace strata {

/// A pool over page-mapped memory (CUDA virtual memory management). Two large address ranges are reserved,
/// one for requests up to `small_limit` and one for larger ones (mixing them is what fragments); each is
/// managed as one TLSF pool whose free blocks merge across page boundaries, so a range never fragments into
/// chunks the way cudaMalloc'd chunks do. Physical memory stands only behind pages that live blocks touch:
/// when a block lands on pages with nothing behind them, each run of such pages gets one physical allocation
/// (one create, one map, one access call: the driver charges per call, not per byte), of the run's size or,
/// at the edge of the mapped memory, extended over the free pages after it to `min_mapping` (at most
/// `min_mapping_fraction` of the memory held), and split at `max_mapping`.
/// A mapping whose blocks are all freed stays mapped ("idle": reused in place at no cost). Only the peak
/// counts against the program, so idle memory is given back only when a new mapping would lift the memory
/// held above its high-water mark (and above the live bytes plus `reclaim_slack`, or `reclaim_slack_fraction`
/// of them). Then, first, idle physical allocations elsewhere are *relocated* (`relocate_idle`): mapped a
/// second time where the new block needs memory — a map and an access call each, no new memory and no wait,
/// since reusing freed memory at another address is as safe as reusing it in place. The range such an
/// allocation leaves stays mapped, out of use, until the device is known done with it: after the next device
/// wait the pool makes anyway, or, once such stale ranges reach `stale_address_limit` bytes of address space,
/// after one wait for them all. What relocation cannot cover, the pool gets by waiting once for the device and
/// unmapping and releasing idle mappings, those idle longest first, until the new memory fits under that mark
/// (one host wait for a batch of mappings, never a wait per mapping, and unmapping never races work still
/// using the memory). Without relocate_idle, reclaims that go on at a steady rate (a loop, not growth:
/// `persistent_reclaim_window`) switch relocation on until release(). Blocks are placed where pages are already mapped when one of the first
/// `placement_candidates` free blocks that fit allows.
/// A physical cap (`max_physical`) bounds what the pool holds; past it, idle mappings are reclaimed before
/// out_of_memory. release() reclaims every idle mapping (what empty_cache does) and lowers the high-water
/// mark to what is left. Block headers and page states live in host memory; the memory handed out is never
/// touched.
///
/// Backend: driver_pages (the CUDA driver, device memory) or simulated_pages (a pretend device, for tests
/// and planning). Models: resource, owning, releasable, sized, usage, snapshot, room-reporting; the backend's
/// properties. Any power-of-two alignment up to 1 GiB. Cost: allocate and free O(1) plus a loop over the
/// pages the block touches (one or two for small blocks) and a bounded placement search; a new mapping costs
/// three driver calls, a relocation two per allocation moved (a scan of the idle mappings and a walk of the
/// blocks of the range it leaves), a reclaim one device wait and two driver calls per mapping reclaimed (a
/// scan of the idle mappings). Unsynchronized.
/// Move-only; the address ranges are reserved on first use.
template <page_backend Backend>
class mapped_pool : public forward_properties<mapped_pool<Backend>, Backend>, public sync_names<mapped_pool<Backend>> {
public:
  static constexpr std::size_t max_alignment = std::size_t{1} << 30;
  static constexpr std::size_t reclaims_per_busy_window = 128;  ///< a busy window: one reclaim per this many allocations

  struct options {
    std::size_t max_physical = SIZE_MAX;                ///< never hold more physical memory than this
    std::size_t small_limit = std::size_t{1} << 20;     ///< requests up to this share one address range
    std::size_t address_space = std::size_t{1} << 38;   ///< bytes reserved for each of the two ranges
    std::size_t reclaim_slack = 0;                      ///< held bytes allowed above the live bytes before idle memory goes back (SIZE_MAX: never)...
    double reclaim_slack_fraction = 0.0;                ///< ... or this share of the live bytes, if more
    std::size_t max_mapping = std::size_t{128} << 20;   ///< the largest physical allocation (a multiple of the page)
    std::size_t min_mapping = std::size_t{8} << 20;     ///< a mapping at the edge of mapped memory takes free pages after it up to this...
    double min_mapping_fraction = 1.0 / 256;            ///< ... but no more than this share of the memory held
    int placement_candidates = 16;                      ///< free blocks compared to find one already mapped
    /// After a reclaim that kept the pool at its high-water mark (not one the cap forced), the mark rises by
    /// this share of itself. Every such reclaim is a device-wide wait on the host, which drains the GPU's
    /// queue: a loop that needs one new mapping at its peak every step would wait once per step (measured on
    /// GPT-2 in PyTorch: 7% of its steps/s). With headroom the loop settles after a few reclaims, holding at
    /// most that much more. 0: never raised (the least memory).
    double reclaim_headroom_fraction = 0.0;
    /// At the high-water mark, move idle physical memory to where it is needed before waiting for the device
    /// to give it back: no device waits, for more memory (whole allocations move, so the pool follows the live
    /// set less closely: up to 2.6 points more held/live on the shared traces, less on some; docs/memory.md).
    /// Off: every such growth is a reclaim (one device-wide wait), the least memory.
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
  // The defaults are the best trade found replaying bench/traces (docs/memory.md, bench/mapped_variants):
  // reclaiming only at the high-water mark and mappings of 8-128 MiB make 1.5-3.7x fewer mappings and
  // 1.3-45x fewer unmappings than reclaiming idle memory past 1% with 32 MiB mappings, at the same memory
  // within half a percent but on one trace at one scale. Smaller mappings follow the live set more closely
  // at more calls; larger ones the reverse (256 MiB already holds 1-2% more on bert_train_varlen).

  explicit mapped_pool(Backend backend = Backend{}) : mapped_pool(std::move(backend), options{}) {}
  mapped_pool(Backend backend, options opts) : backend_(std::move(backend)), opts_(opts)
  {
    const std::size_t page = backend_.page_size();
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
    if (opts.persistent_reclaim_window != 0)
      reclaims_ = detail::persistent_rate{opts.persistent_reclaim_window, opts.persistent_reclaim_window / reclaims_per_busy_window, 2};
  }

  mapped_pool(mapped_pool&& other) noexcept : backend_(std::move(other.backend_)), opts_(other.opts_) { take(other); }
  mapped_pool& operator=(mapped_pool&& other) noexcept
  {
    if (this != &other) {
      return_everything();
      backend_ = std::move(other.backend_);
      opts_ = other.opts_;
      take(other);
    }
    return *this;
  }
  mapped_pool(const mapped_pool&) = delete;
  mapped_pool& operator=(const mapped_pool&) = delete;
  ~mapped_pool() { return_everything(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("mapped_pool", alignment, max_alignment);
    if (bytes == 0) return nullptr;
    if (bytes > opts_.address_space / 2) throw_oom(bytes, "larger than the pool's address range");
    const std::size_t size = align_up(bytes, granule);
    band& bd = band_for(size);
    if (stale_safe_ != 0 || stale_bytes_ > opts_.stale_address_limit) [[unlikely]]
      tidy_stale(stale_bytes_ > opts_.stale_address_limit);
    if (bd.size != 0) return allocate_in(bd, bytes, size, effective_alignment(alignment));
    reserve_band(bd, bytes);
    try {
      return allocate_in(bd, bytes, size, effective_alignment(alignment));
    } catch (...) {
      unreserve_band(bd);  // the first request failed: as if it had never come
      throw;
    }
  }

  void deallocate(void* p, std::size_t, std::size_t = default_alignment) noexcept
  {
    if (p == nullptr) return;
    block* b = nullptr;
    if (!used_.take(p, &b)) return;  // not ours: undefined by the rules; checked<> reports it
    band& bd = band_of(b->address);
    in_use_ -= b->size;
    let_go_pages(bd, page_of(bd, b->address), page_of(bd, b->address + b->size - 1));
    free_block(bd, b);
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
    const band& bd = bands_[size <= opts_.small_limit ? 0 : 1];
    if (bd.size == 0) return false;
    const block* b = place(bd, size, align);
    return b != nullptr && unmapped_pages(bd, align_address(b->address, align), size) == 0;
  }

  /// True when p is the start of a block this pool handed out and has not taken back.
  bool owns(const void* p) const noexcept { return used_.contains(p); }

  /// Waits for the device once, then unmaps and releases every idle mapping and every range relocations
  /// left; returns the bytes given back.
  std::size_t release()
  {
    const std::size_t before = physical_;
    if (idle_bytes_ > 0 || !stale_.empty()) reclaim(nullptr, 0, 0, SIZE_MAX, stale_.size());
    tidy_stale(false);
    high_water_ = physical_;  // asked to give memory back: growing to the old peak again is growth
    reclaims_.reset();
    return before - physical_;
  }

  strata::usage usage() const noexcept
  {
    const std::size_t largest = std::max(bands_[0].free.largest(), bands_[1].free.largest());
    return {.reserved = physical_, .in_use = in_use_, .largest_free = std::min(largest, physical_ - in_use_),
            .chunks = mappings_live_, .used_blocks = used_.size(), .free_blocks = bands_[0].free.count() + bands_[1].free.count()};
  }

  /// Each address range up to the end of its page table (the highest page touched, rounded up as the table
  /// doubles), with its blocks (the last free block clipped there).
  strata::snapshot snapshot() const
  {
    strata::snapshot s{.box = "mapped_pool", .segments = {}};
    for (const band& bd : bands_) {
      if (bd.size == 0 || bd.pages.empty()) continue;
      const std::size_t extent = bd.pages.size() * page_size();
      segment_info seg{.address = bd.base, .size = extent, .blocks = {}};
      for (const block* b = bd.first; b != nullptr && b->address < bd.base + extent; b = b->next)
        seg.blocks.push_back({b->address - bd.base, std::min(b->size, bd.base + extent - b->address), b->free, -1});
      s.segments.push_back(std::move(seg));
    }
    return s;
  }

  std::size_t page_size() const noexcept { return backend_.page_size(); }
  /// Physical memory held now, and the most ever held.
  std::size_t physical_bytes() const noexcept { return physical_; }
  std::size_t peak_physical_bytes() const noexcept { return peak_physical_; }
  /// Physical memory mapped behind no live block (reused in place, or reclaimed).
  std::size_t idle_bytes() const noexcept { return idle_bytes_; }
  /// The pages live blocks touch now, and at most: what page-granular memory would hold at the least, the
  /// floor under physical_bytes() whatever the mapping sizes.
  std::size_t live_page_bytes() const noexcept { return live_pages_ * page_size(); }
  std::size_t peak_live_page_bytes() const noexcept { return peak_live_pages_ * page_size(); }
  std::size_t mappings() const noexcept { return mappings_live_; }
  /// Idle physical allocations moved to where new blocks needed memory (instead of waiting to give them back).
  std::uint64_t relocations() const noexcept { return relocations_; }
  /// Whether idle memory is relocated before the pool waits to reclaim it: relocate_idle, or a persistent
  /// reclaim rate seen since the last release() (options::persistent_reclaim_window).
  bool relocating() const noexcept { return opts_.relocate_idle || reclaims_.persistent(); }
  /// Address space left mapped by relocations and not yet unmapped (aliases of memory held: no physical cost).
  std::size_t stale_bytes() const noexcept { return stale_bytes_; }
  /// Driver calls made so far (creates, maps, unmaps, device waits...).
  const page_counters& page_calls() const noexcept { return backend_.counts(); }
  void reset_peak() noexcept
  {
    peak_physical_ = physical_;
    peak_live_pages_ = live_pages_;
  }

  /// One physical allocation behind part of a live block: where it is mapped, its size, the backend's handle.
  struct backing {
    std::uintptr_t address = 0;
    std::size_t bytes = 0;
    typename Backend::page page{};
  };
  /// The physical allocations behind the live block starting at p, in address order (they are contiguous and
  /// cover the block): what sharing the block with another process exports (ipc/). Empty for a pointer that
  /// does not start a live block. O(pages of the block); allocates the result.
  std::vector<backing> backing_of(const void* p) const
  {
    std::vector<backing> out;
    const block* const* found = used_.find(p);
    if (found == nullptr) return out;
    const block& b = **found;
    const band& bd = b.address - bands_[0].base < bands_[0].size ? bands_[0] : bands_[1];
    const std::uintptr_t start = reinterpret_cast<std::uintptr_t>(p);
    const std::size_t first = page_of(bd, start), last = page_of(bd, b.address + b.size - 1);
    std::uint32_t previous = no_mapping;
    for (std::size_t pg = first; pg <= last; ++pg) {
      const std::uint32_t m = bd.pages[pg].mapping;
      if (m == previous) continue;
      previous = m;
      const mapping& mp = mappings_[m];
      out.push_back({address_of(bd, mp.first), bytes_of(mp), mp.page});
    }
    return out;
  }

  Backend& backend() noexcept { return backend_; }
  const Backend& backend() const noexcept { return backend_; }
  const options& settings() const noexcept { return opts_; }

  friend bool operator==(const mapped_pool& a, const mapped_pool& b) noexcept { return &a == &b; }

private:
  static constexpr std::size_t granule = detail::tlsf::granule;
  static constexpr std::uint32_t no_mapping = UINT32_MAX;
  static constexpr std::uint32_t stale_mapping = UINT32_MAX - 1;
  using page_handle = typename Backend::page;

  using block = detail::address_block;

  struct page_state {
    std::uint32_t live = 0;                ///< live blocks touching the page
    std::uint32_t mapping = no_mapping;    ///< the physical allocation behind it (stale_mapping: a range a relocation left)
  };

  /// One physical allocation mapped at pages [first, first + count) of a band.
  struct mapping {
    page_handle page{};
    std::uint32_t band = 0;
    std::size_t first = 0;
    std::size_t count = 0;
    std::size_t busy = 0;  ///< its pages touched by live blocks
    std::size_t aliases = 0;  ///< stale ranges still mapping it elsewhere: it cannot be released before they are unmapped
    bool idle = false;     ///< counted in idle_bytes_
    bool listed = false;   ///< in the idle queue (entries are re-checked when taken)
  };

  /// Where a relocated allocation was mapped before: still mapped (until `unmapped`), its blocks replaced by
  /// one block that is neither free nor live (`holder`), so nothing lands there while it aliases memory in use.
  struct stale_range {
    std::uint32_t band = 0;
    std::size_t first = 0;
    std::size_t count = 0;
    block* holder = nullptr;
    std::uint32_t slot = 0;  ///< the mapping that moved
    bool unmapped = false;
  };

  /// One reserved address range; `pages` grows to the highest page touched.
  struct band {
    std::uintptr_t base = 0;
    std::size_t size = 0;
    block* first = nullptr;
    detail::tlsf_lists<block> free;
    std::vector<page_state> pages;
  };

  [[noreturn]] void throw_oom(std::size_t bytes, const std::string& why) const
  {
    throw out_of_memory("mapped_pool", bytes, why + "; physical " + std::to_string(physical_) + " bytes, in use " +
                                                std::to_string(in_use_) + " bytes");
  }

  band& band_for(std::size_t size) noexcept { return bands_[size <= opts_.small_limit ? 0 : 1]; }
  band& band_of(std::uintptr_t address) noexcept { return address - bands_[0].base < bands_[0].size ? bands_[0] : bands_[1]; }
  std::size_t page_of(const band& bd, std::uintptr_t address) const noexcept { return (address - bd.base) / page_size(); }
  std::uintptr_t address_of(const band& bd, std::size_t page) const noexcept { return bd.base + page * page_size(); }
  std::size_t bytes_of(const mapping& m) const noexcept { return m.count * page_size(); }

  void reserve_band(band& bd, std::size_t bytes)
  {
    block* whole = nodes_.make();
    std::uintptr_t base = 0;
    try {
      base = backend_.reserve(opts_.address_space, max_alignment);
    } catch (const out_of_memory&) {
      nodes_.recycle(whole);
      throw_oom(bytes, "cannot reserve an address range");
    } catch (...) {
      nodes_.recycle(whole);
      throw;
    }
    *whole = block{.address = base, .size = opts_.address_space, .free = true};
    bd.base = base;
    bd.size = opts_.address_space;
    bd.first = whole;
    bd.free.insert(whole);
  }

  void unreserve_band(band& bd) noexcept
  {
    nodes_.recycle(bd.first);
    backend_.unreserve(bd.base, bd.size);
    bd = band{};
  }

  void* allocate_in(band& bd, std::size_t bytes, std::size_t size, std::size_t align)
  {
    block* b = place(bd, size, align);
    if (b == nullptr && !stale_.empty()) {  // address space held by stale ranges: wait, give it back, try again
      tidy_stale(true);
      b = place(bd, size, align);
    }
    if (b == nullptr) throw_oom(bytes, "no free address range of that size left");
    const std::uintptr_t start = align_address(b->address, align);
    block* rest = start > b->address ? nodes_.make() : nullptr;
    block* tail = nullptr;
    try {
      if (start + size < b->address + b->size) tail = nodes_.make();
      used_.insert(reinterpret_cast<void*>(start), rest != nullptr ? rest : b);
      try {
        hold_pages(bd, {page_of(bd, start), page_of(bd, start + size - 1), page_of(bd, b->address), page_of(bd, b->address + b->size - 1)},
                   bytes, in_use_ + size);
      } catch (...) {
        used_.erase(reinterpret_cast<void*>(start));
        throw;
      }
    } catch (...) {
      if (rest != nullptr) nodes_.recycle(rest);
      if (tail != nullptr) nodes_.recycle(tail);
      throw;
    }
    carve(bd, b, start, size, rest, tail);
    in_use_ += size;
    reclaims_.tick();  // allocations served: a failed one leaves the count as it was
    return reinterpret_cast<void*>(start);
  }

  std::size_t unmapped_pages(const band& bd, std::uintptr_t start, std::size_t size) const noexcept
  {
    std::size_t unmapped = 0;
    for (std::size_t p = page_of(bd, start), last = page_of(bd, start + size - 1); p <= last; ++p)
      unmapped += p >= bd.pages.size() || bd.pages[p].mapping == no_mapping;
    return unmapped;
  }

  /// A free block for the request, preferring one whose pages are already mapped (no driver call, no
  /// physical memory added) among the first few that fit.
  block* place(const band& bd, std::size_t size, std::size_t align) const noexcept
  {
    return bd.free.find_cheapest(size + (align - granule), opts_.placement_candidates,
                                 [&](const block* b) { return unmapped_pages(bd, align_address(b->address, align), size); });
  }

  /// Takes [start, start + size) out of free block b (already found to fit) and returns it; the pieces
  /// before and after stay free, `rest` and `tail` the nodes they need. Cannot fail.
  block* carve(band& bd, block* b, std::uintptr_t start, std::size_t size, block* rest, block* tail) noexcept
  {
    bd.free.remove(b);
    return detail::address_range::carve(b, start, size, rest, tail, [&](block* piece) { bd.free.insert(piece); });
  }

  /// Marks b free and merges it with free neighbours: carve's twin.
  void free_block(band& bd, block* b) noexcept
  {
    bd.free.insert(detail::address_range::merge_free(b, [&](block* n) { bd.free.remove(n); }, [this](block* n) { nodes_.recycle(n); }));
  }

  /// The pages a new block touches, [first, last], and the first and last pages of the free block it is cut
  /// from, [from, reach] (the farthest a new mapping may reach ahead; nothing there may move).
  struct page_span {
    std::size_t first;
    std::size_t last;
    std::size_t from;
    std::size_t reach;
  };

  /// Puts physical memory behind the span's pages and counts one more live block on each. `live_after`: the
  /// pool's live bytes once the block is handed out. On failure every page is as it was, except that idle
  /// memory reclaimed to make room stays reclaimed (no live block moves; only `reserved` can be lower).
  void hold_pages(band& bd, page_span span, std::size_t bytes, std::size_t live_after)
  {
    const std::size_t first = span.first, last = span.last;
    if (last >= bd.pages.size()) grow_page_table(bd, last + 1);
    std::size_t unmapped = 0, idle_in_range = 0;
    std::uint32_t previous = no_mapping;
    for (std::size_t p = first; p <= last; ++p) {
      const std::uint32_t m = bd.pages[p].mapping;
      if (m == no_mapping) ++unmapped;
      else if (m != previous && mappings_[m].idle) idle_in_range += bytes_of(mappings_[m]);
      previous = m;
    }
    if (unmapped > 0) {
      std::size_t ahead = pages_ahead(bd, span);
      if (physical_ + (unmapped + ahead) * page_size() > opts_.max_physical) ahead = 0;  // never refuse for pages not asked for
      map_runs(bd, span, last + ahead, (unmapped + ahead) * page_size(), idle_in_range, bytes, live_after);
    }
    for (std::size_t p = first; p <= last; ++p) {
      if (bd.pages[p].live++ != 0) continue;
      peak_live_pages_ = std::max(peak_live_pages_, ++live_pages_);
      mapping& m = mappings_[bd.pages[p].mapping];
      if (m.busy++ == 0 && m.idle) {
        m.idle = false;
        idle_bytes_ -= bytes_of(m);
      }
    }
  }

  /// How many free, unmapped pages after the span to map with its last run, so that the run reaches
  /// min(min_mapping, min_mapping_fraction of the memory held): growing a page at a time costs a driver round
  /// trip per page, and the pages ahead are where the next blocks land. The run stays within max_mapping, so
  /// the pages ahead share a mapping with live pages (never a mapping no block touches, which nothing would
  /// reclaim). May grow the page table (strong guarantee: entries with nothing behind them).
  std::size_t pages_ahead(band& bd, page_span span)
  {
    if (bd.pages[span.last].mapping != no_mapping || span.reach <= span.last) return 0;
    const std::size_t page = page_size();
    const std::size_t max_run = std::max<std::size_t>(1, opts_.max_mapping / page);
    const auto share = static_cast<std::size_t>(opts_.min_mapping_fraction * static_cast<double>(physical_));
    const std::size_t want = std::min({opts_.min_mapping, share, opts_.max_mapping}) / page;
    std::size_t trailing = 0;  // the unmapped run ending at the span's last page, split at max_run from its start
    for (std::size_t p = span.last + 1; p-- > span.first && bd.pages[p].mapping == no_mapping;) ++trailing;
    const std::size_t last_run = (trailing - 1) % max_run + 1;
    if (last_run >= want) return 0;
    const std::size_t extra = std::min(want - last_run, span.reach - span.last);
    if (span.last + extra >= bd.pages.size()) grow_page_table(bd, span.last + extra + 1);
    std::size_t n = 0;
    while (n < extra && bd.pages[span.last + 1 + n].mapping == no_mapping) ++n;
    return n;
  }

  void let_go_pages(band& bd, std::size_t first, std::size_t last) noexcept
  {
    for (std::size_t p = first; p <= last; ++p) {
      if (--bd.pages[p].live != 0) continue;
      --live_pages_;
      const std::uint32_t slot = bd.pages[p].mapping;
      mapping& m = mappings_[slot];
      if (--m.busy != 0) continue;
      m.idle = true;
      idle_bytes_ += bytes_of(m);
      if (!m.listed) list_idle(slot);
    }
  }

  /// Files an idle mapping. Never allocates: the queue's capacity covers every mapping slot, each listed at
  /// most once, and the taken entries at its head are dropped when it is full.
  void list_idle(std::uint32_t slot) noexcept
  {
    if (idle_.size() == idle_.capacity()) {
      idle_.erase(idle_.begin(), idle_.begin() + static_cast<std::ptrdiff_t>(idle_head_));
      idle_head_ = 0;
    }
    mappings_[slot].listed = true;
    idle_.push_back(slot);
  }

  void grow_page_table(band& bd, std::size_t pages)
  {
    bd.pages.resize(std::max(pages, std::min(bd.size / page_size(), bd.pages.size() * 2)));
  }

  /// Room for `more` mapping records, so recording them and later listing or freeing them cannot throw.
  void reserve_mapping_slots(std::size_t more)
  {
    const std::size_t total = mappings_live_ + more;
    if (total <= mappings_.capacity() && total <= idle_.capacity() && total <= free_slots_.capacity()) return;
    const std::size_t want = std::max(total, 2 * mappings_.capacity());
    mappings_.reserve(want);
    idle_.reserve(want);
    free_slots_.reserve(want);
  }

  /// Maps every run of unmapped pages in [span.first, last], one physical allocation per run (split at
  /// max_mapping). First, when the new memory would lift the pool above its budget (the cap, and the
  /// high-water mark unless the live bytes and their slack are above it), idle memory elsewhere is relocated
  /// there, then, for what is still missing, reclaimed to make room. On failure every relocation made here is
  /// undone (what was reclaimed stays reclaimed).
  void map_runs(band& bd, page_span span, std::size_t last, std::size_t needed, std::size_t idle_in_range, std::size_t bytes,
                std::size_t live_after, bool may_relocate = true)
  {
    const std::size_t first = span.first;
    const std::size_t needed_at_first = needed;
    std::size_t idle_elsewhere = idle_bytes_ - idle_in_range;
    const std::size_t budget = std::min(opts_.max_physical, std::max(high_water_, with_slack(live_after)));
    const std::size_t stale_before = stale_.size();
    try {
      if (physical_ + needed > budget && idle_elsewhere > 0 && relocating() && may_relocate) {
        const relocated moved = relocate(bd, first, last, span);
        needed -= moved.covered;
        idle_elsewhere -= moved.bytes;
        // A relocated allocation longer than what it covers holds its spare pages where they may not help:
        // where that leaves the request over the cap, reclaiming alone may still fit it.
        if (physical_ + needed > opts_.max_physical && physical_ + needed - opts_.max_physical > idle_elsewhere &&
            stale_.size() > stale_before) {
          undo_relocations(stale_before);
          if (stale_.size() == stale_before)
            return map_runs(bd, span, last, needed_at_first, idle_in_range, bytes, live_after, false);
        }
      }
      if (physical_ + needed > budget && idle_elsewhere > 0) {
        // Reclaiming under the cap only keeps memory low: if it fails (its device wait, say, under capture or
        // on a sticky error), the allocation still fits, so it goes on and the idle memory stays for a later
        // reclaim. Only a reclaim that the cap needs makes the allocation fail.
        const bool for_cap = physical_ + needed > opts_.max_physical;
        try {
          reclaim(&bd, first, last, physical_ + needed - budget, stale_before);
        } catch (...) {
          if (for_cap) throw;
        }
        if (!for_cap) {
          raise_high_water_after_reclaim();
          reclaims_.note();
        }
      }
      if (physical_ + needed > opts_.max_physical)
        throw_oom(bytes, "the physical cap of " + std::to_string(opts_.max_physical) + " bytes is reached");
      if (needed > 0) map_unmapped(bd, first, last, needed);
    } catch (...) {
      undo_relocations(stale_before);
      throw;
    }
  }

  /// One physical allocation per run of unmapped pages in [first, last] (`needed` bytes in all); all or none.
  void map_unmapped(band& bd, std::size_t first, std::size_t last, std::size_t needed)
  {
    const std::size_t max_run = std::max<std::size_t>(1, opts_.max_mapping / page_size());
    reserve_mapping_slots(needed / page_size());
    std::vector<std::uint32_t> made;
    made.reserve(needed / page_size());
    try {
      for (std::size_t p = first; p <= last;) {
        if (bd.pages[p].mapping != no_mapping) {
          ++p;
          continue;
        }
        std::size_t run = 0;
        while (p + run <= last && run < max_run && bd.pages[p + run].mapping == no_mapping) ++run;
        made.push_back(map_one(bd, p, run));
        p += run;
      }
    } catch (...) {
      for (std::uint32_t slot : made) drop_mapping(slot);
      throw;
    }
  }

  struct relocated {
    std::size_t covered = 0;  ///< bytes of [first, last] now mapped
    std::size_t bytes = 0;    ///< bytes of the allocations moved (more where one reaches past last)
  };

  /// Covers the runs of unmapped pages in [first, last] with idle allocations from elsewhere, each mapped
  /// again at the run (reaching past `last` over free unmapped pages where it is longer than the rest of the
  /// run). Stops at the first run part no idle allocation fits.
  relocated relocate(band& bd, std::size_t first, std::size_t last, page_span keep)
  {
    relocated done;
    const std::size_t page = page_size();
    const std::size_t band_pages = bd.size / page;
    const std::size_t max_run = std::max<std::size_t>(1, opts_.max_mapping / page);
    for (std::size_t p = first; p <= last;) {
      if (bd.pages[p].mapping != no_mapping) {
        ++p;
        continue;
      }
      std::size_t run = 0;
      while (p + run <= last && bd.pages[p + run].mapping == no_mapping) ++run;
      std::size_t room = run;  // past `last`, unmapped pages are free address space
      if (p + run > last)
        while (room < max_run && p + room < band_pages && (p + room >= bd.pages.size() || bd.pages[p + room].mapping == no_mapping)) ++room;
      while (run > 0) {
        const std::uint32_t slot = idle_to_move(bd, run, room, keep);
        if (slot == no_mapping) break;
        const std::size_t count = mappings_[slot].count;
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

  /// The idle allocation to map at a run of `run` unmapped pages with `room` pages free from its start: the
  /// largest that fits in the run, else the smallest that covers it; never one in [keep.from,
  /// keep.reach] of `bd` (the free block being carved, whose nodes must not change). no_mapping: none fits.
  std::uint32_t idle_to_move(const band& bd, std::size_t run, std::size_t room, page_span keep) const noexcept
  {
    std::uint32_t best = no_mapping;
    std::size_t best_cost = SIZE_MAX;
    for (std::size_t i = idle_head_; i < idle_.size(); ++i) {
      const std::uint32_t slot = idle_[i];
      const mapping& m = mappings_[slot];
      if (!m.idle || m.count > room) continue;
      if (&bands_[m.band] == &bd && m.first <= keep.reach && m.first + m.count > keep.from) continue;
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
  void move_mapping(std::uint32_t slot, band& to, std::size_t at)
  {
    mapping& m = mappings_[slot];
    band& from = bands_[m.band];
    const std::size_t bytes = bytes_of(m);
    const std::uintptr_t old_address = address_of(from, m.first), new_address = address_of(to, at);
    block* holder = detail::address_range::block_over(from.first, old_address);  // free: no live block touches idle pages
    block* rest = holder->address < old_address ? nodes_.make() : nullptr;
    block* tail = nullptr;
    try {
      if (old_address + bytes < holder->address + holder->size) tail = nodes_.make();
      stale_.reserve(stale_.size() + 1);
      if (at + m.count > to.pages.size()) grow_page_table(to, at + m.count);
      backend_.map(new_address, m.page, bytes);
      try {
        backend_.set_access(new_address, bytes);
      } catch (...) {
        try {
          backend_.unmap(new_address, bytes);
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
    holder = carve(from, holder, old_address, bytes, rest, tail);  // the holder: neither free nor live
    for (std::size_t p = m.first; p < m.first + m.count; ++p) from.pages[p].mapping = stale_mapping;
    stale_.push_back({.band = m.band, .first = m.first, .count = m.count, .holder = holder, .slot = slot});
    stale_bytes_ += bytes;
    ++m.aliases;
    m.band = static_cast<std::uint32_t>(&to - bands_);
    m.first = at;
    for (std::size_t p = at; p < at + m.count; ++p) to.pages[p].mapping = slot;
    ++relocations_;
  }

  /// Moves the relocations made since `stale_.size()` was `keep` back where they were (their new ranges were
  /// never used), newest first; one whose alias the driver keeps stays moved (a valid state).
  void undo_relocations(std::size_t keep) noexcept
  {
    while (stale_.size() > keep) {
      const stale_range g = stale_.back();
      mapping& m = mappings_[g.slot];
      band& now = bands_[m.band];
      try {
        backend_.unmap(address_of(now, m.first), bytes_of(m));
      } catch (...) {
        break;
      }
      for (std::size_t p = m.first; p < m.first + m.count; ++p) now.pages[p].mapping = no_mapping;
      band& back = bands_[g.band];
      m.band = g.band;
      m.first = g.first;
      --m.aliases;
      for (std::size_t p = g.first; p < g.first + g.count; ++p) back.pages[p].mapping = g.slot;
      stale_bytes_ -= bytes_of(m);
      free_block(back, g.holder);
      stale_.pop_back();
      --relocations_;
    }
    stale_safe_ = std::min(stale_safe_, stale_.size());
  }

  /// Gives back stale ranges the device is known done with (after a wait for them all first when `wait`, or
  /// when stale_safe_ says a wait already covered them). Only between calls' block surgery: freeing a holder
  /// merges its neighbours. A failed wait or unmap leaves the rest for later.
  void tidy_stale(bool wait) noexcept
  {
    if (wait && stale_safe_ < stale_.size()) {
      try {
        backend_.synchronize();
        stale_safe_ = stale_.size();
      } catch (...) {
        // Under capture, or a broken device: the ranges stay until a later wait.
      }
    }
    unmap_safe_stale(stale_safe_);
    std::size_t gone = 0;
    while (gone < stale_.size() && stale_[gone].unmapped) {
      const stale_range& g = stale_[gone];
      band& bd = bands_[g.band];
      for (std::size_t p = g.first; p < g.first + g.count; ++p) bd.pages[p].mapping = no_mapping;
      free_block(bd, g.holder);
      ++gone;
    }
    stale_.erase(stale_.begin(), stale_.begin() + static_cast<std::ptrdiff_t>(gone));
    stale_safe_ -= gone;
  }

  /// Unmaps the first `limit` stale ranges (a device wait since they were made), so their allocations can be
  /// released; their holders stay until tidy_stale. Stops at a failed unmap.
  void unmap_safe_stale(std::size_t limit) noexcept
  {
    for (std::size_t i = 0; i < std::min(limit, stale_safe_); ++i)
      if (!stale_[i].unmapped && !unmap_stale(stale_[i])) return;
  }

  /// Unmaps one stale range (its allocation then has one alias fewer); false when the driver refuses.
  bool unmap_stale(stale_range& g) noexcept
  {
    try {
      backend_.unmap(address_of(bands_[g.band], g.first), g.count * page_size());
    } catch (...) {
      return false;
    }
    g.unmapped = true;
    --mappings_[g.slot].aliases;
    stale_bytes_ -= g.count * page_size();
    return true;
  }

  void raise_high_water_after_reclaim() noexcept
  {
    const double more = opts_.reclaim_headroom_fraction * static_cast<double>(high_water_);
    const std::size_t step = more >= 1.8e19 ? SIZE_MAX : static_cast<std::size_t>(more);
    high_water_ = std::min(opts_.max_physical, high_water_ > SIZE_MAX - step ? SIZE_MAX : high_water_ + step);
  }

  std::size_t with_slack(std::size_t live) const noexcept
  {
    const double share = opts_.reclaim_slack_fraction * static_cast<double>(live);
    const std::size_t slack = std::max(opts_.reclaim_slack, share >= 1.8e19 ? SIZE_MAX : static_cast<std::size_t>(share));
    return live > SIZE_MAX - slack ? SIZE_MAX : live + slack;
  }

  /// One physical allocation behind pages [first, first + count): create, map, set access; all or nothing.
  std::uint32_t map_one(band& bd, std::size_t first, std::size_t count)
  {
    const std::size_t bytes = count * page_size();
    const std::uintptr_t address = address_of(bd, first);
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
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(mappings_.size());
      mappings_.emplace_back();  // capacity reserved
    }
    mappings_[slot] = mapping{.page = page, .band = static_cast<std::uint32_t>(&bd - bands_), .first = first, .count = count};
    for (std::size_t p = first; p < first + count; ++p) bd.pages[p].mapping = slot;
    ++mappings_live_;
    physical_ += bytes;
    peak_physical_ = std::max(peak_physical_, physical_);
    high_water_ = std::max(high_water_, physical_);
    return slot;
  }

  /// Unmaps and releases a mapping no live block touches.
  void drop_mapping(std::uint32_t slot) noexcept
  {
    mapping& m = mappings_[slot];
    try {
      backend_.unmap(address_of(bands_[m.band], m.first), bytes_of(m));
    } catch (...) {
      // The driver kept it: it becomes an idle mapping (no live block touches it), retried by a later reclaim.
      if (!m.idle) {
        m.idle = true;
        idle_bytes_ += bytes_of(m);
      }
      if (!m.listed) list_idle(slot);
      return;
    }
    if (m.idle) idle_bytes_ -= bytes_of(m);
    release_unmapped(slot);
  }

  /// One device wait, then idle mappings, those idle longest first, are unmapped and released until `want`
  /// bytes are gone; mappings touching [first, last] of `keep` (the request being served) stay, as do those
  /// still aliased by a stale range. The wait covers every stale range: the first `stale_limit` are unmapped
  /// now (those made by the call under way may yet be undone).
  void reclaim(const band* keep, std::size_t first, std::size_t last, std::size_t want, std::size_t stale_limit)
  {
    std::vector<std::uint32_t> kept;
    kept.reserve(mappings_live_);
    backend_.synchronize();
    stale_safe_ = stale_.size();
    unmap_safe_stale(stale_limit);
    std::size_t done = 0;
    try {
      while (idle_head_ < idle_.size() && done < want) {
        const std::uint32_t slot = idle_[idle_head_];
        mapping& m = mappings_[slot];
        if (!m.idle) {
          m.listed = false;  // stale: reused since it went idle
        } else if ((keep != nullptr && &bands_[m.band] == keep && m.first <= last && m.first + m.count > first) || m.aliases != 0) {
          kept.push_back(slot);
        } else {
          const band& bd = bands_[m.band];
          backend_.unmap(address_of(bd, m.first), bytes_of(m));  // throws before anything changed
          m.listed = false;
          m.idle = false;
          idle_bytes_ -= bytes_of(m);
          done += bytes_of(m);
          release_unmapped(slot);
        }
        ++idle_head_;
      }
    } catch (...) {
      requeue(kept);
      throw;
    }
    requeue(kept);
    if (idle_head_ == idle_.size()) {
      idle_.clear();
      idle_head_ = 0;
    }
  }

  /// The second half of dropping a mapping, once it is unmapped.
  void release_unmapped(std::uint32_t slot) noexcept
  {
    mapping& m = mappings_[slot];
    band& bd = bands_[m.band];
    backend_.destroy(m.page);
    for (std::size_t p = m.first; p < m.first + m.count; ++p) bd.pages[p].mapping = no_mapping;
    physical_ -= bytes_of(m);
    --mappings_live_;
    m = mapping{};
    free_slots_.push_back(slot);  // capacity reserved for every slot
  }

  void requeue(const std::vector<std::uint32_t>& slots) noexcept
  {
    for (std::uint32_t slot : slots) list_idle(slot);
  }

  void return_everything() noexcept
  {
    if (mappings_live_ > 0) {
      try {
        backend_.synchronize();  // work submitted before the pool goes may still use its memory
      } catch (...) {
        // The runtime may be gone at exit, or the device broken: nothing more can be done than unmapping.
      }
    }
    for (stale_range& g : stale_)
      if (!g.unmapped) (void)unmap_stale(g);  // a refusal: as below, the process's mappings go with it
    for (std::uint32_t slot = 0; slot < mappings_.size(); ++slot) {
      mapping& m = mappings_[slot];
      if (m.count == 0) continue;
      try {
        backend_.unmap(address_of(bands_[m.band], m.first), bytes_of(m));
      } catch (...) {
        // The driver may be gone at exit; the process's mappings go with it.
      }
      backend_.destroy(m.page);
    }
    for (band& bd : bands_) {
      detail::address_range::recycle_all(bd.first, [this](block* b) { nodes_.recycle(b); });
      if (bd.size != 0) backend_.unreserve(bd.base, bd.size);
      bd = band{};
    }
    mappings_.clear();
    free_slots_.clear();
    idle_.clear();
    idle_head_ = 0;
    stale_.clear();
    stale_safe_ = stale_bytes_ = 0;
    used_.clear();
    physical_ = idle_bytes_ = in_use_ = mappings_live_ = high_water_ = live_pages_ = 0;
  }

  void take(mapped_pool& other) noexcept
  {
    for (int i = 0; i < 2; ++i) bands_[i] = std::exchange(other.bands_[i], band{});
    nodes_ = std::move(other.nodes_);
    used_ = std::move(other.used_);
    other.used_ = detail::pointer_map<block*>{};
    mappings_ = std::exchange(other.mappings_, {});
    free_slots_ = std::exchange(other.free_slots_, {});
    idle_ = std::exchange(other.idle_, {});
    idle_head_ = std::exchange(other.idle_head_, 0);
    stale_ = std::exchange(other.stale_, {});
    stale_safe_ = std::exchange(other.stale_safe_, 0);
    stale_bytes_ = std::exchange(other.stale_bytes_, 0);
    relocations_ = std::exchange(other.relocations_, 0);
    reclaims_ = other.reclaims_;
    other.reclaims_.reset();
    physical_ = std::exchange(other.physical_, 0);
    peak_physical_ = std::exchange(other.peak_physical_, 0);
    high_water_ = std::exchange(other.high_water_, 0);
    live_pages_ = std::exchange(other.live_pages_, 0);
    peak_live_pages_ = std::exchange(other.peak_live_pages_, 0);
    idle_bytes_ = std::exchange(other.idle_bytes_, 0);
    in_use_ = std::exchange(other.in_use_, 0);
    mappings_live_ = std::exchange(other.mappings_live_, 0);
  }

  [[no_unique_address]] Backend backend_;
  options opts_;
  band bands_[2];
  detail::object_pool<block> nodes_;
  detail::pointer_map<block*> used_;
  std::vector<mapping> mappings_;           ///< slots, recycled through free_slots_
  std::vector<std::uint32_t> free_slots_;
  std::vector<std::uint32_t> idle_;         ///< idle mappings, oldest first from idle_head_
  std::size_t idle_head_ = 0;
  std::vector<stale_range> stale_;          ///< oldest first
  std::size_t stale_safe_ = 0;              ///< how many of the oldest stale ranges a device wait has covered
  std::size_t stale_bytes_ = 0;             ///< address space of stale ranges still mapped
  std::uint64_t relocations_ = 0;
  detail::persistent_rate reclaims_{};      ///< reclaims under the high-water mark, per window of allocations
  std::size_t physical_ = 0;
  std::size_t peak_physical_ = 0;
  std::size_t high_water_ = 0;              ///< the most held since the last release(): reclaiming below it gains nothing
  std::size_t idle_bytes_ = 0;
  std::size_t live_pages_ = 0;              ///< pages some live block touches
  std::size_t peak_live_pages_ = 0;
  std::size_t in_use_ = 0;
  std::size_t mappings_live_ = 0;
};

namespace detail::mapped_pool_claims {
using P = mapped_pool<archetype_pages>;
static_assert(page_backend<archetype_pages>);
static_assert(resource<P> && owning_resource<P> && releasable_resource<P> && sized_resource<P> && usage_reporting_resource<P>);
static_assert(snapshot_resource<P> && room_reporting_resource<P> && !stream_resource<P>);
static_assert(cccl::synchronous_resource_with<P, device_accessible> && !has_property<P, host_accessible>);  // the backend's
static_assert(!std::is_copy_constructible_v<P> && std::is_nothrow_move_constructible_v<P> && std::is_nothrow_move_assignable_v<P>);
} // namespace detail::mapped_pool_claims

} // namespace strata
