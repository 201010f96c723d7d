// What a strata stack costs behind RMM's interface, on a GPU. Three parts:
//   1. pair: allocate then free one size on a stream, ns per pair, 256 B .. 16 MiB;
//   2. random: bench/random_ops.hpp's 50/50 sequence (uniform 1 B .. 1 MiB, and log-uniform 256 B .. 64 MiB),
//      ns per operation;
//   3. replay: every trace of bench/traces through default_pool directly and through RMM's current
//      device resource, peak bytes the pool holds on the device.
// Rows of 1 and 2, measured in rounds with the rows in an order rotated from round to round: default_pool
// called directly; the same stack as rmm_resource called directly (with its lock, and without), and through
// cuda::mr::any_resource as RMM holds it (rmm::mr::get_current_device_resource_ref(), what device_buffer and
// device_uvector call), with its lock and with stack_is_thread_safe (no lock); RMM's
// pool_memory_resource over cudaMalloc through the same reference type.
// Verdict lines (the targets strata holds itself to): "through RMM <= 1.2x direct", "faster than RMM's pool", "replay holds
// what default_pool holds" — PASS or FAIL each. After the pair verdicts, where the time through RMM goes: rmm_resource's
// own call, its lock, and CCCL's dispatch (any_resource behind RMM's resource reference), each the median over
// rounds of the difference between two rows within a round. Usage: rmm_interop [--traces DIR] [--quick] [--parts pair,random,replay]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include <rmm/cuda_stream.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/resource_ref.hpp>

#include <strata/default_pool.hpp>
#include <strata/interop/rmm_current.hpp>

#include "../bench_common.hpp"
#include "../random_ops.hpp"
#include "replay.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using strata::bench::op;

/// Anything with the stream-first names, seen through the synchronous-looking calls run_ops makes, on one stream.
template <class R>
struct on_stream {
  R* r;
  cuda::stream_ref s;
  void* allocate(std::size_t n, std::size_t a) { return r->allocate(s, n, a); }
  void deallocate(void* p, std::size_t n, std::size_t a) noexcept { r->deallocate(s, p, n, a); }
};

template <class S>
double pair_ns(S& a, std::size_t bytes, double budget)
{
  for (int i = 0; i < 3; ++i) a.deallocate(a.allocate(bytes, 256), bytes, 256);
  strata::bench::check(cudaDeviceSynchronize(), "sync");
  std::size_t pairs = 0;
  const auto t0 = clock_type::now();
  double elapsed = 0;
  while (pairs < 3 || elapsed < budget) {
    for (int i = 0; i < 64; ++i) a.deallocate(a.allocate(bytes, 256), bytes, 256);
    pairs += 64;
    elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
  }
  return elapsed * 1e9 / static_cast<double>(pairs);
}

struct row {
  std::string name;
  std::function<double(std::size_t bytes, double budget)> pair;
  std::function<double(const std::vector<op>&, std::size_t)> random;
};

template <class R>
row make_row(std::string name, R& r, cuda::stream_ref s)
{
  return {std::move(name),
          [&r, s](std::size_t bytes, double budget) {
            on_stream<R> a{&r, s};
            return pair_ns(a, bytes, budget);
          },
          [&r, s](const std::vector<op>& ops, std::size_t max_live) {
            on_stream<R> a{&r, s};
            strata::bench::check(cudaDeviceSynchronize(), "sync");
            const double ns = strata::bench::run_ops(a, ops, max_live);
            strata::bench::check(cudaDeviceSynchronize(), "sync");
            return ns;
          }};
}

