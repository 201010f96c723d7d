#pragma once
// The blocks of an address range in address order: splitting a free block around a request and merging a
// freed block with its free neighbours, shared by coalescing_pool (one list per chunk) and mapped_pool (one
// list per reserved range). Intrusive: a Node has `std::uintptr_t address`, `std::size_t size`,
// `Node* prev, *next` (its address neighbours) and `bool free`. Which free list a free block is filed in
// belongs to the caller, who passes `file` / `unfile`; nodes come from and go back to the caller too, so
// nothing here allocates and nothing can fail. O(1) but block_over and the walks, O(blocks before the address).
#include <cstddef>
#include <cstdint>

#include <strata/detail/object_pool.hpp>
#include <strata/detail/tlsf_lists.hpp>

namespace strata::detail {

/// A block of an address range with the links tlsf_lists files it by: what mapped_pool keeps per block.
struct address_block {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  address_block* prev = nullptr;
  address_block* next = nullptr;
  address_block* free_prev = nullptr;
  address_block* free_next = nullptr;
  bool free = false;
};

namespace address_range {

/// Links `node` into the list right after b, holding b's bytes from `offset` on; b keeps the first `offset`.
/// The new node starts blank (in no list) and takes from b only what a pool's node says it inherits
/// (`inherit_from`, such as the band that names its free lists): copying b whole would read and write
/// every link on the hot path for nothing.
template <class Node>
Node* split_off(Node* b, std::size_t offset, Node* node) noexcept
{
  *node = Node{};
  if constexpr (requires { node->inherit_from(*b); }) node->inherit_from(*b);
  node->address = b->address + offset;
  node->size = b->size - offset;
  node->prev = b;
  node->next = b->next;
  if (b->next != nullptr) b->next->prev = node;
  b->next = node;
  b->size = offset;
  return node;
}

/// Takes [start, start + size) out of free block b, already unfiled and found to hold it: the bytes before
/// go on in b and the bytes after in `tail`, both marked free and filed (front first); `rest` holds the
/// taken block, which is returned marked in use. `rest` is given exactly when start is past b's start and
/// `tail` exactly when the block ends before b does.
template <class Node, class File>
Node* carve(Node* b, std::uintptr_t start, std::size_t size, Node* rest, Node* tail, File&& file) noexcept
{
  if (rest != nullptr) {
    split_off(b, start - b->address, rest);
    b->free = true;
    file(b);
    b = rest;
  }
  if (tail != nullptr) {
    split_off(b, size, tail);
    tail->free = true;
    file(tail);
  }
  b->free = false;
  return b;
}

/// b grows over its next neighbour, whose node is handed to `recycle`.
template <class Node, class Recycle>
void absorb_next(Node* b, Recycle&& recycle) noexcept
{
  Node* n = b->next;
  b->size += n->size;
  b->next = n->next;
  if (n->next != nullptr) n->next->prev = b;
  recycle(n);
}

/// Marks b free and merges it with its free neighbours (unfiled first; their nodes recycled): returns the
/// merged block, to be filed by the caller.
template <class Node, class Unfile, class Recycle>
Node* merge_free(Node* b, Unfile&& unfile, Recycle&& recycle) noexcept
{
  b->free = true;
  if (b->next != nullptr && b->next->free) {
    unfile(b->next);
    absorb_next(b, recycle);
  }
  if (b->prev != nullptr && b->prev->free) {
    Node* prev = b->prev;
    unfile(prev);
    absorb_next(prev, recycle);
    b = prev;
  }
  return b;
}

/// The block holding `address`, walking from `first` (which must reach it).
template <class Node>
Node* block_over(Node* first, std::uintptr_t address) noexcept
{
  Node* b = first;
  while (b->address + b->size <= address) b = b->next;
  return b;
}

/// Hands every node of the list starting at `first` to `recycle`.
template <class Node, class Recycle>
void recycle_all(Node* first, Recycle&& recycle) noexcept
{
  for (Node* b = first; b != nullptr;) {
    Node* next = b->next;
    recycle(b);
    b = next;
  }
}

} // namespace address_range

/// The blocks of one address range with the free ones filed by size in TLSF lists: what mapped_pool keeps
/// for each range it reserves. O(1) carve and release; the list's first node never changes.
struct block_range {
  address_block* first = nullptr;
  tlsf_lists<address_block> free;

  /// Takes [start, start + size) out of free block b (found to hold it) and returns it; the pieces before
  /// and after stay free, `rest` and `tail` the nodes they need (address_range::carve). Cannot fail.
  address_block* carve(address_block* b, std::uintptr_t start, std::size_t size, address_block* rest, address_block* tail) noexcept
  {
    free.remove(b);
    return address_range::carve(b, start, size, rest, tail, [this](address_block* piece) { free.insert(piece); });
  }

  /// carve's twin: marks b free, merges it with its free neighbours (their nodes go back to `nodes`) and files it.
  void release(address_block* b, object_pool<address_block>& nodes) noexcept
  {
    free.insert(address_range::merge_free(b, [this](address_block* n) { free.remove(n); }, [&](address_block* n) { nodes.recycle(n); }));
  }
};

} // namespace strata::detail
