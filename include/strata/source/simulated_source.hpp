#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>

namespace strata {

/// Addresses without memory: a range of address space reserved with PROT_NONE and never touched (a touch
/// faults, which is how tests prove that a policy keeps docs/architecture.md's rule 1). With an optional
/// capacity it refuses, with out_of_memory, any request that would put more than `capacity` bytes in use: "does this
/// trace fit in 80 GiB with this stack?" answered on a laptop.
/// Free ranges are kept best-fit (by size) and merged with their neighbours (by address).
/// With `rounding::like_cudamalloc` it rounds as cudaMalloc does on current GPUs (measured on an H200): a
/// request of 2 MiB or more takes a multiple of 2 MiB. Replays that do not round under-count what pools of
/// exact-size chunks really hold, so the replay tools round by default.
/// owns(p) is true exactly when p lies inside a live allocation (the address space between free ranges).
/// Under host out-of-memory it keeps the strong guarantee, and deallocate never allocates: map nodes for
/// every free range there can ever be (one more than the live allocations) are set aside by allocate.
/// A moved-from source is empty and reserves a fresh range on its next allocate.
/// Models: resource, owning, with no accessibility property (the memory cannot be touched). Any power-of-two
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
    address_space_ = address_space;
    reserve_address_space();
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
    address_space_ = other.address_space_;
    in_use_ = std::exchange(other.in_use_, 0);
    peak_ = std::exchange(other.peak_, 0);
    allocations_ = std::exchange(other.allocations_, 0);
    by_address_ = std::move(other.by_address_);
    by_size_ = std::move(other.by_size_);
    spare_nodes_ = std::move(other.spare_nodes_);
    other.by_address_.clear();
    other.by_size_.clear();
    other.spare_nodes_.clear();
    return *this;
  }
  simulated_source(const simulated_source&) = delete;
  simulated_source& operator=(const simulated_source&) = delete;
  ~simulated_source() { unmap(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    if (!is_power_of_two(alignment) || alignment > max_alignment)
      detail::throw_bad_alignment("simulated_source", alignment, max_alignment);
    if (bytes == 0) return nullptr;
    std::size_t rounded = 0;
    if (!checked_align_up(bytes, step_for(bytes), rounded)) throw_oom(bytes, "the request overflows");
    const std::size_t align = effective_alignment(alignment);
    std::scoped_lock lock(mutex_);
    if (base_ == 0) reserve_address_space();  // moved from: start again with a fresh range
    if (align > size_) detail::throw_bad_alignment("simulated_source", alignment, size_);
    if (capacity_ != unlimited && (rounded > capacity_ || in_use_ > capacity_ - rounded))
      throw_oom(bytes, "capacity " + std::to_string(capacity_) + " bytes, in use " + std::to_string(in_use_) + " bytes");
    // Best fit: the smallest free range that still fits once the start is aligned.
    for (auto it = by_size_.lower_bound(rounded); it != by_size_.end(); ++it) {
      const auto [size, start] = *it;
      const std::uintptr_t aligned = align_address(start, align);
      if (aligned - start > size || size - (aligned - start) < rounded) continue;
      set_aside_nodes_for(allocations_ + 1);  // the only step that allocates: nothing has changed yet
      carve(it, aligned, rounded);
      in_use_ += rounded;
      ++allocations_;
      if (in_use_ > peak_) peak_ = in_use_;
      return reinterpret_cast<void*>(aligned);
    }
    throw_oom(bytes, "no free address range of that size left");
  }

  /// Never allocates: merging reuses the neighbours' map nodes, and a lone range takes set-aside ones.
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

  /// True exactly when p lies inside a live allocation: in the reserved range and in no free range.
  bool owns(const void* p) const noexcept
  {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::scoped_lock lock(mutex_);
    if (base_ == 0 || a < base_ || a >= base_ + size_) return false;
    auto it = by_address_.upper_bound(a);
    if (it == by_address_.begin()) return true;
    --it;
    return a >= it->first + it->second;
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

  using free_map = std::map<std::uintptr_t, std::size_t>;
  using node = free_map::node_type;
  static_assert(std::is_same_v<node, std::multimap<std::size_t, std::uintptr_t>::node_type>,
                "set-aside nodes serve both maps");

  void reserve_address_space()
  {
    void* base = ::mmap(nullptr, address_space_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) throw out_of_memory("simulated_source", address_space_, "cannot reserve address space");
    try {
      set_aside_nodes_for(0);
    } catch (...) {
      ::munmap(base, address_space_);
      throw;
    }
    base_ = reinterpret_cast<std::uintptr_t>(base);
    size_ = address_space_;
    insert_free(base_, size_);
  }

  /// Free ranges are maximal, so with n live allocations there are at most n + 1: keep two map nodes (one
  /// per map) for each of them, in use or set aside. Strong guarantee (extra set-aside nodes are invisible).
  void set_aside_nodes_for(std::size_t live_allocations)
  {
    const std::size_t wanted = 2 * (live_allocations + 1);
    while (2 * by_address_.size() + spare_nodes_.size() < wanted) spare_nodes_.emplace(0, 0);
  }

  node spare_node(std::uintptr_t key, std::size_t value) noexcept
  {
    node n = spare_nodes_.extract(spare_nodes_.begin());
    n.key() = key;
    n.mapped() = value;
    return n;
  }

  void insert_free(std::uintptr_t start, std::size_t size) noexcept
  {
    by_address_.insert(spare_node(start, size));
    by_size_.insert(spare_node(size, start));
  }

  void erase_free(free_map::iterator it) noexcept
  {
    auto [first, last] = by_size_.equal_range(it->second);
    for (; first != last; ++first)
      if (first->second == it->first) {
        spare_nodes_.insert(by_size_.extract(first));
        break;
      }
    spare_nodes_.insert(by_address_.extract(it));
  }

  /// Takes [aligned, aligned + bytes) out of the free range at `it`; what is left on either side stays free.
  void carve(std::multimap<std::size_t, std::uintptr_t>::iterator it, std::uintptr_t aligned, std::size_t bytes) noexcept
  {
    const auto [size, start] = *it;
    erase_free(by_address_.find(start));
    if (aligned > start) insert_free(start, aligned - start);
    if (aligned + bytes < start + size) insert_free(aligned + bytes, start + size - (aligned + bytes));
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
  std::size_t address_space_ = 0;
  std::size_t capacity_ = unlimited;
  rounding round_ = rounding::none;
  std::size_t in_use_ = 0;
  std::size_t peak_ = 0;
  std::size_t allocations_ = 0;
  std::map<std::uintptr_t, std::size_t> by_address_;
  std::multimap<std::size_t, std::uintptr_t> by_size_;
  std::multimap<std::uintptr_t, std::size_t> spare_nodes_;  // map nodes set aside for frees (keys unused)
};

static_assert(owning_resource<simulated_source> && answers_to_cccl31_names<simulated_source>);
static_assert(cccl::synchronous_resource<simulated_source>);
static_assert(!has_property<simulated_source, host_accessible> && !has_property<simulated_source, device_accessible>);

} // namespace strata
