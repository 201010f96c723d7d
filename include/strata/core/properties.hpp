#pragma once
// Where memory may be touched, declared the CCCL way: a resource declares a property with a friend
//   friend constexpr void get_property(const R&, strata::device_accessible) noexcept {}
// and every policy or adaptor forwards its upstream's properties by deriving from forward_properties.
#include <concepts>

#include <strata/core/config.hpp>

namespace strata {

using cuda::mr::device_accessible;
using cuda::mr::host_accessible;

template <class R, class Property>
concept has_property = cuda::has_property<R, Property>;

template <class R>
inline constexpr bool is_device_accessible_v = has_property<R, device_accessible>;
template <class R>
inline constexpr bool is_host_accessible_v = has_property<R, host_accessible>;

/// CRTP base: Derived gets every stateless property that Upstream has, and no other. Derived provides
/// nothing: it is only the type the properties are found for.
template <class Derived, class Upstream>
struct forward_properties {
  template <class Property>
    requires has_property<Upstream, Property> && (!cuda::property_with_value<Property>)
  friend constexpr void get_property(const Derived&, Property) noexcept
  {}
};

/// CRTP base for boxes with two upstreams (fallback, segregator): only the properties both share,
/// because a pointer may come from either.
template <class Derived, class First, class Second>
struct forward_common_properties {
  template <class Property>
    requires has_property<First, Property> && has_property<Second, Property> &&
             (!cuda::property_with_value<Property>)
  friend constexpr void get_property(const Derived&, Property) noexcept
  {}
};

} // namespace strata
