#pragma once
#include <cstddef>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/peer_access.hpp>
#include <strata/core/properties.hpp>
#include <strata/detail/cuda_check.hpp>

namespace strata {

namespace detail {
/// "device 0 has 1234 of 5678 bytes free", for out_of_memory messages. The caller's current device is left
/// as it was (cudaMemGetInfo answers for the current device, so `device` is made current for the question).
inline std::string device_memory_figures(int device)
{
  std::size_t free_bytes = 0, total_bytes = 0;
  int previous = -1;
  const bool asked = cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(device) == cudaSuccess &&
                     cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
  if (!asked) {
    clear_last_error();
    return "device " + std::to_string(device);
  }
  return "device " + std::to_string(device) + " has " + std::to_string(free_bytes) + " of " +
         std::to_string(total_bytes) + " bytes free";
}
} // namespace detail

/// Device memory from cudaMalloc / cudaFree on one device, made current for the call and restored after.
/// Built with `peers`, it lets those devices read and write every cudaMalloc'd block of its device
/// (cudaDeviceEnablePeerAccess, once per peer, at construction: the switch covers the device's cudaMalloc
/// memory past and future), or throws peer_access_error naming a peer that cannot reach it.
/// Models: resource, device_accessible. Alignment up to 256. Two sources are equal when on the same device.
/// Cost: a cudaMalloc (tens of µs, grows with size) and a cudaFree (synchronizes the device). Thread-safe.
class device_source : public sync_names<device_source> {
public:
  static constexpr std::size_t max_alignment = default_alignment;

  /// The current device.
  device_source() : device_(detail::current_device()) {}
  explicit device_source(int device) : device_(device) {}
  /// Also lets each of `peers` access this device's cudaMalloc'd memory (see the class comment).
  device_source(int device, const std::vector<int>& peers) : device_(device)
  {
    detail::enable_peer_access("device_source", device, peers);
  }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("device_source", alignment, max_alignment);
    if (bytes == 0) return nullptr;
    detail::scoped_device on(device_);
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status != cudaSuccess) {
      detail::clear_last_error();
      if (detail::is_out_of_memory(status))
        throw out_of_memory("device_source", bytes, "cudaMalloc refused; " + detail::device_memory_figures(device_));
      detail::cuda_check(status, "cudaMalloc");
    }
    return p;
  }

  void deallocate(void* p, std::size_t, std::size_t = default_alignment) noexcept
  {
    if (p == nullptr) return;
    detail::cuda_check_noexcept(cudaFree(p));
  }

  int device() const noexcept { return device_; }

  friend bool operator==(const device_source& a, const device_source& b) noexcept { return a.device_ == b.device_; }
  friend constexpr void get_property(const device_source&, device_accessible) noexcept {}

private:
  int device_;
};

static_assert(resource<device_source> && cccl::synchronous_resource_with<device_source, device_accessible>);
static_assert(!has_property<device_source, host_accessible>);
static_assert(answers_to_cccl31_names<device_source>);

} // namespace strata
