#pragma once
// What mapped_pool needs from a machine that maps physical pages into reserved address ranges, as a concept,
// so the pool's bookkeeping runs over the CUDA driver's virtual memory management (driver_pages) or over a
// pretend device on a machine without a GPU (simulated_pages), where CI tests every line of it and the replay
// tools plan traces.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include <strata/core/properties.hpp>
#include <strata/pinned/pin_lender.hpp>

namespace strata {

/// Calls a page backend made: what the map/unmap design costs, counted so tests and replays can report it.
struct page_counters {
  std::uint64_t reserves = 0;      ///< address ranges reserved
  std::uint64_t creates = 0;       ///< physical allocations created (cuMemCreate)
  std::uint64_t releases = 0;      ///< physical allocations released (cuMemRelease)
  std::uint64_t maps = 0;          ///< allocations mapped (cuMemMap)
  std::uint64_t unmaps = 0;        ///< allocations unmapped (cuMemUnmap)
  std::uint64_t access_calls = 0;  ///< cuMemSetAccess calls
  std::uint64_t synchronizes = 0;  ///< waits for the device before unmapping (host waits)

  constexpr std::uint64_t driver_calls() const noexcept
  {
    return reserves + creates + releases + maps + unmaps + access_calls + synchronizes;
  }
  constexpr bool operator==(const page_counters&) const = default;
};

/// A page backend: `page_size()` is the granularity (2 MiB on H100/H200): every size and address below is a
/// multiple of it. `reserve(bytes, alignment)` an address range with nothing behind it, `unreserve` gives it
/// back; `create(bytes)` one physical allocation (strata::out_of_memory when the device has no room),
/// `destroy` releases it; `map(address, page, bytes)` puts a whole allocation behind part of a reserved range,
/// `set_access(address, bytes)` makes mapped memory usable by the devices the backend serves, `unmap(address,
/// bytes)` takes a whole mapping out again; `synchronize()` waits until no work already submitted can touch the
/// backend's memory. The driver charges per call, not per byte (vmm_costs: mapping, access and unmapping a
/// 64 MiB allocation cost what a 2 MiB one does), which is why allocations are sized to the need.
template <class B>
concept page_backend = std::movable<B> && requires(B& b, const B& cb, typename B::page page, std::uintptr_t address,
                                                   std::size_t bytes) {
  typename B::page;
  { cb.page_size() } noexcept -> std::same_as<std::size_t>;
  { b.reserve(bytes, bytes) } -> std::same_as<std::uintptr_t>;
  { b.unreserve(address, bytes) } noexcept;
  { b.create(bytes) } -> std::same_as<typename B::page>;
  { b.destroy(page) } noexcept;
  b.map(address, page, bytes);
  b.set_access(address, bytes);
  b.unmap(address, bytes);
  b.synchronize();
  { cb.counts() } noexcept -> std::same_as<const page_counters&>;
};

/// A page backend that can also move a paused tag's contents (mapped_pool::pause / resume): `pin(bytes)`
/// page-locked host memory (strata::out_of_memory when the host refuses), `unpin` gives it back;
/// `copy_to_host(host, address, bytes)` and `copy_to_device(address, host, bytes)` queue a copy between pinned
/// memory and mapped memory (in large chunks over the backend's own copy streams, so they run at link speed);
/// `finish_copies()` waits on the host until every queued copy is done (and reports any that failed);
/// `free_bytes()` is the physical memory the device could still create.
template <class B>
concept copying_page_backend = page_backend<B> && requires(B& b, const B& cb, void* host, const void* from, std::uintptr_t address,
                                                           std::size_t bytes) {
  { b.pin(bytes) } -> std::same_as<void*>;
  { b.unpin(host, bytes) } noexcept;
  b.copy_to_host(host, address, bytes);
  b.copy_to_device(address, from, bytes);
  b.finish_copies();
  { cb.free_bytes() } -> std::same_as<std::size_t>;
};

/// A copying page backend whose pinned memory may be borrowed from a pinned pool (Note [One pinned budget],
/// pinned/pin_lender.hpp): `lend_pins_from(lender)` and `pins_lent()`.
template <class B>
concept lends_pins = copying_page_backend<B> && requires(B& b, const B& cb, pin_lender lender) {
  { b.lend_pins_from(lender) } noexcept;
  { cb.pins_lent() } noexcept -> std::same_as<bool>;
};

namespace detail {

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
  void* pin(std::size_t) { throw std::logic_error("archetype_pages pins nothing"); }
  void unpin(void*, std::size_t) noexcept {}
  void copy_to_host(void*, std::uintptr_t, std::size_t) {}
  void copy_to_device(std::uintptr_t, const void*, std::size_t) {}
  void finish_copies() {}
  std::size_t free_bytes() const noexcept { return 0; }
  const page_counters& counts() const noexcept { return counts_; }
  friend constexpr void get_property(const archetype_pages&, device_accessible) noexcept {}
  page_counters counts_;
};

} // namespace detail

} // namespace strata
