#pragma once
// A pretend device for mapped_pool: address ranges reserved with PROT_NONE (never touched: a touch faults),
// physical pages that are numbers, and a strict record of which page sits behind which address. Every misuse
// a driver would punish — mapping over a mapped page, unmapping an empty one, setting access on a range with
// a hole, destroying a mapped page — is a std::logic_error here, so the pool's tests catch it in CI. As with
// the driver, one allocation may be mapped at several addresses at once (they alias the same memory).
// Contents are modelled too, for pause and resume: an allocation written through `write` keeps real bytes
// (in host memory, made on the first write), which copies to and from "pinned" memory (plain host memory
// here) carry.
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/errors.hpp>
#include <strata/pages/page_backend.hpp>
#include <strata/pinned/pin_lender.hpp>

namespace strata {

/// Models page_backend and copying_page_backend. `page_size`: the granularity; `capacity`: the most physical bytes that may exist at
/// once (the device's memory). Tests can make the N-th call of an operation fail (`fail_after`). Not
/// thread-safe (the pool is not).
class simulated_pages {
public:
  using page = std::uint64_t;
  enum class operation { create, map, set_access, unmap, synchronize, pin, copy_to_host, copy_to_device, finish_copies };

  explicit simulated_pages(std::size_t page_size = std::size_t{2} << 20, std::size_t capacity = SIZE_MAX)
      : page_size_(page_size), capacity_(capacity)
  {
    if (page_size == 0 || !is_power_of_two(page_size) || page_size % default_alignment != 0)
      throw std::invalid_argument("simulated_pages: page size " + std::to_string(page_size) +
                                  " is not a power-of-two multiple of 256 bytes");
  }
  simulated_pages(simulated_pages&& other) noexcept { *this = std::move(other); }
  simulated_pages& operator=(simulated_pages&& other) noexcept
  {
    if (this != &other) {
      unreserve_all();
      page_size_ = other.page_size_;
      capacity_ = other.capacity_;
      ranges_ = std::exchange(other.ranges_, {});
      mappings_ = std::exchange(other.mappings_, {});
      granules_ = std::exchange(other.granules_, {});
      peers_ = std::exchange(other.peers_, {});
      pages_ = std::exchange(other.pages_, {});
      live_bytes_ = std::exchange(other.live_bytes_, 0);
      peak_bytes_ = std::exchange(other.peak_bytes_, 0);
      next_page_ = other.next_page_;
      counts_ = std::exchange(other.counts_, {});
      failures_ = std::exchange(other.failures_, {});
      contents_ = std::exchange(other.contents_, {});
      pinned_bytes_ = std::exchange(other.pinned_bytes_, 0);
      lender_ = other.lender_;
    }
    return *this;
  }
  simulated_pages(const simulated_pages&) = delete;
  simulated_pages& operator=(const simulated_pages&) = delete;
  ~simulated_pages() { unreserve_all(); }

  std::size_t page_size() const noexcept { return page_size_; }

  /// driver_pages' peer list, for the host tests: set_access grants every device on it (see granted_devices).
  /// false for device 0 (this simulated device) or a peer present already. O(peers).
  bool add_peer(int peer)
  {
    if (grants(peer)) return false;
    peers_.push_back(peer);
    return true;
  }
  void remove_peer(int peer) noexcept { std::erase(peers_, peer); }
  bool grants(int device) const noexcept { return device == 0 || std::find(peers_.begin(), peers_.end(), device) != peers_.end(); }

  std::uintptr_t reserve(std::size_t bytes, std::size_t alignment)
  {
    if (bytes == 0 || bytes % page_size_ != 0) throw std::invalid_argument("simulated_pages: reserve of " + std::to_string(bytes) + " bytes");
    const std::size_t span = bytes + alignment;
    void* base = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) throw out_of_memory("simulated_pages", bytes, "cannot reserve address space");
    const std::uintptr_t aligned = align_address(reinterpret_cast<std::uintptr_t>(base), alignment);
    try {
      ranges_.emplace(aligned, range{reinterpret_cast<std::uintptr_t>(base), span, bytes});
    } catch (...) {
      ::munmap(base, span);
      throw;
    }
    ++counts_.reserves;
    return aligned;
  }

