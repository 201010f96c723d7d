#pragma once
// Two-level segregated fit (TLSF) arithmetic for coalescing_pool. Sizes are counted in granules of 256 bytes.
// The first level is the power of two of the size, the second splits each power into 32 lists. Below 32
// granules (8 KiB) there is one list per granule. Inserting files a block under the list its size falls in;
// searching rounds the request up to the next list boundary, so any block found there fits: O(1), and at
// most 1/32 (3.1%) of a block is lost to that rounding before the block is split to the exact size.
#include <bit>
#include <cstddef>
#include <cstdint>

namespace strata::detail::tlsf {

inline constexpr unsigned second_level_bits = 5;
inline constexpr std::size_t second_level_count = std::size_t{1} << second_level_bits;  // 32
inline constexpr std::size_t first_level_count = 64 - second_level_bits;
inline constexpr std::size_t granule = 256;

struct list_index {
  unsigned first;
  unsigned second;
  bool operator==(const list_index&) const = default;
};

/// The list a free block of `granules` granules is filed under.
constexpr list_index mapping_insert(std::size_t granules) noexcept
{
  if (granules < second_level_count) return {0, static_cast<unsigned>(granules)};
  const unsigned msb = static_cast<unsigned>(std::bit_width(granules)) - 1;
  return {msb - second_level_bits + 1,
          static_cast<unsigned>((granules >> (msb - second_level_bits)) ^ second_level_count)};
}

/// The first list whose every block holds `granules`: round up to the next list boundary, then map.
constexpr list_index mapping_search(std::size_t granules) noexcept
{
  if (granules >= second_level_count) {
    const unsigned msb = static_cast<unsigned>(std::bit_width(granules)) - 1;
    granules += (std::size_t{1} << (msb - second_level_bits)) - 1;
  }
  return mapping_insert(granules);
}

/// The smallest size (in granules) filed under `index`.
constexpr std::size_t list_floor(list_index index) noexcept
{
  if (index.first == 0) return index.second;
  const unsigned msb = index.first + second_level_bits - 1;
  return (std::size_t{1} << msb) + (std::size_t{index.second} << (msb - second_level_bits));
}

} // namespace strata::detail::tlsf
