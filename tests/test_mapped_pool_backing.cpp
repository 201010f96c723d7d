// mapped_pool::backing_of, what IPC exports for page-mapped memory: the physical allocations behind a live
// block, contiguous, in address order, covering the block, over simulated pages.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/mapped_pool.hpp>

using namespace strata;

namespace {
constexpr std::size_t mib = std::size_t{1} << 20;
using pool_t = mapped_pool<simulated_pages>;

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
