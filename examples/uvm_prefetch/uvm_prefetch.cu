// Managed memory without page-fault storms: the same kernel over 1 GiB of managed memory initialised on the
// host, first faulting its pages in, then after the block was prefetched to the device by prefetch<>.
#include <chrono>
#include <cstdio>
#include <cstring>

#include <strata/adaptor/prefetch.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/managed_source.hpp>

__global__ void scale(float* p, std::size_t n)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) p[i] = 2 * p[i] + 1;
}

double kernel_gbps(float* p, std::size_t bytes, cudaStream_t s)
{
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, s);
  scale<<<1024, 512, 0, s>>>(p, bytes / sizeof(float));
  cudaEventRecord(b, s);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

int main()
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("uvm_prefetch: no GPU here; this example needs one\n");
    return 77;
  }
  constexpr std::size_t bytes = std::size_t{1} << 30;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  using managed_pool = strata::coalescing_pool<strata::managed_source>;
  strata::prefetch<managed_pool> pool{managed_pool{strata::managed_source{}, {.initial_chunk = bytes}}};

  auto* first_touch = static_cast<float*>(pool.upstream().allocate(bytes));  // no prefetch: the plain pool
  std::memset(first_touch, 0, bytes);
  const double faulting = kernel_gbps(first_touch, bytes, s);
  pool.upstream().deallocate(first_touch, bytes);

  auto* prefetched = static_cast<float*>(pool.allocate_async(bytes, 256, s));  // prefetched on s
  cudaMemsetAsync(prefetched, 0, bytes, s);
  const double fast = kernel_gbps(prefetched, bytes, s);
  pool.deallocate_async(prefetched, bytes, 256, s);
  cudaStreamDestroy(s);
  std::printf("uvm_prefetch on the GPU (prefetch %s): kernel over 1 GiB of managed memory\n", pool.enabled() ? "on" : "a no-op here");
  std::printf("  pages on the host, faulted in: %8.1f GB/s\n  prefetched to the device:      %8.1f GB/s (%.0fx)\n", faulting, fast, fast / faulting);
  return fast > faulting ? 0 : 1;
}
