#pragma once
// What per_device needs to know about devices, as a concept, so that its routing runs over the CUDA runtime
// (cuda_devices) or over pretend devices on a machine without a GPU (simulated_devices), where CI tests it.
#include <concepts>

#include <strata/core/config.hpp>
#include <strata/core/cuda_check.hpp>

namespace strata {

/// A device backend: `count()` devices numbered from 0; `current()` is the calling thread's current device and
/// `make_current(d)` changes it (as cudaGetDevice / cudaSetDevice: per host thread); `device_of(p)` is the
/// device whose memory p lies in, or -1 when p is not device memory the backend knows.
template <class D>
concept device_backend = std::copyable<D> && requires(const D& d, const void* p, int device) {
  { d.count() } -> std::same_as<int>;
  { d.current() } -> std::same_as<int>;
  d.make_current(device);
  { d.device_of(p) } -> std::same_as<int>;
};

/// The CUDA runtime's devices. Every call is a runtime call; failures are strata::cuda_error (device_of: -1).
/// cudaGetDevice and cudaSetDevice touch only the calling thread's state (no driver round trip once the
/// device's context exists); cudaPointerGetAttributes asks the driver (a lookup in its table of allocations).
/// Stateless and thread-safe.
struct cuda_devices {
  int count() const
  {
    int n = 0;
    detail::cuda_check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    return n;
  }
  int current() const { return detail::current_device(); }
  void make_current(int device) const { detail::cuda_check(cudaSetDevice(device), "cudaSetDevice"); }
  int device_of(const void* p) const noexcept
  {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
      detail::clear_last_error();
      return -1;
    }
    return attributes.type == cudaMemoryTypeUnregistered ? -1 : attributes.device;
  }
  friend constexpr bool operator==(const cuda_devices&, const cuda_devices&) noexcept { return true; }
};

static_assert(device_backend<cuda_devices>);

} // namespace strata
