// Host time per allocate+free pair through the plug-in's C entry points, against the same stack called
// directly, and what the entry points add around it (making the device current, the lock, telling the stream
// apart). PyTorch's plugged path calls strata_malloc/strata_free once per tensor; alloc_cost.py measures the
// whole path from Python, this the part that is ours. Needs a GPU (exits 77 without one).
//   build/plugin/bench/strata_plugin_cost [--json FILE]
// The pattern: eight allocations of sizes taken from a ResNet-like mix (512 B to 12 MiB), freed in reverse,
// repeated; the figure is the best of 7 repetitions (host time, which is what a training loop waits for).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <strata_alloc.h>

#include <strata/default_pool.hpp>

#include "backend_path.hpp"
#include "steady_loop.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

constexpr int depth = strata::bench::steady_loop_depth;

/// ns per allocate+free pair over the steady loop.
template <class Allocate, class Free>
double pair_ns(Allocate allocate, Free free, int rounds = 40000)
{
  return strata::bench::steady_loop_pair_ns(allocate, free, rounds, 7);
}

/// ns per call of f.
template <class F>
double call_ns(F f, int calls = 400000)
{
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = clock_type::now();
    for (int i = 0; i < calls; ++i) f();
    best = std::min(best, std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / calls);
  }
  return best;
}

/// The plug-in's own stack (stack=default), built as build_cuda does with the configuration's defaults.
strata::default_pool plugin_stack()
{
  strata::default_pool_options o;
  o.pool.relocate_idle = true;
  o.stream.owner_cover_window = 4096;
  o.stream.check_capture = false;
  return strata::make_default_pool(o);
}

} // namespace

int main(int argc, char** argv)
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("strata_plugin_cost: no GPU, skipped\n");
    return 77;
  }
  std::string json_path;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--json") json_path = argv[i + 1];
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  cudaSetDevice(0);
  if (strata_configure("stack=default") != 0) {
    std::printf("strata_configure: %s\n", strata_last_error());
    return 1;
  }
  using namespace strata;
  std::vector<std::pair<std::string, double>> rows;
  auto row = [&rows](const char* name, double value, const char* unit = "ns") {
    std::printf("%-62s %8.1f %s\n", name, value, unit);
    rows.emplace_back(name, value);
  };
  std::printf("host time on %s (best of repetitions)\n", prop.name);
  row("pair: strata_malloc + strata_free (stream 0, as PyTorch calls)",
      pair_ns([](std::size_t n) { return strata_malloc(n, 0, nullptr); }, [](void* p, std::size_t n) { strata_free(p, n, 0, nullptr); }));
  // strata's PyTorch backend per tensor, without PyTorch (backend_path.hpp): the two ways of locking, twice
  // each, interleaved, so that the stack's state is alike for both.
  for (int round = 0; round < 2; ++round) {
    {
      strata::bench::backend_path<true> b;
      row("pair: backend path, its own mutex then the observed calls",
          pair_ns([&b](std::size_t n) { return b.allocate(n, nullptr); }, [&b](void* p, std::size_t) { b.free(p); }));
    }
    {
      strata::bench::backend_path<false> b;
      row("pair: backend path, the plug-in's device lock across both",
          pair_ns([&b](std::size_t n) { return b.allocate(n, nullptr); }, [&b](void* p, std::size_t) { b.free(p); }));
    }
  }
  {
    default_pool pool = plugin_stack();
    const cuda::stream_ref legacy{cudaStreamLegacy};
    row("pair: the same stack directly, stream handle",
        pair_ns([&](std::size_t n) { return pool.allocate_async(n, 256, legacy); }, [&](void* p, std::size_t n) { pool.deallocate_async(p, n, 256, legacy); }));
    const identified_stream id = identify(legacy);
    row("pair: the same stack directly, identified stream",
        pair_ns([&](std::size_t n) { return pool.allocate_async(n, 256, id); }, [&](void* p, std::size_t n) { pool.deallocate_async(p, n, 256, id); }));
  }
  {
    // The library's own defaults reclaim idle memory at the high-water mark instead of relocating it: on this
    // steady loop, whose blocks land on other pages from round to round, that is a device wait and a
    // map/unmap every few rounds (docs/memory.md, "Known limit").
    default_pool pool = make_default_pool();
    const cuda::stream_ref legacy{cudaStreamLegacy};
    row("pair: default_pool with the library's defaults (reclaiming)",
        pair_ns([&](std::size_t n) { return pool.allocate_async(n, 256, legacy); }, [&](void* p, std::size_t n) { pool.deallocate_async(p, n, 256, legacy); }, 4000));
    row("  its device waits per 1000 pairs", 1000.0 * static_cast<double>(pool.policy().page_calls().synchronizes) / (7.0 * 4000 * depth), "");
  }
  {
    mapped_pool<driver_pages>::options o;
    o.relocate_idle = true;
    mapped_pool<driver_pages> pool{driver_pages{}, o};
    row("pair: its mapped_pool alone", pair_ns([&](std::size_t n) { return pool.allocate(n, 256); }, [&](void* p, std::size_t n) { pool.deallocate(p, n, 256); }));
  }
  row("call: scoped_device (device already current)", call_ns([] { detail::scoped_device on(0); }));
  row("call: cudaGetDevice", call_ns([] {
        int d = 0;
        (void)cudaGetDevice(&d);
      }));
  row("call: current_context (cuCtxGetCurrent)", call_ns([] { (void)detail::current_context(); }));
  row("call: identify (cuStreamGetId on the legacy stream)", call_ns([] { (void)identify(cuda::stream_ref{cudaStreamLegacy}); }));
  std::mutex m;
  row("call: std::mutex lock + unlock", call_ns([&m] { std::lock_guard lock(m); }));
  row("call: strata_device_lock + strata_device_unlock", call_ns([] {
        (void)strata_device_lock(0);
        strata_device_unlock(0);
      }));
  row("pair: strata_malloc + strata_free again (drift check)",
      pair_ns([](std::size_t n) { return strata_malloc(n, 0, nullptr); }, [](void* p, std::size_t n) { strata_free(p, n, 0, nullptr); }));
  if (!json_path.empty()) {
    std::ofstream json(json_path);
    json << "{\"device\":\"" << prop.name << "\",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) json << (i ? "," : "") << "{\"name\":\"" << rows[i].first << "\",\"value\":" << rows[i].second << "}";
    json << "]}\n";
  }
  return 0;
}
