#pragma once
// What the two-GPU tests share: how many devices the run demands (STRATA_REQUIRE_GPU=2 makes a machine
// with one device a failure instead of a skip), and a guard restoring the current device.
#include <cstdlib>

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

namespace strata::testing {

inline int device_count()
{
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/// True when the test may run (two devices or more). Otherwise a MESSAGE says it was skipped, or a FAIL when
/// the run demands two devices (STRATA_REQUIRE_GPU=2, what tests/device/multi_gpu.sh sets).
inline bool have_two_devices()
{
  if (device_count() >= 2) return true;
  const char* require = std::getenv("STRATA_REQUIRE_GPU");
  if (require != nullptr && std::atoi(require) >= 2) FAIL("STRATA_REQUIRE_GPU=" << require << " but this machine has " << device_count() << " device(s)");
  MESSAGE("one device: this test needs two and is skipped");
  return false;
}

/// Restores the current device at the end of a test, whatever the test made current.
class keep_current_device {
public:
  keep_current_device() { (void)cudaGetDevice(&device_); }
  keep_current_device(const keep_current_device&) = delete;
  keep_current_device& operator=(const keep_current_device&) = delete;
  ~keep_current_device() { (void)cudaSetDevice(device_); }

private:
  int device_ = 0;
};

inline int device_of(const void* p)
{
  cudaPointerAttributes a{};
  REQUIRE(cudaPointerGetAttributes(&a, p) == cudaSuccess);
  return a.device;
}

} // namespace strata::testing
