#pragma once
// Pinned host memory at the size asked, fast, on the GPU's NUMA node. Pinning is bound by the kernel faulting
// every page in (a cudaHostAlloc of many GiB takes seconds, copying the same bytes a fraction of one), so the
// pages are faulted in first, by several threads at once and as huge pages where the kernel offers them, and
// then registered with CUDA in one call, which finds them present.
#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include <strata/core/cuda_check.hpp>
#include <strata/core/errors.hpp>
#include <strata/detail/on_threads.hpp>
#include <strata/pinned/pinning_backend.hpp>

namespace strata {

// Note [one registration per region]: a copy whose source spans two cudaHostRegister registrations is not a
// pinned copy (CUDA stages it through its own buffer, at pageable speed), and a pool hands out blocks anywhere
// inside a region. So each region is registered in a single call; the parallel part is faulting the pages in
// beforehand, which is where the time goes.
//
// Note [RLIMIT_MEMLOCK]: whether cudaHostRegister is charged to the process's lockable-memory limit depends
// on the driver; where it is not, a container's small `ulimit -l` would refuse memory that pins fine. So the
// limit is enforced only when asked (options::honour_memlock), and named in every refusal either way: it is
// the first thing to look at when pinning fails.

/// The pinning_backend for a real GPU: an anonymous mapping at the size asked (huge-page aligned and
/// advised MADV_HUGEPAGE from 2 MiB), bound preferentially to the GPU's NUMA node (the driver's
/// cudaDevAttrHostNumaId, through the mbind system call: no libnuma), faulted in by up to `threads` threads
/// (MADV_POPULATE_WRITE where the kernel has it, a write per page otherwise), then registered with
/// cudaHostRegisterPortable and Mapped in one call (Note [one registration per region]) on the backend's device:
/// every device may copy from it, and kernels may use the host pointer where the device reports
/// cudaDevAttrCanUseHostPointerForRegisteredMem.
/// Models: pinning_backend. Cost per pin: a read of /proc/meminfo, an mmap, an madvise, an mbind, the threads'
/// page faults, one cudaHostRegister; per unpin: cudaHostUnregister and munmap. Thread-safe. Copyable and
/// movable (it holds only its settings).
class host_pinning {
public:
  struct options {
    unsigned threads = 0;          ///< threads faulting pages in (0: the hardware's, at most 16)
    bool numa = true;              ///< bind to the GPU's NUMA node when the host has several
    bool honour_memlock = false;   ///< refuse beyond RLIMIT_MEMLOCK before trying (Note [RLIMIT_MEMLOCK])
  };

  /// Pins for `device` (-1: the calling thread's current device).
  explicit host_pinning(int device = -1) : host_pinning(device, options{}) {}
  host_pinning(int device, options opts) : device_(device < 0 ? detail::current_device() : device), opts_(opts)
  {
    int node = -1;
    if (opts.numa && cudaDeviceGetAttribute(&node, cudaDevAttrHostNumaId, device_) != cudaSuccess) {
      detail::clear_last_error();  // a driver without the attribute: no placement, first touch decides
      node = -1;
    }
    node_ = opts.numa ? node : -1;
  }

  int device() const noexcept { return device_; }
  int numa_node() const noexcept { return node_; }

  /// Bytes pinned by every host_pinning of the process now (what an RLIMIT_MEMLOCK refusal is measured against).
  static std::size_t pinned_in_process() noexcept { return pinned_total().load(std::memory_order_relaxed); }

  /// What the kernel reports it could still provide without swapping (MemAvailable), SIZE_MAX when unknown: a
  /// request beyond it is refused up front, since faulting it in would wake the OOM killer instead of failing.
  static std::size_t available_memory() noexcept
  {
    std::FILE* f = std::fopen("/proc/meminfo", "r");
    if (f == nullptr) return SIZE_MAX;
    char line[256];
    std::size_t available = SIZE_MAX;
    while (std::fgets(line, sizeof line, f) != nullptr) {
      unsigned long long kib = 0;
      if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
        available = static_cast<std::size_t>(kib) * 1024;
        break;
      }
    }
    std::fclose(f);
    return available;
  }

  /// The process's lockable-memory limit (RLIMIT_MEMLOCK's soft value), SIZE_MAX when unlimited.
  static std::size_t memlock_limit() noexcept
  {
    rlimit limit{};
    if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
    return static_cast<std::size_t>(limit.rlim_cur);
  }

