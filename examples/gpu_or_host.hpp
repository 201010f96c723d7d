#pragma once
// What the examples share: find out whether there is a GPU, touch memory where it lives, and check results
// (each example exits non-zero when it did not do what it shows, so the smoke tests can fail).
#include <cstdio>
#include <cstring>

#include <cuda_runtime_api.h>

namespace examples {

inline bool has_gpu()
{
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

/// Writes `bytes` at p: cudaMemset for device memory, memset for host memory.
inline void touch(void* p, std::size_t bytes, bool on_gpu)
{
  if (on_gpu) {
    if (cudaMemset(p, 0x5a, bytes) != cudaSuccess) std::fprintf(stderr, "cudaMemset failed\n");
  } else {
    std::memset(p, 0x5a, bytes);
  }
}

/// Reports a result that is not what the example promises; main returns examples::status().
inline int failures = 0;
inline void expect(bool ok, const char* what)
{
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}
inline int status() { return failures == 0 ? 0 : 1; }

/// A CUDA call that must succeed for the example to mean anything.
inline void check(cudaError_t status, const char* call)
{
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", call, cudaGetErrorString(status));
    ++failures;
  }
}

} // namespace examples
