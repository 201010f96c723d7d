// A file in shared memory (/dev/shm), mapped and registered with cudaHostRegister, processed in place by a
// kernel: the kernel reads what another process could have written, and its writes land in the file.
#include <cstdio>
#include <string>

#include <unistd.h>

#include <strata/source/registered_host_source.hpp>

__global__ void increment(unsigned* words, std::size_t n)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) words[i] += 1;
}

int main()
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("mapped_file: no GPU here; this example needs one\n");
    return 77;
  }
  const std::string path = "/dev/shm/strata_mapped_file_example_" + std::to_string(::getpid());
  constexpr std::size_t bytes = 16 << 20;
  int status = 1;
  {
    auto file = strata::registered_host_source::map_file(path, bytes);
    auto* words = static_cast<unsigned*>(file.data());
    for (std::size_t i = 0; i < bytes / 4; ++i) words[i] = static_cast<unsigned>(i);  // "another process" wrote this
    increment<<<256, 256>>>(words, bytes / 4);  // the kernel works on the file's pages directly
    cudaDeviceSynchronize();
    bool ok = true;
    for (std::size_t i = 0; i < bytes / 4; i += 4099) ok = ok && words[i] == static_cast<unsigned>(i + 1);
    std::printf("mapped_file on the GPU: %s (%zu MiB) registered and incremented in place by a kernel: %s\n", path.c_str(),
                bytes >> 20, ok ? "correct" : "WRONG");
    file.release();  // unregisters and unmaps; the file keeps the kernel's writes
    status = ok ? 0 : 1;
  }
  ::unlink(path.c_str());
  return status;
}
