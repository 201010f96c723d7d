// The torch backend's statistics: PyTorch's meaning of current, peak, allocated and freed, per pool kind, and
// its reset rules, over figures a stack reports.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <random>
#include <vector>

#include "device_statistics.hpp"

using namespace strata::plugin;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;
}

namespace {
/// A private pool holding one large segment, wholly parked.
pool_figures parked_large(std::size_t bytes)
{
  pool_figures p;
  p.segments[pool_figures::index(false)] = 1;
  p.segment_bytes[pool_figures::index(false)] = bytes;
  p.parked_bytes[pool_figures::index(false)] = bytes;
  p.parked_blocks[pool_figures::index(false)] = 1;
  return p;
}
} // namespace

TEST_CASE("device_statistics: a stat keeps current, peak and the totals added and removed")
{
  stat s;
  s.increase(100);
  s.increase(50);
  s.decrease(120);
  CHECK(s.current == 30);
  CHECK(s.peak == 150);
  CHECK(s.allocated == 150);
  CHECK(s.freed == 120);
  s.set(80);  // observed figures move by their difference
  CHECK(s.current == 80);
  CHECK(s.allocated == 200);
  s.set(10);
  CHECK(s.freed == 190);
  CHECK(s.peak == 150);
  s.reset_peak();
  CHECK(s.peak == 10);
  s.reset_accumulated();
  CHECK(s.allocated == 0);
  CHECK(s.freed == 0);
  CHECK(s.current == 10);
}

TEST_CASE("device_statistics: blocks count in their pool kind and in the aggregate; 1 MiB is still small")
{
  CHECK(kind_of(1) == pool_kind::small_pool);
  CHECK(kind_of(MiB) == pool_kind::small_pool);
  CHECK(kind_of(MiB + 1) == pool_kind::large_pool);
  CHECK(std::string(key_of(pool_kind::small_pool)) == "small_pool");

  device_statistics d;
  d.on_allocate(512, 500);
  d.on_allocate(4 * MiB, 4 * MiB - 7);
  CHECK(d.allocated_bytes[pool_kind::all].current == static_cast<std::int64_t>(512 + 4 * MiB));
  CHECK(d.allocated_bytes[pool_kind::small_pool].current == 512);
  CHECK(d.allocated_bytes[pool_kind::large_pool].current == static_cast<std::int64_t>(4 * MiB));
  CHECK(d.requested_bytes[pool_kind::all].current == static_cast<std::int64_t>(500 + 4 * MiB - 7));
  CHECK(d.allocation[pool_kind::all].current == 2);
  CHECK(d.allocation[pool_kind::small_pool].current == 1);
  d.on_free(4 * MiB, 4 * MiB - 7);
  CHECK(d.allocated_bytes[pool_kind::large_pool].current == 0);
  CHECK(d.allocated_bytes[pool_kind::large_pool].peak == static_cast<std::int64_t>(4 * MiB));
  CHECK(d.allocation[pool_kind::all].freed == 1);
  CHECK(d.requested_bytes[pool_kind::all].current == 500);
}

TEST_CASE("device_statistics: reserved, segments, inactive split and active follow the stack's figures")
{
  device_statistics d;
  d.on_allocate(3 * MiB, 3 * MiB);
  stack_figures f;
  f.reserved = 8 * MiB;
  f.in_use = 3 * MiB;
  f.chunks = 2;
  f.free_blocks = 1;
  f.device_allocs = 2;
  d.observe(f);
  CHECK(d.reserved_bytes[pool_kind::all].current == static_cast<std::int64_t>(8 * MiB));
  CHECK(d.reserved_bytes[pool_kind::large_pool].current == static_cast<std::int64_t>(8 * MiB));  // no small block live
  CHECK(d.reserved_bytes[pool_kind::small_pool].current == 0);
  CHECK(d.segment[pool_kind::all].current == 2);
  CHECK(d.inactive_split_bytes[pool_kind::all].current == static_cast<std::int64_t>(5 * MiB));
  CHECK(d.inactive_split[pool_kind::all].current == 1);
  CHECK(d.active_bytes[pool_kind::all].current == static_cast<std::int64_t>(3 * MiB));
  CHECK(d.active_bytes[pool_kind::large_pool].current == static_cast<std::int64_t>(3 * MiB));
  CHECK(d.num_device_alloc == 2);

  // Freed but held back for another stream: no longer allocated, still active (aggregate).
  d.on_free(3 * MiB, 3 * MiB);
  f.held_bytes = 3 * MiB;
  f.held_blocks = 1;
  d.observe(f);
  CHECK(d.allocated_bytes[pool_kind::all].current == 0);
  CHECK(d.active_bytes[pool_kind::all].current == static_cast<std::int64_t>(3 * MiB));
  CHECK(d.active[pool_kind::all].current == 1);
  CHECK(d.active_bytes[pool_kind::large_pool].current == 0);

  // Parked graph-pool pieces are inactive in PyTorch's view although strata counts them in use.
  f = stack_figures{.reserved = 8 * MiB, .in_use = 2 * MiB, .chunks = 1, .free_blocks = 1};
  d.observe(f, parked_large(2 * MiB));
  CHECK(d.inactive_split_bytes[pool_kind::all].current == static_cast<std::int64_t>(8 * MiB));
  CHECK(d.inactive_split[pool_kind::all].current == 2);
  CHECK(d.reserved_bytes[pool_kind::all].peak == static_cast<std::int64_t>(8 * MiB));
  CHECK(d.segment[pool_kind::all].current == 2);  // strata's chunk and the pool's segment
  CHECK(d.segment[pool_kind::large_pool].current == 2);
}

