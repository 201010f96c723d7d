// strata in a few dozen lines. First the recommended stack, default_pool: stream-ordered reuse over
// page-mapped device memory, which holds little more than what is live. Then the building blocks: a
// coalescing pool stacked on a memory source, allocate, use, free, look inside.
// With a GPU both run on device memory; without one the pool runs on host memory and the recommended stack
// is planned on a pretend device (planning_pool), which answers the same questions about memory.
#include <cstdio>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/usage.hpp>
#include <strata/default_pool.hpp>
#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/host_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include "../gpu_or_host.hpp"

/// A training-like pattern through the recommended stack: activations allocated, freed, allocated again at
/// other sizes. `held` reads the physical memory the stack holds; `sync` waits for the stream's work.
template <class Stack, class Held>
void recommended(Stack& stack, cuda::stream_ref stream, Held held, bool on_gpu)
{
  constexpr std::size_t mib = std::size_t{1} << 20;
  std::size_t live = 0, peak_live = 0, peak_held = 0;
  for (std::size_t step = 1; step <= 3; ++step) {
    std::vector<std::pair<void*, std::size_t>> activations;
    for (std::size_t layer = 0; layer < 12; ++layer) {
      const std::size_t bytes = (3 + layer % 5) * mib * step + 512 * layer;  // sizes change from step to step
      activations.push_back({stack.allocate_async(bytes, 256, stream), bytes});
      if (on_gpu) examples::check(cudaMemsetAsync(activations.back().first, 1, bytes, stream.get()), "cudaMemsetAsync");
      live += bytes;
      peak_live = std::max(peak_live, live);
      peak_held = std::max(peak_held, held());
    }
    for (auto [p, bytes] : activations) {
      stack.deallocate_async(p, bytes, 256, stream);
      live -= bytes;
    }
  }
  std::printf("recommended stack: peak live %.1f MiB, peak held %.1f MiB (%.3fx)\n", double(peak_live) / mib, double(peak_held) / mib,
              double(peak_held) / double(peak_live));
  examples::expect(peak_held <= peak_live + peak_live / 20 + 4 * mib, "the stack holds within 5% (and a page or two) of what is live");
  stack.release();
  examples::expect(held() == 0, "release() hands back every page");
}

template <class Source>
int run(Source source, bool on_gpu)
{
  strata::coalescing_pool<Source> pool(std::move(source), {.initial_chunk = 64 << 20});
  void* a = pool.allocate(1000);             // rounded to 1024 bytes, 256-byte aligned
  void* b = pool.allocate(10 << 20, 4096);   // any power-of-two alignment
  examples::touch(a, 1000, on_gpu);
  examples::touch(b, 10 << 20, on_gpu);
  examples::expect(strata::is_aligned(a, 256) && strata::is_aligned(b, 4096), "blocks aligned as asked");
  pool.deallocate(a, 1000);
  const strata::usage u = pool.usage();
  std::printf("coalescing_pool: reserved %zu bytes in %zu chunk(s), %zu in use, largest free block %zu, fragmentation %.3f\n",
              u.reserved, u.chunks, u.in_use, u.largest_free, u.fragmentation());
  // Small and large requests live in chunks of their own (mixing them fragments): two chunks.
  examples::expect(u.in_use == 10 << 20 && u.chunks == 2, "a small chunk and a 64 MiB one; the 10 MiB block still in use");
  pool.deallocate(b, 10 << 20, 4096);
  const std::size_t reserved = pool.usage().reserved;
  const std::size_t returned = pool.release();
  std::printf("after the frees: %zu bytes in use; release() hands back %zu bytes\n", pool.usage().in_use, returned);
  examples::expect(returned == reserved && pool.usage().reserved == 0, "release() hands back everything");
  return examples::status();
}

int main()
{
  if (examples::has_gpu()) {
    std::puts("quickstart: running on the GPU (default_pool on page-mapped device memory; coalescing_pool on cudaMalloc)");
    cudaStream_t stream = nullptr;
    examples::check(cudaStreamCreate(&stream), "cudaStreamCreate");
    {
      strata::default_pool stack = strata::make_default_pool();
      recommended(stack, cuda::stream_ref{stream}, [&] { return stack.policy().physical_bytes(); }, true);
    }
    examples::check(cudaStreamDestroy(stream), "cudaStreamDestroy");
    return run(strata::device_source{}, true);
  }
  std::puts("quickstart: no GPU found, running on host memory (coalescing_pool on host_source) and planning the "
            "recommended stack on a pretend device (planning_pool)");
  strata::simulated_streams world;
  strata::planning_pool stack{strata::mapped_pool<strata::simulated_pages>{}, {}, strata::simulated_events(world)};
  recommended(stack, world.create(), [&] { return stack.policy().physical_bytes(); }, false);
  return run(strata::host_source{}, false);
}
