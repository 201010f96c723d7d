#pragma once
// Small kernels the GPU tests use to prove memory is really usable where a box says it is.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

namespace strata::testing {

__global__ inline void fill_kernel(std::uint32_t* p, std::size_t n, std::uint32_t seed)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = seed ^ static_cast<std::uint32_t>(i * 2654435761u);
}

__global__ inline void count_mismatches_kernel(const std::uint32_t* p, std::size_t n, std::uint32_t seed,
                                               unsigned long long* mismatches)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    if (p[i] != (seed ^ static_cast<std::uint32_t>(i * 2654435761u))) atomicAdd(mismatches, 1ull);
}

inline void fill(void* p, std::size_t bytes, std::uint32_t seed, cudaStream_t stream = nullptr)
{
  fill_kernel<<<256, 256, 0, stream>>>(static_cast<std::uint32_t*>(p), bytes / 4, seed);
  REQUIRE(cudaGetLastError() == cudaSuccess);
}

/// How many words of p do not hold the pattern fill(seed) writes; 0 means intact.
inline unsigned long long mismatches(const void* p, std::size_t bytes, std::uint32_t seed, cudaStream_t stream = nullptr)
{
  unsigned long long* counter = nullptr;
  REQUIRE(cudaMallocManaged(&counter, sizeof *counter) == cudaSuccess);
  *counter = 0;
  count_mismatches_kernel<<<256, 256, 0, stream>>>(static_cast<const std::uint32_t*>(p), bytes / 4, seed, counter);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  const unsigned long long result = *counter;
  REQUIRE(cudaFree(counter) == cudaSuccess);
  return result;
}

/// A kernel writes then reads back `bytes` at p: the memory is usable from the device.
inline void check_device_round_trip(void* p, std::size_t bytes, std::uint32_t seed = 7, cudaStream_t stream = nullptr)
{
  fill(p, bytes, seed, stream);
  CHECK(mismatches(p, bytes, seed, stream) == 0);
}

/// Spins for about `ns` on the GPU: the long kernel of the race tests.
__global__ inline void sleep_kernel(unsigned long long ns)
{
  const unsigned long long start = clock64();
  (void)start;
  for (unsigned long long waited = 0; waited < ns; waited += 1000) __nanosleep(1000);
}

} // namespace strata::testing
