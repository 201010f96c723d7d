#pragma once
// A model of PyTorch's CUDA caching allocator, for comparing strata's stacks with what a PyTorch program
// would have held on the same trace without a GPU. A model, not PyTorch: it follows the rules of
// c10/cuda/CUDACachingAllocator.cpp with default settings (no max_split_size, no expandable segments, no
// garbage collection threshold) and nothing else; docs/planner.md compares its figures with PyTorch's own.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/usage.hpp>

namespace strata::replay {

/// The rules modelled: a request is rounded up to 512 bytes; requests up to 1 MiB are "small" and come from
/// 2 MiB segments, larger ones from a 20 MiB segment when under 10 MiB, otherwise from a segment of their
/// own size rounded up to 2 MiB (each segment one upstream allocation: cudaMalloc). Free blocks are kept
/// per stream and per kind (small, large) and searched best-fit (smallest, then lowest address); a block is
/// split when what remains is at least 512 bytes (small) or more than 1 MiB (large); a freed block merges
/// with free neighbours in its segment and returns to the pool of the stream that allocated it. Nothing is
/// given back to the upstream until it refuses a segment: then every wholly free segment is released
/// (empty_cache) and the segment is asked for once more, and out_of_memory follows a second refusal.
/// Not modelled: cross-stream events (record_stream), which only delay reuse, and the config knobs.
/// Models: the calls the replay needs (allocate with a stream, deallocate), usage, snapshot. Cost: O(log n)
/// per call (ordered sets), an upstream call per new segment. Unsynchronized. Not movable (holds its upstream).
template <resource Upstream>
class torch_caching_model {
public:
  static constexpr std::size_t min_block = 512;                    // kMinBlockSize
  static constexpr std::size_t small_size = std::size_t{1} << 20;  // kSmallSize
  static constexpr std::size_t small_buffer = std::size_t{2} << 20;   // kSmallBuffer
  static constexpr std::size_t large_buffer = std::size_t{20} << 20;  // kLargeBuffer
  static constexpr std::size_t min_large_alloc = std::size_t{10} << 20;  // kMinLargeAlloc
  static constexpr std::size_t round_large = std::size_t{2} << 20;       // kRoundLarge

  explicit torch_caching_model(Upstream upstream) : upstream_(std::move(upstream)) {}
  torch_caching_model(const torch_caching_model&) = delete;
  torch_caching_model& operator=(const torch_caching_model&) = delete;
  ~torch_caching_model()
  {
    for (const auto& [address, size] : segments_) upstream_.deallocate(reinterpret_cast<void*>(address), size);
  }

  static constexpr std::size_t round_size(std::size_t bytes) noexcept
  {
    return bytes < min_block ? min_block : align_up(bytes, min_block);
  }
  static constexpr std::size_t segment_size(std::size_t rounded) noexcept
  {
    if (rounded <= small_size) return small_buffer;
    if (rounded < min_large_alloc) return large_buffer;
    return align_up(rounded, round_large);
  }

  void* allocate(std::size_t bytes, int stream)
  {
    if (bytes == 0) return nullptr;
    const std::size_t size = round_size(bytes);
    const bool small = size <= small_size;
    auto& pool = free_[{stream, small}];
    auto it = pool.lower_bound({size, 0});
    std::uintptr_t address = 0;
    if (it != pool.end()) {
      address = it->second;
      pool.erase(it);
    } else {
      address = new_segment(size, stream, small);
    }
    block& b = blocks_.at(address);
    const std::size_t remaining = b.size - size;
    if (small ? remaining >= min_block : remaining > small_size) {
      blocks_.emplace(address + size, block{remaining, b.segment, stream, small, false});
      pool.insert({remaining, address + size});
      b.size = size;
    }
    b.allocated = true;
    allocated_ += b.size;
    return reinterpret_cast<void*>(address);
  }

