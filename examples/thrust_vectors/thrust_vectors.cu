// Thrust on strata: device_vectors whose storage comes from a pool, and a sort whose temporary storage comes
// from a stream-ordered pool on the sort's own stream. After the first sort the pool holds what the sort
// needs, so later sorts cost no cudaMalloc at all.
#include <cstdio>
#include <random>
#include <vector>

#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/functional.h>
#include <thrust/sort.h>

#include <strata/adaptor/statistics.hpp>
#include <strata/interop/thrust_allocator.hpp>
#include <strata/interop/thrust_temp_allocator.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/stream/stream_ordered.hpp>

int main()
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("thrust_vectors: no GPU here; this example needs one\n");
    return 77;
  }
  using storage_pool = strata::coalescing_pool<strata::device_source>;
  using temp_pool = strata::statistics<strata::stream_ordered<strata::coalescing_pool<strata::device_source>>>;
  storage_pool storage;
  temp_pool temporaries;
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  strata::thrust_temp_allocator<temp_pool> temp(temporaries, stream);

  std::vector<float> host(1 << 24);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (auto& x : host) x = dist(rng);
  thrust::device_vector<float, strata::thrust_allocator<float, storage_pool>> keys(
    host.begin(), host.end(), strata::thrust_allocator<float, storage_pool>(storage));

  const auto chunks_before = temporaries.upstream().policy().usage().chunks;
  for (int round = 0; round < 5; ++round) {
    thrust::sort(thrust::cuda::par(temp).on(stream), keys.begin(), keys.end(), thrust::greater<float>());
    thrust::sort(thrust::cuda::par(temp).on(stream), keys.begin(), keys.end());
  }
  cudaStreamSynchronize(stream);
  const bool sorted = thrust::is_sorted(keys.begin(), keys.end());
  const auto counts = temporaries.snapshot_counts();
  std::printf("thrust_vectors on the GPU: 10 sorts of %zu floats, result %s\n", host.size(), sorted ? "sorted" : "NOT SORTED");
  std::printf("  storage pool: %zu bytes in use; temporaries: %zu allocations from the pool, peak %zu bytes, chunks %zu -> %zu\n",
              storage.usage().in_use, counts.total_blocks, counts.peak_bytes, chunks_before,
              temporaries.upstream().policy().usage().chunks);
  cudaStreamDestroy(stream);
  return sorted && counts.current_bytes == 0 ? 0 : 1;
}
