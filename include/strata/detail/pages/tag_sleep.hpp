#pragma once
// What pausing a tag keeps, and the two halves of the work: copying a tag's live blocks to pinned memory
// before its physical memory goes, and copying them back once it is mapped again at the same addresses.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <strata/core/errors.hpp>
#include <strata/core/tags.hpp>
#include <strata/detail/pages/backup_store.hpp>

namespace strata::detail {

/// A paused tag: its blocks as they were (address order), which of them were freed while it slept (they do
/// not come back), and where their contents wait (one extent of pinned memory, blocks back to back, exact
/// sizes). Owned by the tag's entry in mapped_pool while the tag sleeps.
struct sleeping_tag {
  std::vector<std::pair<std::uintptr_t, std::size_t>> blocks;
  std::vector<unsigned char> freed;
  backup_store::slot backup{};
  bool backed = false;

  /// Frees a block while the tag sleeps: false when p starts none of its blocks still asleep. O(log blocks).
  bool forget(const void* p) noexcept
  {
    const std::size_t i = index_of(p);
    if (i == blocks.size()) return false;
    freed[i] = 1;
    return true;
  }
  bool holds(const void* p) const noexcept { return index_of(p) != blocks.size(); }

  /// The block starting at p and still asleep, or blocks.size().
  std::size_t index_of(const void* p) const noexcept
  {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const auto it = std::lower_bound(blocks.begin(), blocks.end(), a, [](const auto& b, std::uintptr_t x) { return b.first < x; });
    const auto i = static_cast<std::size_t>(it - blocks.begin());
    return i < blocks.size() && blocks[i].first == a && freed[i] == 0 ? i : blocks.size();
  }

  /// The blocks to hand out again, and the backup offset of each.
  std::vector<std::pair<std::uintptr_t, std::size_t>> waking(std::vector<std::size_t>& offsets) const
  {
    std::vector<std::pair<std::uintptr_t, std::size_t>> out;
    std::size_t offset = 0;
    for (std::size_t i = 0; i < blocks.size(); offset += blocks[i].second, ++i)
      if (freed[i] == 0) {
        out.push_back(blocks[i]);
        offsets.push_back(offset);
      }
    return out;
  }

  /// Bytes of blocks still asleep (freed ones excluded).
  std::size_t bytes() const noexcept
  {
    std::size_t n = 0;
    for (std::size_t i = 0; i < blocks.size(); ++i) n += freed[i] == 0 ? blocks[i].second : 0;
    return n;
  }
};

/// Pages of `page` bytes the blocks touch (a page shared by neighbours counted once): what waking them maps.
inline std::size_t pages_touched(const std::vector<std::pair<std::uintptr_t, std::size_t>>& blocks, std::size_t page) noexcept
{
  std::size_t pages = 0;
  std::uintptr_t covered = 0;  // end of the last page counted
  for (const auto& [address, size] : blocks) {
    const std::uintptr_t first = std::max(address / page * page, covered), end = (address + size + page - 1) / page * page;
    if (end > first) pages += (end - first) / page;
    covered = std::max(covered, end);
  }
  return pages;
}

/// Out of room to wake a tag: names the tag, the bytes of pages it needs and what is free (`where`: the
/// device, or the pool's cap).
[[noreturn]] inline void throw_no_room(tag_id tag, std::size_t need, std::size_t free, const char* where)
{
  throw out_of_memory("mapped_pool", need, "resuming tag " + std::to_string(tag) + " needs " + std::to_string(need) +
                                               " bytes of pages, " + where + " has " + std::to_string(free) +
                                               " free; the tag stays paused, its backup kept");
}

/// Waits until no copy queued on `pages` can still run, after a copy failed part way: the queued pieces may
/// be in flight. Never throws; when the copies' own wait fails, the device-wide wait stands in for it.
template <class Pages>
void drain_copies(Pages& pages) noexcept
{
  try {
    pages.finish_copies();
  } catch (...) {
    try {
      pages.synchronize();
    } catch (...) {  // nothing more can be waited for
    }
  }
}

/// Lists a tag's live blocks and, with a backup, copies each to pinned memory taken from `store`. The caller
/// has waited for the device since the last work was queued on them. Nothing in the pool changes: on failure
/// the backup's room goes back to the store and the tag runs on. Costs: a pin only when no pinned memory kept
/// from earlier pauses fits, and copies at link speed with one host wait at the end.
template <class Core, class Pages>
std::unique_ptr<sleeping_tag> copy_out(Core& core, Pages& pages, backup_store& store, bool backup)
{
  auto t = std::make_unique<sleeping_tag>();
  t->blocks = core.live_blocks();
  t->freed.assign(t->blocks.size(), 0);
  t->backed = backup;
  std::size_t total = 0;
  for (const auto& b : t->blocks) total += b.second;
  if (!backup) return t;
  t->backup = store.take(pages, total);
  try {
    std::size_t offset = 0;
    for (const auto& [address, size] : t->blocks) {
      pages.copy_to_host(store.at(t->backup) + offset, address, size);
      offset += size;
    }
    pages.finish_copies();
  } catch (...) {
    drain_copies(pages);  // the backup's room goes back only once no queued copy writes into it
    store.give(t->backup);
    throw;
  }
  return t;
}

/// Hands a sleeping tag's blocks out again at their addresses (core.restore) and copies their contents back.
/// All or nothing: on failure the tag still sleeps, its backup untouched (the copies only read it), and the
/// memory mapped for it is given back. Out of room: strata::out_of_memory naming the tag, the bytes it needs
/// and the device's free bytes. `make_room` is called once before the last try (other tags' idle memory).
template <class Core, class Pages, class MakeRoom>
void copy_in(Core& core, Pages& pages, const backup_store& store, const sleeping_tag& t, tag_id tag, MakeRoom&& make_room)
{
  std::vector<std::size_t> offsets;
  const auto blocks = t.waking(offsets);
  try {
    core.restore(blocks);
  } catch (const out_of_memory&) {
    make_room();
    try {
      core.restore(blocks);
    } catch (const out_of_memory&) {
      throw_no_room(tag, pages_touched(blocks, pages.page_size()) * pages.page_size(), pages.free_bytes(), "the device");
    }
  }
  if (!t.backed) return;
  try {
    for (std::size_t i = 0; i < blocks.size(); ++i) pages.copy_to_device(blocks[i].first, store.at(t.backup) + offsets[i], blocks[i].second);
    pages.finish_copies();
  } catch (...) {
    drain_copies(pages);  // no copy may still write into memory about to be unmapped
    for (const auto& b : blocks) (void)core.take_back(reinterpret_cast<void*>(b.first));
    try {
      (void)core.release();
    } catch (...) {  // stays idle until the next release()
    }
    throw;
  }
}

} // namespace strata::detail
