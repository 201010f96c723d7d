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

/// Managed (unified) memory from cudaMallocManaged(cudaMemAttachGlobal): host- and device-accessible.
/// Pages migrate on touch; pair with prefetch to avoid page-fault storms.
/// Models: resource, host_accessible, device_accessible. Alignment up to 256. Stateless; all equal.
/// Cost: a cudaMallocManaged / cudaFree (the free synchronizes the device). Thread-safe.
class managed_source : public sync_names<managed_source> {
public:
  static constexpr std::size_t max_alignment = default_alignment;

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("managed_source", alignment, max_alignment);
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    detail::cuda_check_alloc(cudaMallocManaged(&p, bytes, cudaMemAttachGlobal), "cudaMallocManaged",
                             "managed_source", bytes);
    return p;
  }

  void deallocate(void* p, std::size_t, std::size_t = default_alignment) noexcept
  {
    if (p == nullptr) return;
    detail::cuda_check_noexcept(cudaFree(p));
  }

  friend constexpr bool operator==(const managed_source&, const managed_source&) noexcept { return true; }
  friend constexpr void get_property(const managed_source&, device_accessible) noexcept {}
  friend constexpr void get_property(const managed_source&, host_accessible) noexcept {}
};

static_assert(cccl::synchronous_resource_with<managed_source, device_accessible, host_accessible>);
static_assert(answers_to_cccl31_names<managed_source>);

} // namespace strata
