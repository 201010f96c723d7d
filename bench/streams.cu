// Multi-stream pipeline: S streams, one host thread enqueuing round-robin "allocate; kernel; free" per launch.
// For every allocator: the whole pipeline's wall time (does it serialize streams?) and the host time spent
// inside allocate and free (what the allocator costs), next to a pipeline with preallocated buffers.
// Also the bare stream-ordered pair latency (allocate then free on one stream, no kernels).
//   streams [--json FILE] [--launches N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <cub/util_allocator.cuh>

#include <strata/default_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/async_source.hpp>
#include <strata/source/device_source.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "bench_common.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

using strata::bench::check;
using strata::bench::median;

__global__ void work_kernel(unsigned* p, std::size_t words, unsigned long long spin_ns)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = static_cast<unsigned>(i);
  if (threadIdx.x == 0)
    for (unsigned long long waited = 0; waited < spin_ns; waited += 1000) __nanosleep(1000);
}

/// One allocator as the benchmark sees it: allocate/free on a stream (identified once, when created; only
/// the rows marked "identified" use the id, the others pass the plain handle).
using stream_t = strata::identified_stream;
struct allocator_under_test {
  std::string name;
  std::function<void*(std::size_t, const stream_t&)> allocate;
  std::function<void(void*, std::size_t, const stream_t&)> free;
  /// Times the host has waited inside the allocator so far (stream_ordered's stats().host_waits); null for
  /// allocators that do not count them.
  std::function<std::uint64_t()> host_waits = nullptr;
};

struct pipeline_result {
  std::string allocator;
  int streams = 0;
  std::size_t launches = 0;
  double total_ms = 0;
  double enqueue_ms = 0;  ///< the host loop alone: when it is most of total_ms, the host sets the pace
  double alloc_ns_per_pair = 0;
  std::int64_t host_waits = -1;  ///< during this pipeline; -1: the allocator does not count them
};

constexpr std::size_t sizes[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
constexpr unsigned long long kernel_spin_ns = 20'000;

/// Host time of clock_type::now() itself, subtracted from the timed allocator calls.
double clock_overhead_ns()
{
  constexpr int n = 100000;
  const auto start = clock_type::now();
  for (int i = 0; i < n; ++i) (void)clock_type::now();
  return std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / n;
}

pipeline_result run_pipeline(const allocator_under_test* a, std::vector<stream_t>& streams, std::size_t launches,
                             double clock_ns, std::vector<void*>& prealloc)
{
  double alloc_ns = 0;
  const std::uint64_t waits_before = a != nullptr && a->host_waits ? a->host_waits() : 0;
  check(cudaDeviceSynchronize(), "sync");
  const auto start = clock_type::now();
  for (std::size_t i = 0; i < launches; ++i) {
    const std::size_t si = i % streams.size();
    const stream_t& s = streams[si];
    const std::size_t bytes = sizes[(i / streams.size() + si) % 4];
    void* p = nullptr;
    if (a != nullptr) {
      const auto t0 = clock_type::now();
      p = a->allocate(bytes, s);
      alloc_ns += std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() - clock_ns;
    } else {
      p = prealloc[si * 4 + (i / streams.size() + si) % 4];  // the same footprint as the allocators'
    }
    work_kernel<<<64, 256, 0, s.stream().get()>>>(static_cast<unsigned*>(p), bytes / 4, kernel_spin_ns);
    if (a != nullptr) {
      const auto t0 = clock_type::now();
      a->free(p, bytes, s);
      alloc_ns += std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() - clock_ns;
    }
  }
  const double enqueue = std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
  check(cudaDeviceSynchronize(), "sync");
  const double total = std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
  const std::int64_t waits = a != nullptr && a->host_waits ? static_cast<std::int64_t>(a->host_waits() - waits_before) : -1;
  return {a != nullptr ? a->name : "preallocated (no allocator)", static_cast<int>(streams.size()), launches, total, enqueue,
          a != nullptr ? alloc_ns / static_cast<double>(launches) : 0.0, waits};
}

/// Allocate then free the same size on one stream, no kernels: the allocator's own cost per pair.
double pair_latency_ns(const allocator_under_test& a, const stream_t& s, std::size_t bytes, int pairs)
{
  for (int i = 0; i < 100; ++i) a.free(a.allocate(bytes, s), bytes, s);  // warm
  check(cudaStreamSynchronize(s.stream().get()), "sync");
  const auto start = clock_type::now();
  for (int i = 0; i < pairs; ++i) a.free(a.allocate(bytes, s), bytes, s);
  const double ns = std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / pairs;
  check(cudaStreamSynchronize(s.stream().get()), "sync");
  return ns;
}

/// What telling streams apart costs: the runtime's cudaStreamGetId, or strata::identify (the driver's).
template <class Lookup>
double stream_id_ns(cudaStream_t s, Lookup lookup)
{
  constexpr int n = 200000;
  unsigned long long sum = 0;
  const auto start = clock_type::now();
  for (int i = 0; i < n; ++i) sum += lookup(s);
  const double ns = std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / n;
  return sum == 0 ? -ns : ns;
}

} // namespace

