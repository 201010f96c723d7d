#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <strata/core/snapshot.hpp>
#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/mapped_pool.hpp>
#include "support/conformance.hpp"
#include "support/invariants.hpp"
#include "../plugin/bench/steady_loop.hpp"

using namespace strata;
using pool_t = mapped_pool<simulated_pages>;
using op = simulated_pages::operation;

namespace {

constexpr std::size_t page = std::size_t{2} << 20;
constexpr std::size_t mib = std::size_t{1} << 20;

/// The pool's own figures agree with the pretend device's: what the pool says it holds exists, and every
/// live byte sits on mapped, accessible memory.
void check_against_device(const pool_t& pool, const testing::live_set& live)
{
  const simulated_pages& device = pool.backend();
  REQUIRE(pool.physical_bytes() == device.bytes_alive());
  REQUIRE(pool.usage().reserved == device.bytes_alive());
  REQUIRE(device.bytes_mapped() == device.bytes_alive() + pool.stale_bytes());  // nothing physical sits unmapped; aliases only where relocations left them
  REQUIRE(pool.idle_bytes() <= pool.physical_bytes());
  for (const auto& b : live.blocks()) REQUIRE(device.is_usable(reinterpret_cast<std::uintptr_t>(b.p), b.bytes));
}

struct pool_figures {
  usage u;
  std::size_t device_bytes;
  bool operator==(const pool_figures&) const = default;
};
pool_figures figures_of(const pool_t& pool) { return {pool.usage(), pool.backend().bytes_alive()}; }

/// After a failed allocate: every live block and figure of use as before; only idle memory may have gone back
/// to the device (reclaimed trying to stay under a cap).
void check_unchanged_but_idle(const pool_figures& before, const pool_t& pool)
{
  const pool_figures after = figures_of(pool);
  CHECK(after.u.in_use == before.u.in_use);
  CHECK(after.u.used_blocks == before.u.used_blocks);
  CHECK(after.u.free_blocks == before.u.free_blocks);
  CHECK(after.u.reserved <= before.u.reserved);
  CHECK(after.device_bytes == after.u.reserved);
}

} // namespace

static_assert(resource<pool_t> && owning_resource<pool_t> && releasable_resource<pool_t> && sized_resource<pool_t>);
static_assert(usage_reporting_resource<pool_t> && snapshot_resource<pool_t> && room_reporting_resource<pool_t>);
static_assert(!has_property<pool_t, device_accessible> && !has_property<pool_t, host_accessible>);
static_assert(!std::is_copy_constructible_v<pool_t> && std::is_nothrow_move_constructible_v<pool_t>);

TEST_CASE("mapped_pool conforms")
{
  pool_t pool;
  testing::check_conformance(pool, {.max_alignment = 1 << 30, .rejects_above = 1 << 30});
}

TEST_CASE("mapped_pool: randomized, every live byte on mapped memory, usage exact, everything back at the end")
{
  // The defaults, then mappings that always reach ahead and split often (runs of 2-8 pages).
  // Last, relocation with a small stale limit, so stale ranges are unmapped and given back often.
  const pool_t::options eager{.max_mapping = 16 * mib, .min_mapping = 12 * mib, .min_mapping_fraction = 1.0};
  const pool_t::options moving{.relocate_idle = true, .stale_address_limit = 256 * mib};
  for (const auto& [log_uniform, opts] : {std::pair{true, pool_t::options{}}, std::pair{false, pool_t::options{}}, std::pair{true, eager},
                                          std::pair{false, moving}}) {
    CAPTURE(log_uniform);
    CAPTURE(opts.min_mapping);
    pool_t pool{simulated_pages{}, opts};
    std::mt19937_64 rng(log_uniform ? 7 : 8);
    std::uniform_real_distribution<double> log_size(0, std::log2(64.0 * mib));
    std::uniform_int_distribution<std::size_t> uniform_size(1, 8 * mib);
    std::uniform_int_distribution<int> percent(0, 99);
    testing::live_set live;
    std::size_t allocations = 0;
    for (int step = 0; step < 20'000; ++step) {
      if (live.size() == 0 || (live.size() < 300 && percent(rng) < 50)) {
        const std::size_t bytes = log_uniform ? static_cast<std::size_t>(std::exp2(log_size(rng))) : uniform_size(rng);
        const std::size_t align = percent(rng) < 10 ? std::size_t{1} << (8 + percent(rng) % 14) : default_alignment;
        void* p = pool.allocate(bytes, align);  // no cap: a refusal is a failure
        REQUIRE(is_aligned(p, align));
        REQUIRE(live.add({p, bytes, align}));
        ++allocations;
      } else {
        const auto b = live.take(std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng));
        pool.deallocate(b.p, b.bytes, b.alignment);
      }
      testing::check_usage(pool, live);
      if (step % 16 == 0) check_against_device(pool, live);
    }
    CHECK(allocations > 9'000);
    CHECK(pool.page_calls().creates > 0);
    if (opts.relocate_idle) {
      MESSAGE("relocations " << pool.relocations() << ", device waits " << pool.page_calls().synchronizes);
      CHECK(pool.relocations() > 10);
      CHECK(pool.page_calls().synchronizes > 0);  // the stale limit was reached
    }
    while (live.size() > 0) {
      const auto b = live.take(0);
      pool.deallocate(b.p, b.bytes, b.alignment);
    }
    CHECK(pool.usage().in_use == 0);
    CHECK(pool.release() > 0);
    CHECK(pool.physical_bytes() == 0);
    CHECK(pool.backend().bytes_alive() == 0);
    CHECK(pool.backend().bytes_mapped() == 0);
    CHECK(pool.page_calls().creates == pool.page_calls().releases);
  }
}

TEST_CASE("mapped_pool: physical memory follows the live blocks, not the address range's high-water mark")
{
  pool_t pool{simulated_pages{}, {.small_limit = mib, .reclaim_slack = 0, .reclaim_slack_fraction = 0.0, .relocate_idle = false}};
  void* a = pool.allocate(8 * mib);
  void* b = pool.allocate(8 * mib);
  CHECK(pool.physical_bytes() == 16 * mib);
  CHECK(pool.mappings() == 2);
  pool.deallocate(a, 8 * mib);
  CHECK(pool.idle_bytes() == 8 * mib);  // still mapped: reused in place at no cost
  void* again = pool.allocate(6 * mib);
  CHECK(again == a);
  CHECK(pool.page_calls().creates == 2);
  pool.deallocate(again, 6 * mib);
  // 16 MiB cannot fit the 8 MiB hole: new memory, and the idle mapping goes back first (one device wait).
  void* c = pool.allocate(16 * mib);
  CHECK(pool.page_calls().synchronizes == 1);
  CHECK(pool.page_calls().unmaps == 1);
  CHECK(pool.physical_bytes() == 24 * mib);
  CHECK(pool.idle_bytes() == 0);
  for (auto [p, n] : {std::pair{b, 8 * mib}, std::pair{c, 16 * mib}}) pool.deallocate(p, n);
  CHECK(pool.release() == 24 * mib);
  CHECK(pool.page_calls().synchronizes == 2);
  CHECK(pool.backend().bytes_alive() == 0);
}

