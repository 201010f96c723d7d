#pragma once
// Pinned host memory that paused tags' contents go to, kept from one pause to the next: pinning is what
// costs (the kernel locks every page), while copying runs at link speed, so a pool that sleeps and wakes many
// times an hour pins once.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace strata::detail {

/// Regions of pinned memory, each holding the backups of some paused tags (extents, first fit). A backup
/// goes into a free gap of a region already pinned; failing that, wholly unused regions too small are
/// unpinned and one region of exactly the size asked is pinned, so memory pinned never exceeds the most
/// that was paused at once. `Pins` is the backend: `pin(bytes)` / `unpin(p, bytes)`. Costs: O(regions +
/// extents) per take and give, a pin (slow: the host locks every page) only when nothing pinned fits.
/// Unsynchronized. The owner calls drop() before it loses the backend.
class backup_store {
public:
  struct slot {
    std::size_t region = 0;
    std::size_t offset = 0;
    std::size_t bytes = 0;
  };

  backup_store() = default;
  backup_store(backup_store&& other) noexcept : regions_(std::exchange(other.regions_, {})) {}
  backup_store& operator=(backup_store&& other) noexcept
  {
    regions_ = std::exchange(other.regions_, {});  // the owner dropped its own regions first
    return *this;
  }
  backup_store(const backup_store&) = delete;
  backup_store& operator=(const backup_store&) = delete;

  /// Room for `bytes` (0 takes nothing). Throws what pin throws, with nothing changed but unused regions unpinned.
  template <class Pins>
  slot take(Pins& pins, std::size_t bytes)
  {
    if (bytes == 0) return {};
    for (std::size_t i = 0; i < regions_.size(); ++i)
      if (const std::size_t at = gap(regions_[i], bytes); at != SIZE_MAX) return claim(i, at, bytes);
    regions_.reserve(regions_.size() + 1);
    trim(pins, bytes);
    void* base = pins.pin(bytes);
    regions_.push_back({base, bytes, {}});
    return claim(regions_.size() - 1, 0, bytes);
  }

  /// Hands a backup's room back to its region (still pinned, for the next pause).
  void give(const slot& s) noexcept
  {
    if (s.bytes == 0) return;
    auto& used = regions_[s.region].used;
    for (std::size_t i = 0; i < used.size(); ++i)
      if (used[i].first == s.offset) {
        used.erase(used.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
  }

  /// Pins ahead so that a backup of `bytes` needs no pin later (nothing when an unused region that large exists).
  template <class Pins>
  void reserve(Pins& pins, std::size_t bytes)
  {
    give(take(pins, bytes));
  }

  /// Unpins every region no paused tag uses; returns the bytes unpinned.
  template <class Pins>
  std::size_t release(Pins& pins) noexcept
  {
    return trim(pins, SIZE_MAX);
  }

  /// Unpins everything (the owner is going, or taking another store's regions).
  template <class Pins>
  void drop(Pins& pins) noexcept
  {
    for (auto& r : regions_) pins.unpin(r.base, r.bytes);
    regions_.clear();
  }

  unsigned char* at(const slot& s) const noexcept { return static_cast<unsigned char*>(regions_[s.region].base) + s.offset; }
  std::size_t pinned_bytes() const noexcept
  {
    std::size_t n = 0;
    for (const auto& r : regions_) n += r.bytes;
    return n;
  }
  std::size_t regions() const noexcept { return regions_.size(); }

private:
  struct region {
    void* base = nullptr;
    std::size_t bytes = 0;
    std::vector<std::pair<std::size_t, std::size_t>> used;  ///< (offset, bytes), in offset order
  };
  std::vector<region> regions_;

  /// The first offset of a gap of `bytes` in r, or SIZE_MAX.
  static std::size_t gap(const region& r, std::size_t bytes) noexcept
  {
    std::size_t at = 0;
    for (const auto& [offset, n] : r.used) {
      if (offset - at >= bytes) return at;
      at = offset + n;
    }
    return r.bytes - at >= bytes ? at : SIZE_MAX;
  }

  slot claim(std::size_t i, std::size_t at, std::size_t bytes)
  {
    auto& used = regions_[i].used;
    std::size_t pos = 0;
    while (pos < used.size() && used[pos].first < at) ++pos;
    used.insert(used.begin() + static_cast<std::ptrdiff_t>(pos), {at, bytes});
    return {i, at, bytes};
  }

  /// Unpins unused regions smaller than `below` (all unused ones for SIZE_MAX); region indices of backups in
  /// use are kept by leaving their regions where they are (an unpinned one becomes an empty placeholder).
  template <class Pins>
  std::size_t trim(Pins& pins, std::size_t below) noexcept
  {
    std::size_t freed = 0;
    for (auto& r : regions_)
      if (r.used.empty() && r.bytes != 0 && (below == SIZE_MAX || r.bytes < below)) {
        pins.unpin(r.base, r.bytes);
        freed += r.bytes;
        r = region{};
      }
    while (!regions_.empty() && regions_.back().bytes == 0) regions_.pop_back();
    return freed;
  }
};

} // namespace strata::detail
