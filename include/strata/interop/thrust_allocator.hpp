#pragma once
#include <cstddef>
#include <limits>
#include <memory>
#include <new>

#include <thrust/device_ptr.h>
#include <thrust/universal_ptr.h>

#include <strata/core/alignment.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/properties.hpp>

namespace strata {

namespace detail {

/// The allocator both Thrust allocators share; Pointer<T> is the fancy pointer Thrust dispatches on.
template <class T, class R, template <class> class Pointer>
class thrust_allocator_base {
public:
  using value_type = T;
  using pointer = Pointer<T>;
  using const_pointer = Pointer<const T>;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  // Containers with different allocators may swap and move storage only when the allocators are equal.
  using propagate_on_container_copy_assignment = std::false_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;

  explicit thrust_allocator_base(R& resource) noexcept : resource_(std::addressof(resource)) {}
  /// Rebinding: an allocator of U over the same resource (derived allocators inherit this constructor).
  template <class U>
  thrust_allocator_base(const thrust_allocator_base<U, R, Pointer>& other) noexcept : resource_(std::addressof(other.resource()))
  {}

  pointer allocate(size_type n)
  {
    if (n > std::numeric_limits<size_type>::max() / sizeof(T)) throw std::bad_array_new_length();
    return pointer(static_cast<T*>(resource_->allocate(n * sizeof(T), effective_alignment(alignof(T)))));
  }
  void deallocate(pointer p, size_type n) noexcept
  {
    resource_->deallocate(thrust::raw_pointer_cast(p), n * sizeof(T), effective_alignment(alignof(T)));
  }
  size_type max_size() const noexcept { return std::numeric_limits<size_type>::max() / sizeof(T); }

  R& resource() const noexcept { return *resource_; }

  // Deliberately no construct/destroy: Thrust would call them element by element from the host.

  /// Equal when memory from one may be freed by the other: their resources are equal.
  template <class U>
  friend bool operator==(const thrust_allocator_base& a, const thrust_allocator_base<U, R, Pointer>& b) noexcept
  {
    return a.resource() == b.resource();
  }

protected:
  R* resource_;
};

} // namespace detail

/// An allocator for thrust::device_vector<T, thrust_allocator<T, R>> over any device-accessible strata stack:
/// pointer type thrust::device_ptr<T>, so Thrust's algorithms run on the device. It refers to the resource
/// (which must outlive it); copies and rebinds share it and compare equal when the resources do.
/// Models: the C++ Allocator requirements as Thrust uses them. Cost: R's allocate/deallocate.
template <class T, resource R>
class thrust_allocator : public detail::thrust_allocator_base<T, R, thrust::device_ptr> {
  static_assert(is_device_accessible_v<R>, "thrust_allocator<T, R>: R must declare device_accessible memory");

public:
  using detail::thrust_allocator_base<T, R, thrust::device_ptr>::thrust_allocator_base;
  template <class U>
  struct rebind {
    using other = thrust_allocator<U, R>;
  };
};

/// The same for memory both host and device may touch (managed or pinned stacks), with
/// thrust::universal_ptr<T>: for thrust::universal_vector<T, thrust_universal_allocator<T, R>>.
template <class T, resource R>
class thrust_universal_allocator : public detail::thrust_allocator_base<T, R, thrust::universal_ptr> {
  static_assert(is_device_accessible_v<R> && is_host_accessible_v<R>,
                "thrust_universal_allocator<T, R>: R must declare both host_accessible and device_accessible memory");

public:
  using detail::thrust_allocator_base<T, R, thrust::universal_ptr>::thrust_allocator_base;
  template <class U>
  struct rebind {
    using other = thrust_universal_allocator<U, R>;
  };
};

} // namespace strata