TEST_CASE("mapped_pool: idle memory goes back only to keep the pool under its high-water mark; release() lowers the mark")
{
  pool_t pool{simulated_pages{}, {.min_mapping = 0, .relocate_idle = false}};
  void* a = pool.allocate(16 * mib);
  void* b = pool.allocate(16 * mib);
  pool.deallocate(a, 16 * mib);
  // 20 MiB fits no hole: new memory would lift the pool from 32 to 52 MiB, while the 36 MiB live afterwards
  // need only 36: the idle 16 MiB go back first (one wait), and the pool holds exactly its new high-water mark.
  void* c = pool.allocate(20 * mib);
  CHECK(pool.page_calls().synchronizes == 1);
  CHECK(pool.page_calls().unmaps == 1);
  CHECK(pool.physical_bytes() == 36 * mib);
  CHECK(pool.peak_physical_bytes() == 36 * mib);
  pool.deallocate(c, 20 * mib);
  CHECK(pool.idle_bytes() == 20 * mib);  // no growth since: kept, and reused in place
  void* d = pool.allocate(18 * mib);
  CHECK(d == c);
  CHECK(pool.page_calls().creates == 3);
  pool.deallocate(d, 18 * mib);
  CHECK(pool.release() == 20 * mib);
  CHECK(pool.physical_bytes() == 16 * mib);
  // The mark is now 16 MiB: growing to 20 again is growth, and the pool has nothing idle to give back.
  void* e = pool.allocate(4 * mib);
  CHECK(pool.physical_bytes() == 20 * mib);
  CHECK(pool.page_calls().unmaps == 2);  // release()'s only
  for (auto [p, n] : {std::pair{b, 16 * mib}, std::pair{e, 4 * mib}}) pool.deallocate(p, n);
  CHECK(pool.release() == 20 * mib);
  CHECK(pool.backend().bytes_alive() == 0);
}

TEST_CASE("mapped_pool: a mapping at the edge reaches ahead to min_mapping, never past the cap")
{
  const pool_t::options ahead{.max_mapping = 32 * mib, .min_mapping = 8 * mib, .min_mapping_fraction = 0.5};
  pool_t pool{simulated_pages{}, ahead};
  void* big = pool.allocate(16 * mib);  // nothing held yet: half of nothing is no page ahead
  CHECK(pool.physical_bytes() == 16 * mib);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(pool.allocate(2 * mib));
  CHECK(pool.page_calls().creates == 2);  // one 8 MiB mapping serves all four
  CHECK(pool.physical_bytes() == 24 * mib);
  CHECK(pool.live_page_bytes() == 24 * mib);
  for (void* p : blocks) CHECK(pool.backend().is_usable(reinterpret_cast<std::uintptr_t>(p), 2 * mib));
  blocks.push_back(pool.allocate(2 * mib));  // the next run reaches ahead again
  CHECK(pool.page_calls().creates == 3);
  CHECK(pool.physical_bytes() == 32 * mib);
  for (void* p : blocks) pool.deallocate(p, 2 * mib);
  pool.deallocate(big, 16 * mib);
  CHECK(pool.live_page_bytes() == 0);
  CHECK(pool.peak_live_page_bytes() == 26 * mib);

  // Under a cap of 20 MiB the pages ahead would pass it: the pool maps what each block needs and no more.
  pool_t capped{simulated_pages{}, {.max_physical = 20 * mib, .max_mapping = 32 * mib, .min_mapping = 8 * mib, .min_mapping_fraction = 0.5}};
  void* p = capped.allocate(16 * mib);
  void* q = capped.allocate(2 * mib);
  void* r = capped.allocate(2 * mib);
  CHECK(capped.physical_bytes() == 20 * mib);
  CHECK_THROWS_AS((void)capped.allocate(2 * mib), out_of_memory);
  for (auto [x, n] : {std::pair{p, 16 * mib}, std::pair{q, 2 * mib}, std::pair{r, 2 * mib}}) capped.deallocate(x, n);
}

TEST_CASE("mapped_pool: growth past the high-water mark maps ahead by growth_ahead_fraction of what is held")
{
  // min_mapping 0: only the growth share maps ahead, so each difference below is that option's.
  const pool_t::options base{.max_mapping = 64 * mib, .min_mapping = 0};
  pool_t::options ahead = base;
  ahead.growth_ahead_fraction = 0.5;
  pool_t plain{simulated_pages{}, base}, growing{simulated_pages{}, ahead};
  std::vector<void*> in_plain, in_growing;
  for (int i = 0; i < 8; ++i) {  // a ramp: each 8 MiB block lifts the mark
    in_plain.push_back(plain.allocate(8 * mib));
    in_growing.push_back(growing.allocate(8 * mib));
    if (i == 0) CHECK(growing.physical_bytes() == 8 * mib);  // half of nothing held: no page ahead
  }
  CHECK(plain.page_calls().creates == 8);
  CHECK(growing.page_calls().creates < 8);  // mappings taken ahead serve the next blocks
  CHECK(growing.page_calls().creates >= 3);
  CHECK(growing.physical_bytes() >= 64 * mib);
  CHECK(growing.physical_bytes() <= 64 * mib + 32 * mib);  // at most half of what is held, ahead
  for (void* p : in_growing) CHECK(growing.backend().is_usable(reinterpret_cast<std::uintptr_t>(p), 8 * mib));
  for (void* p : in_growing) growing.deallocate(p, 8 * mib);
  for (void* p : in_plain) plain.deallocate(p, 8 * mib);
  CHECK(growing.release() == growing.peak_physical_bytes());
}

