// What the recommended stack asks of the driver on bench/peers' random allocations, counted on simulated pages
// (no GPU needed): why its time per operation there is mostly driver calls. Runs the same sequences as
// bench/peers (200,000 operations, up to 2,000 live, seeds 42 and 43) from a fresh pool, as bench/peers does,
// through planning_pool (default_pool's twin) with the library's defaults and with relocate_idle, and prints
// per sequence the host time per operation (bookkeeping only: simulated calls cost nothing) and the calls.
//   build/bench/random_calls
#include <cstdio>
#include <utility>
#include <vector>

#include <strata/default_pool.hpp>

#include "random_ops.hpp"

namespace {

using namespace strata;

/// planning_pool on one stream, as bench/peers drives a stream-ordered stack.
struct on_stream {
  planning_pool& pool;
  cuda::stream_ref stream;
  void* allocate(std::size_t n, std::size_t a) { return pool.allocate_async(n, a, stream); }
  void deallocate(void* p, std::size_t n, std::size_t a) { pool.deallocate_async(p, n, a, stream); }
};

void run(const char* name, const std::vector<bench::op>& ops, bool relocate)
{
  simulated_streams world;
  mapped_pool<simulated_pages>::options opts;
  opts.relocate_idle = relocate;
  planning_pool pool{mapped_pool<simulated_pages>{simulated_pages{}, opts}, planning_pool::options{}, simulated_events{world}};
  on_stream bound{pool, world.create()};
  const double ns = bench::run_ops(bound, ops, 2000);
  const page_counters c = pool.policy().page_calls();
  std::printf("%-12s %-18s %8.1f %8lu %8lu %8lu %8lu %8lu %10.2f\n", name, relocate ? "relocate_idle" : "library defaults", ns,
              static_cast<unsigned long>(c.maps), static_cast<unsigned long>(c.creates), static_cast<unsigned long>(c.unmaps),
              static_cast<unsigned long>(c.synchronizes), static_cast<unsigned long>(pool.policy().relocations()),
              static_cast<double>(pool.policy().peak_physical_bytes()) / double(1 << 30));
}

} // namespace

int main()
{
  std::printf("bench/peers' random allocations on planning_pool (simulated pages), from a fresh pool\n");
  std::printf("%-12s %-18s %8s %8s %8s %8s %8s %8s %10s\n", "sizes", "stack", "host ns", "maps", "creates", "unmaps", "waits",
              "relocs", "peak GiB");
  for (int dist = 0; dist < 2; ++dist) {
    const auto ops = bench::random_ops(200000, 2000, dist == 1, 42 + dist);
    for (bool relocate : {false, true}) run(dist == 1 ? "log-uniform" : "uniform", ops, relocate);
  }
}
