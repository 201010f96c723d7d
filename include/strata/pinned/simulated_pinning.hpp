#pragma once
// A pretend host for pinned_host_pool on machines without a GPU: regions are address ranges that cost no
// memory until a page is touched (the pool never touches them; a test may touch what it is handed), and
// pinning is counted against a lockable-memory limit the test sets, so sizes, splits, merges, release and the
// exhaustion of lockable memory run anywhere.
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

#include <strata/core/errors.hpp>
#include <strata/pinned/pinning_backend.hpp>

namespace strata {

/// The host the simulated pinning backend pins on: its lockable-memory limit, what is pinned now, and every
/// call made, so tests can see that reuse pins nothing and that a failed call leaves nothing pinned.
/// Not thread-safe: threads take turns.
class simulated_pinning_host {
public:
  /// `lockable`: the most bytes that may be pinned at once (the simulated RLIMIT_MEMLOCK); `numa_node`: where
  /// the host places the GPU's memory (-1: no NUMA).
  explicit simulated_pinning_host(std::size_t lockable = SIZE_MAX, int numa_node = -1) noexcept
      : lockable_(lockable), node_(numa_node)
  {}
  simulated_pinning_host(const simulated_pinning_host&) = delete;
  simulated_pinning_host& operator=(const simulated_pinning_host&) = delete;
  ~simulated_pinning_host()
  {
    for (const auto& [base, bytes] : regions_) ::munmap(reinterpret_cast<void*>(base), bytes);
  }

  void set_lockable(std::size_t bytes) noexcept { lockable_ = bytes; }
  std::size_t lockable() const noexcept { return lockable_; }
  /// The next `n` pins fail as a CUDA registration refused by the driver would (after the limit check).
  void fail_next_pins(unsigned n) noexcept { failures_ = n; }

  std::size_t pinned() const noexcept { return pinned_; }
  std::size_t regions() const noexcept { return regions_.size(); }
  std::size_t pins() const noexcept { return pins_; }
  std::size_t unpins() const noexcept { return unpins_; }
  int numa_node() const noexcept { return node_; }
  /// The size of the pinned region starting at `p`, 0 when none starts there.
  std::size_t region_at(const void* p) const noexcept
  {
    const auto it = regions_.find(reinterpret_cast<std::uintptr_t>(p));
    return it == regions_.end() ? 0 : it->second;
  }

  void* pin(std::size_t bytes)
  {
    if (bytes == 0 || bytes % pinned_pages::small != 0)
      throw std::invalid_argument("simulated_pinning: " + std::to_string(bytes) + " bytes is not a positive number of 4 KiB pages");
    if (bytes > lockable_ || pinned_ > lockable_ - bytes)
      throw out_of_memory("simulated_pinning", bytes,
                          "the lockable-memory limit (RLIMIT_MEMLOCK, ulimit -l) of " + std::to_string(lockable_) +
                              " bytes would be passed: " + std::to_string(pinned_) + " bytes pinned");
    if (failures_ > 0) {
      --failures_;
      throw out_of_memory("simulated_pinning", bytes, "cudaHostRegister refused");
    }
    const std::size_t align = bytes >= pinned_pages::huge ? pinned_pages::huge : pinned_pages::small;
    // Untouched pages cost nothing, so a test may "pin" more than the machine has.
    void* raw = ::mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) throw out_of_memory("simulated_pinning", bytes, "mmap refused the address range");
    const auto start = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t base = (start + align - 1) / align * align;
    if (base > start) ::munmap(raw, base - start);
    if (start + bytes + align > base + bytes) ::munmap(reinterpret_cast<void*>(base + bytes), start + bytes + align - base - bytes);
    try {
      regions_.emplace(base, bytes);
    } catch (...) {
      ::munmap(reinterpret_cast<void*>(base), bytes);
      throw;
    }
    pinned_ += bytes;
    ++pins_;
    return reinterpret_cast<void*>(base);
  }

  void unpin(void* p, std::size_t bytes) noexcept
  {
    const auto it = regions_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == regions_.end() || it->second != bytes) {
      ++mismatched_unpins_;
      return;
    }
    regions_.erase(it);
    ::munmap(p, bytes);
    pinned_ -= bytes;
    ++unpins_;
  }
  /// Unpins that named no region pinned, or the wrong size: tests check 0.
  std::size_t mismatched_unpins() const noexcept { return mismatched_unpins_; }

private:
  std::size_t lockable_;
  int node_;
  unsigned failures_ = 0;
  std::size_t pinned_ = 0, pins_ = 0, unpins_ = 0, mismatched_unpins_ = 0;
  std::map<std::uintptr_t, std::size_t> regions_;
};

/// The pinning_backend over a simulated_pinning_host (held by pointer: the host outlives the pools using it).
/// Models: pinning_backend. Cost: an mmap and a map insert per pin, no CUDA call.
class simulated_pinning {
public:
  explicit simulated_pinning(simulated_pinning_host& host) noexcept : host_(&host) {}
  void* pin(std::size_t bytes) { return host_->pin(bytes); }
  void unpin(void* p, std::size_t bytes) noexcept { host_->unpin(p, bytes); }
  int numa_node() const noexcept { return host_->numa_node(); }

private:
  simulated_pinning_host* host_;
};

static_assert(pinning_backend<simulated_pinning>);

} // namespace strata