TEST_CASE("mapped_pool: small blocks share pages; a block spanning pages is wholly usable")
{
  pool_t pool;
  testing::live_set live;
  for (int i = 0; i < 64; ++i) {
    void* p = pool.allocate(100'000);
    REQUIRE(live.add({p, 100'000, 256}));
  }
  CHECK(pool.physical_bytes() <= 4 * page);  // 6.4 MB of small blocks on at most four 2 MiB pages
  void* big = pool.allocate(5 * mib + 3);
  REQUIRE(live.add({big, 5 * mib + 3, 256}));
  check_against_device(pool, live);
  while (live.size() > 0) {
    const auto b = live.take(0);
    pool.deallocate(b.p, b.bytes, b.alignment);
  }
}

TEST_CASE("mapped_pool: the physical cap is out_of_memory naming the pool, with nothing changed")
{
  pool_t pool{simulated_pages{}, {.max_physical = 64 * mib}};
  std::vector<void*> blocks;
  try {
    for (;;) blocks.push_back(pool.allocate(10 * mib));
  } catch (const out_of_memory& e) {
    CHECK(std::string(e.what()).find("mapped_pool") != std::string::npos);
    CHECK(std::string(e.what()).find("cap") != std::string::npos);
  }
  CHECK(blocks.size() == 6);
  const pool_figures before = figures_of(pool);
  CHECK_THROWS_AS((void)pool.allocate(10 * mib), out_of_memory);
  CHECK(figures_of(pool) == before);
  // Idle memory is reclaimed before the cap refuses: free two, and a 16 MiB block fits.
  pool.deallocate(blocks[0], 10 * mib);
  pool.deallocate(blocks[1], 10 * mib);
  void* p = pool.allocate(16 * mib);
  CHECK(pool.physical_bytes() <= 64 * mib);
  pool.deallocate(p, 16 * mib);
  for (std::size_t i = 2; i < blocks.size(); ++i) pool.deallocate(blocks[i], 10 * mib);
}

TEST_CASE("mapped_pool: set_max_physical moves the cap of a live pool, every tag's pool with it")
{
  for (const bool relocate : {false, true}) {
    pool_t pool{simulated_pages{}, {.relocate_idle = relocate}};
    std::mt19937 rng(relocate ? 2 : 1);
    std::vector<std::pair<void*, std::size_t>> live;
    std::size_t cap = 96 * mib;
    pool.set_max_physical(cap);
    CHECK(pool.settings().max_physical == cap);
    int served = 0, refused = 0;
    for (int i = 0; i < 600; ++i) {
      if (i == 300) {  // lowered below what may be held: no growth past it, idle memory goes back first
        cap = 48 * mib;
        pool.set_max_physical(cap);
      }
      if (!live.empty() && rng() % 3 == 0) {
        const std::size_t k = rng() % live.size();
        pool.deallocate(live[k].first, live[k].second);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        continue;
      }
      const std::size_t n = (1 + rng() % 12) * mib + rng() % 4096;
      const tag_id tag = static_cast<tag_id>(rng() % 2);
      const std::size_t before = pool.physical_bytes();
      try {
        live.emplace_back(pool.allocate_tagged(tag, n), n);
        ++served;
      } catch (const out_of_memory&) {
        ++refused;
        CHECK(pool.physical_bytes() <= std::max(before, cap));
        continue;
      }
      // Growth never lifts the pool past the cap; memory held above a lowered cap only shrinks.
      CHECK(pool.physical_bytes() <= std::max(before, cap));
    }
    CHECK(pool.physical_bytes() <= 48 * mib);  // the 96 MiB held before the cap fell has been worked off
    CHECK(served > 150);
    CHECK(refused > 0);
    for (auto [p, n] : live) pool.deallocate(p, n);
    pool.set_max_physical(SIZE_MAX);  // lifted: the pool grows again
    void* big = pool.allocate(200 * mib);
    CHECK(pool.physical_bytes() >= 200 * mib);
    pool.deallocate(big, 200 * mib);
  }
}

TEST_CASE("mapped_pool: at the cap, a request too large gives idle memory back and fails cleanly")
{
  for (const bool relocate : {false, true}) {
    CAPTURE(relocate);
    pool_t pool{simulated_pages{}, {.max_physical = 64 * mib, .reclaim_slack = 64 * mib, .relocate_idle = relocate}};
    std::vector<void*> blocks;
    for (int i = 0; i < 6; ++i) blocks.push_back(pool.allocate(10 * mib));
    pool.deallocate(blocks.front(), 10 * mib);  // a hole no 40 MiB block fits in
    blocks.erase(blocks.begin());
    CHECK(pool.idle_bytes() == 10 * mib);
    const pool_figures at_cap = figures_of(pool);
    CHECK_THROWS_AS((void)pool.allocate(40 * mib), out_of_memory);
    check_unchanged_but_idle(at_cap, pool);
    // Relocating the idle 10 MiB cannot bring the request under the cap: moved back, and reclaimed instead.
    CHECK(pool.physical_bytes() == 50 * mib);
    CHECK(pool.relocations() == 0);
    CHECK(pool.stale_bytes() == 0);
    for (void* b : blocks) pool.deallocate(b, 10 * mib);
  }
}

TEST_CASE("mapped_pool: a full device is out_of_memory with nothing changed")
{
  pool_t pool{simulated_pages{page, 32 * mib}};
  void* a = pool.allocate(30 * mib);
  const pool_figures before = figures_of(pool);
  CHECK_THROWS_AS((void)pool.allocate(4 * mib), out_of_memory);
  CHECK(figures_of(pool) == before);
  pool.deallocate(a, 30 * mib);
  void* b = pool.allocate(4 * mib);  // the idle 30 MiB is reclaimed under the device's limit
  CHECK(b != nullptr);
  pool.deallocate(b, 4 * mib);
}

TEST_CASE("mapped_pool: a failed device wait in a reclaim fails the allocation only when the cap needs the reclaim")
{
  // The 20 MiB request fits no hole and would lift the pool from 32 to 52 MiB: the idle 16 MiB go back first,
  // after one device wait, which fails here.
  for (const std::size_t cap : {SIZE_MAX, 40 * mib}) {
    CAPTURE(cap);
    pool_t pool{simulated_pages{}, {.max_physical = cap, .min_mapping = 0, .relocate_idle = false}};
    void* a = pool.allocate(16 * mib);
    void* b = pool.allocate(16 * mib);
    pool.deallocate(a, 16 * mib);
    pool.backend().fail_after(op::synchronize, 0);
    const pool_figures before = figures_of(pool);
    if (cap == SIZE_MAX) {  // under the cap anyway: the reclaim only kept memory low; the allocation goes on
      void* c = pool.allocate(20 * mib);
      CHECK(pool.page_calls().synchronizes == 0);
      CHECK(pool.physical_bytes() == 52 * mib);
      CHECK(pool.idle_bytes() == 16 * mib);  // kept for a later reclaim
      pool.deallocate(c, 20 * mib);
    } else {  // 52 MiB would break the cap: the failed wait fails the allocation, nothing changed
      CHECK_THROWS_AS((void)pool.allocate(20 * mib), std::runtime_error);
      CHECK(figures_of(pool) == before);
      void* c = pool.allocate(20 * mib);  // the next wait works: reclaimed, under the cap
      CHECK(pool.physical_bytes() == 36 * mib);
      pool.deallocate(c, 20 * mib);
    }
    pool.deallocate(b, 16 * mib);
    pool.release();
    CHECK(pool.backend().bytes_alive() == 0);
  }
}

TEST_CASE("mapped_pool: a failed driver call anywhere leaves the pool exactly as it was")
{
  for (const op which : {op::create, op::map, op::set_access, op::unmap, op::synchronize}) {
    for (std::uint64_t after = 0; after < 12; ++after) {
      const bool relocate = after >= 6;
      CAPTURE(static_cast<int>(which));
      CAPTURE(after);
      pool_t pool{simulated_pages{}, {.reclaim_slack = 0, .reclaim_slack_fraction = 0.0, .relocate_idle = relocate,
                                      .stale_address_limit = 64 * mib}};
      pool.backend().fail_after(which, after % 6);
      std::mt19937_64 rng(after % 6);
      testing::live_set live;
      int failures = 0, successes = 0;
      for (int step = 0; step < 400; ++step) {
        if (live.size() < 40 && (live.size() == 0 || rng() % 2 == 0)) {
          const std::size_t bytes = std::size_t{1} << (10 + rng() % 15);
          const pool_figures before = figures_of(pool);
          try {
            void* p = pool.allocate(bytes);
            REQUIRE(live.add({p, bytes, 256}));
            ++successes;
          } catch (const std::exception&) {
            ++failures;
            // Idle memory given back to stay under the high-water mark stays given back; nothing else moves.
            check_unchanged_but_idle(before, pool);
          }
        } else {
          const auto b = live.take(rng() % live.size());
          pool.deallocate(b.p, b.bytes);
        }
        check_against_device(pool, live);
      }
      CHECK(successes > 100);
      // A failed create, map or access call fails its allocation. A device wait or an unmap fails only inside
      // a reclaim, which never fails an allocation that fits under the cap (none here): the workload goes on.
      if (which == op::unmap || which == op::synchronize)
        CHECK(failures == 0);
      else
        CHECK(failures == 1);
      while (live.size() > 0) {
        const auto b = live.take(0);
        pool.deallocate(b.p, b.bytes);
      }
      try {
        pool.release();  // may meet the injected failure if the workload never did
      } catch (const std::runtime_error&) {
        CHECK(pool.backend().bytes_alive() == pool.physical_bytes());
      }
      pool.release();
      CHECK(pool.backend().bytes_alive() == 0);
    }
  }
}

TEST_CASE("mapped_pool: bad options are std::invalid_argument")
{
  CHECK_THROWS_AS(pool_t(simulated_pages{}, {.address_space = 0}), std::invalid_argument);
  CHECK_THROWS_AS(pool_t(simulated_pages{}, {.address_space = 3 * page}), std::invalid_argument);
  CHECK_THROWS_AS(pool_t(simulated_pages{}, {.max_physical = mib}), std::invalid_argument);
  CHECK_THROWS_AS(pool_t(simulated_pages{}, {.max_mapping = 4096}), std::invalid_argument);
  CHECK_THROWS_AS(pool_t(simulated_pages{}, {.reclaim_slack_fraction = 2.0}), std::invalid_argument);
  CHECK_THROWS_AS(pool_t(simulated_pages{}, {.min_mapping_fraction = -0.5}), std::invalid_argument);
  CHECK_THROWS_WITH_AS(pool_t(simulated_pages{}, {.growth_ahead_fraction = 1.5}),
                       doctest::Contains("growth_ahead_fraction 1.5"), std::invalid_argument);
  CHECK_THROWS_AS(pool_t(simulated_pages{}, {.placement_candidates = 0}), std::invalid_argument);
  CHECK_THROWS_AS(pool_t(simulated_pages{}, {.persistent_reclaim_window = 100}), std::invalid_argument);  // under 128
  CHECK_THROWS_AS(simulated_pages(3 * mib), std::invalid_argument);  // not a power-of-two page
}

TEST_CASE("mapped_pool: moves hand the memory over; the moved-from pool is empty and usable")
{
  pool_t a;
  void* p = a.allocate(3 * mib);
  pool_t b = std::move(a);
  CHECK(b.owns(p));
  CHECK_FALSE(a.owns(p));
  CHECK(a.usage().reserved == 0);
  void* q = a.allocate(1000);  // reserves its own range afresh
  CHECK(a.owns(q));
  a.deallocate(q, 1000);
  b.deallocate(p, 3 * mib);
  a = std::move(b);
  CHECK(a.usage().in_use == 0);
}

TEST_CASE("mapped_pool: has_room_for, good_size, snapshot")
{
  pool_t pool;
  CHECK_FALSE(pool.has_room_for(1000));  // nothing mapped yet
  void* p = pool.allocate(1000);
  CHECK(pool.has_room_for(1000));  // the rest of the page is mapped
  CHECK_FALSE(pool.has_room_for(64 * mib));
  CHECK(pool.good_size(1000) == 1024);
  CHECK(pool.good_size(SIZE_MAX) == SIZE_MAX);
  const strata::snapshot s = pool.snapshot();
  REQUIRE(s.segments.size() == 1);
  std::size_t covered = 0;
  for (const auto& b : s.segments[0].blocks) covered += b.size;
  CHECK(covered == s.segments[0].size);
  CHECK(to_json(s).find("mapped_pool") != std::string::npos);
  pool.deallocate(p, 1000);
}

TEST_CASE("mapped_pool: the snapshot lists every mapping made, where it is mapped, relocated ones included, and nothing once released")
{
  // Mapped bytes listed = what the device has mapped (stale ranges included): each listed range a whole
  // allocation, inside its segment, none overlapping; over a randomized run that relocates idle memory.
  pool_t::options opts;
  opts.relocate_idle = true;
  opts.max_physical = 96 * mib;
  pool_t pool(simulated_pages(page), opts);
  std::mt19937_64 rng(7);
  std::vector<std::pair<void*, std::size_t>> live;
  std::size_t after_relocation = 0;
  for (int step = 0; step < 1500; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const std::size_t bytes = 256 + rng() % (12 * mib);
      try {
        live.emplace_back(pool.allocate(bytes), bytes);
      } catch (const out_of_memory&) {
      }
    }
    if (!live.empty() && rng() % 2 == 0) {
      const std::size_t i = rng() % live.size();
      pool.deallocate(live[i].first, live[i].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (step % 50 != 0) continue;
    const strata::snapshot s = pool.snapshot();
    std::size_t listed = 0;
    for (const auto& seg : s.segments) {
      std::size_t end = 0;
      for (const auto& m : seg.mapped) {
        REQUIRE(m.offset >= end);  // address order, no overlap
        REQUIRE(m.size % page == 0);
        REQUIRE(m.offset + m.size <= seg.size);
        REQUIRE(pool.backend().mapping_at(seg.address + m.offset) == m.size);  // a mapping starts there, of that allocation's size
        end = m.offset + m.size;
        listed += m.size;
      }
    }
    REQUIRE(listed == pool.backend().bytes_mapped());
    if (pool.relocations() > 0) ++after_relocation;
  }
  CHECK(pool.relocations() > 0);
  CHECK(after_relocation > 0);  // the listing was checked while relocated allocations existed
  for (const auto& [p, bytes] : live) pool.deallocate(p, bytes);
  pool.release();
  for (const auto& seg : pool.snapshot().segments) CHECK(seg.mapped.empty());
  CHECK(to_json(pool.snapshot()).find("\"mapped\"") == std::string::npos);
}

TEST_CASE("mapped_pool: reclaim headroom lets a training-like loop settle instead of waiting for the device every few steps")
{
  // Each step: activations of varying sizes, some freed mid-step, all at its end; one long-lived block
  // replaced (gradients with set_to_none). The free layout shifts every step, so new mappings keep being
  // needed at the peak: without headroom each is a reclaim, a device-wide wait.
  struct outcome {
    std::uint64_t waits_first_half, waits_second_half;
    std::size_t peak_physical, peak_live;
    int served;
  };
  const auto run = [](double headroom, bool relocate) {
    pool_t pool{simulated_pages{}, {.reclaim_headroom_fraction = headroom, .relocate_idle = relocate}};
    std::mt19937 rng(7);
    testing::live_set all;  // overlap checks
    std::vector<testing::live_block> keep, step;
    std::size_t peak_live = 0, live = 0;
    int served = 0;
    const auto take = [&](std::vector<testing::live_block>& set, std::size_t n) {
      const testing::live_block b{pool.allocate(n), n, 256};
      REQUIRE(all.add(b));
      set.push_back(b);
      live += n;
      ++served;
    };
    const auto give = [&](std::vector<testing::live_block>& set, std::size_t index) {
      const testing::live_block b = set[index];
      set.erase(set.begin() + static_cast<std::ptrdiff_t>(index));
      REQUIRE(all.remove(b.p));
      pool.deallocate(b.p, b.bytes);
      live -= b.bytes;
    };
    for (int k = 0; k < 16; ++k) take(keep, (1 + rng() % 8) * mib);
    std::uint64_t waits_half = 0;
    for (int it = 0; it < 200; ++it) {
      for (int k = 0; k < 12; ++k) {
        take(step, (1 + rng() % 30) * mib + (rng() % 1000) * 4096);
        peak_live = std::max(peak_live, live);
        if (k % 3 == 2) give(step, step.size() - 2);
      }
      give(keep, rng() % keep.size());
      take(keep, (1 + rng() % 8) * mib + (rng() % 100) * 4096);
      check_against_device(pool, all);
      while (!step.empty()) give(step, step.size() - 1);
      if (it == 99) waits_half = pool.page_calls().synchronizes;
    }
    const outcome o{waits_half, pool.page_calls().synchronizes - waits_half, pool.peak_physical_bytes(), peak_live, served};
    while (!keep.empty()) give(keep, keep.size() - 1);
    pool.release();
    CHECK(pool.backend().bytes_alive() == 0);
    return o;
  };
  const outcome none = run(0.0, false), some = run(1.0 / 16, false), moved = run(0.0, true);
  MESSAGE("device waits (first/second 100 steps) without headroom " << none.waits_first_half << "/" << none.waits_second_half
          << ", with 1/16: " << some.waits_first_half << "/" << some.waits_second_half << "; peak physical / peak live "
          << double(none.peak_physical) / double(none.peak_live) << " vs " << double(some.peak_physical) / double(some.peak_live));
  CHECK(none.served == 200 * 13 + 16);
  CHECK(some.served == none.served);
  CHECK(none.waits_second_half >= 3);      // the loop keeps waiting without headroom...
  CHECK(some.waits_second_half == 0);      // ...and settles with it
  CHECK(some.waits_first_half < none.waits_first_half);
  CHECK(some.peak_physical <= none.peak_physical + none.peak_physical / 10);  // for at most a tenth more memory
  // Relocating idle memory instead of reclaiming it needs no wait at all, for a little more memory.
  MESSAGE("relocating: waits " << moved.waits_first_half << "/" << moved.waits_second_half << ", peak physical / peak live "
          << double(moved.peak_physical) / double(moved.peak_live));
  CHECK(moved.served == none.served);
  CHECK(moved.waits_first_half + moved.waits_second_half == 0);
  CHECK(moved.peak_physical <= none.peak_physical + none.peak_physical / 20);  // for at most a twentieth more memory
  CHECK_THROWS_AS(pool_t(simulated_pages{}, {.reclaim_headroom_fraction = 1.5}), std::invalid_argument);
}

TEST_CASE("mapped_pool: a loop that keeps reclaiming switches to relocation and stops waiting for the device")
{
  // plugin_cost's steady loop (plugin/bench/steady_loop.hpp): the live set never outgrows the high-water mark,
  // but its blocks land on other pages from round to round, so reclaiming at the mark waits for the device
  // every few rounds for as long as the loop runs.
  static_assert(bench::steady_loop_depth == 8);
  struct outcome {
    std::uint64_t waits_early, waits_late;
    std::size_t peak_physical;
    bool relocating;
    int served;
  };
  const auto run = [&](std::size_t window) {
    pool_t pool{simulated_pages{}, {.persistent_reclaim_window = window}};
    testing::live_set all;
    int served = 0;
    std::uint64_t waits_early = 0;
    for (int round = 0; round < 4000; ++round) {
      if (round == 2000) waits_early = pool.page_calls().synchronizes;
      testing::live_block held[8];
      for (int k = 0; k < 8; ++k) {
        const std::size_t n = bench::steady_loop_size(round, k);
        held[k] = {pool.allocate(n), n, 256};
        REQUIRE(all.add(held[k]));
        ++served;
      }
      if (round % 500 == 0) check_against_device(pool, all);
      for (int k = 7; k >= 0; --k) {
        REQUIRE(all.remove(held[k].p));
        pool.deallocate(held[k].p, held[k].bytes);
      }
    }
    const outcome o{waits_early, pool.page_calls().synchronizes - waits_early, pool.peak_physical_bytes(), pool.relocating(), served};
    pool.release();
    CHECK_FALSE(pool.relocating());  // release() starts over: reclaiming first again
    CHECK(pool.physical_bytes() == 0);
    return o;
  };
  const outcome fixed = run(0), defaults = run(4096);
  MESSAGE("device waits in rounds 0-1999 / 2000-3999: never switching " << fixed.waits_early << " / " << fixed.waits_late
          << ", defaults " << defaults.waits_early << " / " << defaults.waits_late << "; peak physical " << fixed.peak_physical / mib
          << " vs " << defaults.peak_physical / mib << " MiB");
  CHECK(fixed.served == 8 * 4000);
  CHECK(defaults.served == fixed.served);
  CHECK_FALSE(fixed.relocating);
  CHECK(fixed.waits_late >= 500);  // the loop waits every few rounds, for ever
  CHECK(defaults.relocating);
  CHECK(defaults.waits_late == 0);  // switched within the first 2000 rounds (16,000 allocations) and never waits again
  CHECK(defaults.waits_early * 3 < fixed.waits_early);  // only the first two windows' (8,192 allocations of 16,000) waited
  CHECK(defaults.peak_physical <= fixed.peak_physical + fixed.peak_physical / 4);
}

TEST_CASE("mapped_pool: relocation maps idle memory where it is needed, with no wait and no new memory")
{
  pool_t pool{simulated_pages{}, {.small_limit = mib, .min_mapping = 0, .relocate_idle = true}};
  void* a = pool.allocate(8 * mib);
  void* b = pool.allocate(8 * mib);
  pool.deallocate(a, 8 * mib);
  const std::size_t creates = pool.page_calls().creates;
  // 16 MiB fits no hole and would lift the pool above its mark: a's idle 8 MiB is mapped again at the new
  // block's place (its old range stays mapped and out of use), and only the other 8 MiB is new memory.
  void* c = pool.allocate(16 * mib);
  CHECK(pool.relocations() == 1);
  CHECK(pool.page_calls().synchronizes == 0);
  CHECK(pool.page_calls().unmaps == 0);
  CHECK(pool.page_calls().creates == creates + 1);
  CHECK(pool.physical_bytes() == 24 * mib);
  CHECK(pool.stale_bytes() == 8 * mib);
  CHECK(pool.backend().is_usable(reinterpret_cast<std::uintptr_t>(c), 16 * mib));
  const auto parts = pool.backing_of(c);
  REQUIRE(parts.size() == 2);
  CHECK(pool.backend().times_mapped(parts[0].page) == 2);  // at c and, stale, where a was
  // Nothing lands on the stale range while it aliases c's memory.
  void* d = pool.allocate(8 * mib);
  const auto inside_a = [&](void* p) {
    const auto x = reinterpret_cast<std::uintptr_t>(p), lo = reinterpret_cast<std::uintptr_t>(a);
    return x + 8 * mib > lo && x < lo + 8 * mib;
  };
  CHECK_FALSE(inside_a(d));
  pool.deallocate(d, 8 * mib);
  // release(): one wait, the stale range unmapped and its address space free again.
  pool.deallocate(c, 16 * mib);
  pool.release();
  CHECK(pool.stale_bytes() == 0);
  CHECK(pool.backend().bytes_mapped() == pool.physical_bytes());
  void* e = pool.allocate(8 * mib);
  CHECK(pool.backend().is_usable(reinterpret_cast<std::uintptr_t>(e), 8 * mib));
  pool.deallocate(e, 8 * mib);
  pool.deallocate(b, 8 * mib);
  CHECK(pool.release() == 16 * mib);  // b's and e's
  CHECK(pool.backend().bytes_alive() == 0);
  CHECK(pool.backend().bytes_mapped() == 0);
}

TEST_CASE("mapped_pool: stale ranges go back after the device wait their limit calls for, or any wait the pool makes")
{
  pool_t pool{simulated_pages{}, {.small_limit = mib, .min_mapping = 0, .relocate_idle = true, .stale_address_limit = 12 * mib}};
  void* keep = pool.allocate(4 * mib);
  std::uint64_t waits = 0;
  for (int i = 0; i < 6; ++i) {  // each round, a hole too small for c: a's memory moves to c, leaving 8 MiB stale
    void* a = pool.allocate(8 * mib);
    void* fence = pool.allocate(2 * mib);
    pool.deallocate(a, 8 * mib);
    void* c = pool.allocate(10 * mib);
    CHECK(pool.stale_bytes() <= 20 * mib);  // past the limit, the next allocation waits once and unmaps them
    pool.deallocate(c, 10 * mib);
    pool.deallocate(fence, 2 * mib);
    waits = pool.page_calls().synchronizes;
  }
  CHECK(pool.relocations() >= 3);
  CHECK(waits >= 1);
  CHECK(waits < pool.relocations());
  CHECK(pool.backend().bytes_mapped() == pool.physical_bytes() + pool.stale_bytes());
  pool.deallocate(keep, 4 * mib);
  pool.release();
  CHECK(pool.backend().bytes_alive() == 0);
  CHECK(pool.backend().bytes_mapped() == 0);
}

TEST_CASE("mapped_pool: an allocation failing after a relocation moves the memory back: nothing changed")
{
  for (const op which : {op::create, op::map, op::set_access}) {
    CAPTURE(static_cast<int>(which));
    pool_t pool{simulated_pages{}, {.small_limit = mib, .min_mapping = 0, .relocate_idle = true}};
    void* a = pool.allocate(8 * mib);
    void* b = pool.allocate(8 * mib);
    pool.deallocate(a, 8 * mib);
    const pool_figures before = figures_of(pool);
    // create fails making the missing 8 MiB; map and access fail on the relocation's second call or the new one
    pool.backend().fail_after(which, which == op::create ? 0 : 1);
    CHECK_THROWS((void)pool.allocate(16 * mib));
    CHECK(figures_of(pool) == before);
    CHECK(pool.relocations() == 0);
    CHECK(pool.stale_bytes() == 0);
    CHECK(pool.backend().bytes_mapped() == pool.physical_bytes());
    void* again = pool.allocate(6 * mib);  // the idle memory is back in its place
    CHECK(again == a);
    pool.deallocate(again, 6 * mib);
    void* c = pool.allocate(16 * mib);
    CHECK(pool.relocations() == 1);
    pool.deallocate(c, 16 * mib);
    pool.deallocate(b, 8 * mib);
    pool.release();
    CHECK(pool.backend().bytes_alive() == 0);
    CHECK(pool.backend().bytes_mapped() == 0);
  }
}

// mapped_pool::backing_of, what IPC exports for page-mapped memory: the physical allocations behind a live
// block, contiguous, in address order, covering the block, over simulated pages.
namespace {

/// The allocations are contiguous, cover [p, p + bytes), and each is a whole number of pages.
void check_covers(const pool_t& pool, const void* p, std::size_t bytes)
{
  const auto backing = pool.backing_of(p);
  REQUIRE_FALSE(backing.empty());
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  CHECK(backing.front().address <= start);
  CHECK(backing.back().address + backing.back().bytes >= start + bytes);
  for (std::size_t i = 0; i < backing.size(); ++i) {
    CHECK(backing[i].bytes % pool.page_size() == 0);
    CHECK(backing[i].bytes <= pool.settings().max_mapping);
    if (i > 0) CHECK(backing[i].address == backing[i - 1].address + backing[i - 1].bytes);
  }
}
} // namespace

TEST_CASE("mapped_pool::backing_of names the physical allocations behind each live block")
{
  pool_t pool{simulated_pages{}, {.reclaim_slack_fraction = 0.0, .max_mapping = 8 * mib}};
  void* small = pool.allocate(1000);
  void* big = pool.allocate(21 * mib);  // more than two mappings of 8 MiB
  check_covers(pool, small, 1000);
  check_covers(pool, big, 21 * mib);
  CHECK(pool.backing_of(small).size() == 1);
  CHECK(pool.backing_of(big).size() == 3);

  const auto inside = static_cast<char*>(big) + 4096;
  CHECK(pool.backing_of(inside).empty());  // not the start of a block
  pool.deallocate(big, 21 * mib);
  CHECK(pool.backing_of(big).empty());  // no longer live
  pool.deallocate(small, 1000);
}

TEST_CASE("mapped_pool::backing_of over random blocks: always contiguous and covering")
{
  pool_t pool{simulated_pages{}, {.reclaim_slack_fraction = 0.0, .max_mapping = 4 * mib}};
  std::mt19937 rng(5);
  std::uniform_int_distribution<std::size_t> size(1, 12 * mib);
  std::vector<std::pair<void*, std::size_t>> live;
  int checked = 0;
  for (int step = 0; step < 400; ++step) {
    if (live.size() < 20 && (live.empty() || rng() % 2 == 0)) {
      const std::size_t bytes = size(rng);
      live.emplace_back(pool.allocate(bytes), bytes);
    } else {
      const std::size_t i = rng() % live.size();
      pool.deallocate(live[i].first, live[i].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    for (auto [p, bytes] : live) {
      check_covers(pool, p, bytes);
      ++checked;
    }
  }
  CHECK(checked > 2000);
  for (auto [p, bytes] : live) pool.deallocate(p, bytes);
}

TEST_CASE("mapped_pool: an allocation and a free write the same page state for a block of 2 MiB, 256 MiB or 1 GiB")
{
  constexpr int pairs = 10;
  std::vector<std::uint64_t> per_pair;
  for (const std::size_t size : {2 * mib, 256 * mib, 1024 * mib}) {
    CAPTURE(size);
    pool_t pool{simulated_pages{}, {.relocate_idle = false}};
    void* spacer = pool.allocate(mib + 256);  // the blocks start mid-page, sharing their first page
    void* warm = pool.allocate(size);         // maps the block's pages once
    pool.deallocate(warm, size);
    const page_counters calls = pool.page_calls();
    const std::uint64_t before = pool.page_state_updates();
    for (int i = 0; i < pairs; ++i) {
      void* p = pool.allocate(size);
      CHECK(p == warm);  // reused in place
      CHECK(pool.live_page_bytes() == align_up(size + mib + 256, page));
      pool.deallocate(p, size);
    }
    CHECK(pool.page_calls().creates == calls.creates);
    CHECK(pool.page_calls().maps == calls.maps);
    CHECK(pool.idle_bytes() == pool.physical_bytes() - page);  // all but the spacer's first page
    per_pair.push_back((pool.page_state_updates() - before) / pairs);
    pool.deallocate(spacer, mib + 256);
  }
  CHECK(per_pair[0] == 4);  // the first and last page, once each way
  CHECK(per_pair[1] == per_pair[0]);
  CHECK(per_pair[2] == per_pair[0]);
}

TEST_CASE("mapped_pool: when the live set moves, the allocations a reclaim unmaps are mapped again where needed, not released and created anew")
{
  pool_t pool{simulated_pages{}, {.relocate_idle = false, .persistent_reclaim_window = 0}};
  testing::live_set live;
  void* a = pool.allocate(256 * mib);  // two mappings of 128 MiB
  void* b = pool.allocate(2 * mib);
  REQUIRE(live.add({b, 2 * mib, 256}));
  pool.deallocate(a, 256 * mib);
  const page_counters before = pool.page_calls();
  CHECK(before.creates == 3);
  // 258 MiB fits no hole: mapped after b in runs of 128, 128 and 2 MiB, over the mark of 258 MiB held, so the
  // idle 256 MiB are reclaimed first. Their two allocations are the size of two of the new runs.
  void* c = pool.allocate(258 * mib);
  REQUIRE(live.add({c, 258 * mib, 256}));
  const page_counters& after = pool.page_calls();
  CHECK(after.synchronizes == before.synchronizes + 1);
  CHECK(after.unmaps == before.unmaps + 2);
  CHECK(after.creates == before.creates + 1);  // the 2 MiB run only: release-then-create would make 3 ...
  CHECK(after.releases == before.releases);    // ... and release 2
  CHECK(after.maps == before.maps + 3);
  CHECK(pool.physical_bytes() == 260 * mib);  // the memory held is what releasing and creating would hold
  CHECK(pool.mappings() == 4);
  check_against_device(pool, live);

  for (auto [p, n] : {std::pair{b, 2 * mib}, std::pair{c, 258 * mib}}) pool.deallocate(p, n);
  pool.release();
  CHECK(pool.backend().bytes_alive() == 0);

  // A map or access call refused after the reclaim: the allocation fails, the spares go back to the device
  // (the reclaim stays done), and the pool is as before but for the idle memory it gave back.
  for (const op which : {op::map, op::set_access}) {
    CAPTURE(static_cast<int>(which));
    pool_t again{simulated_pages{}, {.relocate_idle = false, .persistent_reclaim_window = 0}};
    testing::live_set held;
    void* first = again.allocate(256 * mib);
    void* spacer = again.allocate(2 * mib);
    REQUIRE(held.add({spacer, 2 * mib, 256}));
    again.deallocate(first, 256 * mib);
    const page_counters calls = again.page_calls();
    const pool_figures figures = figures_of(again);
    again.backend().fail_after(which, 0);
    CHECK_THROWS((void)again.allocate(258 * mib));
    check_unchanged_but_idle(figures, again);
    check_against_device(again, held);
    CHECK(again.physical_bytes() == 2 * mib);
    // The access call comes once all three runs are mapped (they lie back to back): its failure also
    // releases the 2 MiB allocation created for the last run.
    const std::uint64_t made_first = which == op::set_access ? 1 : 0;
    CHECK(again.page_calls().releases == calls.releases + 2 + made_first);
    void* moved = again.allocate(258 * mib);  // nothing idle left to reclaim: three new allocations
    REQUIRE(held.add({moved, 258 * mib, 256}));
    CHECK(again.page_calls().creates == calls.creates + 3 + made_first);
    check_against_device(again, held);
    for (auto [p, n] : {std::pair{spacer, 2 * mib}, std::pair{moved, 258 * mib}}) again.deallocate(p, n);
  }
}

TEST_CASE("mapped_pool: a block over several allocations costs one access call, and the live set moving reuses them")
{
  pool_t pool{simulated_pages{}, {.max_mapping = 2 * page, .min_mapping = 0, .relocate_idle = false, .persistent_reclaim_window = 0}};
  testing::live_set live;
  void* a = pool.allocate(16 * mib);  // four allocations of two pages, back to back
  const page_counters grown = pool.page_calls();
  CHECK(grown.creates == 4);
  CHECK(grown.maps == 4);
  CHECK(grown.access_calls == 1);
  void* b = pool.allocate(2 * mib);
  REQUIRE(live.add({b, 2 * mib, 256}));
  pool.deallocate(a, 16 * mib);
  const page_counters before = pool.page_calls();
  // 18 MiB fits no hole: mapped after b in runs of 2, 2, 2, 2 and 1 pages, over the mark, so the idle 16 MiB
  // are reclaimed first and their four allocations mapped again, with one access call for all five runs.
  void* c = pool.allocate(18 * mib);
  REQUIRE(live.add({c, 18 * mib, 256}));
  const page_counters& after = pool.page_calls();
  CHECK(after.synchronizes == before.synchronizes + 1);
  CHECK(after.unmaps == before.unmaps + 4);
  CHECK(after.creates == before.creates + 1);
  CHECK(after.releases == before.releases);
  CHECK(after.maps == before.maps + 5);
  CHECK(after.access_calls == before.access_calls + 1);
  CHECK(pool.physical_bytes() == 20 * mib);
  check_against_device(pool, live);
  for (auto [p, n] : {std::pair{b, 2 * mib}, std::pair{c, 18 * mib}}) pool.deallocate(p, n);
  pool.release();
  CHECK(pool.backend().bytes_alive() == 0);
}

TEST_CASE("mapped_pool: randomized, blocks over several small allocations stay usable with fewer access calls than maps")
{
  pool_t pool{simulated_pages{}, {.max_mapping = 2 * page, .min_mapping = 0}};
  const auto result = testing::run_random_workload(
      pool, {.operations = 6'000, .max_live = 60, .min_bytes = 256, .max_bytes = 24 << 20, .max_alignment = 1 << 16, .seed = 7, .min_allocations = 1'500});
  CHECK(result.allocations >= 1'500);
  CHECK(result.frees == result.allocations);
  const page_counters& calls = pool.page_calls();
  CHECK(calls.maps > 0);
  CHECK(calls.access_calls < calls.maps);
  CHECK(pool.backend().bytes_alive() == pool.physical_bytes());
  pool.release();
  CHECK(pool.backend().bytes_alive() == 0);
}

TEST_CASE("mapped_pool::add_peer grants a peer every mapping held now (stale ranges and tags' too) and every later one")
{
  pool_t pool{simulated_pages{}, {.small_limit = mib, .min_mapping = 0, .relocate_idle = true}};
  // A live block, a relocation's stale range, and a tag's mapping: everything the pool maps.
  void* keep = pool.allocate(8 * mib);
  void* a = pool.allocate(8 * mib);
  void* fence = pool.allocate(2 * mib);
  pool.deallocate(a, 8 * mib);
  void* moved = pool.allocate(16 * mib);
  REQUIRE(pool.stale_bytes() == 8 * mib);
  void* tagged = pool.allocate_tagged(1, 4 * mib);
  const auto granted = [&](void* p, std::size_t bytes, std::size_t devices) {
    for (std::size_t off = 0; off < bytes; off += page)
      if (pool.backend().granted_devices(reinterpret_cast<std::uintptr_t>(p) + off) != devices) return false;
    return true;
  };
  REQUIRE(granted(keep, 8 * mib, 1));
  REQUIRE(granted(a, 8 * mib, 1));  // the stale range where a's memory was mapped first
  REQUIRE(granted(tagged, 4 * mib, 1));

  // A failure part way leaves the peer off the list, so a second call grants everything.
  const std::uint64_t calls = pool.page_calls().access_calls;
  pool.backend().fail_after(op::set_access, 1);
  CHECK_THROWS_AS(pool.add_peer(1), std::runtime_error);
  CHECK_FALSE(pool.backend().grants(1));
  CHECK(pool.add_peer(1));
  CHECK(pool.backend().grants(1));
  CHECK(pool.page_calls().access_calls > calls + 1);
  for (auto [p, bytes] : {std::pair{keep, 8 * mib}, {a, 8 * mib}, {moved, 16 * mib}, {fence, 2 * mib}, {tagged, 4 * mib}})
    CHECK(granted(p, bytes, 2));

  // Granted once: a second call changes nothing; the pool's own device is never a peer.
  const std::uint64_t after = pool.page_calls().access_calls;
  CHECK_FALSE(pool.add_peer(1));
  CHECK_FALSE(pool.add_peer(0));
  CHECK(pool.page_calls().access_calls == after);

  // Later mappings name the peer too.
  void* later = pool.allocate(64 * mib);
  CHECK(granted(later, 64 * mib, 2));
  for (auto [p, bytes] : {std::pair{keep, 8 * mib}, {moved, 16 * mib}, {fence, 2 * mib}, {tagged, 4 * mib}, {later, 64 * mib}})
    pool.deallocate(p, bytes);
  pool.release();
  CHECK(pool.backend().bytes_alive() == 0);
}
