#pragma once
// The free lists of a two-level segregated fit (TLSF) pool, factored out of coalescing_pool so one pool can
// keep several independent sets (small and large requests apart) and other pools can reuse them.
// Intrusive: a Node has `std::size_t size` (a multiple of tlsf::granule) and `Node* free_prev, *free_next`;
// the lists never allocate, so filing and unfiling cannot fail.
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#include <strata/detail/tlsf_mapping.hpp>

namespace strata::detail {

template <class Node>
class tlsf_lists {
public:
  void insert(Node* b) noexcept
  {
    const tlsf::list_index i = tlsf::mapping_insert(b->size / tlsf::granule);
    Node*& h = head(i);
    b->free_prev = nullptr;
    b->free_next = h;
    if (h != nullptr) h->free_prev = b;
    h = b;
    first_bits_ |= std::uint64_t{1} << i.first;
    second_bits_[i.first] |= std::uint32_t{1} << i.second;
    ++count_;
  }

  void remove(Node* b) noexcept
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

  /// A free block of at least `bytes` (a multiple of the granule), or null. The lists above the one
  /// `bytes` falls in hold only blocks that fit, so plain TLSF searches from there; but then a free block
  /// of exactly `bytes`, filed in the request's own list, is never found and the pool grows beside it.
  /// So the own list is looked at first: at most `scan_limit` blocks, the best fit among them (stopping at
  /// an exact one). Then the first non-empty list above, in O(1) by find-first-set.
  Node* find(std::size_t bytes, unsigned scan_limit) const noexcept
  {
    const std::size_t granules = bytes / tlsf::granule;
    const tlsf::list_index own = tlsf::mapping_insert(granules);
    if (own.first >= tlsf::first_level_count) return nullptr;
    if (tlsf::list_floor(own) != granules) {  // the own list may hold blocks too small: scan it
      if (Node* b = best_in(own, bytes, scan_limit)) return b;
    }
    return first_at_or_above(tlsf::mapping_search(granules));
  }

  /// A block find_cheapest chose and what `cost` rated it (null and SIZE_MAX when none fits).
  struct cheapest {
    Node* block = nullptr;
    std::size_t cost = SIZE_MAX;
  };

  /// Of the first `budget` blocks that fit `bytes` (the request's own list first, then every list above it in
  /// order), the one `cost` rates lowest (the first of those), with its cost; the walk stops early at a cost of
  /// zero. O(budget): empty lists are skipped by find-first-set on both levels, however far apart the blocks are.
  template <class Cost>
  cheapest find_cheapest(std::size_t bytes, int budget, Cost&& cost) const
  {
    cheapest best;
    auto consider = [&](Node* b) {
      const std::size_t c = cost(b);
      if (c < best.cost) best = {b, c};
      return c == 0 || --budget <= 0;
    };
    const tlsf::list_index own = tlsf::mapping_insert(bytes / tlsf::granule);
    if (own.first >= tlsf::first_level_count) return best;
    int own_walk = budget;  // blocks of the own list too small still count: the walk stays bounded
    for (Node* b = heads_[own.first][own.second]; b != nullptr && own_walk-- > 0; b = b->free_next) {
      if (b->size >= bytes && consider(b)) return best;
    }
    tlsf::list_index i = tlsf::mapping_search(bytes / tlsf::granule);
    if (i == own && ++i.second == tlsf::second_level_count) {  // own list already walked
      i.second = 0;
      ++i.first;
    }
    for (std::uint64_t firsts = levels_from(i.first); firsts != 0; firsts &= firsts - 1) {
      const auto first = static_cast<unsigned>(std::countr_zero(firsts));
      std::uint32_t lists = second_bits_[first];
      if (first == i.first) lists = i.second < 32 ? lists & (~std::uint32_t{0} << i.second) : 0;
      for (; lists != 0; lists &= lists - 1) {
        const auto second = static_cast<unsigned>(std::countr_zero(lists));
        for (Node* b = heads_[first][second]; b != nullptr; b = b->free_next)
          if (consider(b)) return best;
      }
    }
    return best;
  }

  std::size_t count() const noexcept { return count_; }

  /// The size of the largest free block: the top non-empty list, scanned (a report, not the hot path).
  std::size_t largest() const noexcept
  {
    if (first_bits_ == 0) return 0;
    const unsigned first = 63 - static_cast<unsigned>(std::countl_zero(first_bits_));
    const unsigned second = 31 - static_cast<unsigned>(std::countl_zero(second_bits_[first]));
    std::size_t largest = 0;
    for (const Node* b = heads_[first][second]; b != nullptr; b = b->free_next) largest = largest < b->size ? b->size : largest;
    return largest;
  }

  /// Forgets every block (the nodes themselves belong to the caller).
  void clear() noexcept
  {
    for (auto& row : heads_) row.fill(nullptr);
    first_bits_ = 0;
    second_bits_.fill(0);
    count_ = 0;
  }

private:
  Node*& head(tlsf::list_index i) noexcept { return heads_[i.first][i.second]; }

  /// The non-empty first levels from `first` up, one bit each.
  std::uint64_t levels_from(unsigned first) const noexcept { return first < 64 ? first_bits_ & (~std::uint64_t{0} << first) : 0; }

  Node* best_in(tlsf::list_index i, std::size_t bytes, unsigned scan_limit) const noexcept
  {
    Node* best = nullptr;
    unsigned seen = 0;
    for (Node* b = heads_[i.first][i.second]; b != nullptr && seen < scan_limit; b = b->free_next, ++seen) {
      if (b->size < bytes || (best != nullptr && best->size <= b->size)) continue;
      best = b;
      if (b->size == bytes) break;
    }
    return best;
  }

  Node* first_at_or_above(tlsf::list_index i) const noexcept
  {
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

  std::array<std::array<Node*, tlsf::second_level_count>, tlsf::first_level_count> heads_{};
  std::uint64_t first_bits_ = 0;
  std::array<std::uint32_t, tlsf::first_level_count> second_bits_{};
  std::size_t count_ = 0;
};

} // namespace strata::detail
