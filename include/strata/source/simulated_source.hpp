#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>

namespace strata {

/// Addresses without memory: a range of address space reserved with PROT_NONE and never touched (a touch
/// faults, which is how tests prove that a policy keeps DESIGN.md's rule 1). With an optional capacity it
/// refuses, with out_of_memory, any request that would put more than `capacity` bytes in use: "does this
/// trace fit in 80 GiB with this stack?" answered on a laptop.
/// Free ranges are kept best-fit (by size) and merged with their neighbours (by address).
/// With `rounding::like_cudamalloc` it rounds as cudaMalloc does on current GPUs (measured on an H200): a
/// request of 2 MiB or more takes a multiple of 2 MiB. Replays that do not round under-count what pools of
/// exact-size chunks really hold, so the replay tools round by default.
/// Models: resource, with no accessibility property (the memory cannot be touched). Any power-of-two
/// alignment. Equal only to itself. Cost: O(log n) with a mutex (sources are thread-safe). Move-only.
class simulated_source : public sync_names<simulated_source> {
public:
  static constexpr std::size_t unlimited = SIZE_MAX;
  static constexpr std::size_t granularity = default_alignment;
  static constexpr std::size_t max_alignment = std::size_t{1} << 40;  // and never more than the reservation
  static constexpr std::size_t cudamalloc_page = std::size_t{2} << 20;

  enum class rounding { none, like_cudamalloc };

  /// `capacity`: most bytes in use at once. `address_space`: what is reserved (at least the capacity).
  explicit simulated_source(std::size_t capacity = unlimited, std::size_t address_space = std::size_t{1} << 40,
                            rounding round = rounding::none)
      : capacity_(capacity), round_(round)
  {
    if (capacity != unlimited && capacity > address_space) address_space = align_up(capacity, std::size_t{1} << 21) * 2;
    void* base = ::mmap(nullptr, address_space, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) throw out_of_memory("simulated_source", address_space, "cannot reserve address space");
    base_ = reinterpret_cast<std::uintptr_t>(base);
    size_ = address_space;
    insert_free(base_, size_);
  }

