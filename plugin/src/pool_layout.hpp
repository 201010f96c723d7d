#pragma once
// PyTorch's block and segment sizes, as the torch backend reproduces them where a program can see them.
//
// Note [Private pools are laid out as PyTorch lays them out]
// Programs and tools read a private pool (a CUDA graph's, a MemPool's) through its segments: torch.compile's
// graph trees checkpoint and compare them, torch.cuda.memory_snapshot() lists them, and memory_stats() counts
// them per small and large pool. So a private pool takes its segments from strata at PyTorch's sizes (2 MiB
// for blocks up to 1 MiB, 20 MiB for blocks under 10 MiB, else the block rounded up to 2 MiB), cuts them into
// blocks rounded up to 512 bytes, splits and merges them by PyTorch's rules, and serves a small block only
// from a small segment and a large one only from a large segment. It then holds what PyTorch's allocator
// holds for the same program, no more; strata's own stack, outside the pools, keeps its own tighter layout.
// The figures count a block at its PyTorch size everywhere (memory_allocated is PyTorch's figure).
#include <array>
#include <cstddef>

namespace strata::plugin::pool_layout {

inline constexpr std::size_t min_block = 512;                         ///< blocks are multiples of this
inline constexpr std::size_t small_block_limit = std::size_t{1} << 20;  ///< the small pool's largest block
inline constexpr std::size_t small_segment = std::size_t{2} << 20;
inline constexpr std::size_t large_segment = std::size_t{20} << 20;
inline constexpr std::size_t min_large_alloc = std::size_t{10} << 20;  ///< from here a segment is the block
inline constexpr std::size_t large_rounding = std::size_t{2} << 20;

/// The block PyTorch cuts for a request of `bytes`.
constexpr std::size_t block_bytes(std::size_t bytes) noexcept
{
  return bytes < min_block ? min_block : (bytes + min_block - 1) / min_block * min_block;
}

constexpr bool is_small(std::size_t block) noexcept { return block <= small_block_limit; }

/// The segment a private pool takes from strata when no piece of it holds `block`.
constexpr std::size_t segment_bytes(std::size_t block) noexcept
{
  if (is_small(block)) return small_segment;
  if (block < min_large_alloc) return large_segment;
  return (block + large_rounding - 1) / large_rounding * large_rounding;
}

/// Whether a free piece of `piece` bytes handing out `block` keeps the rest as a piece of its own: in a small
/// segment any rest of a block or more, in a large one a rest of more than the small pool's largest block.
constexpr bool splits(std::size_t piece, std::size_t block, bool small_segment_piece) noexcept
{
  const std::size_t rest = piece - block;
  return small_segment_piece ? rest >= min_block : rest > small_block_limit;
}

} // namespace strata::plugin::pool_layout

namespace strata::plugin {

/// The private pools' memory by PyTorch's pool kind, index 0 the small pool and 1 the large (the statistics
/// count a pool's segments and pieces in their kind).
struct pool_figures {
  static constexpr std::size_t index(bool small) noexcept { return small ? 0 : 1; }
  std::array<std::size_t, 2> segments{};       ///< segments the pools hold
  std::array<std::size_t, 2> segment_bytes{};
  std::array<std::size_t, 2> live_bytes{};     ///< pieces handed to PyTorch
  std::array<std::size_t, 2> parked_bytes{};   ///< pieces parked (free in PyTorch's view)
  std::array<std::size_t, 2> parked_blocks{};
};

} // namespace strata::plugin
