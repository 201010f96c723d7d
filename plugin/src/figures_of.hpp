#pragma once
// The C ABI's device figures (strata_device_figures) as the statistics' stack figures: one conversion for the
// PyTorch backend and the benchmarks that replay its path.
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
          .releasable = f.releasable};
}

} // namespace strata::plugin
