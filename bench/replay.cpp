// Replays an allocation trace against strata stacks and reports time per operation and peak reserved over
// peak live: how much memory each stack holds from its upstream, at its worst, for what the program needed.
//   replay TRACE [--json FILE]
// Runs on simulated_source (no GPU needed); the GPU replay (real cudaMalloc'd memory, peers beside it) is
// bench/replay_gpu.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include <strata/core/ref.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/simulated_source.hpp>
#include "replay_driver.hpp"
#include "trace.hpp"

int main(int argc, char** argv)
{
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TRACE [--json FILE]\n", argv[0]);
    return 2;
  }
  const std::string json_path = argc >= 4 && std::string(argv[2]) == "--json" ? argv[3] : "";
  const auto events = strata::bench::read_trace(argv[1]);
  using namespace strata;
  std::vector<bench::replay_result> results;

  {
    simulated_source sim;
    coalescing_pool<ref<simulated_source>> pool{ref(sim)};
    results.push_back(bench::replay("coalescing_pool (defaults)", pool, sim, events));
  }
  {
    simulated_source sim;
    coalescing_pool<ref<simulated_source>> pool{ref(sim), {.initial_chunk = 2 << 20, .max_chunk = 1 << 30, .growth_factor = 1.0}};
    results.push_back(bench::replay("coalescing_pool (2 MiB chunks, no growth)", pool, sim, events));
  }
  {
    simulated_source sim;
    coalescing_pool<ref<simulated_source>> pool{ref(sim), {.initial_chunk = 20 << 20, .max_chunk = 1 << 30, .growth_factor = 1.0}};
    results.push_back(bench::replay("coalescing_pool (20 MiB chunks, no growth)", pool, sim, events));
  }
  {
    simulated_source sim;
    buddy_pool<ref<simulated_source>> pool{ref(sim)};
    results.push_back(bench::replay("buddy_pool (1 GiB regions)", pool, sim, events));
  }
  {
    simulated_source sim;
    buddy_pool<ref<simulated_source>> pool{ref(sim), {.region_size = 64 << 20}};
    results.push_back(bench::replay("buddy_pool (64 MiB regions)", pool, sim, events));
  }
  {
    simulated_source sim;
    size_class_pool<ref<simulated_source>> pool{ref(sim)};
    results.push_back(bench::replay("size_class_pool (large requests direct)", pool, sim, events));
  }
  bench::print_table(argv[1], results);
  if (!json_path.empty()) bench::write_json(json_path, argv[1], results);
  return 0;
}
