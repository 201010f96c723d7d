// std::pmr containers on a pinned-memory pool: the host builds ordinary containers, and a kernel reads them
// in place (pinned memory is device-accessible), with no copy and no cudaMallocHost per container.
#include <cstdio>
#include <memory_resource>
#include <string>

#include <strata/interop/pmr_adaptor.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/pinned_source.hpp>

__global__ void histogram(const int* values, std::size_t n, unsigned* bins)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    atomicAdd(&bins[values[i] % 16], 1u);
}

int main()
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("pmr_containers: no GPU here; this example needs one\n");
    return 77;
  }
  strata::pmr_adaptor<strata::size_class_pool<strata::pinned_source>> pinned;
  std::pmr::vector<int> values(&pinned);
  for (int i = 0; i < 1'000'000; ++i) values.push_back(i * 7);
  std::pmr::vector<unsigned> bins(16, 0u, &pinned);
  std::pmr::map<std::pmr::string, int> labels(&pinned);  // any std::pmr container works the same way
  labels.emplace("multiples of seven", 7);

  histogram<<<256, 256>>>(values.data(), values.size(), bins.data());
  const bool ok = cudaDeviceSynchronize() == cudaSuccess;
  unsigned total = 0;
  for (unsigned b : bins) total += b;
  std::printf("pmr_containers on the GPU: a kernel read %zu ints from a std::pmr::vector in pinned memory; %u counted\n",
              values.size(), total);
  std::printf("  pinned pool: %zu bytes in use in %zu chunk(s)\n", pinned.resource().usage().in_use, pinned.resource().usage().chunks);
  return ok && total == values.size() ? 0 : 1;
}
