// Managed memory with and without prefetch against cudaMalloc, pinned pools against cudaMallocHost, and
// host-to-device copies from pinned-pool, cudaMallocHost and pageable buffers. One run, ratios in the table.
//   pinned_managed [--json FILE] [--gib N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <strata/adaptor/prefetch.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/managed_source.hpp>
#include <strata/source/pinned_source.hpp>
#include "bench_common.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

using strata::bench::check;

__global__ void scale_kernel(float* p, std::size_t n)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) p[i] = p[i] * 2.0f + 1.0f;
}

/// GB/s of one read+write pass of a kernel over `bytes` at p (timed with events on the stream).
double kernel_bandwidth(float* p, std::size_t bytes, cudaStream_t s)
{
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  check(cudaEventRecord(a, s), "record");
  scale_kernel<<<1024, 512, 0, s>>>(p, bytes / sizeof(float));
  check(cudaEventRecord(b, s), "record");
  check(cudaEventSynchronize(b), "sync");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "elapsed");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

template <class F>
double ns_per_call(F f, int n)
{
  const auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i) f();
  return std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() / n;
}

struct row {
  std::string section, name;
  double value;
  std::string unit;
};

} // namespace

int main(int argc, char** argv)
{
  const std::string json_path = strata::bench::option(argc, argv, "--json");
  const std::size_t gib = std::stoul(strata::bench::option(argc, argv, "--gib", "4"));
  if (!strata::bench::gpu_present("pinned_managed")) return 0;
  std::size_t free_bytes = 0, total = 0;
  check(cudaMemGetInfo(&free_bytes, &total), "meminfo");
  const std::size_t bytes = std::min(gib << 30, free_bytes / 4);  // managed memory well below what is free
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  std::vector<row> rows;

  // 1. Kernel bandwidth: cudaMalloc, managed with pages on the host, prefetch<coalescing_pool<managed_source>>.
  {
    float* d = nullptr;
    check(cudaMalloc(&d, bytes), "cudaMalloc");
    check(cudaMemset(d, 0, bytes), "memset");
    kernel_bandwidth(d, bytes, s);  // warm
    rows.push_back({"kernel bandwidth", "cudaMalloc", kernel_bandwidth(d, bytes, s), "GB/s"});
    check(cudaFree(d), "free");

    float* m = nullptr;
    check(cudaMallocManaged(&m, bytes), "cudaMallocManaged");
    std::memset(m, 0, bytes);  // pages on the host, as after host-side initialisation
    rows.push_back({"kernel bandwidth", "managed, pages on the host (faults)", kernel_bandwidth(m, bytes, s), "GB/s"});
    check(cudaFree(m), "free");

    using pool_type = strata::prefetch<strata::coalescing_pool<strata::managed_source>>;
    pool_type pool{strata::coalescing_pool<strata::managed_source>{strata::managed_source{}, {.initial_chunk = bytes}}};
    auto* p = static_cast<float*>(pool.allocate(bytes));
    std::memset(p, 0, bytes);  // the same host initialisation...
    const auto t0 = clock_type::now();
    strata::prefetch_to_device(p, bytes, 0, s);  // ...then the migration the layer does on allocate_async
    check(cudaStreamSynchronize(s), "sync");
    const double migrate_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    rows.push_back({"kernel bandwidth", "prefetch<coalescing_pool<managed_source>>", kernel_bandwidth(p, bytes, s), "GB/s"});
    rows.push_back({"kernel bandwidth", "(its host-to-device migration)", static_cast<double>(bytes) / migrate_s / 1e9, "GB/s"});
    pool.deallocate(p, bytes);
    // Fresh blocks from allocate_async: prefetched on the stream before any touch.
    auto* q = static_cast<float*>(pool.allocate_async(bytes, 256, s));
    rows.push_back({"kernel bandwidth", "prefetch<...> allocate_async, untouched", kernel_bandwidth(q, bytes, s), "GB/s"});
    pool.deallocate_async(q, bytes, 256, s);
  }

  // 2. Pinned pool pairs against cudaMallocHost/cudaFreeHost.
  {
    strata::size_class_pool<strata::pinned_source> small_pool;
    strata::coalescing_pool<strata::pinned_source> large_pool{strata::pinned_source{}, {.initial_chunk = 128 << 20}};
    for (std::size_t n : {std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{64} << 20}) {
      const std::string size = n >= (1 << 20) ? std::to_string(n >> 20) + " MiB" : std::to_string(n >> 10) + " KiB";
      const int calls = n >= (64 << 20) ? 5 : 50;
      const double host_ns = ns_per_call([&] {
        void* p = nullptr;
        check(cudaMallocHost(&p, n), "cudaMallocHost");
        check(cudaFreeHost(p), "cudaFreeHost");
      }, calls);
      double pool_ns = 0;
      if (n <= (1 << 20)) {
        small_pool.deallocate(small_pool.allocate(n), n);
        pool_ns = ns_per_call([&] { small_pool.deallocate(small_pool.allocate(n), n); }, 1'000'000);
      } else {
        large_pool.deallocate(large_pool.allocate(n), n);
        pool_ns = ns_per_call([&] { large_pool.deallocate(large_pool.allocate(n), n); }, 1'000'000);
      }
      rows.push_back({"pinned pair " + size, "cudaMallocHost/cudaFreeHost", host_ns, "ns"});
      rows.push_back({"pinned pair " + size, n <= (1 << 20) ? "size_class_pool<pinned_source>" : "coalescing_pool<pinned_source>", pool_ns, "ns"});
    }
  }

  // 3. Host-to-device copies of 256 MiB.
  {
    constexpr std::size_t n = 256 << 20;
    void* d = nullptr;
    check(cudaMalloc(&d, n), "cudaMalloc");
    auto copy_gbps = [&](const void* src) {
      check(cudaMemcpyAsync(d, src, n, cudaMemcpyHostToDevice, s), "copy");  // warm
      check(cudaStreamSynchronize(s), "sync");
      std::vector<double> runs;
      for (int r = 0; r < 5; ++r) {
        const auto t0 = clock_type::now();
        check(cudaMemcpyAsync(d, src, n, cudaMemcpyHostToDevice, s), "copy");
        check(cudaStreamSynchronize(s), "sync");
        runs.push_back(static_cast<double>(n) / std::chrono::duration<double>(clock_type::now() - t0).count() / 1e9);
      }
      std::sort(runs.begin(), runs.end());
      return runs[2];
    };
    strata::coalescing_pool<strata::pinned_source> pool{strata::pinned_source{}, {.initial_chunk = n}};
    void* from_pool = pool.allocate(n);
    std::memset(from_pool, 1, n);
    rows.push_back({"H2D copy 256 MiB", "pinned pool buffer", copy_gbps(from_pool), "GB/s"});
    pool.deallocate(from_pool, n);
    void* host_pinned = nullptr;
    check(cudaMallocHost(&host_pinned, n), "cudaMallocHost");
    std::memset(host_pinned, 1, n);
    rows.push_back({"H2D copy 256 MiB", "cudaMallocHost buffer", copy_gbps(host_pinned), "GB/s"});
    check(cudaFreeHost(host_pinned), "free");
    std::vector<char> pageable(n, 1);
    rows.push_back({"H2D copy 256 MiB", "pageable (std::vector)", copy_gbps(pageable.data()), "GB/s"});
    check(cudaFree(d), "free");
  }

  std::printf("\npinned and managed memory (managed buffers %.1f GiB)\n%-22s %-46s %14s\n", static_cast<double>(bytes) / (1 << 30),
              "measure", "stack", "value");
  for (const auto& r : rows) std::printf("%-22s %-46s %11.2f %s\n", r.section.c_str(), r.name.c_str(), r.value, r.unit.c_str());
  auto find = [&](const std::string& section, const std::string& prefix) {
    for (const auto& r : rows)
      if (r.section == section && r.name.rfind(prefix, 0) == 0) return r.value;
    return 0.0;
  };
  std::printf("ratios: prefetch / cudaMalloc bandwidth %.3f (target >= 0.95); pinned pool vs cudaMallocHost pair: 4 KiB %.0fx, "
              "1 MiB %.0fx, 64 MiB %.0fx (target >= 1000x)\n",
              find("kernel bandwidth", "prefetch<coalescing") / find("kernel bandwidth", "cudaMalloc"),
              find("pinned pair 4 KiB", "cuda") / find("pinned pair 4 KiB", "size_class"),
              find("pinned pair 1 MiB", "cuda") / find("pinned pair 1 MiB", "size_class"),
              find("pinned pair 64 MiB", "cuda") / find("pinned pair 64 MiB", "coalescing"));
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\"managed_bytes\":" << bytes << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i)
      out << (i ? "," : "") << "{\"section\":\"" << rows[i].section << "\",\"stack\":\"" << rows[i].name << "\",\"value\":" << rows[i].value
          << ",\"unit\":\"" << rows[i].unit << "\"}";
    out << "]}\n";
  }
  check(cudaStreamDestroy(s), "destroy");
  return 0;
}
