// memory_stats' JSON and the device figures of the C ABI (slot_statistics.hpp).
#include "slot_statistics.hpp"

#include <nlohmann/json.hpp>

namespace strata::plugin {

std::string stats_json(const stats_reading& r, const std::string& stack_name)
{
  const slot_statistics& st = r.counts;
  const strata::usage& u = r.usage;
  // In this order: readers that print the object show PyTorch's figures first.
  nlohmann::ordered_json out;
  out["allocated_bytes.all.current"] = st.allocated;
  out["allocated_bytes.all.peak"] = st.allocated_peak;
  out["active_bytes.all.current"] = st.allocated + r.held_bytes;
  out["reserved_bytes.all.current"] = u.reserved;
  out["reserved_bytes.all.peak"] = std::max(st.reserved_peak, u.reserved);
  out["allocation.all.current"] = st.allocations_current;
  out["allocation.all.peak"] = st.allocations_peak;
  out["allocation.all.allocated"] = st.allocations_total;
  out["allocation.all.freed"] = st.frees_total;
  out["segment.all.current"] = u.chunks;
  out["num_alloc_retries"] = st.num_alloc_retries;
  out["num_ooms"] = st.num_ooms;
  out["num_sync_all_streams"] = st.syncs_all_streams;
  out["strata.fragmentation"] = u.fragmentation();
  out["strata.largest_free"] = u.largest_free;
  out["strata.in_use_bytes"] = u.in_use;
  out["strata.held_for_other_streams_bytes"] = r.held_bytes;
  out["strata.limit_bytes"] = r.limit;
  // What the stack asked of CUDA so far (counts since the stack was built): a loop whose counts grow per step
  // pays driver calls or waits every step.
  const stack_calls& calls = r.calls;
  out["strata.calls.events"] = calls.events;
  out["strata.calls.stream_waits"] = calls.stream_waits;
  out["strata.calls.host_waits"] = calls.host_waits;
  out["strata.calls.policy"] = calls.policy_calls;
  out["strata.calls.relocations"] = calls.relocations;
  out["strata.calls.page_maps"] = calls.pages.maps;
  out["strata.calls.page_unmaps"] = calls.pages.unmaps;
  out["strata.calls.page_creates"] = calls.pages.creates;
  out["strata.calls.page_releases"] = calls.pages.releases;
  out["strata.calls.page_access"] = calls.pages.access_calls;
  out["strata.calls.page_device_waits"] = calls.pages.synchronizes;
  out["strata.stack"] = stack_name;
  return out.dump();
}

strata_device_figures device_figures_of(const stack_reading& r, const slot_statistics& counts, std::size_t limit,
                                        std::size_t device_memory) noexcept
{
  return {.reserved = r.usage.reserved,
          .in_use = r.usage.in_use,
          .largest_free = r.usage.largest_free,
          .chunks = r.usage.chunks,
          .free_blocks = r.usage.free_blocks,
          .held_bytes = r.held_bytes,
          .held_blocks = r.held_blocks,
          .allocated = counts.allocated,
          .limit = limit,
          .device_memory = device_memory,
          .device_allocs = r.page_creates,
          .device_frees = r.page_releases,
          .alloc_retries = counts.num_alloc_retries,
          .ooms = counts.num_ooms,
          .releasable = r.releasable,
          .page_maps = r.page_maps,
          .page_unmaps = r.page_unmaps,
          .syncs_all_streams = counts.syncs_all_streams};
}

} // namespace strata::plugin
