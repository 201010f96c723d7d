#pragma once
// Host-side nodes for a pool's bookkeeping (block headers live here, never in the memory handed out:
// docs/architecture.md, rule 1). Nodes come from slabs of 256 and are recycled through a free stack: O(1), no
// malloc on the hot path once warm. The stack's room always covers every node, so recycle() never allocates
// nor checks for room (it is noexcept and a store); make() that throws changes nothing.
#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

namespace strata::detail {

template <class T>
class object_pool {
public:
  object_pool() = default;
  object_pool(object_pool&& other) noexcept
      : slabs_(std::exchange(other.slabs_, {})), free_(std::exchange(other.free_, {})), free_count_(std::exchange(other.free_count_, 0))
  {}
  object_pool& operator=(object_pool&& other) noexcept
  {
    if (this != &other) {
      slabs_ = std::exchange(other.slabs_, {});
      free_ = std::exchange(other.free_, {});
      free_count_ = std::exchange(other.free_count_, 0);
    }
    return *this;
  }
  object_pool(const object_pool&) = delete;
  object_pool& operator=(const object_pool&) = delete;
  ~object_pool() = default;

  T* make(T value = T{})
  {
    if (free_count_ == 0) grow();
    T* node = free_[--free_count_];
    *node = std::move(value);
    return node;
  }

  /// Takes back a node from make(). Never allocates: the free stack has room for every node ever made.
  void recycle(T* node) noexcept { free_[free_count_++] = node; }

  std::size_t capacity() const noexcept { return slabs_.size() * slab_nodes; }
  std::size_t free_count() const noexcept { return free_count_; }

private:
  static constexpr std::size_t slab_nodes = 256;

  /// Every allocation comes first; the pool changes only after all of them succeeded (strong guarantee).
  void grow()
  {
    if (slabs_.size() == slabs_.capacity()) slabs_.reserve(2 * slabs_.size() + 1);
    auto slab = std::make_unique<T[]>(slab_nodes);
    auto room = std::make_unique_for_overwrite<T*[]>(capacity() + slab_nodes);
    std::copy(free_.get(), free_.get() + free_count_, room.get());
    T* first = slab.get();
    slabs_.push_back(std::move(slab));
    free_ = std::move(room);
    for (std::size_t i = slab_nodes; i-- > 0;) free_[free_count_++] = first + i;
  }

  std::vector<std::unique_ptr<T[]>> slabs_;
  std::unique_ptr<T*[]> free_;  ///< room for capacity() nodes; the first free_count_ are free
  std::size_t free_count_ = 0;
};

} // namespace strata::detail
