#pragma once
// The plug-in's counts of one device, in PyTorch's words: what memory_stats reports (as JSON) and what
// strata_device_figures_get fills in. Kept by the plug-in, under the device's lock, beside the stack's own
// figures.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include <strata_alloc.h>

#include <strata/core/usage.hpp>

#include "device_stack.hpp"

namespace strata::plugin {

/// PyTorch's names where the meaning is the same (bytes as requested, counts of allocations). Models: the
/// counters of PyTorch's DeviceStats the plug-in can keep. Cost: O(1) per allocation and free; no lock of its
/// own (the device's is held), no CUDA call.
struct slot_statistics {
  std::size_t allocated = 0, allocated_peak = 0;
  std::size_t reserved_peak = 0;
  std::uint64_t allocations_current = 0, allocations_peak = 0, allocations_total = 0, frees_total = 0;
  std::uint64_t num_ooms = 0, num_alloc_retries = 0;
  /// Releases that waited for every pending free first (empty_cache, the retry after out of memory): PyTorch's
  /// num_sync_all_streams, its count of synchronize_and_free_events.
  std::uint64_t syncs_all_streams = 0;

  /// Counts an allocation; the reserved peak is the caller's (note_reserved), from whichever read of the
  /// stack it makes anyway.
  void on_allocate(std::size_t size) noexcept
  {
    allocated += size;
    allocated_peak = std::max(allocated_peak, allocated);
    ++allocations_current;
    allocations_peak = std::max(allocations_peak, allocations_current);
    ++allocations_total;
  }
  void on_free(std::size_t size) noexcept
  {
    allocated -= std::min(size, allocated);
    if (allocations_current > 0) --allocations_current;
    ++frees_total;
  }
  void note_reserved(std::size_t reserved) noexcept { reserved_peak = std::max(reserved_peak, reserved); }
  /// reset_peak_stats: each peak starts again from where its figure stands.
  void reset_peaks(std::size_t reserved) noexcept
  {
    allocated_peak = allocated;
    allocations_peak = allocations_current;
    reserved_peak = reserved;
  }
};

/// What memory_stats reads of one device, taken under its lock; all zero for a device without a stack.
struct stats_reading {
  slot_statistics counts{};
  strata::usage usage{};
  std::size_t held_bytes = 0;
  std::size_t limit = 0;
  stack_calls calls{};
};

/// memory_stats as one flat JSON object: PyTorch's keys where the meaning is the same, strata.* for the rest,
/// strata.stack naming the configured stack. O(keys); allocates the text.
std::string stats_json(const stats_reading& r, const std::string& stack_name);

/// strata_device_figures from one read of the stack and the plug-in's counts. O(1).
strata_device_figures device_figures_of(const stack_reading& r, const slot_statistics& counts, std::size_t limit,
                                        std::size_t device_memory) noexcept;

} // namespace strata::plugin
