#pragma once
// Host-side nodes for a pool's bookkeeping (block headers live here, never in the memory handed out:
// DESIGN.md rule 1). Nodes come from slabs of 256 and are recycled through a free list: O(1), no malloc on
// the hot path once warm.
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

  void recycle(T* node) noexcept { free_.push_back(node); }

private:
  static constexpr std::size_t slab_nodes = 256;

  void grow()
  {
    slabs_.push_back(std::make_unique<T[]>(slab_nodes));
    free_.reserve(free_.size() + slab_nodes);
    T* slab = slabs_.back().get();
    for (std::size_t i = slab_nodes; i-- > 0;) free_.push_back(slab + i);
  }

  std::vector<std::unique_ptr<T[]>> slabs_;
  std::vector<T*> free_;
};

} // namespace strata::detail
