#pragma once
#include <concepts>
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
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
#include <strata/detail/pointer_map.hpp>

namespace strata {

/// Binary buddy allocation: power-of-two blocks (smallest 256 B by default) inside regions taken from the
/// upstream (1 GiB by default; more regions on demand; smaller when the upstream has less). The buddy of the
/// block with index k at order o is k ^ 1 — an XOR of its offset — and a freed block merges with its free
/// buddy at once, level by level. Blocks are naturally aligned to their size inside the region (regions are
/// asked for as much alignment as the upstream gives, up to their size). Free and split state are bitmaps
/// per order in host memory; each order also has a list of candidate free blocks, checked against the bitmap
/// when popped. A request rounds up to a power of two: fast and simple, but up to half a block is wasted
/// (coalescing_pool wastes at most 256 bytes).
/// After any exception (the upstream's out of memory, or std::bad_alloc in the host bookkeeping) the pool is as
/// it was: host memory is reserved before a block is split, and a region added for a request that then
/// fails goes back. A request above 2^56 bytes can never be served: out_of_memory (good_size: SIZE_MAX).
/// Models: resource, owning, releasable, sized, usage, snapshot; the upstream's properties.
/// Cost: O(log(region / min_block)) allocate and free, no lock; an upstream call only to add or release a
/// region. Unsynchronized. Move-only.
template <resource Upstream>
class buddy_pool : public forward_properties<buddy_pool<Upstream>, Upstream>, public sync_names<buddy_pool<Upstream>> {
public:
  struct options {
    std::size_t min_block = 256;
    std::size_t region_size = std::size_t{1} << 30;
  };

  buddy_pool() requires std::default_initializable<Upstream> : buddy_pool(Upstream{}, options{}) {}
  explicit buddy_pool(Upstream upstream) : buddy_pool(std::move(upstream), options{}) {}
  buddy_pool(Upstream upstream, options opts) : upstream_(std::move(upstream)), opts_(opts)
  {
    if (!std::has_single_bit(opts.min_block) || opts.min_block < default_alignment || !std::has_single_bit(opts.region_size) ||
        opts.region_size < opts.min_block)
      throw std::invalid_argument("buddy_pool: min_block (>= 256) and region_size (>= min_block) must be powers of two");
    min_shift_ = static_cast<unsigned>(std::countr_zero(opts.min_block));
  }

  buddy_pool(buddy_pool&& other) noexcept : upstream_(std::move(other.upstream_)) { take(other); }
  buddy_pool& operator=(buddy_pool&& other) noexcept
  {
    if (this != &other) {
      return_everything();
      upstream_ = std::move(other.upstream_);
      take(other);
    }
    return *this;
  }
  buddy_pool(const buddy_pool&) = delete;
  buddy_pool& operator=(const buddy_pool&) = delete;
  ~buddy_pool() { return_everything(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("buddy_pool", alignment, opts_.region_size);
    if (bytes == 0) return nullptr;
    const std::size_t align = effective_alignment(alignment);
    const unsigned order = order_for(bytes, align);
    if (order == unservable) throw_oom(bytes);
    std::uintptr_t block = take_block(order);
    std::uintptr_t added = 0;  // a region added for this request goes back if the request fails
    if (block == 0) {
      added = add_region(order, bytes);
      block = take_block_or_return(order, added);
    }
    void* p = reinterpret_cast<void*>(block);
    // Above the regions' alignment the block was sized to hold an aligned start inside.
    if (align > region_alignment()) p = reinterpret_cast<void*>(align_address(block, align));
    if (p != reinterpret_cast<void*>(block)) {
      try {
        interior_.insert(p, block);
      } catch (...) {
        free_block(block, order);
        if (added != 0) return_region(regions_.find(added));
        throw;
      }
    }
    in_use_ += block_size(order);
    ++used_blocks_;
    return p;
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    const std::size_t align = effective_alignment(alignment);
    const unsigned order = order_for(bytes, align);
    auto block = reinterpret_cast<std::uintptr_t>(p);
    if (align > region_alignment()) {
      if (const std::uintptr_t* start = interior_.find(p)) {
        block = *start;
        interior_.erase(p);
      }
    }
    in_use_ -= block_size(order);
    --used_blocks_;
    free_block(block, order);
  }

  /// The block a request takes: the next power of two (at least min_block and the alignment).
  /// SIZE_MAX when no block can ever hold the request.
  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const noexcept
  {
    if (bytes == 0) return 0;
    const unsigned order = order_for(bytes, effective_alignment(alignment));
    return order == unservable ? SIZE_MAX : block_size(order);
  }

  bool owns(const void* p) const noexcept { return region_of(reinterpret_cast<std::uintptr_t>(p)) != nullptr; }

  /// Returns every wholly free region to the upstream; returns how many bytes went back.
  std::size_t release()
  {
    std::size_t returned = 0;
    for (auto it = regions_.begin(); it != regions_.end();) {
      if (!it->second.is_free(it->second.top, 0)) {
        ++it;
        continue;
      }
      returned += it->second.size;
      it = return_region(it);
    }
    return returned;
  }

  strata::usage usage() const noexcept
  {
    strata::usage u{.reserved = reserved_, .in_use = in_use_, .chunks = regions_.size(), .used_blocks = used_blocks_};
    for (unsigned o = 0; o < max_orders; ++o) {
      u.free_blocks += free_per_order_[o];
      if (free_per_order_[o] != 0) u.largest_free = block_size(o);
    }
    return u;
  }

  strata::snapshot snapshot() const
  {
    strata::snapshot s{.box = "buddy_pool", .segments = {}};
    for (const auto& [base, r] : regions_) {
      segment_info seg{.address = base, .size = r.size, .blocks = {}, .mapped = {}};
      describe(r, r.top, 0, seg.blocks);
      s.segments.push_back(std::move(seg));
    }
    return s;
  }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }

