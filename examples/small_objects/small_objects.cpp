// Many small buffers (a graph's node features, per-request metadata...) from size classes: one cudaMalloc
// per 2 MiB chunk instead of one per buffer, O(1) allocate and free.
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include <strata/policy/size_class_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/host_source.hpp>
#include "../gpu_or_host.hpp"

template <class Source>
int run(Source source, bool on_gpu)
{
  strata::size_class_pool<Source> pool(std::move(source));
  std::mt19937 rng(3);
  std::vector<std::pair<void*, std::size_t>> buffers;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 100'000; ++i) {
    const std::size_t bytes = 64 + rng() % 16'000;
    buffers.emplace_back(pool.allocate(bytes), bytes);
    if (buffers.size() > 5'000) {  // free a random one: the mix a long-running service sees
      const std::size_t victim = rng() % buffers.size();
      pool.deallocate(buffers[victim].first, buffers[victim].second);
      buffers[victim] = buffers.back();
      buffers.pop_back();
    }
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  examples::touch(buffers.front().first, buffers.front().second, on_gpu);
  const auto u = pool.usage();
  std::size_t live_bytes = 0;
  for (auto [p, n] : buffers) live_bytes += n;
  // Size classes waste at most 20% of a block; the slabs sit in 2 MiB chunks, not one allocation per buffer.
  examples::expect(u.used_blocks == buffers.size() && u.in_use >= live_bytes && u.in_use <= live_bytes / 4 * 5 + 256 * buffers.size(),
                   "every live buffer counted, rounded by at most 20% (+256 B)");
  examples::expect(u.chunks < buffers.size() / 10, "chunks, not one upstream allocation per buffer");
  std::printf("100000 allocations (+%zu frees) in %.2f ms; %zu live buffers in %zu chunk(s): %zu bytes in use of %zu reserved\n",
              100'000 - buffers.size(), ms, u.used_blocks, u.chunks, u.in_use, u.reserved);
  for (auto [p, n] : buffers) pool.deallocate(p, n);
  pool.release();
  std::printf("after freeing everything and release(): %zu bytes reserved\n", pool.usage().reserved);
  examples::expect(pool.usage().reserved == 0, "release() hands every chunk back");
  return examples::status();
}

int main()
{
  if (examples::has_gpu()) {
    std::puts("small_objects: on the GPU (size_class_pool<device_source>)");
    return run(strata::device_source{}, true);
  }
  std::puts("small_objects: no GPU found, on host memory (size_class_pool<host_source>)");
  return run(strata::host_source{}, false);
}