/// Peak bytes default_pool maps while the trace replays through `allocate`/`deallocate` on real streams.
template <class Alloc, class Free>
strata::replay::replay_result replay_through(const std::string& name, const std::vector<strata::replay::trace_event>& events,
                                             Alloc allocate, Free deallocate, std::function<std::size_t()> reserved)
{
  std::unordered_map<int, cudaStream_t> streams{{0, cudaStream_t{}}};
  auto stream_of = [&](int n) {
    auto it = streams.find(n);
    if (it == streams.end()) {
      cudaStream_t s{};
      strata::bench::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
      it = streams.emplace(n, s).first;
    }
    return cuda::stream_ref{it->second};
  };
  strata::replay::driver d{[&](const strata::replay::trace_event& e) { return allocate(stream_of(e.stream), e.bytes); },
                           [&](void* p, std::size_t bytes, const strata::replay::trace_event& e) { deallocate(stream_of(e.stream), p, bytes); },
                           [](const strata::replay::trace_event&) {}, reserved, [] { return std::size_t{0}; },
                           [] { return strata::snapshot{}; }};
  auto r = strata::replay::run(name, d, events, {});
  strata::bench::check(cudaDeviceSynchronize(), "sync");
  for (auto& [n, s] : streams)
    if (n != 0) cudaStreamDestroy(s);
  return r;
}

} // namespace

