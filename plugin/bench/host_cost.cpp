// Host time per allocate+free pair of the plug-in's layers, on a machine without a GPU: the C entry points over
// stack=simulated (the same entry points and locks as on a GPU, over simulated pages and streams), the stack
// itself, and what strata's PyTorch backend (torch_backend.cpp) adds on top: its lock, its block table and its
// statistics. The backend itself needs PyTorch and a GPU; "backend path" (backend_path.hpp) makes the same calls
// in the same order, so a change to block_table.hpp, device_statistics.hpp or the observed entry points shows
// here. A simulated device's stack has the simulated world's lock besides the device's: both backend paths take
// two locks here, where on a GPU the device lock takes one (plugin_cost.cpp shows that).
//   build/plugin/strata_plugin_host_cost [--json FILE] [--only TEXT]   (TEXT: rows whose name contains it)
// The pattern is strata_plugin_cost's (steady_loop.hpp); each figure is the best of 25 short repetitions (short, so
// that some repetition runs undisturbed on a shared host).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <strata_alloc.h>

#include <strata/default_pool.hpp>

#include "backend_path.hpp"
#include "block_table.hpp"
#include "device_statistics.hpp"
#include "steady_loop.hpp"

namespace {

using context_ptr = std::shared_ptr<void>;  // the backend's context is a shared_ptr too
using namespace strata::plugin;

/// Keeps the compiler from dropping work whose result nothing reads.
template <class T>
void keep(T& value)
{
  asm volatile("" : : "r"(&value) : "memory");
}

/// ns per allocate+free pair over the steady loop.
template <class Allocate, class Free>
double pair_ns(Allocate allocate, Free free, int rounds = 4000)
{
  return strata::bench::steady_loop_pair_ns(allocate, free, rounds, 25);
}

/// The rows: each runs in a process of its own (a fresh plug-in and simulated device), so that no row times a
/// stack another row left fragmented.
std::vector<std::pair<std::string, std::function<double()>>> rows()
{
  std::vector<std::pair<std::string, std::function<double()>>> out;
  out.emplace_back("C ABI: strata_malloc_or_throw + strata_free", [] {
    return pair_ns([](std::size_t n) { return strata_malloc_or_throw(n, 0, nullptr); }, [](void* p, std::size_t n) { strata_free(p, n, 0, nullptr); });
  });
  out.emplace_back("C ABI: the observed pair (figures filled)", [] {
    strata_device_figures f{};
    return pair_ns([&f](std::size_t n) { return strata_malloc_or_throw_observed(n, 0, nullptr, &f); },
                   [&f](void* p, std::size_t n) { strata_free_observed(p, n, 0, nullptr, &f); });
  });
  out.emplace_back("backend path: its own mutex, then the observed pair (locks again)", [] {
    strata::bench::backend_path<true> v;
    return pair_ns([&v](std::size_t n) { return v.allocate(n, nullptr); }, [&v](void* p, std::size_t) { v.free(p); });
  });
  out.emplace_back("backend path: the plug-in's device lock across both", [] {
    strata::bench::backend_path<false> v;
    return pair_ns([&v](std::size_t n) { return v.allocate(n, nullptr); }, [&v](void* p, std::size_t) { v.free(p); });
  });
  out.emplace_back("the simulated stack directly", [] {
    strata::simulated_streams world;
    strata::mapped_pool<strata::simulated_pages>::options o;
    strata::planning_pool pool{strata::mapped_pool<strata::simulated_pages>{strata::simulated_pages{std::size_t{2} << 20, std::size_t{64} << 30}, o},
                               {}, strata::simulated_events{world}};
    const cuda::stream_ref legacy{cudaStreamLegacy};
    return pair_ns([&](std::size_t n) { return pool.allocate_async(n, 256, legacy); },
                   [&](void* p, std::size_t n) { pool.deallocate_async(p, n, 256, legacy); });
  });
  out.emplace_back("block_table: insert + erase", [] {
    block_table<context_ptr> t;
    std::uintptr_t next = 4096;
    return pair_ns(
        [&](std::size_t n) {
          next += 4096;
          t.insert(next, {n, n, nullptr, {}, {}});
          return reinterpret_cast<void*>(next);
        },
        [&](void* p, std::size_t) { (void)t.erase(reinterpret_cast<std::uintptr_t>(p)); });
  });
  out.emplace_back("device_statistics: on_allocate + observe, on_free + observe", [] {
    device_statistics s;
    stack_figures f{.reserved = std::size_t{1} << 30, .chunks = 4};
    return pair_ns(
        [&](std::size_t n) {
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
        });
  });
  out.emplace_back("std::mutex: two lock + unlock", [] {
    std::mutex m;
    return pair_ns(
        [&m](std::size_t n) {
          std::lock_guard lock(m);
          return reinterpret_cast<void*>(n);
        },
        [&m](void*, std::size_t) { std::lock_guard lock(m); });
  });
  out.emplace_back("strata_device_lock + unlock, twice (a device without a stack: no world lock)", [] {
    return pair_ns(
        [](std::size_t n) {
          (void)strata_device_lock(1);
          strata_device_unlock(1);
          return reinterpret_cast<void*>(n);
        },
        [](void*, std::size_t) {
          (void)strata_device_lock(1);
          strata_device_unlock(1);
        });
  });
  return out;
}

/// Runs f in a child process (configured afresh) and returns its figure; negative when the child failed.
double in_child(const std::function<double()>& f)
{
  int fds[2];
  if (pipe(fds) != 0) return -1;
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    double value = -1;
    if (strata_configure("stack=simulated,sim_capacity=64GiB") == 0) value = f();
    else std::printf("strata_configure: %s\n", strata_last_error());
    const ssize_t written = write(fds[1], &value, sizeof value);
    _exit(written == sizeof value ? 0 : 1);
  }
  close(fds[1]);
  double value = -1;
  if (read(fds[0], &value, sizeof value) != sizeof value) value = -1;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return value;
}

} // namespace

int main(int argc, char** argv)
{
  std::string json_path, only;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--json") json_path = argv[i + 1];
    if (std::string(argv[i]) == "--only") only = argv[i + 1];  // rows whose name contains this
  }
  std::vector<std::pair<std::string, double>> results;
  std::printf("host time per allocate+free pair, stack=simulated (best of repetitions, each row a fresh process)\n");
  for (const auto& [name, f] : rows()) {
    if (name.find(only) == std::string::npos) continue;
    const double value = in_child(f);
    std::printf("%-66s %8.1f ns\n", name.c_str(), value);
    results.emplace_back(name, value);
  }
  if (!json_path.empty()) {
    std::ofstream json(json_path);
    json << "{\"stack\":\"simulated\",\"rows\":[";
    for (std::size_t i = 0; i < results.size(); ++i)
      json << (i ? "," : "") << "{\"name\":\"" << results[i].first << "\",\"value\":" << results[i].second << "}";
    json << "]}\n";
  }
  return 0;
}
