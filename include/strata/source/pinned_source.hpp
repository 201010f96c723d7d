#pragma once
#include <cstddef>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/detail/cuda_check.hpp>

namespace strata {

/// Page-locked host memory from cudaHostAlloc with its flags (cudaHostAllocPortable, Mapped, WriteCombined).
/// Host- and device-accessible: on every 64-bit platform CUDA supports, pinned memory is mapped into the
/// unified address space, so a kernel can use the host pointer directly.
/// Models: resource, host_accessible, device_accessible. Alignment up to 256 (pages are 4 KiB).
/// Cost: cudaHostAlloc pins pages, slow even for 4 KiB: put a pool over it. Thread-safe.
class pinned_source : public sync_names<pinned_source> {
public:
  static constexpr std::size_t max_alignment = default_alignment;

  explicit pinned_source(unsigned flags = cudaHostAllocPortable) noexcept : flags_(flags) {}

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("pinned_source", alignment, max_alignment);
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    detail::cuda_check_alloc(cudaHostAlloc(&p, bytes, flags_), "cudaHostAlloc", "pinned_source", bytes);
    return p;
  }

  void deallocate(void* p, std::size_t, std::size_t = default_alignment) noexcept
  {
    if (p == nullptr) return;
    detail::cuda_check_noexcept(cudaFreeHost(p));
  }

  unsigned flags() const noexcept { return flags_; }

  /// Any pinned block may be freed by cudaFreeHost, whatever flags it was made with.
  friend constexpr bool operator==(const pinned_source&, const pinned_source&) noexcept { return true; }
  friend constexpr void get_property(const pinned_source&, device_accessible) noexcept {}
  friend constexpr void get_property(const pinned_source&, host_accessible) noexcept {}

private:
  unsigned flags_;
};

static_assert(cccl::synchronous_resource_with<pinned_source, device_accessible, host_accessible>);
static_assert(answers_to_cccl31_names<pinned_source>);

} // namespace strata