  void unreserve(std::uintptr_t address, std::size_t) noexcept
  {
    const auto it = ranges_.find(address);
    if (it == ranges_.end()) return;
    ::munmap(reinterpret_cast<void*>(it->second.mapping), it->second.span);
    ranges_.erase(it);
  }

  page create(std::size_t bytes)
  {
    maybe_fail(operation::create);
    if (bytes == 0 || bytes % page_size_ != 0)
      throw std::logic_error("simulated_pages: create of " + std::to_string(bytes) + " bytes, not a multiple of the page size");
    if (bytes > capacity_ || live_bytes_ > capacity_ - bytes)
      throw out_of_memory("simulated_pages", bytes, "device of " + std::to_string(capacity_) + " bytes has " +
                                                  std::to_string(capacity_ - live_bytes_) + " free");
    const page p = next_page_;
    pages_.emplace(p, allocation{bytes, 0});
    ++next_page_;
    live_bytes_ += bytes;
    peak_bytes_ = live_bytes_ > peak_bytes_ ? live_bytes_ : peak_bytes_;
    ++counts_.creates;
    return p;
  }

  void destroy(page p) noexcept
  {
    const auto it = pages_.find(p);
    if (it == pages_.end() || it->second.mappings != 0) std::terminate();  // a driver would fail; the pool has a bug
    live_bytes_ -= it->second.bytes;
    contents_.erase(p);
    pages_.erase(it);
    ++counts_.releases;
  }

  void map(std::uintptr_t address, page p, std::size_t bytes)
  {
    maybe_fail(operation::map);
    const auto it = pages_.find(p);
    if (it == pages_.end()) throw std::logic_error("simulated_pages: map of an allocation that does not exist");
    if (bytes != it->second.bytes) throw std::logic_error("simulated_pages: map of part of an allocation");
    if (address % page_size_ != 0 || !inside_reservation(address, bytes))
      throw std::logic_error("simulated_pages: map outside a reserved range or off a page boundary");
    for (std::uintptr_t a = address; a < address + bytes; a += page_size_)
      if (granules_.count(a) != 0) throw std::logic_error("simulated_pages: address already mapped");
    mappings_.emplace(address, p);
    std::uintptr_t a = address;
    try {
      for (; a < address + bytes; a += page_size_) granules_.emplace(a, 0);
    } catch (...) {  // all or nothing, as the driver's call is
      for (std::uintptr_t g = address; g < a; g += page_size_) granules_.erase(g);
      mappings_.erase(address);
      throw;
    }
    ++it->second.mappings;
    ++counts_.maps;
  }

  void set_access(std::uintptr_t address, std::size_t bytes)
  {
    maybe_fail(operation::set_access);
    if (address % page_size_ != 0 || bytes == 0 || bytes % page_size_ != 0)
      throw std::logic_error("simulated_pages: set_access off page boundaries");
    for (std::uintptr_t a = address; a < address + bytes; a += page_size_)
      if (granules_.count(a) == 0) throw std::logic_error("simulated_pages: set_access over unmapped memory");
    const auto devices = static_cast<std::uint32_t>(1 + peers_.size());
    for (std::uintptr_t a = address; a < address + bytes; a += page_size_) granules_[a] = devices;
    ++counts_.access_calls;
  }

  void unmap(std::uintptr_t address, std::size_t bytes)
  {
    maybe_fail(operation::unmap);
    const auto it = mappings_.find(address);
    if (it == mappings_.end()) throw std::logic_error("simulated_pages: unmap of an address where no mapping starts");
    allocation& a = pages_.at(it->second);
    if (a.bytes != bytes) throw std::logic_error("simulated_pages: unmap of part of a mapping");
    for (std::uintptr_t g = address; g < address + bytes; g += page_size_) granules_.erase(g);
    --a.mappings;
    mappings_.erase(it);
    ++counts_.unmaps;
  }

