// The replaceable global allocation functions of the fault-injection program (strata_fault_tests only):
// every host allocation is counted, and the one host_faults::arm() names throws std::bad_alloc, so a test
// can make the N-th host allocation inside a box fail (see fault_injection.hpp).
#include <cstdlib>
#include <new>

#include "fault_injection.hpp"

namespace {
namespace hf = strata::testing::host_faults;

void* allocate_or_throw(std::size_t bytes, std::size_t alignment)
{
  if (hf::next_allocation_fails()) throw std::bad_alloc();
  if (bytes == 0) bytes = 1;
  void* p = nullptr;
  if (alignment <= alignof(std::max_align_t)) p = std::malloc(bytes);
  else p = std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);  // a multiple, as C11 asks
  if (p == nullptr) throw std::bad_alloc();
  hf::live_blocks.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void release(void* p) noexcept
{
  if (p == nullptr) return;
  hf::live_blocks.fetch_sub(1, std::memory_order_relaxed);
  std::free(p);
}

void* allocate_or_null(std::size_t bytes, std::size_t alignment) noexcept
{
  try {
    return allocate_or_throw(bytes, alignment);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
} // namespace

void* operator new(std::size_t n) { return allocate_or_throw(n, 0); }
void* operator new[](std::size_t n) { return allocate_or_throw(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate_or_null(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate_or_null(n, 0); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return allocate_or_null(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return allocate_or_null(n, static_cast<std::size_t>(a)); }

void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
void operator delete(void* p, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }
