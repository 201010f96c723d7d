// Sleep and wake by tag at scale: a tag holding SIZE bytes of live blocks (20 GiB by default, never more than
// the card has free) paused and resumed through mapped_pool<driver_pages>, with a backup (steady state: the
// pinned memory already kept; and the first pause, which pins), and without one. Beside them, in the same run:
// what pinning SIZE costs by cudaHostAlloc and by pin_host (chunks registered by several threads, and by one),
// and the pinned copy bandwidth each way, so each pause and resume can be read against the link's speed.
//   sleep_wake_bench [SIZE_GIB] [--blocks N] [--cycles N] [--no-hostalloc] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <strata/pages/driver_pages.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/sleep/pinned_host.hpp>
#include "bench_common.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using strata::bench::check;
constexpr std::size_t gib = std::size_t{1} << 30;
constexpr std::size_t mib = std::size_t{1} << 20;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

template <class F>
double timed(F&& f)
{
  const auto t = clock_type::now();
  f();
  return seconds_since(t);
}

/// GB/s of one pinned copy of `bytes` each way (host -> device, device -> host), timed with events.
std::pair<double, double> copy_bandwidth(void* device, void* host, std::size_t bytes)
{
  cudaStream_t s = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  // pin_host registers its memory chunk by chunk, and one copy may not cross two registrations: copy in
  // chunk-sized pieces, as driver_pages does.
  auto copy = [&](void* dst, const void* src, cudaMemcpyKind kind, const char* what) {
    constexpr std::size_t piece = strata::pinned_host_layout::chunk;
    for (std::size_t off = 0; off < bytes; off += piece)
      check(cudaMemcpyAsync(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, std::min(piece, bytes - off), kind, s), what);
  };
  auto run = [&](void* dst, const void* src, cudaMemcpyKind kind) {
    copy(dst, src, kind, "warm copy");
    check(cudaEventRecord(a, s), "record");
    copy(dst, src, kind, "copy");
    check(cudaEventRecord(b, s), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    return static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
  };
  const double h2d = run(device, host, cudaMemcpyHostToDevice), d2h = run(host, device, cudaMemcpyDeviceToHost);
  check(cudaEventDestroy(a), "event");
  check(cudaEventDestroy(b), "event");
  check(cudaStreamDestroy(s), "stream");
  return {h2d, d2h};
}

std::size_t device_used()
{
  std::size_t free_bytes = 0, total = 0;
  check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  return total - free_bytes;
}

__global__ void touch_kernel(unsigned* p, std::size_t n)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) p[i] = static_cast<unsigned>(i);
}

} // namespace

