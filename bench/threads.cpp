// Allocate+free throughput at 1, 2, 4, 8, 16 threads sharing one stack: each thread keeps up to 16 blocks
// live and allocates or frees at random (sizes 256 B .. 64 KiB). On a GPU machine the stacks sit on device
// memory and cudaMallocAsync (per-thread default streams) is measured beside them; without one, host memory.
//   threads [--json FILE] [--ops N]
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <strata/adaptor/synchronized.hpp>
#include <strata/adaptor/thread_cached.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/async_source.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/host_source.hpp>
#include "bench_common.hpp"

namespace {

struct result {
  std::string stack;
  int threads;
  double mops;  ///< million operations (allocations + frees) per second, all threads together
};

/// Runs `ops` operations on every thread at once; returns the wall time of the slowest.
double run_threads(int threads, std::size_t ops, const std::function<void*(std::size_t)>& allocate,
                   const std::function<void(void*, std::size_t)>& free)
{
  using clock = std::chrono::steady_clock;
  std::barrier start(threads);
  std::vector<clock::time_point> began(threads), ended(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::mt19937 rng(t + 1);
      std::vector<std::pair<void*, std::size_t>> live;
      live.reserve(16);
      start.arrive_and_wait();
      began[t] = clock::now();
      for (std::size_t i = 0; i < ops; ++i) {
        if (live.empty() || (live.size() < 16 && (rng() & 1))) {
          const std::size_t bytes = std::size_t{256} << (rng() % 9);
          live.emplace_back(allocate(bytes), bytes);
        } else {
          const std::size_t k = rng() % live.size();
          free(live[k].first, live[k].second);
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (auto [p, n] : live) free(p, n);
      ended[t] = clock::now();
    });
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(*std::max_element(ended.begin(), ended.end()) -
                                       *std::min_element(began.begin(), began.end())).count();
}

template <class Stack>
void measure(const std::string& name, Stack& stack, std::size_t ops, std::vector<result>& out)
{
  for (int threads : {1, 2, 4, 8, 16}) {
    std::vector<double> mops;
    for (int rep = 0; rep < 3; ++rep) {
      const double s = run_threads(threads, ops, [&](std::size_t n) { return stack.allocate(n, 256); },
                                   [&](void* p, std::size_t n) { stack.deallocate(p, n, 256); });
      mops.push_back(static_cast<double>(ops) * threads / s / 1e6);
    }
    std::sort(mops.begin(), mops.end());
    out.push_back({name, threads, mops[1]});
  }
}

template <class Source>
void measure_strata(const std::string& source_name, Source source, std::size_t ops, std::vector<result>& out)
{
  {
    strata::synchronized<strata::coalescing_pool<Source>> s{strata::coalescing_pool<Source>{source}};
    measure("synchronized<coalescing_pool<" + source_name + ">>", s, ops, out);
  }
  {
    strata::thread_cached<strata::coalescing_pool<Source>> s{strata::coalescing_pool<Source>{source}};
    measure("thread_cached<coalescing_pool<" + source_name + ">>", s, ops, out);
  }
  {
    strata::thread_cached<strata::size_class_pool<Source>> s{strata::size_class_pool<Source>{source}};
    measure("thread_cached<size_class_pool<" + source_name + ">>", s, ops, out);
  }
}

} // namespace

int main(int argc, char** argv)
{
  const std::string json_path = strata::bench::option(argc, argv, "--json");
  const std::size_t ops = std::stoul(strata::bench::option(argc, argv, "--ops", "200000"));
  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  std::vector<result> results;
  if (gpu) {
    measure_strata("device_source", strata::device_source{}, ops, results);
    // cudaMallocAsync from one pool, each thread on its own per-thread default stream.
    struct async_per_thread {
      strata::async_source source;
      void* allocate(std::size_t n, std::size_t a) { return source.allocate_async(n, a, cuda::stream_ref{cudaStreamPerThread}); }
      void deallocate(void* p, std::size_t n, std::size_t a) { source.deallocate_async(p, n, a, cuda::stream_ref{cudaStreamPerThread}); }
    } async;
    measure("cudaMallocAsync (async_source, per-thread streams)", async, ops / 4, results);
  } else {
    measure_strata("host_source", strata::host_source{}, ops, results);
  }
  std::printf("\nthreads benchmark (%s; %zu operations per thread, median of 3)\n%-56s %7s %12s %9s\n",
              gpu ? "device memory" : "no GPU: host memory", ops, "stack", "threads", "Mops/s", "scaling");
  for (const auto& r : results) {
    const auto base = std::find_if(results.begin(), results.end(), [&](const result& x) { return x.stack == r.stack && x.threads == 1; });
    std::printf("%-56s %7d %12.2f %8.2fx\n", r.stack.c_str(), r.threads, r.mops, r.mops / base->mops);
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\"memory\":\"" << (gpu ? "device" : "host") << "\",\"results\":[";
    for (std::size_t i = 0; i < results.size(); ++i)
      out << (i ? "," : "") << "{\"stack\":\"" << results[i].stack << "\",\"threads\":" << results[i].threads
          << ",\"mops\":" << results[i].mops << "}";
    out << "]}\n";
  }
  return 0;
}
