// A double-buffered host-to-device pipeline: the host fills one pinned staging buffer while the previous one
// is copied and processed on the GPU. Staging buffers come from a pinned pool, so each batch costs a free-list
// pop instead of a cudaMallocHost, which pins pages and is slow even for 4 KiB.
#include <cstdio>
#include <vector>

#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/pinned_source.hpp>

__global__ void checksum(const unsigned* data, std::size_t n, unsigned long long* sum)
{
  unsigned long long local = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) local += data[i];
  atomicAdd(sum, local);
}

int main()
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("pinned_staging: no GPU here; this example needs one\n");
    return 77;
  }
  constexpr std::size_t batch_words = 4 << 20, batches = 32;
  strata::size_class_pool<strata::pinned_source, std::size_t{32} << 20> staging;  // classes up to 32 MiB
  strata::coalescing_pool<strata::device_source> device;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  auto* device_buffer = static_cast<unsigned*>(device.allocate(batch_words * sizeof(unsigned)));
  auto* sum = static_cast<unsigned long long*>(device.allocate(sizeof(unsigned long long)));
  cudaMemsetAsync(sum, 0, sizeof *sum, s);
  unsigned* in_flight[2] = {nullptr, nullptr};
  cudaEvent_t copied[2];
  cudaEventCreate(&copied[0]);
  cudaEventCreate(&copied[1]);
  unsigned long long expected = 0;
  for (std::size_t b = 0; b < batches; ++b) {
    const int slot = b % 2;
    if (in_flight[slot] != nullptr) {  // the copy out of this slot must finish before the buffer is reused
      cudaEventSynchronize(copied[slot]);
      staging.deallocate(in_flight[slot], batch_words * sizeof(unsigned));
    }
    auto* host = static_cast<unsigned*>(staging.allocate(batch_words * sizeof(unsigned)));
    for (std::size_t i = 0; i < batch_words; ++i) host[i] = static_cast<unsigned>(b + i % 7);
    for (std::size_t i = 0; i < batch_words; ++i) expected += static_cast<unsigned>(b + i % 7);
    cudaMemcpyAsync(device_buffer, host, batch_words * sizeof(unsigned), cudaMemcpyHostToDevice, s);
    cudaEventRecord(copied[slot], s);
    checksum<<<256, 256, 0, s>>>(device_buffer, batch_words, sum);
    in_flight[slot] = host;
  }
  unsigned long long got = 0;
  cudaMemcpyAsync(&got, sum, sizeof got, cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  for (auto* h : in_flight) staging.deallocate(h, batch_words * sizeof(unsigned));
  std::printf("pinned_staging on the GPU: %zu batches of %zu MiB through 2 pinned staging buffers, checksum %s\n", batches,
              batch_words * sizeof(unsigned) >> 20, got == expected ? "correct" : "WRONG");
  std::printf("  pinned pool: %zu chunk(s), %zu bytes reserved for %zu batches\n", staging.usage().chunks, staging.usage().reserved, batches);
  device.deallocate(device_buffer, batch_words * sizeof(unsigned));
  device.deallocate(sum, sizeof(unsigned long long));
  cudaEventDestroy(copied[0]);
  cudaEventDestroy(copied[1]);
  cudaStreamDestroy(s);
  return got == expected ? 0 : 1;
}
