// Writes a real snapshot for the viewer's browser check (tests/viewer/check_viewer.sh): strata's own
// coalescing_pool over simulated memory, after a seeded random mix of small and large allocations with
// every third one freed, so that the map has many segments, used blocks and free holes. The JSON is exactly
// what strata::to_json writes, so the page is checked against the library's format, not a copy of it.
// Prints the JSON on stdout.
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/simulated_source.hpp>

#include <cstdio>
#include <random>
#include <utility>
#include <vector>

int main()
{
  strata::coalescing_pool<strata::simulated_source> pool;
  std::mt19937_64 rng(18);
  std::vector<std::pair<void*, std::size_t>> live;
  for (int i = 0; i < 3000; ++i) {
    // Mostly activations of a few KiB to 1 MiB, now and then a weight of several MiB.
    const std::size_t bytes = rng() % 10 == 0 ? (std::size_t{1} << 20) * (1 + rng() % 24) : 512 * (1 + rng() % 2048);
    live.emplace_back(pool.allocate(bytes), bytes);
    if (i % 3 == 2) {
      const std::size_t victim = rng() % live.size();
      pool.deallocate(live[victim].first, live[victim].second);
      live[victim] = live.back();
      live.pop_back();
    }
  }
  std::puts(strata::to_json(pool.snapshot()).c_str());
  for (auto [p, bytes] : live) pool.deallocate(p, bytes);
  return 0;
}