  friend bool operator==(const buddy_pool& a, const buddy_pool& b) noexcept { return &a == &b; }

private:
  static constexpr unsigned max_orders = 64;
  static constexpr std::size_t largest_block = std::size_t{1} << 56;  // so no order arithmetic can overflow
  static constexpr unsigned unservable = ~0u;

  /// One region: bitmaps per order (bit k: block k at that order is free / is split into two halves).
  struct region {
    std::size_t size = 0;
    std::size_t alignment = 0;
    unsigned top = 0;  // the order of the whole region
    std::vector<std::vector<std::uint64_t>> free_bits, split_bits;

    static bool get(const std::vector<std::uint64_t>& bits, std::size_t k) noexcept { return (bits[k >> 6] >> (k & 63)) & 1; }
    static void put(std::vector<std::uint64_t>& bits, std::size_t k, bool v) noexcept
    {
      if (v) bits[k >> 6] |= std::uint64_t{1} << (k & 63);
      else bits[k >> 6] &= ~(std::uint64_t{1} << (k & 63));
    }
    bool is_free(unsigned o, std::size_t k) const noexcept { return get(free_bits[o], k); }
    void set_free(unsigned o, std::size_t k, bool v) noexcept { put(free_bits[o], k, v); }
    bool is_split(unsigned o, std::size_t k) const noexcept { return get(split_bits[o], k); }
    void set_split(unsigned o, std::size_t k, bool v) noexcept { put(split_bits[o], k, v); }
  };

  [[noreturn]] void throw_oom(std::size_t bytes) const { throw out_of_memory("buddy_pool", bytes, figures(reserved_, in_use_)); }

  std::size_t block_size(unsigned order) const noexcept { return std::size_t{1} << (order + min_shift_); }

  /// Regions are asked for min(size, what the upstream can align): a block is then aligned to its own size
  /// up to this, with no padding.
  static constexpr std::size_t region_alignment() noexcept { return max_alignment_of<Upstream>; }

  /// The order of the block for a request, or `unservable` above largest_block; above the regions' alignment
  /// the block has room to align inside. Computed without overflow for any bytes and alignment.
  unsigned order_for(std::size_t bytes, std::size_t align) const noexcept
  {
    if (bytes > largest_block || align > largest_block) return unservable;
    std::size_t need = std::max({bytes, opts_.min_block, align});
    if (align > region_alignment()) need = std::max(bytes, opts_.min_block) + (align - region_alignment());
    if (need > largest_block) return unservable;
    return static_cast<unsigned>(std::bit_width(std::bit_ceil(need) - 1)) - min_shift_;
  }

  /// The region holding address a and its base, in one map lookup; {0, nullptr} when none does.
  std::pair<std::uintptr_t, const region*> find_region(std::uintptr_t a) const noexcept
  {
    auto it = regions_.upper_bound(a);
    if (it == regions_.begin()) return {0, nullptr};
    --it;
    return a < it->first + it->second.size ? std::pair{it->first, &it->second} : std::pair<std::uintptr_t, const region*>{0, nullptr};
  }
  const region* region_of(std::uintptr_t a) const noexcept { return find_region(a).second; }
  std::pair<std::uintptr_t, region*> find_region(std::uintptr_t a) noexcept
  {
    const auto [base, r] = std::as_const(*this).find_region(a);
    return {base, const_cast<region*>(r)};
  }