  void synchronize()
  {
    maybe_fail(operation::synchronize);
    ++counts_.synchronizes;
  }

  const page_counters& counts() const noexcept { return counts_; }

  /// Plain host memory stands in for pinned memory, or the lender's (lend_pins_from, as driver_pages);
  /// `pinned_bytes()` counts what is out.
  void* pin(std::size_t bytes)
  {
    maybe_fail(operation::pin);
    void* p = lender_ ? lender_.take(bytes) : ::operator new(bytes == 0 ? 1 : bytes);
    pinned_bytes_ += bytes;
    return p;
  }
  void unpin(void* host, std::size_t bytes) noexcept
  {
    if (lender_) lender_.give(host, bytes);
    else ::operator delete(host);
    pinned_bytes_ -= bytes;
  }
  /// Set through mapped_pool::lend_pins_from, as driver_pages's.
  void lend_pins_from(pin_lender lender) noexcept { lender_ = lender; }
  bool pins_lent() const noexcept { return static_cast<bool>(lender_); }
  /// Copies at once (no streams here); every page crossed must be mapped and accessible.
  void copy_to_host(void* host, std::uintptr_t address, std::size_t bytes)
  {
    maybe_fail(operation::copy_to_host);
    walk(address, bytes, [&](std::vector<unsigned char>* data, std::size_t offset, std::size_t done, std::size_t n) {
      if (data == nullptr) std::memset(static_cast<unsigned char*>(host) + done, 0, n);
      else std::memcpy(static_cast<unsigned char*>(host) + done, data->data() + offset, n);
    }, false);
  }
  void copy_to_device(std::uintptr_t address, const void* host, std::size_t bytes)
  {
    maybe_fail(operation::copy_to_device);
    write(address, host, bytes);
  }
  void finish_copies() { maybe_fail(operation::finish_copies); }
  std::size_t free_bytes() const noexcept { return capacity_ - live_bytes_; }

  // For tests and planning.
  /// Writes bytes through the mapping at `address` (std::logic_error where a page is not usable).
  void write(std::uintptr_t address, const void* from, std::size_t bytes)
  {
    walk(address, bytes, [&](std::vector<unsigned char>* data, std::size_t offset, std::size_t done, std::size_t n) {
      std::memcpy(data->data() + offset, static_cast<const unsigned char*>(from) + done, n);
    }, true);
  }
  /// Reads bytes through the mapping at `address`; never-written memory reads as zeros.
  void read(std::uintptr_t address, void* to, std::size_t bytes) const
  {
    const_cast<simulated_pages*>(this)->walk(address, bytes, [&](std::vector<unsigned char>* data, std::size_t offset, std::size_t done, std::size_t n) {
      if (data == nullptr) std::memset(static_cast<unsigned char*>(to) + done, 0, n);
      else std::memcpy(static_cast<unsigned char*>(to) + done, data->data() + offset, n);
    }, false);
  }
  std::size_t pinned_bytes() const noexcept { return pinned_bytes_; }
  /// How many devices the last set_access over the page holding `address` granted (this one and the peers
  /// then listed); 0 for a page not mapped or not yet accessible.
  std::size_t granted_devices(std::uintptr_t address) const
  {
    const auto it = granules_.find(address / page_size_ * page_size_);
    return it == granules_.end() ? 0 : it->second;
  }
  /// True when every page touching [address, address + bytes) is mapped and accessible.
  bool is_usable(std::uintptr_t address, std::size_t bytes) const
  {
    if (bytes == 0) return true;
    for (std::uintptr_t a = address / page_size_ * page_size_; a < address + bytes; a += page_size_) {
      const auto it = granules_.find(a);
      if (it == granules_.end() || it->second == 0) return false;
    }
    return true;
  }
  /// Bytes of the mapping that starts at `address` (0 where none starts): a whole allocation.
  std::size_t mapping_at(std::uintptr_t address) const
  {
    const auto it = mappings_.find(address);
    return it == mappings_.end() ? 0 : pages_.at(it->second).bytes;
  }
  /// How many addresses the allocation is mapped at now (0 for one that does not exist).
  std::size_t times_mapped(page p) const noexcept
  {
    const auto it = pages_.find(p);
    return it == pages_.end() ? 0 : it->second.mappings;
  }
  /// Physical bytes that exist now (mapped or not), and the most that ever did.
  std::size_t bytes_alive() const noexcept { return live_bytes_; }
  std::size_t peak_bytes() const noexcept { return peak_bytes_; }
  std::size_t allocations_alive() const noexcept { return pages_.size(); }
  std::size_t bytes_mapped() const noexcept { return granules_.size() * page_size_; }  ///< address space mapped (an aliased allocation counts at each address)
  std::size_t ranges_reserved() const noexcept { return ranges_.size(); }
  std::size_t capacity() const noexcept { return capacity_; }
  /// The next call of `op` after `successes` more successful ones throws (create, pin: out_of_memory; others: a
  /// std::runtime_error standing in for a driver failure). Once.
  void fail_after(operation op, std::uint64_t successes) { failures_[op] = successes + 1; }

private:
  struct range {
    std::uintptr_t mapping;
    std::size_t span;
    std::size_t bytes;
  };
  struct allocation {
    std::size_t bytes;
    std::size_t mappings;  ///< addresses it is mapped at
  };

