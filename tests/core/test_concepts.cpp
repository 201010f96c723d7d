// core/concepts.hpp: what is and is not a resource, and the capabilities and properties forwarded through ref.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <type_traits>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/ref.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/cuda_check.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>

namespace {

struct no_deallocate {
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  friend bool operator==(const no_deallocate&, const no_deallocate&) { return true; }
};
struct throwing_deallocate {
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) {}  // not noexcept: a free must never throw
  friend bool operator==(const throwing_deallocate&, const throwing_deallocate&) { return true; }
};
struct not_comparable {
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
};
struct minimal {
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
  friend bool operator==(const minimal&, const minimal&) { return true; }
};

} // namespace

static_assert(!strata::resource<no_deallocate>);
static_assert(!strata::resource<throwing_deallocate>);
static_assert(!strata::resource<not_comparable>);
static_assert(strata::resource<minimal>);
static_assert(!strata::stream_resource<minimal>);
static_assert(!strata::owning_resource<minimal> && !strata::releasable_resource<minimal>);
static_assert(!strata::sized_resource<minimal> && !strata::usage_reporting_resource<minimal>);
static_assert(!strata::has_property<minimal, strata::host_accessible>);
static_assert(strata::resource<strata::ref<strata::host_source>>);
static_assert(strata::has_property<strata::ref<strata::host_source>, strata::host_accessible>);
static_assert(!strata::has_property<strata::ref<strata::host_source>, strata::device_accessible>);
static_assert(strata::owning_resource<strata::ref<strata::simulated_source>>);
static_assert(!strata::owning_resource<strata::ref<strata::host_source>>);
static_assert(std::is_base_of_v<std::bad_alloc, strata::out_of_memory>);
static_assert(std::is_base_of_v<std::logic_error, strata::usage_error>);
