#pragma once
// The least a resource can be: what every policy header instantiates itself over to static_assert, at the
// end of the header, the concepts it claims for any upstream (CCCL's habit of positive checks at the point of
// definition). Never allocates: calling it is a logic error.
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include <strata/core/alignment.hpp>
#include <strata/core/properties.hpp>
#include <strata/pages/page_backend.hpp>

namespace strata::detail {

struct archetype_resource {
  void* allocate(std::size_t, std::size_t = default_alignment) { throw std::logic_error("archetype_resource allocates nothing"); }
  void deallocate(void*, std::size_t, std::size_t = default_alignment) noexcept {}
  friend constexpr bool operator==(const archetype_resource&, const archetype_resource&) noexcept { return true; }
  friend constexpr void get_property(const archetype_resource&, device_accessible) noexcept {}
};

/// The least a page backend can be (mapped_pool's claims are checked over it). Never maps anything.
struct archetype_pages {
  using page = unsigned long long;
  std::size_t page_size() const noexcept { return std::size_t{2} << 20; }
  std::uintptr_t reserve(std::size_t, std::size_t) { throw std::logic_error("archetype_pages reserves nothing"); }
  void unreserve(std::uintptr_t, std::size_t) noexcept {}
  page create(std::size_t) { throw std::logic_error("archetype_pages creates nothing"); }
  void destroy(page) noexcept {}
  void map(std::uintptr_t, page, std::size_t) {}
  void set_access(std::uintptr_t, std::size_t) {}
  void unmap(std::uintptr_t, std::size_t) {}
  void synchronize() {}
  const page_counters& counts() const noexcept { return counts_; }
  friend constexpr void get_property(const archetype_pages&, device_accessible) noexcept {}
  page_counters counts_;
};

} // namespace strata::detail