int main(int argc, char** argv)
{
  if (!strata::bench::gpu_present("sleep_wake")) return 0;
  double asked_gib = 20.0;
  if (argc > 1 && argv[1][0] != '-') asked_gib = std::atof(argv[1]);
  const int blocks = std::stoi(strata::bench::option(argc, argv, "--blocks", "64"));
  const int cycles = std::stoi(strata::bench::option(argc, argv, "--cycles", "5"));
  const bool hostalloc = !strata::bench::flag(argc, argv, "--no-hostalloc");
  const std::string json = strata::bench::option(argc, argv, "--json");

  std::size_t free_bytes = 0, total = 0;
  check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  std::size_t size = static_cast<std::size_t>(asked_gib * static_cast<double>(gib));
  const std::size_t room = free_bytes > 2 * gib ? free_bytes - 2 * gib : free_bytes / 2;  // the copy test and the driver need some
  if (size > room) {
    std::printf("asked for %.1f GiB; the card has %.1f GiB free: using %.1f GiB\n", asked_gib, static_cast<double>(free_bytes) / gib,
                static_cast<double>(room) / gib);
    size = room;
  }
  const std::size_t block = size / static_cast<std::size_t>(blocks) / (2 * mib) * (2 * mib);
  size = block * static_cast<std::size_t>(blocks);

  // Pinning SIZE three ways.
  double t_hostalloc = -1;
  if (hostalloc) {
    void* p = nullptr;
    t_hostalloc = timed([&] { check(cudaHostAlloc(&p, size, cudaHostAllocPortable), "cudaHostAlloc"); });
    check(cudaFreeHost(p), "cudaFreeHost");
  }
  void* pinned = nullptr;
  const double t_pin_parallel = timed([&] { pinned = strata::pin_host(size); });
  // The copy bandwidth, on the same pinned memory and a device buffer of up to 1 GiB.
  const std::size_t probe = std::min(size, gib);
  void* device = nullptr;
  check(cudaMalloc(&device, probe), "cudaMalloc");
  const auto [h2d, d2h] = copy_bandwidth(device, pinned, probe);
  check(cudaFree(device), "cudaFree");
  strata::unpin_host(pinned, size);
  const double t_pin_one = timed([&] { pinned = strata::pin_host(size, 1); });
  strata::unpin_host(pinned, size);

  // The pool: one tag holding SIZE in `blocks` blocks, written by a kernel.
  strata::mapped_pool<strata::driver_pages> pool;
  std::vector<void*> ps;
  for (int i = 0; i < blocks; ++i) {
    ps.push_back(pool.allocate_tagged(1, block));
    touch_kernel<<<1024, 256>>>(static_cast<unsigned*>(ps.back()), block / sizeof(unsigned));
  }
  check(cudaDeviceSynchronize(), "touch");
  const double first_pause = timed([&] { pool.pause({1}); });
  const double first_resume = timed([&] { pool.resume({1}); });
  std::vector<double> pause_s, resume_s, pause_nb, resume_nb;
  // What a pause gives back, as the device sees it, against the physical memory the tag held.
  const std::size_t held = pool.physical_bytes(1);
  const std::size_t used_awake = device_used();
  pause_s.push_back(timed([&] { pool.pause({1}); }));
  const std::size_t given_back = used_awake - std::min(used_awake, device_used());
  resume_s.push_back(timed([&] { pool.resume({1}); }));
  for (int c = 1; c < cycles; ++c) {
    pause_s.push_back(timed([&] { pool.pause({1}); }));
    resume_s.push_back(timed([&] { pool.resume({1}); }));
  }
  for (int c = 0; c < cycles; ++c) {
    pause_nb.push_back(timed([&] { pool.pause({1}, /*backup=*/false); }));
    resume_nb.push_back(timed([&] { pool.resume({1}); }));
  }
  for (void* p : ps) pool.deallocate(p, block);
  const double pause_med = strata::bench::median(pause_s), resume_med = strata::bench::median(resume_s);
  const double gb = static_cast<double>(size) / 1e9;

  std::printf("sleep_wake: %.2f GiB in %d blocks of one tag (%s)\n", static_cast<double>(size) / gib, blocks, "mapped_pool<driver_pages>");
  std::printf("pinned copy bandwidth: host->device %.1f GB/s, device->host %.1f GB/s (1 GiB probe)\n", h2d, d2h);
  std::printf("pinning %.2f GiB: cudaHostAlloc %s s, pin_host (parallel) %.3f s, pin_host (one thread) %.3f s\n", static_cast<double>(size) / gib,
              hostalloc ? std::to_string(t_hostalloc).c_str() : "skipped", t_pin_parallel, t_pin_one);
  std::printf("first pause (pins): %.3f s; first resume %.3f s\n", first_pause, first_resume);
  std::printf("steady pause with backup: %.3f s (%.1f GB/s); resume: %.3f s (%.1f GB/s); link alone: %.3f s / %.3f s\n", pause_med,
              gb / pause_med, resume_med, gb / resume_med, gb / d2h, gb / h2d);
  std::printf("without backup: pause %.3f s, resume %.3f s\n", strata::bench::median(pause_nb), strata::bench::median(resume_nb));
  std::printf("a pause gave back %.3f GiB of device memory (cudaMemGetInfo) of the %.3f GiB the tag held: %.2f%%\n",
              static_cast<double>(given_back) / gib, static_cast<double>(held) / gib, 100.0 * static_cast<double>(given_back) / static_cast<double>(held));
  if (hostalloc) std::printf("first pause, pinning included, against one cudaHostAlloc of the size: %.2fx faster\n", t_hostalloc / first_pause);
  std::printf("driver calls: creates %llu, maps %llu, unmaps %llu, releases %llu, device waits %llu\n",
              static_cast<unsigned long long>(pool.page_calls().creates), static_cast<unsigned long long>(pool.page_calls().maps),
              static_cast<unsigned long long>(pool.page_calls().unmaps), static_cast<unsigned long long>(pool.page_calls().releases),
              static_cast<unsigned long long>(pool.page_calls().synchronizes));
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"bytes\": " << size << ", \"blocks\": " << blocks << ", \"cycles\": " << cycles << ", \"h2d_gbps\": " << h2d
        << ", \"d2h_gbps\": " << d2h << ", \"pin_cudahostalloc_s\": " << t_hostalloc << ", \"pin_host_parallel_s\": " << t_pin_parallel
        << ", \"pin_host_one_thread_s\": " << t_pin_one << ", \"first_pause_s\": " << first_pause << ", \"first_resume_s\": " << first_resume
        << ", \"pause_s\": " << pause_med << ", \"resume_s\": " << resume_med << ", \"pause_no_backup_s\": " << strata::bench::median(pause_nb)
        << ", \"resume_no_backup_s\": " << strata::bench::median(resume_nb) << ", \"held_bytes\": " << held
        << ", \"given_back_bytes\": " << given_back << "}\n";
  }
  return 0;
}
