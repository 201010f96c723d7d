#pragma once
#include <cstddef>
#include <memory_resource>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/properties.hpp>

namespace strata {

/// A std::pmr::memory_resource over any strata resource, so std::pmr containers (on a host-accessible
/// stack, e.g. a pinned pool) and code written against std::pmr use strata pools. A request of 0 bytes gets a
/// valid, unique pointer (std::pmr requires one; strata boxes return nullptr for 0): it is served as 1 byte.
/// Two adaptors are equal when memory from one may be freed by the other: both are pmr_adaptor<R> over
/// equal resources (unlike Thrust's memory_resource, which calls any two resources equal).
/// Models: std::pmr::memory_resource; the resource's properties. Cost: a virtual call, then R's.
/// Synchronized as R is. Holds R by value (use strata::ref to share a pool).
template <resource R>
class pmr_adaptor final : public std::pmr::memory_resource, public forward_properties<pmr_adaptor<R>, R> {
public:
  explicit pmr_adaptor(R resource = R{}) : resource_(std::move(resource)) {}

  R& resource() noexcept { return resource_; }
  const R& resource() const noexcept { return resource_; }

private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override
  {
    return resource_.allocate(bytes == 0 ? 1 : bytes, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override
  {
    resource_.deallocate(p, bytes == 0 ? 1 : bytes, alignment);
  }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override
  {
    if (this == &other) return true;
    const auto* same = dynamic_cast<const pmr_adaptor*>(&other);
    return same != nullptr && same->resource_ == resource_;
  }

  R resource_;
};

} // namespace strata
