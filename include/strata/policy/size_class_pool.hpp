#pragma once
#include <concepts>
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
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
#include <strata/detail/size_classes.hpp>

namespace strata {

/// Segregated fits for many small and medium requests. Requests are rounded up to a size class (256-byte
/// steps to 2 KiB, then four classes per doubling up to LargestClass: at most 20% of a block wasted); each
/// class pops blocks from its own free list, refilled by carving a slab (about 16 blocks, 64 KiB or one
/// chunk if that is smaller, up to one chunk) out of chunks taken from the upstream. Requests above LargestClass, and alignments above 256, go
/// straight to the upstream (recorded, so owns/usage/snapshot still see them).
/// release() returns every chunk whose slabs are all free; slabs that are wholly free inside a chunk still in
/// use are kept for any class to reuse.
/// After any exception (the upstream's out of memory, or std::bad_alloc in the host bookkeeping) the pool is as
/// it was: a chunk taken from the upstream goes back if it cannot be recorded.
/// Models: resource, owning, releasable, sized (good_size = the class size; SIZE_MAX for a request no block can
/// ever hold), usage, snapshot, room-reporting; the upstream's properties. Cost: allocate and free are O(1) — a class computed by arithmetic and a push or pop on a
/// vector — with no lock; a slab refill is O(blocks in the slab). Unsynchronized. Move-only.
template <resource Upstream, std::size_t LargestClass = (std::size_t{1} << 20)>
class size_class_pool : public forward_properties<size_class_pool<Upstream, LargestClass>, Upstream>,
                        public sync_names<size_class_pool<Upstream, LargestClass>> {
  static_assert(std::has_single_bit(LargestClass) && LargestClass >= detail::linear_classes_end,
                "the largest class must be a power of two of at least 2 KiB");

public:
  static constexpr auto class_sizes = detail::make_class_table<LargestClass>();
  static constexpr std::size_t largest_class = LargestClass;
  static constexpr std::size_t min_slab = std::size_t{64} << 10;

  struct options {
    std::size_t chunk_size = std::max(std::size_t{2} << 20, 2 * LargestClass);
  };

  size_class_pool() requires std::default_initializable<Upstream> : size_class_pool(Upstream{}, options{}) {}
  explicit size_class_pool(Upstream upstream) : size_class_pool(std::move(upstream), options{}) {}
  size_class_pool(Upstream upstream, options opts) : upstream_(std::move(upstream)), opts_(opts)
  {
    if (!std::has_single_bit(opts.chunk_size) || opts.chunk_size < LargestClass)
      throw std::invalid_argument("size_class_pool: chunk_size " + std::to_string(opts.chunk_size) +
                                  " must be a power of two no smaller than the largest class");
  }

  /// The moved-from pool is empty and usable (over its moved-from upstream).
  size_class_pool(size_class_pool&& other) noexcept : upstream_(std::move(other.upstream_)) { take(other); }
  size_class_pool& operator=(size_class_pool&& other) noexcept
  {
    if (this != &other) {
      return_everything();
      upstream_ = std::move(other.upstream_);
      take(other);
    }
    return *this;
  }
  size_class_pool(const size_class_pool&) = delete;
  size_class_pool& operator=(const size_class_pool&) = delete;
  ~size_class_pool() { return_everything(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    if (bytes == 0) {
      check_alignment("size_class_pool", alignment, opts_.chunk_size);
      return nullptr;
    }
    if (bytes <= LargestClass && alignment <= default_alignment && is_power_of_two(alignment)) {
      const std::size_t c = detail::class_index(bytes);
      auto& list = free_[c];
      if (list.empty()) refill(c, bytes);
      void* p = list.back();
      list.pop_back();
      ++live_[c];
      return p;
    }
    check_alignment("size_class_pool", alignment, opts_.chunk_size);
    return allocate_direct(bytes, alignment);
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    if (bytes <= LargestClass && alignment <= default_alignment) {
      const std::size_t c = detail::class_index(bytes);
      free_[c].push_back(p);  // capacity reserved at refill: cannot throw
      --live_[c];
      return;
    }
    deallocate_direct(p);
  }

  /// The bytes a request consumes: its class; or, when it bypasses the classes, the request rounded to 256 plus
  /// the room needed to align it where the upstream cannot.
  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const noexcept
  {
    if (bytes == 0) return 0;
    if (bytes <= LargestClass && alignment <= default_alignment) return class_sizes[detail::class_index(bytes)];
    return direct_bytes(bytes, alignment);
  }

  /// Whether the request's class has a free block or a slab could be carved without a new chunk; requests
  /// served directly by the upstream never have room.
  bool has_room_for(std::size_t bytes, std::size_t alignment = default_alignment) const noexcept
  {
    if (bytes == 0) return true;
    if (bytes > LargestClass || alignment > default_alignment) return false;
    const std::size_t c = detail::class_index(bytes);
    if (!free_[c].empty()) return true;
    const std::size_t slab = slab_bytes(c);
    return !spare_slabs_[std::countr_zero(slab)].empty() || (bump_chunk_ != 0 && opts_.chunk_size - bump_offset_ >= slab);
  }

  bool owns(const void* p) const noexcept
  {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = chunks_.upper_bound(a);
    if (it != chunks_.begin() && a < std::prev(it)->first + opts_.chunk_size) return true;
    return direct_.contains(p);
  }

  /// Returns every chunk whose slabs are all free to the upstream. O(free blocks · log slabs).
  void release()
  {
    // Count the free blocks of each slab; a slab whose blocks are all free leaves its class.
    for (auto& [base, slab] : slabs_) slab.free_blocks = 0;
    for (std::size_t c = 0; c < class_sizes.size(); ++c)
      for (void* p : free_[c]) ++slab_of(p).free_blocks;
    std::vector<std::uintptr_t> emptied;
    for (auto& [base, slab] : slabs_)
      if (slab.cls != no_class && slab.free_blocks == slab.blocks) emptied.push_back(base);
    const bool no_spares = std::ranges::all_of(spare_slabs_, [](const auto& spares) { return spares.empty(); });
    if (emptied.empty() && no_spares) return;  // every chunk has a live slab: nothing can go back
    // The one step below that allocates comes first, so an exception leaves the pool as it was.
    std::array<std::size_t, 64> emptied_per_size{};
    for (std::uintptr_t base : emptied) ++emptied_per_size[std::countr_zero(slabs_.at(base).bytes)];
    for (std::size_t k = 0; k < spare_slabs_.size(); ++k) spare_slabs_[k].reserve(spare_slabs_[k].size() + emptied_per_size[k]);
    for (std::size_t c = 0; c < class_sizes.size(); ++c)
      std::erase_if(free_[c], [&](void* p) { return slab_of(p).cls == no_class || slab_of(p).free_blocks == slab_of(p).blocks; });
    for (std::uintptr_t base : emptied) {
      slab_info& slab = slabs_.at(base);
      carved_[slab.cls] -= slab.blocks;
      slab.cls = no_class;
      spare_slabs_[std::countr_zero(slab.bytes)].push_back(base);
      --chunks_.at(chunk_base(base)).live_slabs;
    }
    // Chunks without a live slab go back, with their spare slabs and untouched tail.
    for (auto it = chunks_.begin(); it != chunks_.end();) {
      if (it->second.live_slabs != 0) {
        ++it;
        continue;
      }
      const std::uintptr_t base = it->first;
      for (auto& spares : spare_slabs_)
        std::erase_if(spares, [&](std::uintptr_t s) { return s >= base && s < base + opts_.chunk_size; });
      std::erase_if(slabs_, [&](const auto& kv) { return kv.first >= base && kv.first < base + opts_.chunk_size; });
      if (bump_chunk_ == base) bump_chunk_ = 0;
      upstream_.deallocate(reinterpret_cast<void*>(base), opts_.chunk_size, chunk_alignment());
      it = chunks_.erase(it);
    }
  }

  strata::usage usage() const noexcept
  {
    strata::usage u{};
    u.reserved = chunks_.size() * opts_.chunk_size;
    u.chunks = chunks_.size();
    for (std::size_t c = 0; c < class_sizes.size(); ++c) {
      u.in_use += live_[c] * class_sizes[c];
      u.used_blocks += live_[c];
      u.free_blocks += free_[c].size();
      if (!free_[c].empty()) u.largest_free = std::max(u.largest_free, class_sizes[c]);
    }
    // Room for a new slab (a spare one, or the bump chunk's tail) serves any class whose slab fits there.
    std::size_t room = bump_chunk_ != 0 ? opts_.chunk_size - bump_offset_ : 0;
    for (std::size_t k = 0; k < spare_slabs_.size(); ++k)
      if (!spare_slabs_[k].empty()) room = std::max(room, std::size_t{1} << k);
    for (std::size_t c = 0; c < class_sizes.size(); ++c)
      if (slab_bytes(c) <= room) u.largest_free = std::max(u.largest_free, class_sizes[c]);
    direct_.for_each([&](void*, const direct_block& d) {
      u.reserved += d.raw_bytes;
      u.in_use += d.raw_bytes;  // alignment slack included: it serves nothing else
      ++u.used_blocks;
      ++u.chunks;
    });
    return u;
  }

  strata::snapshot snapshot() const
  {
    detail::pointer_map<bool> free_set;
    for (const auto& list : free_)
      for (void* p : list) free_set.insert(p, true);
    strata::snapshot s{.box = "size_class_pool", .segments = {}};
    for (const auto& [base, chunk] : chunks_) {
      segment_info seg{.address = base, .size = opts_.chunk_size, .blocks = {}, .mapped = {}};
      for (auto it = slabs_.lower_bound(base); it != slabs_.end() && it->first < base + opts_.chunk_size; ++it) {
        const slab_info& slab = it->second;
        if (slab.cls == no_class) {
          seg.blocks.push_back({it->first - base, slab.bytes, true, -1});
          continue;
        }
        for (std::size_t i = 0; i < slab.blocks; ++i) {
          const std::uintptr_t b = it->first + i * class_sizes[slab.cls];
          seg.blocks.push_back({b - base, class_sizes[slab.cls], free_set.contains(reinterpret_cast<void*>(b)), -1});
        }
      }
      s.segments.push_back(std::move(seg));
    }
    direct_.for_each([&](void* p, const direct_block& d) {
      s.segments.push_back({reinterpret_cast<std::uintptr_t>(d.raw), d.raw_bytes,
                            {{static_cast<std::size_t>(static_cast<char*>(p) - static_cast<char*>(d.raw)), align_up(d.bytes, default_alignment), false, -1}},
                            {}});
    });
    return s;
  }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }

  friend bool operator==(const size_class_pool& a, const size_class_pool& b) noexcept { return &a == &b; }

private:
  static constexpr std::size_t class_count = class_sizes.size();
  static constexpr std::size_t no_class = SIZE_MAX;

  struct slab_info {
    std::size_t cls = no_class;
    std::size_t bytes = 0;
    std::size_t blocks = 0;
    std::size_t free_blocks = 0;  // scratch for release()
  };
  struct chunk_info {
    std::size_t live_slabs = 0;
  };
  struct direct_block {
    void* raw = nullptr;
    std::size_t raw_bytes = 0;
    std::size_t raw_alignment = 0;
    std::size_t bytes = 0;
  };

  /// About 16 blocks a slab, a power of two between 64 KiB (or one chunk, if smaller) and one chunk.
  std::size_t slab_bytes(std::size_t c) const noexcept
  {
    return std::clamp(std::bit_ceil(class_sizes[c] * 16), std::min(min_slab, opts_.chunk_size), opts_.chunk_size);
  }

  /// What a request served by the upstream takes: rounded to 256, plus room to align; SIZE_MAX if that overflows
  /// (no upstream can serve it).
  static std::size_t direct_bytes(std::size_t bytes, std::size_t alignment) noexcept
  {
    std::size_t rounded = 0;
    const std::size_t slack = alignment_slack(alignment);
    if (!checked_align_up(bytes, default_alignment, rounded) || rounded > SIZE_MAX - slack) return SIZE_MAX;
    return rounded + slack;
  }

  /// Room to align inside a direct block when the upstream cannot align that much itself.
  static constexpr std::size_t alignment_slack(std::size_t alignment) noexcept
  {
    const std::size_t align = effective_alignment(alignment);
    return align - std::min(align, max_alignment_of<Upstream>);
  }

  std::size_t chunk_alignment() const noexcept { return std::min(opts_.chunk_size, max_alignment_of<Upstream>); }
  std::uintptr_t chunk_base(std::uintptr_t slab) const { return std::prev(chunks_.upper_bound(slab))->first; }

  slab_info& slab_of(void* p) { return std::prev(slabs_.upper_bound(reinterpret_cast<std::uintptr_t>(p)))->second; }

  /// Gives class c a new slab: a spare one, the bump chunk's tail, or a new chunk. Strong guarantee: every
  /// step that can throw (the free list's room, the slab's record, the upstream, the chunk's record) comes
  /// before the pool changes, and a new chunk goes back if it cannot be recorded.
  void refill(std::size_t c, std::size_t bytes)
  {
    const std::size_t slab = slab_bytes(c);
    const std::size_t size = class_sizes[c];
    const std::size_t blocks = slab / size;
    auto& list = free_[c];
    list.reserve(carved_[c] + blocks);  // room for every block of the class: frees never reallocate
    auto& spares = spare_slabs_[std::countr_zero(slab)];
    std::uintptr_t base = 0;
    if (!spares.empty()) {
      base = spares.back();  // its slabs_ entry is kept while spare: reusing it allocates nothing
      spares.pop_back();
      slabs_.at(base) = {c, slab, blocks, 0};
    } else if (bump_chunk_ != 0 && opts_.chunk_size - bump_offset_ >= slab) {
      base = bump_chunk_ + bump_offset_;
      slabs_.insert_or_assign(base, slab_info{c, slab, blocks, 0});
      bump_offset_ += slab;
    } else {
      base = new_chunk_with_slab(slab_info{c, slab, blocks, 0}, bytes);
    }
    carved_[c] += blocks;
    ++chunks_.at(chunk_base(base)).live_slabs;
    for (std::size_t i = blocks; i-- > 0;) list.push_back(reinterpret_cast<void*>(base + i * size));
  }

  /// Takes a chunk from the upstream, records it and its first slab, and makes it the bump chunk.
  std::uintptr_t new_chunk_with_slab(const slab_info& first_slab, std::size_t bytes)
  {
    void* p = nullptr;
    try {
      p = upstream_.allocate(opts_.chunk_size, chunk_alignment());
    } catch (const out_of_memory&) {
      const auto u = usage();
      throw out_of_memory("size_class_pool", bytes, figures(u.reserved, u.in_use));
    }
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    try {
      chunks_.emplace(base, chunk_info{});
      slabs_.emplace(base, first_slab);
    } catch (...) {
      chunks_.erase(base);
      upstream_.deallocate(p, opts_.chunk_size, chunk_alignment());
      throw;
    }
    bump_chunk_ = base;
    bump_offset_ = first_slab.bytes;
    return base;
  }

  void* allocate_direct(std::size_t bytes, std::size_t alignment)
  {
    const std::size_t align = effective_alignment(alignment);
    const std::size_t upstream_align = std::min(align, max_alignment_of<Upstream>);
    const std::size_t raw_bytes = direct_bytes(bytes, alignment);
    if (raw_bytes == SIZE_MAX) throw out_of_memory("size_class_pool", bytes, "larger than any block can be");
    void* raw = nullptr;
    try {
      raw = upstream_.allocate(raw_bytes, upstream_align);
    } catch (const out_of_memory&) {
      const auto u = usage();
      throw out_of_memory("size_class_pool", bytes, figures(u.reserved, u.in_use));
    }
    void* p = reinterpret_cast<void*>(align_address(reinterpret_cast<std::uintptr_t>(raw), align));
    try {
      direct_.insert(p, {raw, raw_bytes, upstream_align, bytes});
    } catch (...) {
      upstream_.deallocate(raw, raw_bytes, upstream_align);
      throw;
    }
    return p;
  }

  void deallocate_direct(void* p) noexcept
  {
    direct_block* d = direct_.find(p);
    if (d == nullptr) return;  // not ours: undefined by the rules; checked<> reports it
    const direct_block block = *d;
    direct_.erase(p);
    upstream_.deallocate(block.raw, block.raw_bytes, block.raw_alignment);
  }

  void return_everything() noexcept
  {
    direct_.for_each([&](void*, const direct_block& d) { upstream_.deallocate(d.raw, d.raw_bytes, d.raw_alignment); });
    direct_.clear();
    for (const auto& [base, chunk] : chunks_) upstream_.deallocate(reinterpret_cast<void*>(base), opts_.chunk_size, chunk_alignment());
    chunks_.clear();
    slabs_.clear();
    for (auto& list : free_) list.clear();
    for (auto& spares : spare_slabs_) spares.clear();
    live_.fill(0);
    carved_.fill(0);
    bump_chunk_ = 0;
    bump_offset_ = 0;
  }

  void take(size_class_pool& other) noexcept
  {
    opts_ = other.opts_;
    carved_ = std::exchange(other.carved_, {});
    free_ = std::move(other.free_);
    live_ = std::exchange(other.live_, {});
    chunks_ = std::move(other.chunks_);
    slabs_ = std::move(other.slabs_);
    spare_slabs_ = std::move(other.spare_slabs_);
    direct_ = std::move(other.direct_);
    bump_chunk_ = std::exchange(other.bump_chunk_, 0);
    bump_offset_ = std::exchange(other.bump_offset_, 0);
    other.chunks_.clear();
    other.slabs_.clear();
    for (auto& list : other.free_) list.clear();
    for (auto& spares : other.spare_slabs_) spares.clear();
  }

  [[no_unique_address]] Upstream upstream_;
  options opts_;
  std::array<std::vector<void*>, class_count> free_{};
  std::array<std::size_t, class_count> live_{};
  std::array<std::size_t, class_count> carved_{};
  std::map<std::uintptr_t, chunk_info> chunks_;
  std::map<std::uintptr_t, slab_info> slabs_;
  std::array<std::vector<std::uintptr_t>, 64> spare_slabs_{};  // by log2 of the slab size
  detail::pointer_map<direct_block> direct_;
  std::uintptr_t bump_chunk_ = 0;
  std::size_t bump_offset_ = 0;
};

namespace detail::size_class_pool_claims {
using P = size_class_pool<archetype_resource>;
static_assert(resource<P> && owning_resource<P> && releasable_resource<P> && sized_resource<P> && usage_reporting_resource<P> && snapshot_resource<P>);
static_assert(room_reporting_resource<P>);
static_assert(cccl::synchronous_resource_with<P, device_accessible> && !has_property<P, host_accessible>);  // forwarded
static_assert(answers_to_cccl31_names<P> && !stream_resource<P>);
static_assert(!std::is_copy_constructible_v<P> && std::is_nothrow_move_constructible_v<P>);
} // namespace detail::size_class_pool_claims

} // namespace strata
