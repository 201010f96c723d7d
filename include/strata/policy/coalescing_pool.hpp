#pragma once
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <type_traits>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/object_pool.hpp>
#include <strata/detail/pointer_map.hpp>
#include <strata/detail/tlsf_mapping.hpp>

namespace strata {

/// The general-purpose pool: two-level segregated fit (TLSF). Free blocks are filed in 32 lists per power of
/// two, found through two levels of bitmaps and find-first-set, so allocate and free are O(1) whatever the
/// number of free blocks. A block is split to the request (rounded to 256 bytes); a freed block merges with
/// its free address neighbours inside its chunk at once. Chunks come from the upstream: an initial size,
/// then geometric growth, optionally bounded by a maximum chunk and a maximum total; when the upstream
/// refuses a chunk, the smallest chunk that fits is tried before giving up. release() returns every wholly
/// free chunk. Block headers live in host memory (never in the memory handed out).
/// Models: resource, owning, releasable, sized, usage, snapshot, room-reporting; the upstream's properties.
/// Any power-of-two alignment up to the largest chunk. Cost: O(1) allocate and free (bit scans, a hash
/// lookup by address), no lock; an upstream call only to grow or release. Unsynchronized. Move-only.
template <resource Upstream>
class coalescing_pool : public forward_properties<coalescing_pool<Upstream>, Upstream>,
                        public sync_names<coalescing_pool<Upstream>> {
public:
  struct options {
    std::size_t initial_chunk = std::size_t{2} << 20;
    std::size_t max_chunk = std::size_t{1} << 30;  ///< growth stops here (a larger request gets its own chunk)
    std::size_t max_reserved = SIZE_MAX;           ///< never hold more than this from the upstream
    double growth_factor = 2.0;                    ///< each new chunk is this times the last (at least 1)
  };

  explicit coalescing_pool(Upstream upstream = Upstream{}) : coalescing_pool(std::move(upstream), options{}) {}
  coalescing_pool(Upstream upstream, options opts) : upstream_(std::move(upstream)), opts_(opts), next_chunk_(opts.initial_chunk)
  {
    if (opts.initial_chunk == 0 || opts.max_chunk == 0 || !(opts.growth_factor >= 1.0))
      throw std::invalid_argument("coalescing_pool: initial_chunk and max_chunk must be positive, growth_factor >= 1");
    next_chunk_ = align_up(std::min(opts.initial_chunk, opts.max_chunk), granule);
  }

  coalescing_pool(coalescing_pool&& other) noexcept : upstream_(std::move(other.upstream_)) { take(other); }
  coalescing_pool& operator=(coalescing_pool&& other) noexcept
  {
    if (this != &other) {
      return_everything();
      upstream_ = std::move(other.upstream_);
      take(other);
    }
    return *this;
  }
  coalescing_pool(const coalescing_pool&) = delete;
  coalescing_pool& operator=(const coalescing_pool&) = delete;
  ~coalescing_pool() { return_everything(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("coalescing_pool", alignment, std::max(opts_.max_chunk, default_alignment));
    if (bytes == 0) return nullptr;
    if (bytes > max_request) throw_oom(bytes);
    const std::size_t align = effective_alignment(alignment);
    const std::size_t size = align_up(bytes, granule);
    const std::size_t search = size + (align - granule);  // room to align inside any block found
    block* b = find_free(search);
    // A chunk of exactly `search` bytes may be filed below the list a search starts at: use it directly.
    if (b == nullptr) b = grow(search, bytes);
    remove_free(b);
    const std::uintptr_t start = align_address(b->address, align);
    if (start > b->address) b = split_front(b, start - b->address);
    if (b->size > size) split_back(b, size);
    b->free = false;
    used_.insert(reinterpret_cast<void*>(b->address), b);
    in_use_ += b->size;
    return reinterpret_cast<void*>(b->address);
  }

  void deallocate(void* p, std::size_t, std::size_t = default_alignment) noexcept
  {
    if (p == nullptr) return;
    block* b = nullptr;
    if (!used_.take(p, &b)) return;  // not ours: undefined by the rules; checked<> reports it
    in_use_ -= b->size;
    b->free = true;
    if (b->next != nullptr && b->next->free) {
      remove_free(b->next);
      absorb_next(b);
    }
    if (b->prev != nullptr && b->prev->free) {
      block* prev = b->prev;
      remove_free(prev);
      absorb_next(prev);
      b = prev;
    }
    insert_free(b);
  }

  std::size_t good_size(std::size_t bytes, std::size_t = default_alignment) const noexcept
  {
    return bytes == 0 ? 0 : align_up(bytes, granule);
  }

  /// Whether a free block could serve the request now (false may be pessimistic by one TLSF list).
  bool has_room_for(std::size_t bytes, std::size_t alignment = default_alignment) const noexcept
  {
    if (bytes == 0) return true;
    if (bytes > max_request) return false;
    const std::size_t search = align_up(bytes, granule) + (effective_alignment(alignment) - granule);
    return const_cast<coalescing_pool*>(this)->find_free(search) != nullptr;
  }

  bool owns(const void* p) const noexcept
  {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = chunks_.upper_bound(a);
    return it != chunks_.begin() && a < std::prev(it)->first + std::prev(it)->second.size;
  }

  /// Returns every wholly free chunk to the upstream; returns how many bytes went back.
  std::size_t release()
  {
    std::size_t returned = 0;
    for (auto it = chunks_.begin(); it != chunks_.end();) {
      block* first = it->second.first;
      if (!first->free || first->size != it->second.size) {
        ++it;
        continue;
      }
      remove_free(first);
      nodes_.recycle(first);
      returned += it->second.size;
      reserved_ -= it->second.size;
      upstream_.deallocate(reinterpret_cast<void*>(it->first), it->second.size, it->second.alignment);
      it = chunks_.erase(it);
    }
    if (chunks_.empty()) next_chunk_ = align_up(std::min(opts_.initial_chunk, opts_.max_chunk), granule);
    return returned;
  }

  strata::usage usage() const noexcept
  {
    return {.reserved = reserved_, .in_use = in_use_, .largest_free = largest_free(), .chunks = chunks_.size(),
            .used_blocks = used_.size(), .free_blocks = free_count_};
  }

  strata::snapshot snapshot() const
  {
    strata::snapshot s{.box = "coalescing_pool", .segments = {}};
    for (const auto& [base, chunk] : chunks_) {
      segment_info seg{.address = base, .size = chunk.size, .blocks = {}};
      for (const block* b = chunk.first; b != nullptr; b = b->next) seg.blocks.push_back({b->address - base, b->size, b->free, -1});
      s.segments.push_back(std::move(seg));
    }
    return s;
  }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }

  friend bool operator==(const coalescing_pool& a, const coalescing_pool& b) noexcept { return &a == &b; }

private:
  static constexpr std::size_t granule = detail::tlsf::granule;
  static constexpr std::size_t max_request = std::size_t{1} << 56;
  using list_index = detail::tlsf::list_index;

  /// A block's header, in host memory. prev/next: address neighbours in the chunk; free_prev/free_next: the
  /// free list it is filed in.
  struct block {
    std::uintptr_t address = 0;
    std::size_t size = 0;
    block* prev = nullptr;
    block* next = nullptr;
    block* free_prev = nullptr;
    block* free_next = nullptr;
    bool free = false;
  };
  struct chunk_info {
    std::size_t size;
    std::size_t alignment;
    block* first;
  };

  [[noreturn]] void throw_oom(std::size_t bytes) const { throw out_of_memory("coalescing_pool", bytes, figures(reserved_, in_use_)); }

  block*& head(list_index i) noexcept { return heads_[i.first][i.second]; }

  void insert_free(block* b) noexcept
  {
    b->free = true;
    const list_index i = detail::tlsf::mapping_insert(b->size / granule);
    block*& h = head(i);
    b->free_prev = nullptr;
    b->free_next = h;
    if (h != nullptr) h->free_prev = b;
    h = b;
    first_bits_ |= std::uint64_t{1} << i.first;
    second_bits_[i.first] |= std::uint32_t{1} << i.second;
    ++free_count_;
  }

  void remove_free(block* b) noexcept
  {
    const list_index i = detail::tlsf::mapping_insert(b->size / granule);
    if (b->free_prev != nullptr) b->free_prev->free_next = b->free_next;
    else head(i) = b->free_next;
    if (b->free_next != nullptr) b->free_next->free_prev = b->free_prev;
    if (head(i) == nullptr) {
      second_bits_[i.first] &= ~(std::uint32_t{1} << i.second);
      if (second_bits_[i.first] == 0) first_bits_ &= ~(std::uint64_t{1} << i.first);
    }
    b->free_prev = b->free_next = nullptr;
    --free_count_;
  }

  /// A free block of at least `bytes`, in O(1): the first non-empty list at or above the search mapping.
  block* find_free(std::size_t bytes) noexcept
  {
    list_index i = detail::tlsf::mapping_search(bytes / granule);
    if (i.first >= detail::tlsf::first_level_count) return nullptr;
    std::uint32_t second = i.second < 32 ? second_bits_[i.first] & (~std::uint32_t{0} << i.second) : 0;
    if (second == 0) {
      const std::uint64_t first = i.first + 1 < 64 ? first_bits_ & (~std::uint64_t{0} << (i.first + 1)) : 0;
      if (first == 0) return nullptr;
      i.first = static_cast<unsigned>(std::countr_zero(first));
      second = second_bits_[i.first];
    }
    i.second = static_cast<unsigned>(std::countr_zero(second));
    return head(i);
  }

  /// Splits `front` bytes off b's start (they stay free); returns the rest, still off the lists.
  block* split_front(block* b, std::size_t front)
  {
    block* rest = nodes_.make({b->address + front, b->size - front, b, b->next, nullptr, nullptr, false});
    if (b->next != nullptr) b->next->prev = rest;
    b->next = rest;
    b->size = front;
    insert_free(b);
    return rest;
  }

  /// Keeps `size` bytes in b; the tail becomes a free block (its next neighbour is never free: merged).
  void split_back(block* b, std::size_t size)
  {
    block* tail = nodes_.make({b->address + size, b->size - size, b, b->next, nullptr, nullptr, false});
    if (b->next != nullptr) b->next->prev = tail;
    b->next = tail;
    b->size = size;
    insert_free(tail);
  }

  void absorb_next(block* b) noexcept
  {
    block* n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    nodes_.recycle(n);
  }

  /// Adds a chunk holding at least `needed` bytes: the next size in the geometric series, or, when the
  /// upstream refuses that, the smallest chunk that fits. Returns the chunk's one free block. Strong guarantee.
  block* grow(std::size_t needed, std::size_t bytes)
  {
    std::size_t size = std::max(needed, next_chunk_);
    if (reserved_ + needed > opts_.max_reserved || reserved_ + needed < reserved_) throw_oom(bytes);
    size = std::max(needed, (std::min(size, opts_.max_reserved - reserved_) / granule) * granule);
    const std::size_t alignment = std::min(std::bit_floor(size), max_alignment_of<Upstream>);
    void* p = nullptr;
    try {
      p = upstream_.allocate(size, alignment);
    } catch (const out_of_memory&) {
      if (size == needed) throw_oom(bytes);
      size = needed;
      try {
        p = upstream_.allocate(size, std::min(std::bit_floor(size), max_alignment_of<Upstream>));
      } catch (const out_of_memory&) {
        throw_oom(bytes);
      }
    }
    const std::size_t used_alignment = std::min(std::bit_floor(size), max_alignment_of<Upstream>);
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    block* b = nullptr;
    try {
      b = nodes_.make({base, size, nullptr, nullptr, nullptr, nullptr, true});
      chunks_.emplace(base, chunk_info{size, used_alignment, b});
      insert_free(b);
    } catch (...) {
      upstream_.deallocate(p, size, used_alignment);
      throw;
    }
    reserved_ += size;
    const double grown = static_cast<double>(next_chunk_) * opts_.growth_factor;
    next_chunk_ = align_up(static_cast<std::size_t>(std::min(grown, static_cast<double>(opts_.max_chunk))), granule);
    return b;
  }

  std::size_t largest_free() const noexcept
  {
    if (first_bits_ == 0) return 0;
    const unsigned first = 63 - static_cast<unsigned>(std::countl_zero(first_bits_));
    const unsigned second = 31 - static_cast<unsigned>(std::countl_zero(second_bits_[first]));
    std::size_t largest = 0;
    for (const block* b = heads_[first][second]; b != nullptr; b = b->free_next) largest = std::max(largest, b->size);
    return largest;
  }

  void return_everything() noexcept
  {
    for (const auto& [base, chunk] : chunks_) {
      for (block* b = chunk.first; b != nullptr;) {
        block* next = b->next;
        nodes_.recycle(b);
        b = next;
      }
      upstream_.deallocate(reinterpret_cast<void*>(base), chunk.size, chunk.alignment);
    }
    chunks_.clear();
    used_.clear();
    for (auto& row : heads_) row.fill(nullptr);
    first_bits_ = 0;
    second_bits_.fill(0);
    reserved_ = in_use_ = free_count_ = 0;
  }

  void take(coalescing_pool& other) noexcept
  {
    opts_ = other.opts_;
    nodes_ = std::move(other.nodes_);
    chunks_ = std::move(other.chunks_);
    used_ = std::move(other.used_);
    heads_ = other.heads_;
    first_bits_ = std::exchange(other.first_bits_, 0);
    second_bits_ = std::exchange(other.second_bits_, {});
    reserved_ = std::exchange(other.reserved_, 0);
    in_use_ = std::exchange(other.in_use_, 0);
    free_count_ = std::exchange(other.free_count_, 0);
    next_chunk_ = other.next_chunk_;
    other.chunks_.clear();
    other.used_ = detail::pointer_map<block*>{};
    for (auto& row : other.heads_) row.fill(nullptr);
  }

  [[no_unique_address]] Upstream upstream_;
  options opts_;
  detail::object_pool<block> nodes_;
  std::map<std::uintptr_t, chunk_info> chunks_;
  detail::pointer_map<block*> used_;
  std::array<std::array<block*, detail::tlsf::second_level_count>, detail::tlsf::first_level_count> heads_{};
  std::uint64_t first_bits_ = 0;
  std::array<std::uint32_t, detail::tlsf::first_level_count> second_bits_{};
  std::size_t reserved_ = 0;
  std::size_t in_use_ = 0;
  std::size_t free_count_ = 0;
  std::size_t next_chunk_ = 0;
};

namespace detail::coalescing_pool_claims {
using P = coalescing_pool<archetype_resource>;
static_assert(resource<P> && owning_resource<P> && releasable_resource<P> && sized_resource<P> && usage_reporting_resource<P> && snapshot_resource<P>);
static_assert(room_reporting_resource<P>);
static_assert(cccl::synchronous_resource_with<P, device_accessible> && !has_property<P, host_accessible>);  // forwarded
static_assert(answers_to_cccl31_names<P> && !stream_resource<P>);
static_assert(!std::is_copy_constructible_v<P> && std::is_nothrow_move_constructible_v<P>);
} // namespace detail::coalescing_pool_claims

} // namespace strata