  void maybe_fail(operation op)
  {
    const auto it = failures_.find(op);
    if (it == failures_.end() || --it->second > 0) return;
    failures_.erase(it);
    if (op == operation::create || op == operation::pin) throw out_of_memory("simulated_pages", page_size_, "refused on purpose");
    throw std::runtime_error("simulated_pages: call refused on purpose");
  }

  /// Calls f(contents or null, offset in the allocation, bytes done so far, bytes in this piece) for each
  /// mapping [address, address + bytes) crosses; `make` creates an allocation's contents where missing.
  template <class F>
  void walk(std::uintptr_t address, std::size_t bytes, F&& f, bool make)
  {
    if (!is_usable(address, bytes)) throw std::logic_error("simulated_pages: copy through memory that is not mapped and accessible");
    for (std::size_t done = 0; done < bytes;) {
      auto it = std::prev(mappings_.upper_bound(address + done));
      const allocation& a = pages_.at(it->second);
      const std::size_t offset = address + done - it->first;
      const std::size_t n = std::min(bytes - done, a.bytes - offset);
      auto found = contents_.find(it->second);
      if (found == contents_.end() && make) found = contents_.emplace(it->second, std::vector<unsigned char>(a.bytes)).first;
      f(found == contents_.end() ? nullptr : &found->second, offset, done, n);
      done += n;
    }
  }

  bool inside_reservation(std::uintptr_t address, std::size_t bytes) const
  {
    auto it = ranges_.upper_bound(address);
    if (it == ranges_.begin()) return false;
    --it;
    return address + bytes <= it->first + it->second.bytes;
  }

  void unreserve_all() noexcept
  {
    for (const auto& [address, r] : ranges_) ::munmap(reinterpret_cast<void*>(r.mapping), r.span);
    ranges_.clear();
  }

  std::size_t page_size_ = std::size_t{2} << 20;
  std::size_t capacity_ = SIZE_MAX;
  std::map<std::uintptr_t, range> ranges_;
  std::map<std::uintptr_t, page> mappings_;                ///< where each mapping starts
  std::unordered_map<std::uintptr_t, std::uint32_t> granules_;  ///< every mapped page: devices granted (0: not accessible yet)
  std::vector<int> peers_;                                       ///< add_peer's devices
  std::unordered_map<page, allocation> pages_;             ///< live allocations, mapped or not
  std::size_t live_bytes_ = 0;
  std::size_t peak_bytes_ = 0;
  page next_page_ = 1;
  page_counters counts_;
  std::map<operation, std::uint64_t> failures_;
  std::unordered_map<page, std::vector<unsigned char>> contents_;  ///< allocations written to, and what they hold
  std::size_t pinned_bytes_ = 0;
  pin_lender lender_;
};

static_assert(copying_page_backend<simulated_pages>);

} // namespace strata
