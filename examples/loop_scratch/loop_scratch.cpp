// Scratch memory in a loop: cudaMalloc/cudaFree every iteration versus one arena reset per iteration.
// Same work in both loops (a few buffers written each iteration); the arena takes its chunks once.
#include <chrono>
#include <cstdio>

#include <strata/policy/arena.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/host_source.hpp>
#include "../gpu_or_host.hpp"

constexpr int iterations = 200;
constexpr std::size_t sizes[] = {1 << 20, 3 << 20, 256 << 10, 8 << 20, 64 << 10};

template <class Allocate, class Free, class EndIteration>
double time_loop(Allocate allocate, Free free, EndIteration end_iteration, bool on_gpu)
{
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) {
    void* buffers[std::size(sizes)];
    for (std::size_t k = 0; k < std::size(sizes); ++k) {
      buffers[k] = allocate(sizes[k]);
      examples::touch(buffers[k], sizes[k], on_gpu);
    }
    for (std::size_t k = std::size(sizes); k-- > 0;) free(buffers[k], sizes[k]);
    end_iteration();
  }
  if (on_gpu) (void)cudaDeviceSynchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

template <class Source>
int run(Source source, bool on_gpu)
{
  Source direct = source;
  const double plain = time_loop([&](std::size_t n) { return direct.allocate(n); },
                                 [&](void* p, std::size_t n) { direct.deallocate(p, n); }, [] {}, on_gpu);
  strata::arena<Source> scratch(std::move(source), {.initial_chunk = 16 << 20});
  const double arena = time_loop([&](std::size_t n) { return scratch.allocate(n); }, [](void*, std::size_t) {},
                                 [&] { scratch.reset(); }, on_gpu);
  std::printf("%d iterations: allocate/free every time %.2f ms, arena reset per iteration %.2f ms (%.1fx)\n",
              iterations, plain, arena, plain / arena);
  std::printf("arena holds %zu bytes in %zu chunk(s)\n", scratch.usage().reserved, scratch.usage().chunks);
  // An iteration's 12.3 MiB fit the first 16 MiB chunk: taken once, reused by every iteration.
  examples::expect(scratch.usage().chunks == 1 && scratch.usage().in_use == 0, "one chunk, empty after the last reset");
  return examples::status();
}

int main()
{
  if (examples::has_gpu()) {
    std::puts("loop_scratch: on the GPU (cudaMalloc/cudaFree vs arena<device_source>)");
    return run(strata::device_source{}, true);
  }
  std::puts("loop_scratch: no GPU found, on host memory (operator new/delete vs arena<host_source>)");
  return run(strata::host_source{}, false);
}
