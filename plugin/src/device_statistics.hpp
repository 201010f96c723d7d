#pragma once
// One device's memory statistics with PyTorch's meaning (torch.cuda.memory_stats), kept without PyTorch so the
// host tests check them: the torch backend copies them into c10's DeviceStats field by field.
//
// What strata can say exactly, and how it maps:
// - allocated / requested / allocation: the blocks handed to PyTorch and not freed, counted by the backend
//   at each allocate and free at their PyTorch sizes (Note [Private pools are laid out as PyTorch lays them
//   out], pool_layout.hpp), per pool kind (small: at most 1 MiB, PyTorch's small-pool limit).
// - reserved / segment: strata's own usage (bytes held from CUDA, chunks), observed after each call, and the
//   private pools' segments (taken from that usage) in their own kinds. Outside the private pools the small
//   pool holds the pages its live blocks lie in (Note [The small pool outside the private pools]), the large
//   pool the rest, and every chunk is the large pool's, so each aggregate is the sum of its kinds.
//
// Note [The small pool outside the private pools]
// Outside the private pools strata has one pool per device, not a small and a large one, so PyTorch's split
// of reserved bytes between its small pool (2 MiB segments of blocks up to 1 MiB) and its large pool has no
// counterpart to read off. The closest is where the small blocks are: the 2 MiB pages holding at least one live
// small block are the small pool's, as PyTorch's small segments are (block_table::small_pages). A few more
// small blocks beside the others move nothing, as a few more blocks in PyTorch's small segments do not; the
// small pool never takes what the large pool's live blocks need.
// - active: allocated, plus (aggregate only) blocks freed but held back for other streams' work.
// - inactive_split: the free bytes inside strata's reserved memory that a release would not hand back, in the
//   large pool (idle pages and wholly free chunks are PyTorch's unsplit free segments, not "inactive split"),
//   and the private pools' parked pieces in their kinds.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "pool_layout.hpp"

namespace strata::plugin {

/// A figure as PyTorch keeps it: the current value, its peak since the last reset, and the totals added and
/// removed since the last accumulated reset. O(1), no lock (the owner holds the device's).
struct stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void increase(std::size_t n) noexcept
  {
    current += static_cast<std::int64_t>(n);
    allocated += static_cast<std::int64_t>(n);
    if (current > peak) peak = current;
  }
  void decrease(std::size_t n) noexcept
  {
    current -= static_cast<std::int64_t>(n);
    freed += static_cast<std::int64_t>(n);
  }
  /// Moves the current value to `value`, counting the difference as added or removed.
  void set(std::size_t value) noexcept
  {
    const auto v = static_cast<std::int64_t>(value);
    if (v > current) increase(static_cast<std::size_t>(v - current));
    else decrease(static_cast<std::size_t>(current - v));
  }
  void reset_peak() noexcept { peak = current; }
  void reset_accumulated() noexcept { allocated = freed = 0; }
};

/// PyTorch's pool kinds, in the order of c10's StatType and memory_stats()' keys.
enum class pool_kind : std::size_t { all = 0, small_pool = 1, large_pool = 2 };
inline constexpr std::size_t pool_kinds = 3;
/// PyTorch serves requests up to this size from its small pool: the split the statistics follow.
inline constexpr std::size_t small_request_limit = std::size_t{1} << 20;

constexpr pool_kind kind_of(std::size_t bytes) noexcept
{
  return bytes <= small_request_limit ? pool_kind::small_pool : pool_kind::large_pool;
}
constexpr const char* key_of(pool_kind k) noexcept
{
  return k == pool_kind::all ? "all" : k == pool_kind::small_pool ? "small_pool" : "large_pool";
}

/// One figure per pool kind; a change to a block's kind changes the aggregate too.
struct stat_array {
  std::array<stat, pool_kinds> kinds{};

  stat& operator[](pool_kind k) noexcept { return kinds[static_cast<std::size_t>(k)]; }
  const stat& operator[](pool_kind k) const noexcept { return kinds[static_cast<std::size_t>(k)]; }
  void increase(pool_kind k, std::size_t n) noexcept
  {
    (*this)[pool_kind::all].increase(n);
    (*this)[k].increase(n);
  }
  void decrease(pool_kind k, std::size_t n) noexcept
  {
    (*this)[pool_kind::all].decrease(n);
    (*this)[k].decrease(n);
  }
  void reset_peak() noexcept
  {
    for (auto& s : kinds) s.reset_peak();
  }
  void reset_accumulated() noexcept
  {
    for (auto& s : kinds) s.reset_accumulated();
  }
};

