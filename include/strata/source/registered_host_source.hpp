#pragma once
#include <bit>
#include <cstddef>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/detail/cuda_check.hpp>

namespace strata {

/// Host memory obtained elsewhere — a buffer the program already has, or a file mapped into memory (e.g.
/// under /dev/shm, shared with another process) — pinned with cudaHostRegister so kernels and copies use it
/// directly. It is a source of exactly one region: allocate hands out the region (to the pool above, which
/// carves it: coalescing_pool{..., {.initial_chunk = size, .max_reserved = size}}) and refuses a second
/// request until it comes back. release() (and destruction) unregisters it, and unmaps a file it mapped.
/// Models: resource, owning, releasable, host_accessible, device_accessible (the device uses the host
/// pointer: checked with cudaDevAttrCanUseHostPointerForRegisteredMem). Alignment up to the region's own
/// (4096 for a mapped file). Cost: cudaHostRegister once (pins every page: slow for large regions), O(1) after.
/// Not thread-safe. Move-only.
class registered_host_source : public sync_names<registered_host_source> {
public:
  /// Pins `bytes` at `base`, which the caller keeps alive until this source is released.
  registered_host_source(void* base, std::size_t bytes) { register_region(base, bytes); }

  /// Maps `path` (created or extended to `bytes` if needed) shared into memory and pins it.
  static registered_host_source map_file(const std::string& path, std::size_t bytes)
  {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
    if (fd < 0) throw std::invalid_argument("registered_host_source: cannot open " + path);
    struct stat st{};
    if (::fstat(fd, &st) != 0 || (static_cast<std::size_t>(st.st_size) < bytes && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0)) {
      ::close(fd);
      throw std::invalid_argument("registered_host_source: cannot size " + path + " to " + std::to_string(bytes) + " bytes");
    }
    void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);  // the mapping keeps the file
    if (base == MAP_FAILED) throw std::invalid_argument("registered_host_source: cannot map " + path);
    registered_host_source source;
    source.mapped_ = true;
    try {
      source.register_region(base, bytes);
    } catch (...) {
      ::munmap(base, bytes);
      source.mapped_ = false;
      throw;
    }
    return source;
  }

  registered_host_source(registered_host_source&& other) noexcept
      : base_(std::exchange(other.base_, nullptr)), size_(std::exchange(other.size_, 0)),
        mapped_(std::exchange(other.mapped_, false)), lent_(std::exchange(other.lent_, false)),
        lent_bytes_(std::exchange(other.lent_bytes_, 0))
  {}
  registered_host_source& operator=(registered_host_source&& other) noexcept
  {
    if (this != &other) {
      unregister();
      base_ = std::exchange(other.base_, nullptr);
      size_ = std::exchange(other.size_, 0);
      mapped_ = std::exchange(other.mapped_, false);
      lent_ = std::exchange(other.lent_, false);
      lent_bytes_ = std::exchange(other.lent_bytes_, 0);
    }
    return *this;
  }
  registered_host_source(const registered_host_source&) = delete;
  ~registered_host_source() { unregister(); }

  /// The region, if it is free and large and aligned enough; out_of_memory otherwise.
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("registered_host_source", alignment, region_alignment());
    if (bytes == 0) return nullptr;
    if (base_ == nullptr || lent_ || bytes > size_)
      throw out_of_memory("registered_host_source", bytes,
                          base_ == nullptr ? "released" : lent_ ? "its one region is in use" : "the region holds " + std::to_string(size_) + " bytes");
    lent_ = true;
    lent_bytes_ = bytes;
    return base_;
  }
  void deallocate(void* p, std::size_t, std::size_t = default_alignment) noexcept
  {
    if (p != nullptr && p == base_) {
      lent_ = false;
      lent_bytes_ = 0;
    }
  }

  /// True exactly inside the block handed out and not yet taken back (concepts.hpp: owning_resource):
  /// not for the rest of the region, nor for the region while it is not lent.
  bool owns(const void* p) const noexcept
  {
    const auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(base_);
    return lent_ && a >= b && a < b + lent_bytes_;
  }
  /// Unregisters (and unmaps a file it mapped); refused while the region is lent out.
  void release()
  {
    if (lent_) throw usage_error("registered_host_source: release() while the region is in use");
    unregister();
  }

  void* data() const noexcept { return base_; }
  std::size_t size() const noexcept { return size_; }

  friend bool operator==(const registered_host_source& a, const registered_host_source& b) noexcept { return &a == &b; }
  friend constexpr void get_property(const registered_host_source&, host_accessible) noexcept {}
  friend constexpr void get_property(const registered_host_source&, device_accessible) noexcept {}

private:
  registered_host_source() = default;

  std::size_t region_alignment() const noexcept
  {
    const auto b = reinterpret_cast<std::uintptr_t>(base_);
    return b == 0 ? default_alignment : std::size_t{1} << std::countr_zero(b);
  }

  void register_region(void* base, std::size_t bytes)
  {
    if (base == nullptr || bytes == 0) throw std::invalid_argument("registered_host_source: an empty region");
    int device = 0, usable = 0;
    detail::cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    detail::cuda_check(cudaDeviceGetAttribute(&usable, cudaDevAttrCanUseHostPointerForRegisteredMem, device),
                       "cudaDeviceGetAttribute(CanUseHostPointerForRegisteredMem)");
    if (usable == 0)
      throw std::invalid_argument("registered_host_source: this device cannot use host pointers to registered memory");
    detail::cuda_check(cudaHostRegister(base, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped), "cudaHostRegister");
    base_ = base;
    size_ = bytes;
  }

  void unregister() noexcept
  {
    if (base_ == nullptr) return;
    detail::cuda_check_noexcept(cudaHostUnregister(base_));
    if (mapped_) ::munmap(base_, size_);
    base_ = nullptr;
    size_ = 0;
    mapped_ = false;
    lent_ = false;
    lent_bytes_ = 0;
  }

  void* base_ = nullptr;
  std::size_t size_ = 0;
  bool mapped_ = false;
  bool lent_ = false;
  std::size_t lent_bytes_ = 0;  ///< the block handed out: what owns() answers for
};

static_assert(resource<registered_host_source> && owning_resource<registered_host_source> && releasable_resource<registered_host_source>);
static_assert(cuda::mr::resource_with<registered_host_source, host_accessible, device_accessible>);
static_assert(answers_to_cccl31_names<registered_host_source>);

} // namespace strata
