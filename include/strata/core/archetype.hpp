#pragma once
// The least a resource can be: what every policy header instantiates itself over to static_assert, at the
// end of the header, the concepts it claims for any upstream (CCCL's habit of positive checks at the point of
// definition). Never allocates: calling it is a logic error.
#include <cstddef>
#include <stdexcept>

#include <strata/core/alignment.hpp>
#include <strata/core/properties.hpp>

namespace strata::detail {

struct archetype_resource {
  void* allocate(std::size_t, std::size_t = default_alignment) { throw std::logic_error("archetype_resource allocates nothing"); }
  void deallocate(void*, std::size_t, std::size_t = default_alignment) noexcept {}
  friend constexpr bool operator==(const archetype_resource&, const archetype_resource&) noexcept { return true; }
  friend constexpr void get_property(const archetype_resource&, device_accessible) noexcept {}
};

} // namespace strata::detail