/// What strata's stack says about the device after a call: the figures the statistics observe.
struct stack_figures {
  std::size_t reserved = 0;      ///< bytes held from CUDA
  std::size_t in_use = 0;        ///< bytes of blocks not free in the stack (held and parked ones included)
  std::size_t chunks = 0;        ///< segments held from CUDA
  std::size_t free_blocks = 0;   ///< free ranges inside the reserved memory
  std::size_t held_bytes = 0;    ///< freed blocks waiting for other streams' work
  std::size_t held_blocks = 0;
  std::uint64_t device_allocs = 0;  ///< driver allocations since the stack was built
  std::uint64_t device_frees = 0;
  std::uint64_t alloc_retries = 0;  ///< allocations retried after releasing idle memory, since built
  std::uint64_t ooms = 0;           ///< allocations refused as out of memory, since built
  std::uint64_t syncs_all_streams = 0;  ///< releases that waited for every pending free, since built
  std::size_t releasable = 0;       ///< idle bytes a release would hand back (free pages, wholly free chunks)
};

/// The statistics of torch.cuda.memory_stats() for one device. Models: PyTorch's DeviceStats (same figures,
/// same reset rules). Cost: O(1) per event; not thread-safe (the backend holds the device's lock).
class device_statistics {
public:
  stat_array allocation, segment, active, inactive_split;
  stat_array allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
  std::int64_t num_alloc_retries = 0;  ///< observed: the stack counts them
  std::int64_t num_ooms = 0;           ///< observed: the stack counts them
  std::int64_t num_sync_all_streams = 0;  ///< observed: the slot counts them
  std::int64_t num_device_alloc = 0;
  std::int64_t num_device_free = 0;

  /// A block of `bytes` (asked for `requested`) handed out. Its kind is the request's block's: a private pool
  /// serves a request only from segments of that kind, though a piece handed out whole may be larger (a
  /// no-split pool hands a small request a whole small segment).
  void on_allocate(std::size_t bytes, std::size_t requested) noexcept
  {
    const pool_kind k = kind_of(pool_layout::block_bytes(requested));
    allocation.increase(k, 1);
    allocated_bytes.increase(k, bytes);
    requested_bytes.increase(k, requested);
    active[k].increase(1);
    active_bytes[k].increase(bytes);
    ++live_blocks_;
    live_bytes_ += bytes;
  }
  /// A block handed out by on_allocate is freed (or parked for a graph pool), counted in the kind it was.
  void on_free(std::size_t bytes, std::size_t requested) noexcept
  {
    const pool_kind k = kind_of(pool_layout::block_bytes(requested));
    allocation.decrease(k, 1);
    allocated_bytes.decrease(k, bytes);
    requested_bytes.decrease(k, requested);
    active[k].decrease(1);
    active_bytes[k].decrease(bytes);
    --live_blocks_;
    live_bytes_ -= bytes;
  }
  /// The stack's figures after a call, the private pools' segments and pieces (their segments are in the
  /// stack's reserved and in_use; their parked pieces are free in PyTorch's view) and the 2 MiB pages holding
  /// live small blocks outside the pools.
  void observe(const stack_figures& f, const pool_figures& pools = {}, std::size_t small_pages = 0) noexcept
  {
    constexpr std::size_t small = pool_figures::index(true), large = pool_figures::index(false);
    // The private pools' segments are in their kinds. Of the rest of what strata holds, the small pool holds
    // the pages of its live blocks and the large pool the remainder (Note [The small pool outside the private
    // pools]). Each aggregate is the sum of its kinds.
    const std::size_t pool_small = std::min(pools.segment_bytes[small], f.reserved);
    const std::size_t rest = f.reserved - std::min(f.reserved, pools.segment_bytes[small] + pools.segment_bytes[large]);
    const std::size_t small_outside = outside_pools(pool_kind::small_pool, pools.live_bytes[small]);
    const std::size_t room = rest - std::min(rest, outside_pools(pool_kind::large_pool, pools.live_bytes[large]));
    const std::size_t small_reserved = pool_small + std::min(std::max(small_outside, small_pages * pool_layout::small_segment), room);
    reserved_bytes[pool_kind::small_pool].set(small_reserved);
    reserved_bytes[pool_kind::large_pool].set(f.reserved - small_reserved);
    reserved_bytes[pool_kind::all].set(f.reserved);
    segment[pool_kind::small_pool].set(pools.segments[small]);
    segment[pool_kind::large_pool].set(f.chunks + pools.segments[large]);
    segment[pool_kind::all].set(f.chunks + pools.segments[small] + pools.segments[large]);
    // Inactive split: free memory inside what strata holds that cannot go back as it is (empty_cache's
    // releasable pages are not split, as PyTorch's wholly free segments are not), and parked pieces.
    const std::size_t unused = f.reserved - (f.in_use < f.reserved ? f.in_use : f.reserved);
    const std::size_t split = unused - (f.releasable < unused ? f.releasable : unused);
    inactive_split_bytes[pool_kind::small_pool].set(pools.parked_bytes[small]);
    inactive_split_bytes[pool_kind::large_pool].set(split + pools.parked_bytes[large]);
    inactive_split_bytes[pool_kind::all].set(split + pools.parked_bytes[small] + pools.parked_bytes[large]);
    inactive_split[pool_kind::small_pool].set(pools.parked_blocks[small]);
    inactive_split[pool_kind::large_pool].set(f.free_blocks + pools.parked_blocks[large]);
    inactive_split[pool_kind::all].set(f.free_blocks + pools.parked_blocks[small] + pools.parked_blocks[large]);
    // The aggregate moves once per call by the net change of live plus held, as one observed figure.
    active[pool_kind::all].set(live_blocks_ + f.held_blocks);
    active_bytes[pool_kind::all].set(live_bytes_ + f.held_bytes);
    last_ = f;
    num_device_alloc = static_cast<std::int64_t>(f.device_allocs - base_.device_allocs);
    num_device_free = static_cast<std::int64_t>(f.device_frees - base_.device_frees);
    num_alloc_retries = static_cast<std::int64_t>(f.alloc_retries - base_.alloc_retries);
    num_ooms = static_cast<std::int64_t>(f.ooms - base_.ooms);
    num_sync_all_streams = static_cast<std::int64_t>(f.syncs_all_streams - base_.syncs_all_streams);
  }

