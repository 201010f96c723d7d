#pragma once
// The device a resource's memory lives on, when the resource can say: a source that takes a device
// (device_source, driver_pages) answers device(); pools, adaptors and ref<> are asked through what they are
// built on (upstream(), backend(), get()). Host bookkeeping only: no CUDA call. Used where a wait must cover
// the device the blocks live on rather than whichever device happens to be current.
#include <concepts>
#include <optional>

namespace strata::detail {

template <class R>
std::optional<int> resource_device(const R& r) noexcept
{
  if constexpr (requires { { r.device() } -> std::convertible_to<int>; }) return static_cast<int>(r.device());
  else if constexpr (requires { r.upstream(); }) return resource_device(r.upstream());
  else if constexpr (requires { r.backend(); }) return resource_device(r.backend());
  else if constexpr (requires { r.get(); }) return resource_device(r.get());
  else return std::nullopt;
}

} // namespace strata::detail