  void mark_free(region& r, std::uintptr_t base, unsigned o, std::uintptr_t block)
  {
    r.set_free(o, (block - base) >> (o + min_shift_), true);
    ++free_per_order_[o];
    candidates_[o].push_back(block);  // last: if it throws, the bitmap and the count already say free
  }

  /// Pops a free block of exactly `order`, splitting a larger one if needed; 0 if there is none.
  /// Strong guarantee: the candidate lists of the orders a split files halves in get their room first.
  std::uintptr_t take_block(unsigned order)
  {
    for (unsigned o = order; o < max_orders; ++o) {
      if (free_per_order_[o] == 0) continue;
      for (unsigned s = order; s < o; ++s) candidates_[s].reserve(candidates_[s].size() + 1);
      auto [block, base, r] = pop_free(o);
      if (block == 0) {
        // Free blocks the list lost (host out of memory in a free): find them again from the bitmaps.
        rebuild_candidates(o);
        std::tie(block, base, r) = pop_free(o);
      }
      if (block == 0) continue;
      // Split down: keep the lower half, file the upper half as free at each order on the way.
      for (unsigned s = o; s > order; --s) {
        r->set_split(s, (block - base) >> (s + min_shift_), true);
        mark_free(*r, base, s - 1, block + block_size(s - 1));
      }
      return block;
    }
    return 0;
  }

  /// Pops the next candidate of order o that really is free and marks it used; {0, 0, nullptr} if none is.
  std::tuple<std::uintptr_t, std::uintptr_t, region*> pop_free(unsigned o) noexcept
  {
    auto& list = candidates_[o];
    while (!list.empty()) {
      const std::uintptr_t block = list.back();
      list.pop_back();
      const auto [base, r] = find_region(block);
      if (r == nullptr || o > r->top) continue;
      const std::size_t k = (block - base) >> (o + min_shift_);
      if (((block - base) & (block_size(o) - 1)) != 0 || !r->is_free(o, k)) continue;  // stale candidate
      r->set_free(o, k, false);
      --free_per_order_[o];
      return {block, base, r};
    }
    return {0, 0, nullptr};
  }

  void free_block(std::uintptr_t block, unsigned o) noexcept
  {
    const auto [base, r] = find_region(block);
    if (r == nullptr) return;  // not ours: undefined by the rules; checked<> reports it
    std::size_t k = (block - base) >> (o + min_shift_);
    while (o < r->top && r->is_free(o, k ^ 1)) {
      r->set_free(o, k ^ 1, false);
      --free_per_order_[o];
      // The buddy's candidate entry goes stale; it is usually the latest one (split then freed), so drop it.
      auto& list = candidates_[o];
      if (!list.empty() && list.back() == base + ((k ^ 1) << (o + min_shift_))) list.pop_back();
      k >>= 1;
      ++o;
      r->set_split(o, k, false);
    }
    try {
      mark_free(*r, base, o, base + (k << (o + min_shift_)));
    } catch (...) {
      // Out of host memory for the candidate list: the bitmap and the count already say free, and
      // take_block finds the block again from the bitmaps.
    }
    compact_if_stale(o);
  }

  /// Candidate lists keep stale entries after merges; rebuild one from the bitmaps when stale ones dominate.
  void compact_if_stale(unsigned o) noexcept
  {
    auto& list = candidates_[o];
    // Rebuilding scans every bitmap word of the order: only when the stale entries outnumber those words.
    if (list.size() < 64 + 4 * free_per_order_[o] + bitmap_words_[o]) return;
    rebuild_candidates(o);  // never grows the list: it holds more entries than there are free blocks
  }

  void rebuild_candidates(unsigned o)
  {
    auto& list = candidates_[o];
    list.clear();
    for (const auto& [base, r] : regions_) {
      if (o > r.top) continue;
      const auto& bits = r.free_bits[o];
      for (std::size_t w = 0; w < bits.size(); ++w)
        for (std::uint64_t word = bits[w]; word != 0; word &= word - 1)
          list.push_back(base + ((w * 64 + std::countr_zero(word)) << (o + min_shift_)));
    }
  }

  /// take_block on a region just added for this request: if it throws, the region goes back first.
  std::uintptr_t take_block_or_return(unsigned order, std::uintptr_t added)
  {
    try {
      return take_block(order);
    } catch (...) {
      return_region(regions_.find(added));
      throw;
    }
  }

  /// Gives a wholly free region back to the upstream; its candidate entry goes stale and is skipped.
  auto return_region(typename std::map<std::uintptr_t, region>::iterator it) noexcept
  {
    region& r = it->second;
    r.set_free(r.top, 0, false);
    --free_per_order_[r.top];
    for (unsigned o = 0; o <= r.top; ++o) bitmap_words_[o] -= r.free_bits[o].size();
    reserved_ -= r.size;
    upstream_.deallocate(reinterpret_cast<void*>(it->first), r.size, r.alignment);
    return regions_.erase(it);
  }