  /// After blocks changed wholesale (a graph pool's checkpoint restored): the live figures recounted from
  /// `live` ({size, requested} of every block live now), each difference counted as added or removed.
  template <class Range>
  void recount_live(const Range& live) noexcept
  {
    device_statistics fresh;
    for (const auto& [bytes, requested] : live) fresh.on_allocate(bytes, requested);
    const std::pair<stat_array*, const stat_array*> pairs[] = {{&allocation, &fresh.allocation},
                                                               {&allocated_bytes, &fresh.allocated_bytes},
                                                               {&requested_bytes, &fresh.requested_bytes}};
    for (const auto& [to, from] : pairs)
      for (std::size_t k = 0; k < pool_kinds; ++k) to->kinds[k].set(static_cast<std::size_t>(from->kinds[k].current));
    for (pool_kind k : {pool_kind::small_pool, pool_kind::large_pool}) {
      active[k].set(static_cast<std::size_t>(fresh.active[k].current));
      active_bytes[k].set(static_cast<std::size_t>(fresh.active_bytes[k].current));
    }
    live_blocks_ = fresh.live_blocks_;
    live_bytes_ = fresh.live_bytes_;
  }

  void reset_peaks() noexcept
  {
    for (stat_array* a : arrays()) a->reset_peak();
  }
  /// PyTorch's resetAccumulatedStats: totals added and removed, retries, out-of-memories and driver calls.
  void reset_accumulated() noexcept
  {
    for (stat_array* a : arrays()) a->reset_accumulated();
    num_alloc_retries = num_ooms = num_sync_all_streams = 0;
    base_ = last_;
    num_device_alloc = num_device_free = 0;
  }

private:
  /// A kind's allocated bytes outside the private pools.
  std::size_t outside_pools(pool_kind k, std::size_t in_pools) const noexcept
  {
    const auto live = static_cast<std::size_t>(std::max<std::int64_t>(allocated_bytes[k].current, 0));
    return live - std::min(live, in_pools);
  }

  std::array<stat_array*, 9> arrays() noexcept
  {
    return {&allocation, &segment, &active, &inactive_split, &allocated_bytes, &reserved_bytes, &active_bytes,
            &inactive_split_bytes, &requested_bytes};
  }

  /// Blocks handed out and not freed: active's aggregate is these plus the blocks held for other streams.
  std::size_t live_blocks_ = 0;
  std::size_t live_bytes_ = 0;
  stack_figures base_{}, last_{};  ///< the counts at the last accumulated reset, and the newest
};

} // namespace strata::plugin
