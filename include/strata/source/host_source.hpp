#pragma once
#include <cstddef>
#include <cstdint>
#include <new>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>

namespace strata {

/// Host memory from aligned `operator new`: the source for CPU tests and host-side pools.
/// Models: resource, host_accessible. Any power-of-two alignment. Stateless; all instances are equal.
/// Cost: one operator new / delete (the C++ runtime's allocator and its locking).
class host_source : public sync_names<host_source> {
public:
  static constexpr std::size_t max_alignment = std::size_t{1} << 62;
  static constexpr std::size_t largest_request = std::size_t{1} << 47;

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("host_source", alignment, max_alignment);
    if (bytes == 0) return nullptr;
    // libstdc++'s aligned operator new rounds the size up without an overflow check: SIZE_MAX wraps to 0
    // and "succeeds". Nothing beyond a 47-bit address space can be had anyway.
    if (bytes > largest_request) throw out_of_memory("host_source", bytes, "larger than the address space");
    try {
      return ::operator new(bytes, std::align_val_t{effective_alignment(alignment)});
    } catch (const std::bad_alloc&) {
      throw out_of_memory("host_source", bytes, "operator new refused");
    }
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
#if defined(__cpp_sized_deallocation)
    ::operator delete(p, bytes, std::align_val_t{effective_alignment(alignment)});
#else
    // clang leaves sized deallocation off unless -fsized-deallocation: the size is only a hint.
    (void)bytes;
    ::operator delete(p, std::align_val_t{effective_alignment(alignment)});
#endif
  }

  friend constexpr bool operator==(const host_source&, const host_source&) noexcept { return true; }
  friend constexpr void get_property(const host_source&, host_accessible) noexcept {}
};

static_assert(resource<host_source> && has_property<host_source, host_accessible>);
static_assert(!has_property<host_source, device_accessible>);
static_assert(cuda::mr::resource_with<host_source, host_accessible>);
static_assert(answers_to_cccl31_names<host_source>);

} // namespace strata
