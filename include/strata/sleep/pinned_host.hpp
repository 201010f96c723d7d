#pragma once
// Page-locked host memory made fast: pinning is the kernel locking every page, bound by faulting the pages
// in, so one cudaHostAlloc of many GiB takes seconds while copying the same bytes takes a fraction of one.
// Here fresh anonymous memory (huge pages where the kernel offers them: a fault per 2 MiB, not per 4 KiB) is
// registered with CUDA in chunks by several threads at once.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include <strata/core/cuda_check.hpp>
#include <strata/core/errors.hpp>
#include <strata/detail/on_threads.hpp>

namespace strata {

/// How pinned memory is registered in chunks: every chunk starts at a multiple of `chunk` in host addresses,
/// so a copy split at those multiples never spans two registrations (each piece stays a pinned copy).
struct pinned_host_layout {
  static constexpr std::size_t chunk = std::size_t{64} << 20;
};

/// Pins `bytes` of new host memory (cudaHostRegisterPortable: every device may copy from it) with up to
/// `threads` threads registering chunks at once (0: up to 8, by the hardware). Throws strata::out_of_memory
/// when the host refuses or `bytes` is beyond the address space, with nothing left pinned or mapped, and
/// strata::cuda_error when the calling thread has no device. Cost: an mmap, bytes / 64 MiB
/// cudaHostRegister calls spread over the threads; the host locks every page. Thread-safe.
inline void* pin_host(std::size_t bytes, unsigned threads = 0)
{
  constexpr std::size_t chunk = pinned_host_layout::chunk;
  if (bytes == 0) return nullptr;
  if (bytes > std::numeric_limits<std::size_t>::max() - 2 * chunk)  // the rounding below would wrap
    throw out_of_memory("pin_host", bytes, "more than the address space holds");
  int device = 0;  // the workers register on the caller's device: a new thread starts on device 0
  detail::cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  const std::size_t length = (bytes + chunk - 1) / chunk * chunk;
  void* raw = ::mmap(nullptr, length + chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) throw out_of_memory("pin_host", bytes, "mmap refused");
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t base = (start + chunk - 1) / chunk * chunk;
  if (base > start) ::munmap(raw, base - start);
  if (base + length < start + length + chunk) ::munmap(reinterpret_cast<void*>(base + length), start + length + chunk - base - length);
  auto* p = reinterpret_cast<unsigned char*>(base);
#ifdef MADV_HUGEPAGE
  (void)::madvise(p, length, MADV_HUGEPAGE);
#endif
  const std::size_t chunks = length / chunk;
  if (threads == 0) threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, chunks));
  std::vector<unsigned char> done(chunks, 0);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    if (cudaSetDevice(device) != cudaSuccess) failed = true;
    for (std::size_t i; !failed.load() && (i = next.fetch_add(1)) < chunks;) {
      if (cudaHostRegister(p + i * chunk, chunk, cudaHostRegisterPortable) == cudaSuccess) done[i] = 1;
      else failed = true;
    }
  };
  detail::run_on_threads(threads, work);
  if (!failed) return p;
  for (std::size_t i = 0; i < chunks; ++i)
    if (done[i] != 0) (void)cudaHostUnregister(p + i * chunk);
  detail::clear_last_error();
  ::munmap(p, length);
  throw out_of_memory("pin_host", bytes, "cudaHostRegister refused");
}

/// Gives back what pin_host(bytes) returned.
inline void unpin_host(void* p, std::size_t bytes) noexcept
{
  constexpr std::size_t chunk = pinned_host_layout::chunk;
  if (p == nullptr) return;
  const std::size_t length = (bytes + chunk - 1) / chunk * chunk;
  for (std::size_t off = 0; off < length; off += chunk) detail::cuda_check_noexcept(cudaHostUnregister(static_cast<unsigned char*>(p) + off));
  ::munmap(p, length);
}

} // namespace strata
