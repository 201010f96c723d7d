#pragma once
// What the benchmark programs share: failing loudly on a CUDA error, medians, command-line options, and
// the "no GPU here" exit.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace strata::bench {

inline void check(cudaError_t status, const char* what)
{
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

inline double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// The value after `name` on the command line, or `fallback`.
inline std::string option(int argc, char** argv, const char* name, std::string fallback = {})
{
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}
inline bool flag(int argc, char** argv, const char* name)
{
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

/// False (after saying so) where there is no GPU: the GPU programs then have nothing to measure.
inline bool gpu_present(const char* program)
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) return true;
  (void)cudaGetLastError();
  std::printf("%s: no GPU here, nothing to measure\n", program);
  return false;
}

} // namespace strata::bench