  /// Adds a region big enough for `order` (smaller than region_size when the upstream has less); returns its
  /// base. Strong guarantee: the region goes back to the upstream if it cannot be recorded.
  std::uintptr_t add_region(unsigned order, std::size_t bytes)
  {
    std::size_t size = std::max(opts_.region_size, block_size(order));
    void* p = nullptr;
    std::size_t alignment = 0;
    for (;;) {
      alignment = std::min(size, max_alignment_of<Upstream>);
      try {
        p = upstream_.allocate(size, alignment);
        break;
      } catch (const out_of_memory&) {
        if (size / 2 < block_size(order)) throw_oom(bytes);  // a region can be smaller, not too small
        size /= 2;
      }
    }
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    try {
      region r;
      r.size = size;
      r.alignment = alignment;
      r.top = static_cast<unsigned>(std::countr_zero(size)) - min_shift_;
      r.free_bits.resize(r.top + 1);
      r.split_bits.resize(r.top + 1);
      for (unsigned o = 0; o <= r.top; ++o) {
        const std::size_t blocks = std::size_t{1} << (r.top - o);
        r.free_bits[o].assign((blocks + 63) / 64, 0);
        r.split_bits[o].assign((blocks + 63) / 64, 0);
      }
      candidates_[r.top].reserve(candidates_[r.top].size() + 1);  // so mark_free below cannot throw
      region& placed = regions_.emplace(base, std::move(r)).first->second;
      for (unsigned o = 0; o <= placed.top; ++o) bitmap_words_[o] += placed.free_bits[o].size();
      reserved_ += size;
      mark_free(placed, base, placed.top, base);
    } catch (...) {
      upstream_.deallocate(p, size, alignment);
      throw;
    }
    return base;
  }

  void describe(const region& r, unsigned o, std::size_t k, std::vector<block_info>& out) const
  {
    const std::size_t offset = k << (o + min_shift_);
    if (r.is_free(o, k)) out.push_back({offset, block_size(o), true, -1});
    else if (o > 0 && r.is_split(o, k)) {
      describe(r, o - 1, 2 * k, out);
      describe(r, o - 1, 2 * k + 1, out);
    } else out.push_back({offset, block_size(o), false, -1});
  }

  void return_everything() noexcept
  {
    for (const auto& [base, r] : regions_) upstream_.deallocate(reinterpret_cast<void*>(base), r.size, r.alignment);
    regions_.clear();
    for (auto& list : candidates_) list.clear();
    free_per_order_.fill(0);
    bitmap_words_.fill(0);
    interior_.clear();
    reserved_ = in_use_ = used_blocks_ = 0;
  }

  void take(buddy_pool& other) noexcept
  {
    opts_ = other.opts_;
    min_shift_ = other.min_shift_;
    regions_ = std::move(other.regions_);
    candidates_ = std::move(other.candidates_);
    free_per_order_ = std::exchange(other.free_per_order_, {});
    bitmap_words_ = std::exchange(other.bitmap_words_, {});
    interior_ = std::move(other.interior_);
    reserved_ = std::exchange(other.reserved_, 0);
    in_use_ = std::exchange(other.in_use_, 0);
    used_blocks_ = std::exchange(other.used_blocks_, 0);
    other.regions_.clear();
    for (auto& list : other.candidates_) list.clear();
  }

  [[no_unique_address]] Upstream upstream_;
  options opts_;
  unsigned min_shift_ = 8;
  std::map<std::uintptr_t, region> regions_;
  std::array<std::vector<std::uintptr_t>, max_orders> candidates_{};
  std::array<std::size_t, max_orders> free_per_order_{};
  std::array<std::size_t, max_orders> bitmap_words_{};  // bitmap words across regions, per order
  detail::pointer_map<std::uintptr_t> interior_;  // aligned start -> block start, for over-aligned requests
  std::size_t reserved_ = 0;
  std::size_t in_use_ = 0;
  std::size_t used_blocks_ = 0;
};

namespace detail::buddy_pool_claims {
using P = buddy_pool<archetype_resource>;
static_assert(resource<P> && owning_resource<P> && releasable_resource<P> && sized_resource<P> && usage_reporting_resource<P> && snapshot_resource<P>);
static_assert(cccl::synchronous_resource_with<P, device_accessible> && !has_property<P, host_accessible>);  // forwarded
static_assert(answers_to_cccl31_names<P> && !stream_resource<P>);
static_assert(!std::is_copy_constructible_v<P> && std::is_nothrow_move_constructible_v<P>);
} // namespace detail::buddy_pool_claims

} // namespace strata
