#pragma once
#include <cstddef>
#include <utility>

#include <thrust/device_ptr.h>
#include <thrust/mr/memory_resource.h>

#include <nv/target>

#include <strata/core/alignment.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/properties.hpp>

namespace strata {

/// A thrust::mr::memory_resource<thrust::device_ptr<void>> over a device-accessible strata stack, for code
/// written against thrust::mr (thrust::mr::allocator, thrust::mr::disjoint pools...). Equality is by the
/// resource: two thrust_resource<R> are equal when their resources are (Thrust's default compares any two
/// resources equal; this one does not).
/// Models: thrust::mr::memory_resource. Cost: a virtual call, then R's. Holds R by value (ref to share).
template <resource R>
class thrust_resource final : public thrust::mr::memory_resource<thrust::device_ptr<void>> {
  static_assert(is_device_accessible_v<R>, "thrust_resource<R>: R must declare device_accessible memory");

public:
  using pointer = thrust::device_ptr<void>;

  explicit thrust_resource(R resource = R{}) : resource_(std::move(resource)) {}

  R& resource() noexcept { return resource_; }

  pointer do_allocate(std::size_t bytes, std::size_t alignment) override
  {
    return pointer(resource_.allocate(bytes == 0 ? 1 : bytes, alignment));
  }
  void do_deallocate(pointer p, std::size_t bytes, std::size_t alignment) override
  {
    resource_.deallocate(thrust::raw_pointer_cast(p), bytes == 0 ? 1 : bytes, alignment);
  }
  // Thrust declares it host-device; the device side (no dynamic_cast there) can only compare identities.
  _CCCL_HOST_DEVICE bool do_is_equal(const thrust::mr::memory_resource<pointer>& other) const noexcept override
  {
    if (this == &other) return true;
    NV_IF_TARGET(NV_IS_HOST, (const auto* same = dynamic_cast<const thrust_resource*>(&other);
                              return same != nullptr && same->resource_ == resource_;),
                 (return false;))
  }

private:
  R resource_;
};

} // namespace strata
