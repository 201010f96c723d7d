#pragma once
// Physical allocations a reclaim unmapped but did not release: a new mapping of the same length made in the
// same call maps one of them again instead of releasing one allocation and creating another (two driver
// calls fewer). The device wait before the reclaim makes them as safe to reuse anywhere as at their old place.
#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace strata::detail {

/// Models a multiset of allocation handles keyed by their length in pages.
/// Cost: take O(spares) (a scan: a reclaim keeps a handful); keep O(1); release_all O(spares). Only reserve
/// allocates (strong guarantee); keep never does within the room reserved, nor after a take.
template <class Handle>
class spare_allocations {
public:
  std::size_t size() const noexcept { return spares_.size(); }
  bool empty() const noexcept { return spares_.empty(); }

  /// Room for `count` spares in all.
  void reserve(std::size_t count) { spares_.reserve(count); }

  /// Files an allocation of `pages` pages (room reserved, or left by a take).
  void keep(Handle page, std::size_t pages) noexcept { spares_.push_back({std::move(page), pages}); }

  /// Takes an allocation of exactly `pages` pages into `out`; false (nothing changed) when there is none.
  bool take(std::size_t pages, Handle& out) noexcept
  {
    const auto found = std::find_if(spares_.begin(), spares_.end(), [&](const spare& sp) { return sp.pages == pages; });
    if (found == spares_.end()) return false;
    out = std::move(found->page);
    if (found != spares_.end() - 1) *found = std::move(spares_.back());
    spares_.pop_back();
    return true;
  }

  /// Hands every allocation to `destroy(handle)` and forgets them.
  template <class Destroy>
  void release_all(Destroy&& destroy) noexcept
  {
    for (spare& sp : spares_) destroy(std::move(sp.page));
    spares_.clear();
  }

private:
  struct spare {
    Handle page{};
    std::size_t pages = 0;
  };
  std::vector<spare> spares_;
};

} // namespace strata::detail
