#pragma once
// mapped_pool's physical allocations as the page table records them: one record per allocation mapped, kept
// in a slot whose number the pages behind it name, and the queue of idle allocations a reclaim takes from,
// those idle longest first.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::detail {

/// One physical allocation mapped at pages [first, first + count) of range `band`.
template <class Handle>
struct mapping_record {
  Handle page{};
  std::uint32_t band = 0;
  std::size_t first = 0;
  std::size_t count = 0;
  std::size_t busy = 0;     ///< its pages touched by live blocks
  std::size_t aliases = 0;  ///< stale ranges still mapping it elsewhere: it cannot be released before they are unmapped
  bool idle = false;        ///< no live block touches it (counted in the table's idle bytes)
  bool listed = false;      ///< in the idle queue (entries are re-checked when taken)
};

/// Models a slot map of mapping records (slot numbers stay valid until the record is removed, then are
/// reused) with a first-in first-out queue of slots that went idle. The queue is lazy: a slot is listed once
/// and may be busy again, or listed again only after it was taken, when the reclaim reaches it.
/// Cost: add, remove, list_idle and taking the queue's head O(1), never allocating within the room that
/// reserve made for the live records (the queue compacts in place when full, O(queue) now and then).
/// The members are plain data, read and written by page_mappings alone, which holds them; the page table and
/// relocation reach records and the queue through page_mappings' interface.
template <class Handle>
struct mapping_slots {
  using record = mapping_record<Handle>;

  std::vector<record> mappings;           ///< by slot; removed records are empty (count 0)
  std::vector<std::uint32_t> free_slots;  ///< removed slots, reused last in first out
  std::vector<std::uint32_t> idle;        ///< idle slots, oldest first from idle_head
  std::size_t idle_head = 0;
  std::size_t mappings_live = 0;

  /// Room for `more` records beyond the live ones, so adding, listing and removing them cannot throw.
  void reserve(std::size_t more)
  {
    const std::size_t total = mappings_live + more;
    if (total <= mappings.capacity() && total <= idle.capacity() && total <= free_slots.capacity()) return;
    const std::size_t want = std::max(total, 2 * mappings.capacity());
    mappings.reserve(want);
    idle.reserve(want);
    free_slots.reserve(want);
  }

  /// Records a new mapping (room reserved); its slot.
  std::uint32_t add(const record& m) noexcept
  {
    std::uint32_t slot = 0;
    if (!free_slots.empty()) {
      slot = free_slots.back();
      free_slots.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(mappings.size());
      mappings.emplace_back();
    }
    mappings[slot] = m;
    ++mappings_live;
    return slot;
  }

  /// Forgets the record in `slot`; the slot is reused by a later add.
  void remove(std::uint32_t slot) noexcept
  {
    mappings[slot] = record{};
    free_slots.push_back(slot);  // capacity reserved for every slot
    --mappings_live;
  }

  /// Queues an idle slot. Never allocates: the queue's capacity covers every slot, each listed at most once,
  /// and the taken entries at its head are dropped when it is full.
  void list_idle(std::uint32_t slot) noexcept
  {
    if (idle.size() == idle.capacity()) {
      idle.erase(idle.begin(), idle.begin() + static_cast<std::ptrdiff_t>(idle_head));
      idle_head = 0;
    }
    mappings[slot].listed = true;
    idle.push_back(slot);
  }

  void list_idle(const std::vector<std::uint32_t>& slots) noexcept
  {
    for (std::uint32_t slot : slots) list_idle(slot);
  }

  bool has_queued() const noexcept { return idle_head < idle.size(); }
  /// The slot idle longest (has_queued()); pop_queued takes it off the queue.
  std::uint32_t next_queued() const noexcept { return idle[idle_head]; }
  void pop_queued() noexcept
  {
    if (++idle_head == idle.size()) {
      idle.clear();
      idle_head = 0;
    }
  }
};

} // namespace strata::detail
