#pragma once
// The C ABI's device figures (strata_device_figures) as the statistics' stack figures, and as the figures whose
// move sends the trace to the stack's listing: one conversion each for the PyTorch backend and the benchmarks
// that replay its path.
#include <array>
#include <cstdint>

#include <strata_alloc.h>

#include "device_statistics.hpp"

namespace strata::plugin {

inline stack_figures figures_of(const strata_device_figures& f)
{
  return {.reserved = f.reserved,
          .in_use = f.in_use,
          .chunks = f.chunks,
          .free_blocks = f.free_blocks,
          .held_bytes = f.held_bytes,
          .held_blocks = f.held_blocks,
          .device_allocs = f.device_allocs,
          .device_frees = f.device_frees,
          .alloc_retries = f.alloc_retries,
          .ooms = f.ooms,
          .syncs_all_streams = f.syncs_all_streams,
          .releasable = f.releasable};
}

/// The figures that move whenever the memory the stack's listing shows changes (Note [Segments and mapped
/// ranges]): the trace reads the listing again only when one of them moved. O(1).
using segment_figures = std::array<std::uint64_t, 6>;
inline segment_figures segment_figures_of(const strata_device_figures& f) noexcept
{
  return {f.reserved, f.chunks, f.device_allocs, f.device_frees, f.page_maps, f.page_unmaps};
}

} // namespace strata::plugin
