#pragma once
// The lone owner's recent frees in stream_ordered: blocks kept unmerged, by shape and tag, for the owner's next
// allocations of the same shape. A loop that frees and allocates the same shapes on one stream then reuses a
// block with a pop instead of a split and a merge in the policy. Kept only while nothing else could want the
// memory: stream_ordered gives them all back before the policy is asked for a block, before another stream
// shares the layer, before a host wait for pending frees, and on release.
#include <bit>
#include <cstddef>
#include <cstdint>

#include <strata/detail/stream/stream_cache.hpp>
#include <strata/core/tags.hpp>

namespace strata::detail {

/// A direct-mapped table of `slot_count` shapes, each with up to `per_slot` blocks (newest last). A free of a
/// shape whose slot holds another shape gives that shape's blocks back first. Never allocates, never throws.
/// Cost: take and keep O(1) (a multiply, a comparison, an array access); give_back_all O(blocks kept).
class recent_frees {
public:
  static constexpr unsigned slot_bits = 4;
  static constexpr unsigned slot_count = 1u << slot_bits;
  static constexpr unsigned per_slot = 4;

  /// A block of this key and tag kept here, removed; null when none.
  [[gnu::always_inline]] void* take(std::uint64_t key, tag_id tag) noexcept
  {
    slot& s = slots_[slot_of(key)];
    if (s.count == 0 || s.key != key || s.tag != tag) return nullptr;
    void* p = s.blocks[--s.count];
    --blocks_;
    bytes_ -= s.footprint;
    if (s.count == 0) used_ &= ~(std::uint32_t{1} << slot_of(key));
    return p;
  }

  /// Keeps p, a block of shape `sh` (its tag included). `give_back(p, request, align)` receives the blocks of
  /// another shape that held the slot. False (nothing kept) when the slot already holds `per_slot` blocks of
  /// this shape: the caller gives p back itself.
  template <class GiveBack>
  [[gnu::always_inline]] bool keep(void* p, const block_shape& sh, GiveBack&& give_back) noexcept
  {
    const unsigned i = slot_of(sh.key);
    slot& s = slots_[i];
    if (s.count != 0 && (s.key != sh.key || s.tag != sh.tag)) [[unlikely]] empty_slot(i, give_back);
    if (s.count == per_slot) return false;
    if (s.count == 0) {
      s.key = sh.key;
      s.tag = sh.tag;
      s.request = sh.request;
      s.align = sh.align;
      s.footprint = sh.footprint;
      used_ |= std::uint32_t{1} << i;
    }
    s.blocks[s.count++] = p;
    ++blocks_;
    bytes_ += sh.footprint;
    return true;
  }

  /// Every block kept, to `give_back(p, request, align)`, oldest of each slot first.
  template <class GiveBack>
  void give_back_all(GiveBack&& give_back) noexcept
  {
    while (used_ != 0) empty_slot(static_cast<unsigned>(std::countr_zero(used_)), give_back);
  }

  std::size_t blocks() const noexcept { return blocks_; }
  std::size_t bytes() const noexcept { return bytes_; }
  bool empty() const noexcept { return blocks_ == 0; }

private:
  struct slot {
    std::uint64_t key = 0;
    tag_id tag = 0;
    unsigned count = 0;
    std::size_t request = 0;
    std::size_t align = 0;
    std::size_t footprint = 0;
    void* blocks[per_slot]{};
  };

  static unsigned slot_of(std::uint64_t key) noexcept
  {
    return static_cast<unsigned>((key * 0x9E3779B97F4A7C15u) >> (64 - slot_bits));
  }

  template <class GiveBack>
  void empty_slot(unsigned i, GiveBack& give_back) noexcept
  {
    slot& s = slots_[i];
    for (unsigned k = 0; k < s.count; ++k) give_back(s.blocks[k], s.request, s.align);
    blocks_ -= s.count;
    bytes_ -= s.count * s.footprint;
    s.count = 0;
    used_ &= ~(std::uint32_t{1} << i);
  }

  slot slots_[slot_count]{};
  std::uint32_t used_ = 0;  ///< slots holding blocks
  std::size_t blocks_ = 0;
  std::size_t bytes_ = 0;
};

} // namespace strata::detail