  void deallocate(void* p) noexcept
  {
    if (p == nullptr) return;
    auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(p));
    block& b = it->second;
    allocated_ -= b.size;
    b.allocated = false;
    auto& pool = free_[{b.stream, b.small}];
    if (auto next = std::next(it); next != blocks_.end() && mergeable(b, next->second)) {
      pool.erase({next->second.size, next->first});
      b.size += next->second.size;
      blocks_.erase(next);
    }
    if (it != blocks_.begin()) {
      if (auto prev = std::prev(it); mergeable(b, prev->second)) {
        pool.erase({prev->second.size, prev->first});
        prev->second.size += b.size;
        blocks_.erase(it);
        it = prev;
      }
    }
    pool.insert({it->second.size, it->first});
  }

  /// Hands every wholly free segment back (torch.cuda.empty_cache()); returns the bytes released.
  std::size_t release()
  {
    std::size_t released = 0;
    for (auto seg = segments_.begin(); seg != segments_.end();) {
      auto b = blocks_.find(seg->first);
      if (b->second.allocated || b->second.size != seg->second) {
        ++seg;
        continue;
      }
      free_[{b->second.stream, b->second.small}].erase({b->second.size, b->first});
      blocks_.erase(b);
      upstream_.deallocate(reinterpret_cast<void*>(seg->first), seg->second);
      reserved_ -= seg->second;
      released += seg->second;
      seg = segments_.erase(seg);
    }
    return released;
  }

  strata::usage usage() const noexcept
  {
    strata::usage u{.reserved = reserved_, .in_use = allocated_, .largest_free = 0, .chunks = segments_.size()};
    for (const auto& [address, b] : blocks_) {
      if (b.allocated) ++u.used_blocks;
      else {
        ++u.free_blocks;
        u.largest_free = std::max(u.largest_free, b.size);
      }
    }
    return u;
  }

  /// Each segment with its blocks in address order (as torch.cuda.memory_snapshot() lists them).
  strata::snapshot snapshot() const
  {
    strata::snapshot s{.box = "torch_caching_model", .segments = {}};
    for (const auto& [address, size] : segments_) {
      segment_info seg{.address = address, .size = size, .blocks = {}, .mapped = {}};
      for (auto b = blocks_.find(address); b != blocks_.end() && b->second.segment == address; ++b)
        seg.blocks.push_back({b->first - address, b->second.size, !b->second.allocated, b->second.stream});
      s.segments.push_back(std::move(seg));
    }
    return s;
  }

  std::size_t reserved() const noexcept { return reserved_; }
  std::size_t allocated() const noexcept { return allocated_; }
  std::size_t segments() const noexcept { return segments_.size(); }

private:
  struct block {
    std::size_t size;
    std::uintptr_t segment;
    int stream;
    bool small;
    bool allocated;
  };

  static bool mergeable(const block& b, const block& other) noexcept { return !other.allocated && other.segment == b.segment; }

  std::uintptr_t new_segment(std::size_t size, int stream, bool small)
  {
    const std::size_t bytes = segment_size(size);
    void* p = nullptr;
    try {
      p = upstream_.allocate(bytes, default_alignment);
    } catch (const out_of_memory&) {
      if (release() == 0) throw;
      p = upstream_.allocate(bytes, default_alignment);  // a second refusal is PyTorch's OutOfMemoryError
    }
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    try {
      blocks_.emplace(address, block{bytes, address, stream, small, false});
      segments_.emplace(address, bytes);
    } catch (...) {
      blocks_.erase(address);
      upstream_.deallocate(p, bytes);
      throw;
    }
    reserved_ += bytes;
    return address;
  }

  Upstream upstream_;
  std::map<std::uintptr_t, block> blocks_;        // every block, by address (segments are contiguous runs)
  std::map<std::uintptr_t, std::size_t> segments_;  // segment start -> size
  std::map<std::pair<int, bool>, std::set<std::pair<std::size_t, std::uintptr_t>>> free_;  // (stream, small) -> (size, address)
  std::size_t reserved_ = 0;
  std::size_t allocated_ = 0;
};

} // namespace strata::replay
