#pragma once
// What pinned_host_pool needs from whatever pins host memory, as a concept, so that the pool runs over the
// real thing (host_pinning: mmap, NUMA placement, cudaHostRegister) or over a pretend host that counts pinned
// bytes against a lockable-memory limit (simulated_pinning) on a machine without a GPU.
#include <concepts>
#include <cstddef>

namespace strata {

/// The page sizes pinned memory is measured in: every pinned region is a whole number of small pages, and
/// large regions are placed on huge-page boundaries so the kernel can back them with huge pages.
struct pinned_pages {
  static constexpr std::size_t small = std::size_t{4} << 10;
  static constexpr std::size_t huge = std::size_t{2} << 20;
};

/// A pinning backend maps and pins fresh host memory and gives it back.
/// `pin(bytes)` (bytes a positive multiple of pinned_pages::small) returns the start of a new region, aligned
/// to pinned_pages::small (to pinned_pages::huge when bytes is at least that), registered with CUDA as one
/// registration (a copy from anywhere inside it is a pinned copy) and placed on `numa_node()` where there is
/// one; it throws strata::out_of_memory when the host refuses, naming the limit that refused, with nothing
/// left pinned or mapped. `unpin(p, bytes)` gives back exactly what one pin returned. `numa_node()` is the
/// NUMA node the memory is placed on, -1 when the host has none to choose. Both calls are thread-safe.
template <class B>
concept pinning_backend = std::movable<B> && requires(B& b, const B& cb, void* p, std::size_t n) {
  { b.pin(n) } -> std::same_as<void*>;
  { b.unpin(p, n) } noexcept;
  { cb.numa_node() } noexcept -> std::same_as<int>;
};

} // namespace strata
