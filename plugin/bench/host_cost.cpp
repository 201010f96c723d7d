// Host time per allocate+free pair of the plug-in's layers, on a machine without a GPU: the C entry points over
// stack=simulated (the same entry points and locks as on a GPU, over simulated pages and streams), the stack
// itself, and what strata's PyTorch backend (torch_backend.cpp) adds on top: its lock, its block table and its
// statistics. The backend itself needs PyTorch and a GPU; "backend path" below makes the same calls in the same
// order, so a change to block_table.hpp, device_statistics.hpp or the observed entry points shows here.
//   build/plugin/bench/strata_plugin_host_cost [--json FILE]
// The pattern is strata_plugin_cost's (steady_loop.hpp); each figure is the best of 7 repetitions.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <strata_alloc.h>

#include <strata/default_pool.hpp>

#include "block_table.hpp"
#include "device_statistics.hpp"
#include "steady_loop.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using context_ptr = std::shared_ptr<void>;  // the backend's context is a shared_ptr too
using namespace strata::plugin;

constexpr int depth = strata::bench::steady_loop_depth;

/// Keeps the compiler from dropping work whose result nothing reads.
template <class T>
void keep(T& value)
{
  asm volatile("" : : "r"(&value) : "memory");
}

/// ns per allocate+free pair over the steady loop.
template <class Allocate, class Free>
double pair_ns(Allocate allocate, Free free, int rounds = 40000)
{
  void* p[depth];
  std::size_t n[depth];
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    const auto start = clock_type::now();
    for (int i = 0; i < rounds; ++i) {
      for (int k = 0; k < depth; ++k) {
        n[k] = strata::bench::steady_loop_size(i, k);
        p[k] = allocate(n[k]);
      }
      for (int k = depth - 1; k >= 0; --k) free(p[k], n[k]);
    }
    best = std::min(best, std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / (double(rounds) * depth));
  }
  return best;
}

stack_figures figures_of(const strata_device_figures& f)
{
  return {.reserved = f.reserved,
          .in_use = f.in_use,
          .chunks = f.chunks,
          .free_blocks = f.free_blocks,
          .held_bytes = f.held_bytes,
          .held_blocks = f.held_blocks,
          .device_allocs = f.device_allocs,
          .device_frees = f.device_frees,
          .alloc_retries = f.alloc_retries,
          .ooms = f.ooms};
}

/// The backend's per-device state, as far as its allocation and free touch it.
struct backend_view {
  std::mutex mutex;
  device_statistics stats;
  block_table<context_ptr> blocks;
  strata_device_figures last{};

  void apply() { stats.observe(figures_of(last), blocks.parked_bytes(), blocks.parked_blocks()); }

  void* allocate(std::size_t n)
  {
    std::lock_guard lock(mutex);
    void* p = strata_malloc_or_throw_observed(n, 0, nullptr, &last);
    blocks.insert(reinterpret_cast<std::uintptr_t>(p), {n, n, nullptr, {}, {}});
    stats.on_allocate(n, n);
    apply();
    return p;
  }
  void free(void* p)
  {
    std::lock_guard lock(mutex);
    auto gone = blocks.erase(reinterpret_cast<std::uintptr_t>(p));
    const auto& [b, parked] = *gone;
    if (!parked) strata_free_observed(p, b.size, 0, static_cast<cudaStream_t>(b.stream), &last);
    stats.on_free(b.size, b.requested);
    apply();
  }
};

} // namespace

int main(int argc, char** argv)
{
  std::string json_path;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--json") json_path = argv[i + 1];
  if (strata_configure("stack=simulated,sim_capacity=64GiB") != 0) {
    std::printf("strata_configure: %s\n", strata_last_error());
    return 1;
  }
  std::vector<std::pair<std::string, double>> rows;
  auto row = [&rows](const char* name, double value) {
    std::printf("%-66s %8.1f ns\n", name, value);
    rows.emplace_back(name, value);
  };
  std::printf("host time per allocate+free pair, stack=simulated (best of repetitions)\n");
  const auto plain = [] {
    return pair_ns([](std::size_t n) { return strata_malloc_or_throw(n, 0, nullptr); }, [](void* p, std::size_t n) { strata_free(p, n, 0, nullptr); });
  };
  row("C ABI: strata_malloc_or_throw + strata_free", plain());
  {
    strata_device_figures f{};
    row("C ABI: the observed pair (figures filled)",
        pair_ns([&f](std::size_t n) { return strata_malloc_or_throw_observed(n, 0, nullptr, &f); },
                [&f](void* p, std::size_t n) { strata_free_observed(p, n, 0, nullptr, &f); }));
  }
  {
    backend_view v;
    row("backend path: lock, observed pair, block table, statistics",
        pair_ns([&v](std::size_t n) { return v.allocate(n); }, [&v](void* p, std::size_t) { v.free(p); }));
  }
  {
    strata::simulated_streams world;
    strata::mapped_pool<strata::simulated_pages>::options o;
    strata::planning_pool pool{strata::mapped_pool<strata::simulated_pages>{strata::simulated_pages{std::size_t{2} << 20, std::size_t{64} << 30}, o},
                               {}, strata::simulated_events{world}};
    const cuda::stream_ref legacy{cudaStreamLegacy};
    row("the simulated stack directly",
        pair_ns([&](std::size_t n) { return pool.allocate_async(n, 256, legacy); }, [&](void* p, std::size_t n) { pool.deallocate_async(p, n, 256, legacy); }));
  }
  {
    block_table<context_ptr> t;
    std::uintptr_t next = 4096;
    row("block_table: insert + erase",
        pair_ns([&](std::size_t n) {
          next += 4096;
          t.insert(next, {n, n, nullptr, {}, {}});
          return reinterpret_cast<void*>(next);
        },
                [&](void* p, std::size_t) { (void)t.erase(reinterpret_cast<std::uintptr_t>(p)); }));
  }
  {
    device_statistics s;
    stack_figures f{.reserved = std::size_t{1} << 30, .chunks = 4};
    row("device_statistics: on_allocate + observe, on_free + observe", pair_ns([&](std::size_t n) {
          s.on_allocate(n, n);
          f.in_use += n;
          ++f.free_blocks;
          s.observe(f);
          keep(s);
          return reinterpret_cast<void*>(n);
        },
                                                                              [&](void*, std::size_t n) {
          s.on_free(n, n);
          f.in_use -= n;
          --f.free_blocks;
          s.observe(f);
          keep(s);
        }));
  }
  {
    std::mutex m;
    row("std::mutex: two lock + unlock", pair_ns([&m](std::size_t n) {
          std::lock_guard lock(m);
          return reinterpret_cast<void*>(n);
        },
                                                  [&m](void*, std::size_t) { std::lock_guard lock(m); }));
  }
  row("C ABI: strata_malloc_or_throw + strata_free again (drift check)", plain());
  if (!json_path.empty()) {
    std::ofstream json(json_path);
    json << "{\"stack\":\"simulated\",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) json << (i ? "," : "") << "{\"name\":\"" << rows[i].first << "\",\"value\":" << rows[i].second << "}";
    json << "]}\n";
  }
  return 0;
}
