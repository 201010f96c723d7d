// "Use at most 80% of the GPU": limit caps the bytes in use through it and refuses past the cap with an
// out_of_memory that names the limit, before the pool below is even asked.
#include <cstdio>

#include <strata/adaptor/limit.hpp>
#include <strata/core/errors.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/simulated_source.hpp>
#include "../gpu_or_host.hpp"

template <class Pool>
int run(strata::limit<Pool>& capped)
{
  const std::size_t cap = capped.max_bytes();
  std::printf("cap: %.1f GiB\n", static_cast<double>(cap) / (1 << 30));
  try {
    (void)capped.allocate(cap + cap / 8);  // more than the cap: refused without touching the device
    std::puts("unexpected: the over-large request was served");
    return 1;
  } catch (const strata::out_of_memory& e) {
    std::printf("refused as expected: %s\n", e.what());
  }
  void* a = capped.allocate(cap / 4);
  void* b = capped.allocate(cap / 4);
  std::printf("two blocks of a quarter of the cap: %.1f GiB in use through the limit\n",
              static_cast<double>(capped.bytes_in_use()) / (1 << 30));
  capped.deallocate(a, cap / 4);
  capped.deallocate(b, cap / 4);
  return capped.bytes_in_use() == 0 ? 0 : 1;
}

int main()
{
  using device_pool = strata::coalescing_pool<strata::device_source>;
  if (examples::has_gpu()) {
    std::puts("memory_fraction: on the GPU (80% of the device's memory, cudaMemGetInfo)");
    auto capped = strata::limit<device_pool>::fraction_of_device(device_pool{}, 0.8);
    return run(capped);
  }
  // Without a GPU: simulated device memory of 80 GiB (addresses only, nothing is touched).
  std::puts("memory_fraction: no GPU found, 80% of a simulated 80 GiB device (simulated_source)");
  using sim_pool = strata::coalescing_pool<strata::simulated_source>;
  const std::size_t device_bytes = std::size_t{80} << 30;
  strata::limit<sim_pool> capped{sim_pool{strata::simulated_source(device_bytes)}, device_bytes / 10 * 8};
  return run(capped);
}
