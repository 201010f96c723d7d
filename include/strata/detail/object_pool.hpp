#pragma once
// Host-side nodes for a pool's bookkeeping (block headers live here, never in the memory handed out:
// docs/architecture.md, rule 1). Nodes come from slabs of 256 and are recycled through a free list: O(1), no malloc on
// the hot path once warm. The free list's capacity always covers every node, so recycle() never allocates
// (it is noexcept); make() that throws changes nothing.
#include <cstddef>
#include <memory>
#include <vector>

namespace strata::detail {

template <class T>
class object_pool {
public:
  object_pool() = default;
  object_pool(object_pool&&) noexcept = default;
  object_pool& operator=(object_pool&&) noexcept = default;

  T* make(T value = T{})
  {
    if (free_.empty()) grow();
    T* node = free_.back();
    free_.pop_back();
    *node = std::move(value);
    return node;
  }

  /// Takes back a node from make(). Never allocates: the free list has room for every node ever made.
  void recycle(T* node) noexcept { free_.push_back(node); }

  std::size_t capacity() const noexcept { return slabs_.size() * slab_nodes; }
  std::size_t free_count() const noexcept { return free_.size(); }

private:
  static constexpr std::size_t slab_nodes = 256;

  /// Every allocation comes first; the pool changes only after all of them succeeded (strong guarantee).
  void grow()
  {
    const std::size_t nodes = capacity() + slab_nodes;
    if (slabs_.size() == slabs_.capacity()) slabs_.reserve(2 * slabs_.size() + 1);
    auto slab = std::make_unique<T[]>(slab_nodes);
    free_.reserve(nodes);
    T* first = slab.get();
    slabs_.push_back(std::move(slab));
    for (std::size_t i = slab_nodes; i-- > 0;) free_.push_back(first + i);
  }

  std::vector<std::unique_ptr<T[]>> slabs_;
  std::vector<T*> free_;
};

} // namespace strata::detail