TEST_CASE("device_statistics: a private pool's segments count in their kind, as PyTorch counts a graph's segments")
{
  device_statistics d;
  d.on_allocate(pool_layout::block_bytes(512), 512);  // a small block outside the pools
  stack_figures f{.reserved = 4 * MiB, .in_use = 512, .chunks = 1, .free_blocks = 1};
  d.observe(f, {}, 1);  // it lies in one 2 MiB page
  CHECK(d.reserved_bytes[pool_kind::small_pool].current == static_cast<std::int64_t>(2 * MiB));
  const auto before_small = d.reserved_bytes[pool_kind::small_pool].current;
  const auto before_segments = d.segment[pool_kind::small_pool].current;
  // A capture takes a 2 MiB small segment from strata and hands out three 512-byte blocks of it.
  for (int i = 0; i < 3; ++i) d.on_allocate(512, 512);
  pool_figures pools;
  pools.segments[pool_figures::index(true)] = 1;
  pools.segment_bytes[pool_figures::index(true)] = 2 * MiB;
  pools.live_bytes[pool_figures::index(true)] = 3 * 512;
  pools.parked_bytes[pool_figures::index(true)] = 2 * MiB - 3 * 512;
  pools.parked_blocks[pool_figures::index(true)] = 1;
  f = stack_figures{.reserved = 6 * MiB, .in_use = 2 * MiB + 512, .chunks = 2, .free_blocks = 1};
  d.observe(f, pools, 1);
  CHECK(d.segment[pool_kind::small_pool].current - before_segments == 1);
  CHECK(d.reserved_bytes[pool_kind::small_pool].current - before_small == static_cast<std::int64_t>(2 * MiB));
  CHECK(d.reserved_bytes[pool_kind::small_pool].current + d.reserved_bytes[pool_kind::large_pool].current ==
        d.reserved_bytes[pool_kind::all].current);
  CHECK(d.segment[pool_kind::all].current == 3);
  CHECK(d.inactive_split_bytes[pool_kind::small_pool].current == static_cast<std::int64_t>(2 * MiB - 3 * 512));
  CHECK(d.inactive_split[pool_kind::small_pool].current == 1);
  CHECK(d.active_bytes[pool_kind::small_pool].current == 4 * 512);
  // Two more small blocks outside the pools, in the page of the first: reserved does not move.
  const auto small_now = d.reserved_bytes[pool_kind::small_pool].current;
  d.on_allocate(512, 512);
  d.on_allocate(512, 512);
  f.in_use += 1024;
  d.observe(f, pools, 1);
  CHECK(d.reserved_bytes[pool_kind::small_pool].current == small_now);
  // A small block in a page of its own brings that page in, as a new small segment would.
  d.on_allocate(512, 512);
  f.in_use += 512;
  d.observe(f, pools, 2);
  CHECK(d.reserved_bytes[pool_kind::small_pool].current - small_now == static_cast<std::int64_t>(2 * MiB));
  // Never what the large pool's live blocks need: a large block filling the rest leaves the small pool its live bytes.
  d.on_allocate(3 * MiB, 3 * MiB);
  f.in_use += 3 * MiB;
  f.reserved = f.in_use;
  d.observe(f, pools, 2);
  CHECK(d.reserved_bytes[pool_kind::large_pool].current >= d.allocated_bytes[pool_kind::large_pool].current);
  CHECK(d.reserved_bytes[pool_kind::small_pool].current >= d.allocated_bytes[pool_kind::small_pool].current);
}

