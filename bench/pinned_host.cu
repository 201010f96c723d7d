// pinned_host_pool on the device host: host memory held over host memory asked for on three patterns of
// pinned buffers (a power-of-two rounding, as a caching allocator that never splits would hold, beside it:
// tests/device/torch/pinned_host.py measures PyTorch's own), the time to pin 20 GiB fresh (pinned_host_pool,
// pin_host and one cudaHostAlloc), reuse of idle pinned memory, and copy bandwidth both ways from the pool.
//   pinned_host [--json FILE] [--scale S] [--fresh-gib N] [--no-cudahostalloc]
// --scale multiplies the buffer counts of the patterns (1: the sizes reported, 24 x 2.0832 GiB and so on;
// the default 0.5 keeps every pattern, PyTorch's included, well inside a 128 GiB host).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <strata/pinned/pinned_host_pool.hpp>
#include <strata/sleep/pinned_host.hpp>
#include "bench_common.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using strata::bench::check;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

struct row {
  std::string section, name;
  double value;
  std::string unit;
};

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

/// The three patterns; tests/device/torch/pinned_host.py builds the same sizes with the same formulas.
std::vector<std::size_t> pattern(const std::string& name, double scale)
{
  std::vector<std::size_t> sizes;
  if (name == "24x2.0832GiB") {
    const auto n = static_cast<std::size_t>(std::lround(24 * scale));
    sizes.assign(n, static_cast<std::size_t>(2.0832 * static_cast<double>(GiB)));
  } else if (name == "experts") {  // 20 to 40 MiB, even sizes (bf16 weights), spread over the range
    const auto n = static_cast<std::size_t>(std::lround(512 * scale));
    for (std::size_t i = 0; i < n; ++i) sizes.push_back((20 * MiB + (i * 7919 % 1000) * 20971) & ~std::size_t{1});
  } else {  // "mixed": 4 KiB to 2 GiB, log-uniform (a golden-ratio sequence of exponents)
    const auto n = static_cast<std::size_t>(std::lround(256 * scale));
    for (std::size_t i = 0; i < n; ++i) {
      const double u = std::fmod(static_cast<double>(i) * 0.6180339887498949, 1.0);
      sizes.push_back(static_cast<std::size_t>(std::exp2(12.0 + 19.0 * u)));
    }
  }
  return sizes;
}

double gbps(std::size_t bytes, float ms) { return static_cast<double>(bytes) / (static_cast<double>(ms) * 1e-3) / 1e9; }

/// Median GB/s of `reps` copies of `bytes` between host `h` and device `d` in direction `kind`.
double copy_gbps(void* d, void* h, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s, int reps = 7)
{
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  std::vector<double> v;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(a, s), "record");
    if (kind == cudaMemcpyHostToDevice) check(cudaMemcpyAsync(d, h, bytes, kind, s), "copy");
    else check(cudaMemcpyAsync(h, d, bytes, kind, s), "copy");
    check(cudaEventRecord(b, s), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    v.push_back(gbps(bytes, ms));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return strata::bench::median(v);
}

} // namespace