  void* pin(std::size_t bytes)
  {
    if (bytes == 0 || bytes % pinned_pages::small != 0)
      throw std::invalid_argument("host_pinning: " + std::to_string(bytes) + " bytes is not a positive number of 4 KiB pages");
    const std::size_t align = bytes >= pinned_pages::huge ? pinned_pages::huge : pinned_pages::small;
    if (bytes > SIZE_MAX - align) throw out_of_memory("host_pinning", bytes, "more than the address space holds");
    if (const std::size_t available = available_memory(); bytes > available)
      throw refusal(bytes, "the host has " + std::to_string(available) + " bytes available (MemAvailable)");
    const std::size_t limit = memlock_limit();
    if (opts_.honour_memlock && (bytes > limit || pinned_in_process() > limit - bytes)) throw refusal(bytes, "the limit would be passed");
    auto* p = static_cast<unsigned char*>(map_aligned(bytes, align));
#ifdef MADV_HUGEPAGE
    if (align == pinned_pages::huge) (void)::madvise(p, bytes, MADV_HUGEPAGE);
#endif
    if (node_ >= 0 && node_ < 8 * static_cast<int>(sizeof(unsigned long)) - 1) {
      // Preferred, not bound: a full node spills over instead of failing the pin or waking the OOM killer.
      const unsigned long mask = 1UL << node_;
      (void)::syscall(SYS_mbind, p, bytes, MPOL_PREFERRED, &mask, 8 * sizeof(mask) + 1, 0U);  // maxnode counts one past the mask
    }
    if (!fault_in(p, bytes)) {
      ::munmap(p, bytes);
      throw out_of_memory("host_pinning", bytes, "the host could not provide the memory (page faults refused)");
    }
    cudaError_t status = cudaSuccess;
    try {
      detail::scoped_device on(device_);
      status = cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
    } catch (...) {  // the device could not be made current
      ::munmap(p, bytes);
      throw;
    }
    if (status != cudaSuccess) {
      detail::clear_last_error();
      ::munmap(p, bytes);
      if (status != cudaErrorMemoryAllocation && status != cudaErrorHostMemoryAlreadyRegistered)
        detail::cuda_check(status, "cudaHostRegister");
      throw refusal(bytes, std::string("cudaHostRegister refused: ") + cudaGetErrorName(status));
    }
    pinned_total().fetch_add(bytes, std::memory_order_relaxed);
    return p;
  }

  void unpin(void* p, std::size_t bytes) noexcept
  {
    if (p == nullptr) return;
    detail::cuda_check_noexcept(cudaHostUnregister(p));
    ::munmap(p, bytes);
    pinned_total().fetch_sub(bytes, std::memory_order_relaxed);
  }

private:
  static std::atomic<std::size_t>& pinned_total() noexcept
  {
    static std::atomic<std::size_t> total{0};
    return total;
  }

  static out_of_memory refusal(std::size_t bytes, const std::string& why)
  {
    const std::size_t limit = memlock_limit();
    return out_of_memory("host_pinning", bytes,
                         why + "; the lockable-memory limit RLIMIT_MEMLOCK (ulimit -l) is " +
                             (limit == SIZE_MAX ? std::string("unlimited") : std::to_string(limit) + " bytes") + ", " +
                             std::to_string(pinned_in_process()) + " bytes pinned by strata in this process");
  }

  static void* map_aligned(std::size_t bytes, std::size_t align)
  {
    void* raw = ::mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) throw out_of_memory("host_pinning", bytes, "mmap refused");
    const auto start = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t base = (start + align - 1) / align * align;
    if (base > start) ::munmap(raw, base - start);
    if (start + bytes + align > base + bytes) ::munmap(reinterpret_cast<void*>(base + bytes), start + bytes + align - base - bytes);
    return reinterpret_cast<void*>(base);
  }

  /// Faults every page of [p, p + bytes) in, in slices shared among the threads; false when the kernel refused.
  bool fault_in(unsigned char* p, std::size_t bytes) const
  {
    constexpr std::size_t slice = std::size_t{64} << 20;
    const std::size_t slices = (bytes + slice - 1) / slice;
    unsigned threads = opts_.threads != 0 ? opts_.threads : std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
    threads = static_cast<unsigned>(std::min<std::size_t>(threads, slices));
    std::atomic<std::size_t> next{0};
    std::atomic<bool> failed{false};
    auto work = [&] {
      for (std::size_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < slices;) {
        unsigned char* s = p + i * slice;
        const std::size_t n = std::min(slice, bytes - i * slice);
#ifdef MADV_POPULATE_WRITE
        if (::madvise(s, n, MADV_POPULATE_WRITE) == 0) continue;
        if (errno != EINVAL) {  // EINVAL: a kernel before 5.14; anything else is the host refusing
          failed = true;
          continue;
        }
#endif
        for (std::size_t off = 0; off < n; off += pinned_pages::small) static_cast<volatile unsigned char*>(s)[off] = 0;
      }
    };
    detail::run_on_threads(threads, work);
    return !failed.load();
  }

  int device_ = 0;
  int node_ = -1;
  options opts_;
};

static_assert(pinning_backend<host_pinning>);

} // namespace strata
