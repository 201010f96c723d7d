// Data-parallel gradients in strata pools, all-reduced with NCCL: one process drives every
// GPU (at most 8), each holding its gradients and its reduced copy in the recommended stack of its own
// device (default_pools: per_device<default_pool>), allocated and freed in stream order on that device's
// stream. ncclAllReduce sums them in place and out of place; a kernel on each device checks every element.
// Prints PASS/FAIL per check and a count; exits 0 when all passed, 77 with fewer than two GPUs (1 under
// STRATA_REQUIRE_GPU=2). NVLink multicast (NVLS) is left off unless the environment says otherwise.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nccl.h>

#include <strata/default_pool.hpp>

namespace {

// Small integers times small integers: exact in float, so the sum can be checked for equality.
__device__ __host__ inline float gradient(int device, std::size_t i) { return static_cast<float>((device + 1) * static_cast<int>(i % 1000)); }

__global__ void fill_gradients(float* g, std::size_t n, int device)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) g[i] = gradient(device, i);
}

__global__ void count_wrong(const float* g, std::size_t n, int devices, unsigned long long* wrong)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    float sum = 0;
    for (int d = 0; d < devices; ++d) sum += gradient(d, i);
    if (g[i] != sum) atomicAdd(wrong, 1ull);
  }
}

bool ok(cudaError_t e, const char* what)
{
  if (e == cudaSuccess) return true;
  std::printf("FAIL %s: %s\n", what, cudaGetErrorString(e));
  return false;
}
bool ok(ncclResult_t r, const char* what)
{
  if (r == ncclSuccess) return true;
  std::printf("FAIL %s: %s\n", what, ncclGetErrorString(r));
  return false;
}

} // namespace

int main()
{
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (devices < 2) {
    const char* require = std::getenv("STRATA_REQUIRE_GPU");
    std::printf("nccl_allreduce: %d GPU(s); the example needs two\n", devices);
    return require != nullptr && std::atoi(require) >= 2 ? 1 : 77;
  }
  devices = std::min(devices, 8);
  constexpr std::size_t count = (std::size_t{32} << 20) / sizeof(float) + 17;  // 32 MiB of gradients and a bit
  int passed = 0, failed = 0;
  const auto report = [&](bool good, const std::string& what) {
    std::printf("%s %s\n", good ? "PASS" : "FAIL", what.c_str());
    (good ? passed : failed) += 1;
  };
  {
    strata::default_pools pools;
    std::vector<int> list(devices);
    for (int d = 0; d < devices; ++d) list[d] = d;
    std::vector<ncclComm_t> comms(devices);
    if (!ok(ncclCommInitAll(comms.data(), devices, list.data()), "ncclCommInitAll")) return 1;
    std::vector<cudaStream_t> streams(devices);
    std::vector<float*> grads(devices), reduced(devices);
    std::vector<unsigned long long*> wrong(devices);
    bool setup = true;
    for (int d = 0; d < devices; ++d) {
      setup = setup && ok(cudaSetDevice(d), "cudaSetDevice") && ok(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking), "cudaStreamCreate");
      const cuda::stream_ref s{streams[d]};
      grads[d] = static_cast<float*>(pools.allocate_async(count * sizeof(float), 256, s));
      reduced[d] = static_cast<float*>(pools.allocate_async(count * sizeof(float), 256, s));
      fill_gradients<<<512, 256, 0, streams[d]>>>(grads[d], count, d);
      setup = setup && ok(cudaMallocManaged(&wrong[d], sizeof(unsigned long long)), "cudaMallocManaged");
    }
    report(setup, "gradients in strata pools on " + std::to_string(devices) + " devices");

    // Out of place first (grads -> reduced), then in place on the gradients themselves.
    for (const bool in_place : {false, true}) {
      bool good = ok(ncclGroupStart(), "ncclGroupStart");
      for (int d = 0; d < devices; ++d)
        good = good && ok(ncclAllReduce(grads[d], in_place ? grads[d] : reduced[d], count, ncclFloat, ncclSum, comms[d], streams[d]),
                          "ncclAllReduce");
      good = ok(ncclGroupEnd(), "ncclGroupEnd") && good;
      unsigned long long total_wrong = 0;
      for (int d = 0; d < devices; ++d) {
        good = good && ok(cudaSetDevice(d), "cudaSetDevice");
        *wrong[d] = 0;
        count_wrong<<<512, 256, 0, streams[d]>>>(in_place ? grads[d] : reduced[d], count, devices, wrong[d]);
        good = good && ok(cudaStreamSynchronize(streams[d]), "cudaStreamSynchronize");
        total_wrong += *wrong[d];
      }
      report(good && total_wrong == 0, std::string("ncclAllReduce ") + (in_place ? "in place" : "out of place") + " over pool memory: " +
                                         std::to_string(total_wrong) + " wrong elements of " + std::to_string(count * devices));
    }

    for (int d = 0; d < devices; ++d) {
      ok(cudaSetDevice(d), "cudaSetDevice");
      const cuda::stream_ref s{streams[d]};
      pools.deallocate_async(grads[d], count * sizeof(float), 256, s);
      pools.deallocate_async(reduced[d], count * sizeof(float), 256, s);
      ok(cudaStreamSynchronize(streams[d]), "cudaStreamSynchronize");
      ok(cudaStreamDestroy(streams[d]), "cudaStreamDestroy");
      cudaFree(wrong[d]);
      ncclCommDestroy(comms[d]);
    }
    pools.release();
    const strata::usage u = pools.usage();
    report(u.used_blocks == 0 && u.in_use == 0, "every block went back to its device's pool (" + std::to_string(u.used_blocks) + " live)");
  }
  std::printf("nccl_allreduce: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