int main(int argc, char** argv)
{
  const std::string json_path = strata::bench::option(argc, argv, "--json");
  const double scale = std::stod(strata::bench::option(argc, argv, "--scale", "0.5"));
  const std::size_t fresh = std::stoull(strata::bench::option(argc, argv, "--fresh-gib", "20")) * GiB;
  const bool host_alloc_reference = !strata::bench::flag(argc, argv, "--no-cudahostalloc");
  if (!strata::bench::gpu_present("pinned_host")) return 0;
  check(cudaFree(nullptr), "context");
  std::vector<row> rows;
  int node = -1;
  {
    strata::pinned_host_pool<> probe;
    node = probe.numa_node();
  }

  // Held over requested, all buffers live at once.
  for (const std::string name : {"24x2.0832GiB", "experts", "mixed"}) {
    const auto sizes = pattern(name, scale);
    std::size_t requested = 0, power_of_two = 0;
    for (const std::size_t b : sizes) {
      requested += b;
      power_of_two += std::bit_ceil(std::max(b, std::size_t{4096}));
    }
    strata::pinned_host_pool<> pool;
    std::vector<void*> blocks;
    const auto t0 = clock_type::now();
    for (const std::size_t b : sizes) blocks.push_back(pool.allocate(b));
    const double pin_s = seconds_since(t0);
    const auto s = pool.stats();
    const std::string section = name + " (" + std::to_string(sizes.size()) + " buffers, " +
                                std::to_string(static_cast<double>(requested) / static_cast<double>(GiB)).substr(0, 5) + " GiB)";
    rows.push_back({section, "pinned_host_pool held / requested", static_cast<double>(s.pinned) / static_cast<double>(requested), "x"});
    rows.push_back({section, "power-of-two rounding held / requested (model)", static_cast<double>(power_of_two) / static_cast<double>(requested), "x"});
    rows.push_back({section, "pinned_host_pool pinning", static_cast<double>(requested) / GiB / pin_s, "GiB/s"});
    for (std::size_t i = 0; i < blocks.size(); ++i) pool.deallocate(blocks[i], sizes[i]);
    // The same buffers again, in reverse order: served from the idle memory.
    const std::size_t pins = pool.stats().pins;
    const auto t1 = clock_type::now();
    for (std::size_t i = sizes.size(); i-- > 0;) blocks[i] = pool.allocate(sizes[i]);
    rows.push_back({section, "pinned_host_pool reuse, pins made", static_cast<double>(pool.stats().pins - pins), "pins"});
    rows.push_back({section, "pinned_host_pool reuse, time per buffer", seconds_since(t1) * 1e6 / static_cast<double>(sizes.size()), "us"});
    for (std::size_t i = 0; i < blocks.size(); ++i) pool.deallocate(blocks[i], sizes[i]);
  }

  // Pinning `fresh` bytes from nothing.
  const std::string fresh_section = "pin " + std::to_string(fresh / GiB) + " GiB fresh";
  {
    strata::pinned_host_pool<> pool;
    auto t0 = clock_type::now();
    void* p = pool.allocate(fresh);
    rows.push_back({fresh_section, "pinned_host_pool", seconds_since(t0), "s"});
    pool.deallocate(p, fresh);
    t0 = clock_type::now();
    p = pool.allocate(fresh);
    rows.push_back({fresh_section, "pinned_host_pool again (idle memory)", seconds_since(t0), "s"});
    pool.deallocate(p, fresh);
    const std::size_t pins = pool.stats().pins;
    void* halves[2] = {pool.allocate(fresh / 2), pool.allocate(fresh / 2)};
    rows.push_back({fresh_section, "pinned_host_pool two halves of it, pins made", static_cast<double>(pool.stats().pins - pins), "pins"});
    pool.deallocate(halves[0], fresh / 2);
    pool.deallocate(halves[1], fresh / 2);
    t0 = clock_type::now();
    (void)pool.release();
    rows.push_back({fresh_section, "pinned_host_pool release (unpin)", seconds_since(t0), "s"});
  }
  {
    auto t0 = clock_type::now();
    void* p = strata::pin_host(fresh);
    rows.push_back({fresh_section, "pin_host (64 MiB registrations)", seconds_since(t0), "s"});
    strata::unpin_host(p, fresh);
  }
  if (host_alloc_reference) {
    void* p = nullptr;
    const auto t0 = clock_type::now();
    check(cudaHostAlloc(&p, fresh, cudaHostAllocPortable), "cudaHostAlloc");
    rows.push_back({fresh_section, "cudaHostAlloc", seconds_since(t0), "s"});
    check(cudaFreeHost(p), "cudaFreeHost");
  }

  // Copy bandwidth from a pool block (1 GiB, inside a larger chunk carved by the pool) against cudaHostAlloc.
  {
    const std::size_t bytes = GiB;
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    void* d = nullptr;
    check(cudaMalloc(&d, bytes), "cudaMalloc");
    strata::pinned_host_pool<> pool;
    void* whole = pool.allocate(3 * bytes);
    pool.deallocate(whole, 3 * bytes);
    void* first = pool.allocate(bytes + 4096);
    void* h = pool.allocate(bytes);  // starts inside the chunk, not at its start
    rows.push_back({"copy 1 GiB", "H2D from pinned_host_pool", copy_gbps(d, h, bytes, cudaMemcpyHostToDevice, s), "GB/s"});
    rows.push_back({"copy 1 GiB", "D2H to pinned_host_pool", copy_gbps(d, h, bytes, cudaMemcpyDeviceToHost, s), "GB/s"});
    pool.deallocate(h, bytes);
    pool.deallocate(first, bytes + 4096);
    void* ref = nullptr;
    check(cudaHostAlloc(&ref, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    rows.push_back({"copy 1 GiB", "H2D from cudaHostAlloc", copy_gbps(d, ref, bytes, cudaMemcpyHostToDevice, s), "GB/s"});
    rows.push_back({"copy 1 GiB", "D2H to cudaHostAlloc", copy_gbps(d, ref, bytes, cudaMemcpyDeviceToHost, s), "GB/s"});
    check(cudaFreeHost(ref), "cudaFreeHost");
    check(cudaFree(d), "cudaFree");
    check(cudaStreamDestroy(s), "destroy");
  }

  std::printf("\npinned_host_pool (GPU's NUMA node %d, scale %.2f)\n%-34s %-48s %12s\n", node, scale, "measure", "what", "value");
  for (const auto& r : rows) std::printf("%-34s %-48s %12.4f %s\n", r.section.c_str(), r.name.c_str(), r.value, r.unit.c_str());
  auto find = [&](const std::string& section_prefix, const std::string& name) {
    for (const auto& r : rows)
      if (r.section.rfind(section_prefix, 0) == 0 && r.name == name) return r.value;
    return 0.0;
  };
  const double worst = std::max({find("24x", "pinned_host_pool held / requested"), find("experts", "pinned_host_pool held / requested"),
                                 find("mixed", "pinned_host_pool held / requested")});
  const double h2d = find("copy", "H2D from pinned_host_pool") / find("copy", "H2D from cudaHostAlloc");
  const double d2h = find("copy", "D2H to pinned_host_pool") / find("copy", "D2H to cudaHostAlloc");
  std::printf("targets: held/requested worst %.4f (<= 1.02: %s); pin fresh %.2f s (<= 3 s: %s); reuse pins %g; "
              "copy vs cudaHostAlloc H2D %.3f D2H %.3f\n",
              worst, worst <= 1.02 ? "yes" : "NO", find("pin ", "pinned_host_pool"), find("pin ", "pinned_host_pool") <= 3.0 ? "yes" : "NO",
              find("pin ", "pinned_host_pool two halves of it, pins made"), h2d, d2h);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\"scale\":" << scale << ",\"numa_node\":" << node << ",\"fresh_bytes\":" << fresh << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i)
      out << (i ? "," : "") << "{\"section\":\"" << rows[i].section << "\",\"what\":\"" << rows[i].name << "\",\"value\":" << rows[i].value
          << ",\"unit\":\"" << rows[i].unit << "\"}";
    out << "]}\n";
  }
  return 0;
}
