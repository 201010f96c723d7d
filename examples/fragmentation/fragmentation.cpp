// The same workload on buddy_pool and coalescing_pool: power-of-two rounding (a 33 MiB request takes a
// 64 MiB block) against splitting to the request and merging neighbours. Runs on simulated_source: the
// bookkeeping is the same as on a GPU, and no GPU is needed.
#include <cstdio>
#include <vector>

#include <strata/core/usage.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/simulated_source.hpp>
#include "../gpu_or_host.hpp"

template <class Pool>
strata::usage run(const char* name, Pool pool)
{
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t mib : {33, 5, 17, 65, 3, 33, 9, 129, 1, 33})  // an odd mix of activations and workspaces
    blocks.emplace_back(pool.allocate(mib << 20), mib << 20);
  for (std::size_t i = 0; i < blocks.size(); i += 2) pool.deallocate(blocks[i].first, blocks[i].second);  // every other one
  const strata::usage u = pool.usage();
  std::printf("%-16s reserved %6zu MiB, in use %5zu MiB, free %5zu MiB, largest free %5zu MiB, fragmentation %.2f\n", name,
              u.reserved >> 20, u.in_use >> 20, u.free() >> 20, u.largest_free >> 20, u.fragmentation());
  for (std::size_t i = 1; i < blocks.size(); i += 2) pool.deallocate(blocks[i].first, blocks[i].second);
  examples::expect(pool.usage().in_use == 0, "every block freed");
  return u;
}

int main()
{
  std::puts("fragmentation: the same 10 requests (361 MiB), then every other one freed (simulated memory)");
  const auto buddy = run("buddy_pool", strata::buddy_pool<strata::simulated_source>{strata::simulated_source{}});
  const auto coalescing = run("coalescing_pool", strata::coalescing_pool<strata::simulated_source>{strata::simulated_source{}});
  // What the comparison shows: rounding to powers of two holds more for the same blocks.
  examples::expect(buddy.in_use > coalescing.in_use && buddy.reserved > coalescing.reserved,
                   "coalescing_pool holds less for the same blocks");
  return examples::status();
}