int main(int argc, char** argv)
{
  if (!strata::bench::gpu_present("rmm_interop")) return 77;
  const bool quick = strata::bench::flag(argc, argv, "--quick");
  const std::string parts = strata::bench::option(argc, argv, "--parts", "pair,random,replay");
  const std::string traces = strata::bench::option(argc, argv, "--traces", "bench/traces");
  auto part = [&](const char* p) { return parts.find(p) != std::string::npos; };
  cudaDeviceProp prop{};
  strata::bench::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("rmm_interop on %s, RMM %s, CCCL %d.%d.%d\n", prop.name, RMM_VERSION, CCCL_MAJOR_VERSION, CCCL_MINOR_VERSION,
              CCCL_PATCH_VERSION);

  rmm::cuda_stream stream;
  const cuda::stream_ref s = stream;
  strata::default_pool direct = strata::make_default_pool();
  strata::rmm_resource locked(strata::make_default_pool());
  strata::rmm_resource lock_free(strata::make_default_pool(), strata::stack_is_thread_safe);  // one thread here
  cuda::mr::any_resource<cuda::mr::device_accessible> locked_any{strata::as_rmm(locked)};
  cuda::mr::any_resource<cuda::mr::device_accessible> lock_free_any{strata::as_rmm(lock_free)};
  rmm::device_async_resource_ref locked_ref{locked_any}, lock_free_ref{lock_free_any};
  rmm::mr::cuda_memory_resource cuda_mr;
  rmm::mr::pool_memory_resource rmm_pool{cuda_mr, 0};
  rmm::device_async_resource_ref rmm_pool_ref{rmm_pool};

  std::vector<row> rows;
  rows.push_back(make_row("strata default_pool, direct", direct, s));
  rows.push_back(make_row("strata rmm_resource, direct (lock)", locked, s));
  rows.push_back(make_row("strata rmm_resource, direct (no lock)", lock_free, s));
  rows.push_back(make_row("strata through RMM's any_resource (lock)", locked_ref, s));
  rows.push_back(make_row("strata through RMM's any_resource (no lock)", lock_free_ref, s));
  rows.push_back(make_row("RMM pool_memory_resource", rmm_pool_ref, s));
  constexpr std::size_t direct_row = 0, wrapped_row = 1, wrapped_nolock_row = 2, through_row = 3, through_nolock_row = 4, rmm_row = 5;
  bool all_pass = true;
  auto verdict = [&](const char* what, double ratio, double limit, bool below) {
    const bool pass = below ? ratio <= limit : ratio < limit;
    all_pass &= pass;
    std::printf("  %-62s %6.3f  %s\n", what, ratio, pass ? "PASS" : "FAIL");
  };

  // Rows are measured in rounds, each round every row once per size, in an order rotated from round to round
  // and reversed every other round, so that no row always runs first or always right after the same other
  // row; a ratio is the median over rounds of the two rows' times in the same round, which cancels what
  // drifts between rounds.
  const int rounds = quick ? 3 : 7;
  const auto row_at = [&](std::size_t position, int round, std::size_t shift) {
    const std::size_t n = rows.size(), r = static_cast<std::size_t>(round);
    const std::size_t step = round % 2 == 0 ? position : n - 1 - position;
    return (step + r + shift) % n;
  };
  const auto paired = [&](const std::vector<double>& num, const std::vector<double>& den) {
    std::vector<double> r;
    for (std::size_t i = 0; i < num.size(); ++i) r.push_back(num[i] / den[i]);
    return strata::bench::median(r);
  };
  const auto spread = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return std::make_pair(v.front(), v.back());
  };

  if (part("pair")) {
    const std::vector<std::size_t> sizes = {256, 4096, 65536, 1 << 20, 16 << 20};
    // times[row][size][round]
    std::vector<std::vector<std::vector<double>>> times(rows.size(), std::vector<std::vector<double>>(sizes.size()));
    for (int r = 0; r < rounds; ++r)
      for (std::size_t i = 0; i < sizes.size(); ++i)
        for (std::size_t j = 0; j < rows.size(); ++j) {
          const std::size_t k = row_at(j, r, i);
          times[k][i].push_back(rows[k].pair(sizes[i], quick ? 0.01 : 0.05));
        }
    std::printf("\n1. pair latency (allocate then free the same size on one stream), ns per pair, median of %d rounds in "
                "rotated order (min-max below each row)\n%-46s", rounds, "allocator");
    for (auto b : sizes) std::printf("%15zu", b);
    std::printf("\n");
    for (std::size_t k = 0; k < rows.size(); ++k) {
      std::printf("%-46s", rows[k].name.c_str());
      for (std::size_t i = 0; i < sizes.size(); ++i) std::printf("%15.1f", strata::bench::median(times[k][i]));
      std::printf("\n%-46s", "");
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const auto [lo, hi] = spread(times[k][i]);
        std::printf("  %6.0f-%-6.0f", lo, hi);
      }
      std::printf("\n");
    }
    std::printf("verdicts (per size, the median over rounds of the ratio within a round; the worst size):\n");
    double worst_through = 0, worst_nolock = 0, worst_vs_rmm = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      worst_through = std::max(worst_through, paired(times[through_row][i], times[direct_row][i]));
      worst_nolock = std::max(worst_nolock, paired(times[through_nolock_row][i], times[direct_row][i]));
      worst_vs_rmm = std::max(worst_vs_rmm, paired(times[through_row][i], times[rmm_row][i]));
    }
    verdict("pair: through RMM (lock) / direct, target <= 1.2", worst_through, 1.2, true);
    verdict("pair: through RMM (no lock) / direct, target <= 1.2", worst_nolock, 1.2, true);
    verdict("pair: through RMM (lock) / RMM's pool, target < 1", worst_vs_rmm, 1.0, false);
    // Differences within a round, over every size's rounds: what each layer adds to a pair.
    const auto added = [&](std::size_t more, std::size_t less) {
      std::vector<double> d;
      for (std::size_t i = 0; i < sizes.size(); ++i)
        for (std::size_t r = 0; r < times[more][i].size(); ++r) d.push_back(times[more][i][r] - times[less][i][r]);
      return strata::bench::median(d);
    };
    std::printf("where a pair's time through RMM goes (ns, the median over rounds and sizes of the difference within a round):\n"
                "  rmm_resource's call %.1f, its lock %.1f, CCCL's dispatch (any_resource behind RMM's reference) %.1f, "
                "over default_pool's own %.1f\n",
                added(wrapped_nolock_row, direct_row), added(wrapped_row, wrapped_nolock_row), added(through_nolock_row, wrapped_nolock_row),
                strata::bench::median([&] {
                  std::vector<double> all;
                  for (const auto& t : times[direct_row]) all.insert(all.end(), t.begin(), t.end());
                  return all;
                }()));
  }

  if (part("random")) {
    const std::size_t count = quick ? 20'000 : 200'000, max_live = 1000;
    std::printf("\n2. random allocations and frees (50/50, at most %zu live), ns per operation, median of %d rounds in "
                "rotated order\n", max_live, rounds);
    std::printf("%-46s%20s%20s\n", "allocator", "1B..1MiB", "256B..64MiB");
    std::vector<std::vector<std::vector<double>>> times(rows.size(), std::vector<std::vector<double>>(2));
    for (int dist = 0; dist < 2; ++dist) {
      const auto ops = strata::bench::random_ops(count, max_live, dist == 1, 42 + static_cast<unsigned>(dist));
      for (int r = 0; r < rounds; ++r)
        for (std::size_t j = 0; j < rows.size(); ++j) {
          const std::size_t k = row_at(j, r, 0);
          times[k][static_cast<std::size_t>(dist)].push_back(rows[k].random(ops, max_live));
        }
    }
    for (std::size_t k = 0; k < rows.size(); ++k) {
      std::printf("%-46s", rows[k].name.c_str());
      for (int dist = 0; dist < 2; ++dist) {
        const auto& t = times[k][static_cast<std::size_t>(dist)];
        const auto [lo, hi] = spread(t);
        std::printf("%8.1f (%4.0f-%-4.0f)", strata::bench::median(t), lo, hi);
      }
      std::printf("\n");
    }
    std::printf("verdicts (the median over rounds of the ratio within a round; the worse distribution):\n");
    verdict("random: through RMM (lock) / direct, target <= 1.2",
            std::max(paired(times[through_row][0], times[direct_row][0]), paired(times[through_row][1], times[direct_row][1])), 1.2, true);
    verdict("random: through RMM (lock) / RMM's pool, target < 1",
            std::max(paired(times[through_row][0], times[rmm_row][0]), paired(times[through_row][1], times[rmm_row][1])), 1.0, false);
  }

  if (part("replay")) {
    std::printf("\n3. replay: peak bytes default_pool maps, directly and as RMM's current device resource\n");
    std::printf("%-28s%16s%16s%8s\n", "trace", "direct", "through RMM", "");
    std::vector<std::string> files;
    for (const auto& f : std::filesystem::directory_iterator(traces))
      if (f.path().string().find(".csv") != std::string::npos) files.push_back(f.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      std::printf("no traces in %s\n", traces.c_str());
      all_pass = false;
    }
    for (const auto& file : files) {
      const auto events = strata::replay::read_trace(file);
      strata::default_pool pool = strata::make_default_pool();
      const auto a = replay_through(
        "direct", events, [&](cuda::stream_ref st, std::size_t n) { return pool.allocate(st, n, 256); },
        [&](cuda::stream_ref st, void* p, std::size_t n) { pool.deallocate(st, p, n, 256); },
        [&] { return pool.policy().physical_bytes(); });
      pool.release();
      strata::rmm_resource current(strata::make_default_pool());
      auto previous = strata::make_current_rmm(current);
      auto ref = rmm::mr::get_current_device_resource_ref();
      const auto b = replay_through(
        "rmm", events, [&](cuda::stream_ref st, std::size_t n) { return ref.allocate(st, n, 256); },
        [&](cuda::stream_ref st, void* p, std::size_t n) { ref.deallocate(st, p, n, 256); },
        [&] { return current.with_stack<strata::default_pool>([](strata::default_pool& q) { return q.policy().physical_bytes(); }); });
      rmm::mr::set_current_device_resource(std::move(previous));
      const bool same = !a.failed && !b.failed && b.peak_reserved <= a.peak_reserved + strata::replay::detail::page;
      all_pass &= same;
      std::printf("%-28s%16zu%16zu%8s%s%s\n", std::filesystem::path(file).filename().string().c_str(), a.peak_reserved,
                  b.peak_reserved, same ? "PASS" : "FAIL", a.failed ? (" direct failed: " + a.failure).c_str() : "",
                  b.failed ? (" through RMM failed: " + b.failure).c_str() : "");
    }
  }
  std::printf("\nrmm_interop: %s\n", all_pass ? "ALL PASS" : "SOME FAIL");
  return all_pass ? 0 : 1;
}
