#pragma once
// Free blocks filed by size in two-level segregated lists (TLSF, see tlsf_mapping.hpp): insert, remove and
// find in O(1) through two levels of bitmaps. One addition to plain TLSF: find() first walks a few blocks of
// the list the request itself falls in, so a free block of exactly the requested size (the common case when a
// program frees and re-allocates the same tensor shapes) is found instead of being skipped for a larger one.
// The blocks are the caller's (intrusive: a block has `size`, `free_prev` and `free_next`); nothing here
// allocates, so every operation is noexcept.
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#include <strata/detail/tlsf_mapping.hpp>

namespace strata::detail {

template <class Block>
class tlsf_index {
public:
  /// How many blocks of the request's own list find() looks at before rounding up to the next list.
  static constexpr int exact_scan = 8;

  void insert(Block* b) noexcept
  {
    const tlsf::list_index i = tlsf::mapping_insert(b->size / tlsf::granule);
    Block*& h = head(i);
    b->free_prev = nullptr;
    b->free_next = h;
    if (h != nullptr) h->free_prev = b;
    h = b;
    first_bits_ |= std::uint64_t{1} << i.first;
    second_bits_[i.first] |= std::uint32_t{1} << i.second;
    ++count_;
  }

  void remove(Block* b) noexcept
  {
    const tlsf::list_index i = tlsf::mapping_insert(b->size / tlsf::granule);
    if (b->free_prev != nullptr) b->free_prev->free_next = b->free_next;
    else head(i) = b->free_next;
    if (b->free_next != nullptr) b->free_next->free_prev = b->free_prev;
    if (head(i) == nullptr) {
      second_bits_[i.first] &= ~(std::uint32_t{1} << i.second);
      if (second_bits_[i.first] == 0) first_bits_ &= ~(std::uint64_t{1} << i.first);
    }
    b->free_prev = b->free_next = nullptr;
    --count_;
  }

  /// A free block of at least `bytes` (a multiple of the granule), or null. O(1): at most exact_scan blocks
  /// of the request's own list, then the first non-empty list whose every block fits.
  Block* find(std::size_t bytes) const noexcept
  {
    const tlsf::list_index own = tlsf::mapping_insert(bytes / tlsf::granule);
    if (own.first < tlsf::first_level_count) {
      int budget = exact_scan;
      for (Block* b = heads_[own.first][own.second]; b != nullptr && budget-- > 0; b = b->free_next)
        if (b->size >= bytes) return b;
    }
    tlsf::list_index i = tlsf::mapping_search(bytes / tlsf::granule);
    if (i.first >= tlsf::first_level_count) return nullptr;
    std::uint32_t second = i.second < 32 ? second_bits_[i.first] & (~std::uint32_t{0} << i.second) : 0;
    if (second == 0) {
      const std::uint64_t first = i.first + 1 < 64 ? first_bits_ & (~std::uint64_t{0} << (i.first + 1)) : 0;
      if (first == 0) return nullptr;
      i.first = static_cast<unsigned>(std::countr_zero(first));
      second = second_bits_[i.first];
    }
    i.second = static_cast<unsigned>(std::countr_zero(second));
    return heads_[i.first][i.second];
  }

  /// Of the first `budget` blocks that fit `bytes` (the request's own list first, then every list above it in
  /// order), the one `cost` rates lowest; the walk stops early at a cost of zero. Null when none fits. O(budget).
  template <class Cost>
  Block* find_cheapest(std::size_t bytes, int budget, Cost&& cost) const
  {
    Block* best = nullptr;
    std::size_t best_cost = SIZE_MAX;
    auto consider = [&](Block* b) {
      const std::size_t c = cost(b);
      if (c < best_cost) {
        best = b;
        best_cost = c;
      }
      return c == 0 || --budget <= 0;
    };
    const tlsf::list_index own = tlsf::mapping_insert(bytes / tlsf::granule);
    if (own.first >= tlsf::first_level_count) return nullptr;
    for (Block* b = heads_[own.first][own.second]; b != nullptr; b = b->free_next) {
      if (b->size >= bytes ? consider(b) : (--budget <= 0 && best != nullptr)) return best;
    }
    tlsf::list_index i = tlsf::mapping_search(bytes / tlsf::granule);
    if (i == own && ++i.second == tlsf::second_level_count) {  // own list already walked
      i.second = 0;
      ++i.first;
    }
    for (unsigned first = i.first; first < tlsf::first_level_count; ++first) {
      std::uint32_t lists = second_bits_[first];
      if (first == i.first) lists = i.second < 32 ? lists & (~std::uint32_t{0} << i.second) : 0;
      for (; lists != 0; lists &= lists - 1) {
        const auto second = static_cast<unsigned>(std::countr_zero(lists));
        for (Block* b = heads_[first][second]; b != nullptr; b = b->free_next)
          if (consider(b)) return best;
      }
    }
    return best;
  }

  /// The size of the largest free block (walks one list: the top non-empty one).
  std::size_t largest() const noexcept
  {
    if (first_bits_ == 0) return 0;
    const unsigned first = 63 - static_cast<unsigned>(std::countl_zero(first_bits_));
    const unsigned second = 31 - static_cast<unsigned>(std::countl_zero(second_bits_[first]));
    std::size_t largest = 0;
    for (const Block* b = heads_[first][second]; b != nullptr; b = b->free_next)
      largest = largest < b->size ? b->size : largest;
    return largest;
  }

  std::size_t count() const noexcept { return count_; }

  /// Forgets every block (the caller owns and recycles them).
  void clear() noexcept
  {
    for (auto& row : heads_) row.fill(nullptr);
    first_bits_ = 0;
    second_bits_.fill(0);
    count_ = 0;
  }

private:
  Block*& head(tlsf::list_index i) noexcept { return heads_[i.first][i.second]; }

  std::array<std::array<Block*, tlsf::second_level_count>, tlsf::first_level_count> heads_{};
  std::uint64_t first_bits_ = 0;
  std::array<std::uint32_t, tlsf::first_level_count> second_bits_{};
  std::size_t count_ = 0;
};

} // namespace strata::detail