int main(int argc, char** argv)
{
  const std::string json_path = strata::bench::option(argc, argv, "--json");
  const std::size_t launches_per_stream = std::stoul(strata::bench::option(argc, argv, "--launches", "2000"));
  if (!strata::bench::gpu_present("streams")) return 0;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");

  strata::stream_ordered<strata::coalescing_pool<strata::device_source>> so_coalescing;
  strata::stream_ordered<strata::size_class_pool<strata::device_source>> so_size_class;
  strata::async_source async;
  // Power-of-two bins from 256 B to 1 GiB, no cache limit: CUB tuned so that every size here is cached.
  cub::CachingDeviceAllocator cub_allocator(2, 8, 30, cub::CachingDeviceAllocator::INVALID_SIZE);

  auto plain = [](const stream_t& s) { return s.stream(); };  // the handle alone: an id lookup per call
  // The README says nothing waits on the host in the normal course: these counts show whether that held.
  std::function<std::uint64_t()> coalescing_waits = [&] { return so_coalescing.stats().host_waits; };
  std::function<std::uint64_t()> size_class_waits = [&] { return so_size_class.stats().host_waits; };
  const std::vector<allocator_under_test> allocators = {
    {"stream_ordered<coalescing_pool> (identified)",
     [&](std::size_t n, const stream_t& s) { return so_coalescing.allocate_async(n, 256, s); },
     [&](void* p, std::size_t n, const stream_t& s) { so_coalescing.deallocate_async(p, n, 256, s); }, coalescing_waits},
    {"stream_ordered<size_class_pool> (identified)",
     [&](std::size_t n, const stream_t& s) { return so_size_class.allocate_async(n, 256, s); },
     [&](void* p, std::size_t n, const stream_t& s) { so_size_class.deallocate_async(p, n, 256, s); }, size_class_waits},
    {"stream_ordered<coalescing_pool> (stream handle)",
     [&](std::size_t n, const stream_t& s) { return so_coalescing.allocate_async(n, 256, plain(s)); },
     [&](void* p, std::size_t n, const stream_t& s) { so_coalescing.deallocate_async(p, n, 256, plain(s)); }, coalescing_waits},
    {"async_source (cudaMallocFromPoolAsync)",
     [&](std::size_t n, const stream_t& s) { return async.allocate_async(n, 256, plain(s)); },
     [&](void* p, std::size_t n, const stream_t& s) { async.deallocate_async(p, n, 256, plain(s)); }},
    {"cub::CachingDeviceAllocator",
     [&](std::size_t n, const stream_t& s) {
       void* p = nullptr;
       check(cub_allocator.DeviceAllocate(&p, n, s.stream().get()), "cub allocate");
       return p;
     },
     [&](void* p, std::size_t, const stream_t&) { check(cub_allocator.DeviceFree(p), "cub free"); }},
    {"cudaMalloc/cudaFree",
     [&](std::size_t n, const stream_t&) {
       void* p = nullptr;
       check(cudaMalloc(&p, n), "cudaMalloc");
       return p;
     },
     [&](void* p, std::size_t, const stream_t&) { check(cudaFree(p), "cudaFree"); }},
  };
  constexpr std::size_t async_row = 3;
  // Pair latency alone: the policies bare and the recommended stack, so that the stream layer's own cost
  // per pair reads as a difference (stream_ordered<P> minus P).
  strata::size_class_pool<strata::device_source> bare_size_class;
  strata::coalescing_pool<strata::device_source> bare_coalescing;
  strata::mapped_pool<strata::driver_pages> bare_mapped{strata::driver_pages{0}, {}};
  strata::default_pool recommended = strata::make_default_pool();
  // Captures announced (begin_allocate_to_pool), as PyTorch does and the plug-in assumes: no capture query.
  strata::default_pool announced = strata::make_default_pool({.stream = {.check_capture = false}});
  const std::vector<allocator_under_test> pair_only = {
    {"size_class_pool alone", [&](std::size_t n, const stream_t&) { return bare_size_class.allocate(n, 256); },
     [&](void* p, std::size_t n, const stream_t&) { bare_size_class.deallocate(p, n, 256); }},
    {"coalescing_pool alone", [&](std::size_t n, const stream_t&) { return bare_coalescing.allocate(n, 256); },
     [&](void* p, std::size_t n, const stream_t&) { bare_coalescing.deallocate(p, n, 256); }},
    {"mapped_pool alone", [&](std::size_t n, const stream_t&) { return bare_mapped.allocate(n, 256); },
     [&](void* p, std::size_t n, const stream_t&) { bare_mapped.deallocate(p, n, 256); }},
    {"default_pool (identified)", [&](std::size_t n, const stream_t& s) { return recommended.allocate_async(n, 256, s); },
     [&](void* p, std::size_t n, const stream_t& s) { recommended.deallocate_async(p, n, 256, s); }},
    {"default_pool (identified, captures announced)", [&](std::size_t n, const stream_t& s) { return announced.allocate_async(n, 256, s); },
     [&](void* p, std::size_t n, const stream_t& s) { announced.deallocate_async(p, n, 256, s); }},
    {"default_pool (stream handle)", [&](std::size_t n, const stream_t& s) { return recommended.allocate_async(n, 256, plain(s)); },
     [&](void* p, std::size_t n, const stream_t& s) { recommended.deallocate_async(p, n, 256, plain(s)); }},
  };

  const double clock_ns = clock_overhead_ns();
  std::vector<pipeline_result> results;
  std::vector<std::pair<std::string, double>> pairs;
  cudaStream_t pair_handle = nullptr;
  check(cudaStreamCreateWithFlags(&pair_handle, cudaStreamNonBlocking), "stream");
  const stream_t pair_stream = strata::identify(pair_handle);
  std::vector<double> id_runs, identify_runs;
  for (int r = 0; r < 5; ++r) {
    id_runs.push_back(stream_id_ns(pair_handle, [](cudaStream_t s) {
      unsigned long long id = 0;
      (void)cudaStreamGetId(s, &id);
      return id;
    }));
    identify_runs.push_back(stream_id_ns(pair_handle, [](cudaStream_t s) { return strata::identify(s).id(); }));
  }
  const double id_ns = median(id_runs), identify_ns = median(identify_runs);
  for (const auto& a : allocators) {
    const int n = a.name.starts_with("cudaMalloc/") ? 2000 : 200000;
    std::vector<double> runs;
    for (int r = 0; r < 5; ++r) runs.push_back(pair_latency_ns(a, pair_stream, 1 << 20, n));
    pairs.emplace_back(a.name, median(runs));
  }
  for (const auto& a : pair_only) {
    std::vector<double> runs;
    for (int r = 0; r < 5; ++r) runs.push_back(pair_latency_ns(a, pair_stream, 1 << 20, 200000));
    pairs.emplace_back(a.name, median(runs));
  }
  for (int nstreams : {1, 2, 4, 8}) {
    std::vector<stream_t> streams;
    for (int i = 0; i < nstreams; ++i) {
      cudaStream_t s = nullptr;
      check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
      streams.push_back(strata::identify(s));
    }
    std::vector<void*> prealloc(4 * static_cast<std::size_t>(nstreams));
    for (std::size_t k = 0; k < prealloc.size(); ++k) check(cudaMalloc(&prealloc[k], sizes[k % 4]), "prealloc");
    const std::size_t launches = launches_per_stream * static_cast<std::size_t>(nstreams);
    const std::size_t reps = 3;
    auto run_median = [&](const allocator_under_test* a) {
      std::vector<pipeline_result> rs;
      for (std::size_t r = 0; r < reps; ++r) rs.push_back(run_pipeline(a, streams, launches, clock_ns, prealloc));
      std::sort(rs.begin(), rs.end(), [](auto& x, auto& y) { return x.total_ms < y.total_ms; });
      return rs[reps / 2];
    };
    results.push_back(run_median(nullptr));
    for (const auto& a : allocators) {
      const bool slow = a.name.starts_with("cudaMalloc/");
      results.push_back(slow ? run_pipeline(&a, streams, launches / 4, clock_ns, prealloc) : run_median(&a));
    }
    for (auto p : prealloc) check(cudaFree(p), "free");
    for (auto s : streams) check(cudaStreamDestroy(s.stream().get()), "destroy");
  }

  std::printf("\nstreams benchmark on %s; kernels spin %llu us each; sizes 64 KiB..4 MiB\n", prop.name, kernel_spin_ns / 1000);
  std::printf("\npair latency on one stream, 1 MiB (median of 5)\n%-50s %12s %10s\n", "allocator", "ns/pair", "vs async");
  const double async_pair = pairs[async_row].second;
  std::printf("%-50s %12.1f   (one call)\n", "cudaStreamGetId", id_ns);
  std::printf("%-50s %12.1f   (one call)\n", "strata::identify (the driver's cuStreamGetId)", identify_ns);
  for (const auto& [name, ns] : pairs) std::printf("%-50s %12.1f %9.1fx\n", name.c_str(), ns, async_pair / ns);
  std::printf("\npipeline (median of 3; cudaMalloc: one run, a quarter of the launches; host waits: inside the allocator, "
              "\"-\" where it does not count them)\n%-50s %7s %9s %11s %11s %14s %12s %10s\n",
              "allocator", "streams", "launches", "total ms", "enqueue ms", "us/launch", "alloc ns/pair", "host waits");
  for (const auto& r : results)
    std::printf("%-50s %7d %9zu %11.2f %11.2f %14.3f %12.1f %10s\n", r.allocator.c_str(), r.streams, r.launches, r.total_ms,
                r.enqueue_ms, r.total_ms * 1000 / static_cast<double>(r.launches), r.alloc_ns_per_pair,
                r.host_waits < 0 ? "-" : std::to_string(r.host_waits).c_str());
  std::printf("host waits over the whole run: stream_ordered<coalescing_pool> %llu, stream_ordered<size_class_pool> %llu\n",
              static_cast<unsigned long long>(coalescing_waits()), static_cast<unsigned long long>(size_class_waits()));

  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\"device\":\"" << prop.name << "\",\"stream_id_ns\":" << id_ns << ",\"identify_ns\":" << identify_ns << ",\"pair_latency_1MiB_ns\":{";
    for (std::size_t i = 0; i < pairs.size(); ++i) out << (i ? "," : "") << "\"" << pairs[i].first << "\":" << pairs[i].second;
    out << "},\"pipeline\":[";
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      out << (i ? "," : "") << "{\"allocator\":\"" << r.allocator << "\",\"streams\":" << r.streams << ",\"launches\":"
          << r.launches << ",\"total_ms\":" << r.total_ms << ",\"enqueue_ms\":" << r.enqueue_ms << ",\"alloc_ns_per_pair\":" << r.alloc_ns_per_pair;
      if (r.host_waits >= 0) out << ",\"host_waits\":" << r.host_waits;
      out << "}";
    }
    out << "],\"host_waits_total\":{\"stream_ordered<coalescing_pool>\":" << coalescing_waits()
        << ",\"stream_ordered<size_class_pool>\":" << size_class_waits() << "}}\n";
  }
  check(cudaStreamDestroy(pair_handle), "destroy");
  return 0;
}
