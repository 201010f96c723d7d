#pragma once
#include <cstddef>

namespace strata {

/// What a pool holds and how it is used, in bytes and counts. Exact, not sampled.
struct usage {
  std::size_t reserved = 0;      ///< bytes held from the upstream
  std::size_t in_use = 0;        ///< bytes of blocks handed out (as they really consume: see good_size)
  std::size_t largest_free = 0;  ///< the largest request that needs no new upstream memory
  std::size_t chunks = 0;        ///< chunks, slabs or regions held from the upstream
  std::size_t used_blocks = 0;   ///< live allocations
  std::size_t free_blocks = 0;   ///< free blocks kept for reuse

  constexpr std::size_t free() const noexcept { return reserved - in_use; }

  /// 1 - largest_free / free: 0 when all free memory is one block, near 1 when it is dust.
  constexpr double fragmentation() const noexcept
  {
    return free() == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free) / static_cast<double>(free());
  }

  constexpr bool operator==(const usage&) const = default;

  /// Adds the figures of a pool disjoint from this one (another device, another tag, the other side of a
  /// segregator): bytes and counts add up; largest_free is the larger of the two, since no request is served
  /// by two pools at once. O(1).
  constexpr usage& operator+=(const usage& other) noexcept
  {
    reserved += other.reserved;
    in_use += other.in_use;
    largest_free = largest_free < other.largest_free ? other.largest_free : largest_free;
    chunks += other.chunks;
    used_blocks += other.used_blocks;
    free_blocks += other.free_blocks;
    return *this;
  }
  friend constexpr usage operator+(usage a, const usage& b) noexcept { return a += b; }
};

} // namespace strata
