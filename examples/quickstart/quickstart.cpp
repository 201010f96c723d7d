// strata in a dozen lines: stack a coalescing pool on a memory source, allocate, use, free, look inside.
// On a machine with a GPU the source is device memory (cudaMalloc); without one, host memory.
#include <cstdio>

#include <strata/strata.hpp>
#include "../gpu_or_host.hpp"

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
  std::printf("reserved %zu bytes in %zu chunk(s), %zu in use, largest free block %zu, fragmentation %.3f\n",
              u.reserved, u.chunks, u.in_use, u.largest_free, u.fragmentation());
  examples::expect(u.in_use == 10 << 20 && u.chunks == 1, "one 64 MiB chunk holds the 10 MiB block still in use");
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
    std::puts("quickstart: running on the GPU (device_source, cudaMalloc)");
    return run(strata::device_source{}, true);
  }
  std::puts("quickstart: no GPU found, running on host memory (host_source)");
  return run(strata::host_source{}, false);
}
