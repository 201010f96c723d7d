#pragma once
// Letting other devices read and write one device's memory: the one check every source makes (can the peer
// reach the device at all?) and the runtime's per-context switch for cudaMalloc'd memory. Memory mapped with
// cuMemMap (driver_pages) and memory of cudaMemPool_t pools (async_source) are not covered by that switch;
// they grant access per range (cuMemSetAccess) and per pool (cudaMemPoolSetAccess), each in its own box.
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include <strata/core/config.hpp>
#include <strata/core/cuda_check.hpp>

namespace strata {

/// A device named as a peer cannot reach the memory's device (no NVLink or PCIe peer path, or no such
/// device). A std::invalid_argument: the request itself was wrong for this machine.
class peer_access_error : public std::invalid_argument {
public:
  peer_access_error(std::string_view box, int peer, int device, std::string_view why)
      : std::invalid_argument(std::string(box) + ": device " + std::to_string(peer) + " cannot access device " +
                              std::to_string(device) + "'s memory (" + std::string(why) + ")"),
        peer_(peer), device_(device)
  {}
  int peer() const noexcept { return peer_; }
  int device() const noexcept { return device_; }

private:
  int peer_, device_;
};

namespace detail {

/// Throws peer_access_error unless `peer` is a device that can reach `device`'s memory. A CUDA call
/// (cudaGetDeviceCount, cudaDeviceCanAccessPeer); no state changes.
inline void check_peer_path(std::string_view box, int device, int peer)
{
  int count = 0;
  cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (peer < 0 || peer >= count) throw peer_access_error(box, peer, device, "there are " + std::to_string(count) + " devices");
  if (device < 0 || device >= count) throw peer_access_error(box, peer, device, "no such device");
  int can = 0;
  cuda_check(cudaDeviceCanAccessPeer(&can, peer, device), "cudaDeviceCanAccessPeer");
  if (can == 0) throw peer_access_error(box, peer, device, "cudaDeviceCanAccessPeer says no peer path");
}

/// Lets every device in `peers` read and write cudaMalloc'd memory of `device`, now and later
/// (cudaDeviceEnablePeerAccess with each peer current: the switch is the peer's context's). Enabling what is
/// already enabled is not an error; the device itself in `peers` is skipped. Every peer is checked before
/// any is enabled, so a bad list changes nothing. The caller's current device is restored.
inline void enable_peer_access(std::string_view box, int device, std::span<const int> peers)
{
  for (const int peer : peers)
    if (peer != device) check_peer_path(box, device, peer);
  for (const int peer : peers) {
    if (peer == device) continue;
    scoped_device on(peer);
    const cudaError_t status = cudaDeviceEnablePeerAccess(device, 0);
    if (status == cudaErrorPeerAccessAlreadyEnabled) clear_last_error();
    else cuda_check(status, "cudaDeviceEnablePeerAccess");
  }
}

} // namespace detail
} // namespace strata