TEST_CASE("device_statistics: reset_peaks moves peaks to current; reset_accumulated clears totals and counts")
{
  device_statistics d;
  d.on_allocate(10 * MiB, 10 * MiB);
  d.observe(stack_figures{.reserved = 10 * MiB, .in_use = 10 * MiB, .chunks = 1, .device_allocs = 5, .device_frees = 1,
                          .alloc_retries = 3, .ooms = 2});
  CHECK(d.num_ooms == 2);
  CHECK(d.num_alloc_retries == 3);
  d.on_free(10 * MiB, 10 * MiB);
  d.reset_peaks();
  CHECK(d.allocated_bytes[pool_kind::all].peak == 0);
  CHECK(d.reserved_bytes[pool_kind::all].peak == static_cast<std::int64_t>(10 * MiB));
  CHECK(d.allocation[pool_kind::all].allocated == 1);  // totals survive a peak reset
  d.reset_accumulated();
  CHECK(d.allocation[pool_kind::all].allocated == 0);
  CHECK(d.allocated_bytes[pool_kind::all].freed == 0);
  CHECK(d.num_ooms == 0);
  CHECK(d.num_alloc_retries == 0);
  CHECK(d.num_device_alloc == 0);
  // Driver calls count again from the reset.
  d.observe(stack_figures{.reserved = 12 * MiB, .chunks = 2, .device_allocs = 6, .device_frees = 1, .alloc_retries = 3, .ooms = 3});
  CHECK(d.num_device_alloc == 1);
  CHECK(d.num_device_free == 0);
  CHECK(d.num_ooms == 1);
  CHECK(d.num_alloc_retries == 0);
}

TEST_CASE("device_statistics: random allocations and frees keep the aggregate the sum of the kinds")
{
  std::mt19937_64 rng(7);
  device_statistics d;
  std::vector<std::size_t> live;
  std::size_t sum = 0, checked = 0;
  for (int i = 0; i < 2000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const std::size_t n = 1 + rng() % (4 * MiB);
      d.on_allocate(n, n);
      live.push_back(n);
      sum += n;
    } else {
      const std::size_t k = rng() % live.size();
      d.on_free(live[k], live[k]);
      sum -= live[k];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    const auto& a = d.allocated_bytes;
    if (a[pool_kind::all].current == a[pool_kind::small_pool].current + a[pool_kind::large_pool].current &&
        a[pool_kind::all].current == static_cast<std::int64_t>(sum) &&
        d.allocation[pool_kind::all].current == static_cast<std::int64_t>(live.size()))
      ++checked;
  }
  CHECK(checked == 2000);
}

TEST_CASE("device_statistics: recount_live replaces the live figures, counting the differences")
{
  device_statistics d;
  d.on_allocate(4096, 4000);
  d.on_allocate(2 * MiB, 2 * MiB);
  const std::vector<std::pair<std::size_t, std::size_t>> now{{4096, 4000}, {8192, 8192}, {8192, 8000}};
  d.recount_live(now);
  CHECK(d.allocation[pool_kind::all].current == 3);
  CHECK(d.allocated_bytes[pool_kind::all].current == 4096 + 8192 * 2);
  CHECK(d.allocated_bytes[pool_kind::large_pool].current == 0);
  CHECK(d.allocated_bytes[pool_kind::large_pool].freed == static_cast<std::int64_t>(2 * MiB));
  CHECK(d.requested_bytes[pool_kind::small_pool].current == 4000 + 8192 + 8000);
  d.observe(stack_figures{});
  CHECK(d.active_bytes[pool_kind::small_pool].current == 4096 + 8192 * 2);
}

TEST_CASE("device_statistics: a block counts in its request's kind, as a no-split pool's whole small segment does")
{
  device_statistics d;
  d.on_allocate(2 * MiB, 512);  // a 512-byte request handed a whole 2 MiB small segment
  CHECK(d.allocated_bytes[pool_kind::small_pool].current == static_cast<std::int64_t>(2 * MiB));
  CHECK(d.allocated_bytes[pool_kind::large_pool].current == 0);
  d.on_free(2 * MiB, 512);
  CHECK(d.allocated_bytes[pool_kind::small_pool].current == 0);
  CHECK(d.allocation[pool_kind::small_pool].freed == 1);
  CHECK(d.allocation[pool_kind::large_pool].allocated == 0);
}