  simulated_source(simulated_source&& other) noexcept { *this = std::move(other); }
  simulated_source& operator=(simulated_source&& other) noexcept
  {
    if (this == &other) return *this;
    unmap();
    std::scoped_lock lock(other.mutex_);
    base_ = std::exchange(other.base_, 0);
    size_ = std::exchange(other.size_, 0);
    capacity_ = other.capacity_;
    round_ = other.round_;
    in_use_ = std::exchange(other.in_use_, 0);
    peak_ = std::exchange(other.peak_, 0);
    allocations_ = std::exchange(other.allocations_, 0);
    by_address_ = std::move(other.by_address_);
    by_size_ = std::move(other.by_size_);
    other.by_address_.clear();
    other.by_size_.clear();
    return *this;
  }
  simulated_source(const simulated_source&) = delete;
  simulated_source& operator=(const simulated_source&) = delete;
  ~simulated_source() { unmap(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("simulated_source", alignment, size_);
    if (bytes == 0) return nullptr;
    std::size_t rounded = 0;
    if (!checked_align_up(bytes, step_for(bytes), rounded)) throw_oom(bytes, "the request overflows");
    const std::size_t align = effective_alignment(alignment);
    std::scoped_lock lock(mutex_);
    if (capacity_ != unlimited && (rounded > capacity_ || in_use_ > capacity_ - rounded))
      throw_oom(bytes, "capacity " + std::to_string(capacity_) + " bytes, in use " + std::to_string(in_use_) + " bytes");
    // Best fit: the smallest free range that still fits once the start is aligned.
    for (auto it = by_size_.lower_bound(rounded); it != by_size_.end(); ++it) {
      const auto [size, start] = *it;
      const std::uintptr_t aligned = align_address(start, align);
      if (aligned - start > size || size - (aligned - start) < rounded) continue;
      by_size_.erase(it);
      by_address_.erase(start);
      if (aligned > start) insert_free(start, aligned - start);
      const std::uintptr_t end = aligned + rounded;
      if (end < start + size) insert_free(end, start + size - end);
      in_use_ += rounded;
      ++allocations_;
      if (in_use_ > peak_) peak_ = in_use_;
      return reinterpret_cast<void*>(aligned);
    }
    throw_oom(bytes, "no free address range of that size left");
  }

  void deallocate(void* p, std::size_t bytes, std::size_t = default_alignment) noexcept
  {
    if (p == nullptr) return;
    std::uintptr_t start = reinterpret_cast<std::uintptr_t>(p);
    std::size_t size = align_up(bytes, step_for(bytes));
    std::scoped_lock lock(mutex_);
    in_use_ -= size;
    --allocations_;
    // Merge with the free neighbours on both sides so address space never fragments for good.
    auto next = by_address_.lower_bound(start);
    if (next != by_address_.end() && next->first == start + size) {
      size += next->second;
      erase_free(next);
    }
    auto prev = by_address_.lower_bound(start);
    if (prev != by_address_.begin()) {
      --prev;
      if (prev->first + prev->second == start) {
        start = prev->first;
        size += prev->second;
        erase_free(prev);
      }
    }
    insert_free(start, size);
  }

  bool owns(const void* p) const noexcept
  {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    return a >= base_ && a < base_ + size_;
  }

  std::size_t capacity() const noexcept { return capacity_; }
  rounding rounds() const noexcept { return round_; }
  /// What a request of `bytes` really takes from the capacity.
  std::size_t rounded_size(std::size_t bytes) const noexcept
  {
    std::size_t rounded = 0;
    return checked_align_up(bytes, step_for(bytes), rounded) ? rounded : SIZE_MAX;
  }
  std::size_t allocated_bytes() const
  {
    std::scoped_lock lock(mutex_);
    return in_use_;
  }
  std::size_t peak_bytes() const
  {
    std::scoped_lock lock(mutex_);
    return peak_;
  }
  std::size_t allocation_count() const
  {
    std::scoped_lock lock(mutex_);
    return allocations_;
  }
  void reset_peak()
  {
    std::scoped_lock lock(mutex_);
    peak_ = in_use_;
  }

  friend bool operator==(const simulated_source& a, const simulated_source& b) noexcept { return &a == &b; }

private:
  [[noreturn]] void throw_oom(std::size_t bytes, const std::string& why) const
  {
    throw out_of_memory("simulated_source", bytes, why);
  }

  std::size_t step_for(std::size_t bytes) const noexcept
  {
    return round_ == rounding::like_cudamalloc && bytes >= cudamalloc_page ? cudamalloc_page : granularity;
  }

  void insert_free(std::uintptr_t start, std::size_t size)
  {
    by_address_.emplace(start, size);
    by_size_.emplace(size, start);
  }

  void erase_free(std::map<std::uintptr_t, std::size_t>::iterator it)
  {
    auto [first, last] = by_size_.equal_range(it->second);
    for (; first != last; ++first)
      if (first->second == it->first) {
        by_size_.erase(first);
        break;
      }
    by_address_.erase(it);
  }

  void unmap() noexcept
  {
    if (base_ != 0) ::munmap(reinterpret_cast<void*>(base_), size_);
    base_ = 0;
    size_ = 0;
  }

  mutable std::mutex mutex_;
  std::uintptr_t base_ = 0;
  std::size_t size_ = 0;
  std::size_t capacity_ = unlimited;
  rounding round_ = rounding::none;
  std::size_t in_use_ = 0;
  std::size_t peak_ = 0;
  std::size_t allocations_ = 0;
  std::map<std::uintptr_t, std::size_t> by_address_;
  std::multimap<std::size_t, std::uintptr_t> by_size_;
};

static_assert(owning_resource<simulated_source> && answers_to_cccl31_names<simulated_source>);
static_assert(cccl::synchronous_resource<simulated_source>);
static_assert(!has_property<simulated_source, host_accessible> && !has_property<simulated_source, device_accessible>);

} // namespace strata
