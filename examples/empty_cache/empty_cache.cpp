// release(): what torch.cuda.empty_cache() does, for any strata pool. Shows the device's free memory
// before, while the pool caches freed blocks, and after release() hands wholly free chunks back.
#include <cstdio>
#include <vector>

#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/simulated_source.hpp>
#include "../gpu_or_host.hpp"

template <class Source, class FreeMemory>
int run(Source source, FreeMemory free_memory)
{
  strata::coalescing_pool<Source> pool(std::move(source), {.initial_chunk = 64 << 20, .max_chunk = 256 << 20});
  const std::size_t before = free_memory();
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(pool.allocate(48 << 20));
  for (void* p : blocks) pool.deallocate(p, 48 << 20);
  const std::size_t cached = free_memory();
  std::printf("pool reserves %zu MiB after freeing everything (cached for reuse)\n", pool.usage().reserved >> 20);
  const std::size_t returned = pool.release();
  const std::size_t after = free_memory();
  std::printf("free memory: before %zu MiB, while cached %zu MiB, after release() %zu MiB (%zu MiB handed back)\n",
              before >> 20, cached >> 20, after >> 20, returned >> 20);
  examples::expect(returned >= std::size_t{16} * (48 << 20) && pool.usage().reserved == 0, "release() hands every chunk back");
  examples::expect(cached < before && after > cached, "the device sees the memory go and come back");
  return examples::status();
}

int main()
{
  if (examples::has_gpu()) {
    std::puts("empty_cache: on the GPU (coalescing_pool<device_source>; free memory from cudaMemGetInfo)");
    return run(strata::device_source{}, [] {
      std::size_t free_bytes = 0, total = 0;
      (void)cudaMemGetInfo(&free_bytes, &total);
      return free_bytes;
    });
  }
  std::puts("empty_cache: no GPU found, on simulated memory with a 4 GiB capacity (free = capacity - allocated)");
  strata::simulated_source sim(std::size_t{4} << 30);
  auto* s = &sim;
  return run(strata::ref(sim), [s] { return s->capacity() - s->allocated_bytes(); });
}