TEST_CASE("device_statistics: one call's change of live and held blocks moves active's aggregate by the net only")
{
  device_statistics d;
  d.on_allocate(2 * MiB, 2 * MiB);
  d.on_free(2 * MiB, 2 * MiB);
  d.observe(stack_figures{.reserved = 4 * MiB, .in_use = 2 * MiB, .chunks = 1, .held_bytes = 2 * MiB, .held_blocks = 1});
  const auto before = d.active_bytes[pool_kind::all];
  // The allocation reaped the held block in the same call: as many bytes active as before, none added.
  d.on_allocate(2 * MiB, 2 * MiB);
  d.observe(stack_figures{.reserved = 4 * MiB, .in_use = 2 * MiB, .chunks = 1});
  CHECK(d.active_bytes[pool_kind::all].current == before.current);
  CHECK(d.active_bytes[pool_kind::all].allocated == before.allocated);
  CHECK(d.active_bytes[pool_kind::all].freed == before.freed);
  CHECK(d.active[pool_kind::all].current == 1);
  // The kind's figure has no held part: it counts the block itself.
  CHECK(d.active_bytes[pool_kind::large_pool].current == static_cast<std::int64_t>(2 * MiB));
  CHECK(d.active_bytes[pool_kind::large_pool].allocated == static_cast<std::int64_t>(4 * MiB));
}

TEST_CASE("device_statistics: the small pool reserves its live blocks, the large pool the rest; each aggregate sums its kinds")
{
  device_statistics d;
  std::mt19937 rng(11);
  std::vector<std::size_t> live;
  std::size_t live_bytes = 0;
  int checked = 0;
  for (int i = 0; i < 2000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const std::size_t n = rng() % 2 == 0 ? 512 * (1 + rng() % 2048) : MiB * (1 + rng() % 64);  // small and large
      d.on_allocate(n, n);
      live.push_back(n);
      live_bytes += n;
    } else {
      const std::size_t k = rng() % live.size();
      d.on_free(live[k], live[k]);
      live_bytes -= live[k];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    stack_figures f;
    f.in_use = live_bytes;
    f.reserved = live_bytes + (rng() % 64) * MiB;
    f.releasable = (f.reserved - f.in_use) / 2;
    f.chunks = 1 + live.size() / 4;
    std::size_t small_live = 0;
    for (std::size_t n : live) small_live += n <= MiB ? n : 0;
    const std::size_t pages = small_live == 0 ? 0 : (small_live + 2 * MiB - 1) / (2 * MiB) + rng() % 3;
    d.observe(f, {}, pages);
    for (const stat_array* a : {&d.reserved_bytes, &d.segment, &d.inactive_split_bytes, &d.inactive_split, &d.allocated_bytes}) {
      CHECK((*a)[pool_kind::all].current == (*a)[pool_kind::small_pool].current + (*a)[pool_kind::large_pool].current);
      ++checked;
    }
    // The small pool: the pages of its live blocks, never less than those blocks, never what large ones need.
    const auto small_reserved = static_cast<std::size_t>(d.reserved_bytes[pool_kind::small_pool].current);
    CHECK(small_reserved >= small_live);
    CHECK(small_reserved <= std::max(small_live, pages * 2 * MiB));
    if (f.reserved - f.in_use >= pages * 2 * MiB) CHECK(small_reserved == std::max(small_live, pages * 2 * MiB));
    CHECK(d.reserved_bytes[pool_kind::large_pool].current >= d.allocated_bytes[pool_kind::large_pool].current);
    CHECK(d.inactive_split_bytes[pool_kind::all].current ==
          static_cast<std::int64_t>(f.reserved - f.in_use - f.releasable));
  }
  CHECK(checked == 10000);
}

TEST_CASE("device_statistics: releasable idle memory is not inactive split; parked blocks are, and are not allocated")
{
  device_statistics d;
  d.on_allocate(4 * MiB, 4 * MiB);
  d.on_free(4 * MiB, 4 * MiB);  // parked in a graph pool: strata keeps it, PyTorch sees it free
  stack_figures f{.reserved = 16 * MiB, .in_use = 6 * MiB, .chunks = 2, .free_blocks = 3};
  f.releasable = 8 * MiB;  // whole pages empty_cache would unmap
  d.observe(f, parked_large(4 * MiB));
  CHECK(d.allocated_bytes[pool_kind::all].current == 0);
  CHECK(d.allocation[pool_kind::all].current == 0);
  CHECK(d.inactive_split_bytes[pool_kind::all].current == static_cast<std::int64_t>(2 * MiB + 4 * MiB));
  f.releasable = 0;
  d.observe(f, parked_large(4 * MiB));
  CHECK(d.inactive_split_bytes[pool_kind::all].current == static_cast<std::int64_t>(10 * MiB + 4 * MiB));
}
