#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include <strata/detail/address_range.hpp>

using strata::detail::address_block;
namespace range = strata::detail::address_range;

namespace {
/// A list of blocks over [0, total) with a set standing for the free lists.
struct blocks {
  explicit blocks(std::size_t total) { first = make(address_block{.address = 0, .size = total, .free = true}); filed.insert(first); }
  address_block* make(address_block b = {})
  {
    pool.push_back(new address_block(b));
    return pool.back();
  }
  ~blocks()
  {
    for (address_block* b : pool) delete b;
  }
  blocks(const blocks&) = delete;
  blocks& operator=(const blocks&) = delete;

  /// The list is contiguous from 0 to `total`, linked both ways; no two free blocks are neighbours; the
  /// filed blocks are exactly the free ones.
  void check(std::size_t total) const
  {
    std::size_t at = 0, free_seen = 0;
    const address_block* prev = nullptr;
    for (const address_block* b = first; b != nullptr; prev = b, b = b->next) {
      REQUIRE(b->address == at);
      REQUIRE(b->prev == prev);
      REQUIRE(b->size > 0);
      if (prev != nullptr) REQUIRE_FALSE((prev->free && b->free));
      REQUIRE(b->free == (filed.count(const_cast<address_block*>(b)) == 1));
      free_seen += b->free;
      at += b->size;
    }
    REQUIRE(at == total);
    REQUIRE(free_seen == filed.size());
  }

  address_block* carve(address_block* b, std::uintptr_t start, std::size_t size)
  {
    filed.erase(b);
    address_block* rest = start > b->address ? make() : nullptr;
    address_block* tail = start + size < b->address + b->size ? make() : nullptr;
    return range::carve(b, start, size, rest, tail, [&](address_block* piece) { filed.insert(piece); });
  }
  void free(address_block* b)
  {
    filed.insert(range::merge_free(b, [&](address_block* n) { filed.erase(n); }, [&](address_block*) { ++recycled; }));
  }

  address_block* first = nullptr;
  std::set<address_block*> filed;
  std::vector<address_block*> pool;
  std::size_t recycled = 0;
};
} // namespace

TEST_CASE("address_range: carve leaves the bytes before and after free and filed, front first")
{
  blocks list(4096);
  address_block* whole = list.first;
  std::vector<std::uintptr_t> order;
  list.filed.erase(whole);
  address_block* rest = list.make();
  address_block* tail = list.make();
  address_block* mid = range::carve(whole, 1024, 512, rest, tail, [&](address_block* piece) {
    order.push_back(piece->address);
    list.filed.insert(piece);
  });
  CHECK(mid == rest);
  CHECK(mid->address == 1024);
  CHECK(mid->size == 512);
  CHECK_FALSE(mid->free);
  CHECK(list.first == whole);  // the front keeps the list's first node
  CHECK(whole->size == 1024);
  CHECK(tail->address == 1536);
  CHECK(tail->size == 4096 - 1536);
  CHECK(order == std::vector<std::uintptr_t>{0, 1536});
  list.check(4096);
}

TEST_CASE("address_range: a block carved from the start or to the end needs no node there")
{
  blocks list(4096);
  address_block* a = list.carve(list.first, 0, 1024);
  CHECK(a == list.first);
  address_block* b = list.carve(a->next, 3072, 1024);
  CHECK(b->next == nullptr);
  CHECK(b->address == 3072);
  list.check(4096);
  CHECK(list.filed.size() == 1);
}

TEST_CASE("address_range: a freed block merges with both free neighbours and their nodes are recycled")
{
  blocks list(4096);
  address_block* a = list.carve(list.first, 0, 1024);
  address_block* b = list.carve(a->next, 1024, 1024);
  address_block* c = list.carve(b->next, 2048, 1024);
  list.check(4096);
  list.free(a);
  list.free(c);  // merges with the free tail
  CHECK(list.recycled == 1);
  list.free(b);  // merges with a before and c after
  CHECK(list.recycled == 3);
  CHECK(list.first->size == 4096);
  CHECK(list.first->next == nullptr);
  CHECK(list.first->free);
  list.check(4096);
}

TEST_CASE("address_range: block_over finds the block holding an address")
{
  blocks list(4096);
  list.carve(list.first, 1024, 1024);
  CHECK(range::block_over(list.first, 0)->address == 0);
  CHECK(range::block_over(list.first, 1024)->address == 1024);
  CHECK(range::block_over(list.first, 2047)->address == 1024);
  CHECK(range::block_over(list.first, 4095)->address == 2048);
  std::size_t seen = 0;
  range::recycle_all(list.first, [&](address_block*) { ++seen; });
  CHECK(seen == 3);
}

TEST_CASE("address_range: random carves and frees keep the list contiguous and free blocks apart")
{
  constexpr std::size_t total = 1 << 20, unit = 256;
  blocks list(total);
  std::mt19937 rng(7);
  std::vector<address_block*> live;
  std::size_t carved = 0, freed = 0;
  for (int step = 0; step < 4000; ++step) {
    if (!live.empty() && (rng() % 2 == 0 || list.filed.empty())) {
      const std::size_t i = rng() % live.size();
      list.free(live[i]);
      live[i] = live.back();
      live.pop_back();
      ++freed;
    } else {
      address_block* f = *std::next(list.filed.begin(), static_cast<std::ptrdiff_t>(rng() % list.filed.size()));
      const std::size_t units = f->size / unit;
      const std::size_t offset = rng() % units, size = 1 + rng() % (units - offset);
      live.push_back(list.carve(f, f->address + offset * unit, size * unit));
      ++carved;
    }
    list.check(total);
  }
  for (address_block* b : live) list.free(b);
  list.check(total);
  CHECK(list.first->size == total);
  CHECK(carved > 1000);
  CHECK(freed > 1000);
}

TEST_CASE("block_range: carve and release file the free pieces by size and give merged nodes back")
{
  strata::detail::object_pool<address_block> nodes;
  strata::detail::block_range r;
  r.first = nodes.make(address_block{.address = 0, .size = 1 << 20, .free = true});
  r.free.insert(r.first);
  address_block* b = r.first;
  address_block* mid = r.carve(b, 4096, 8192, nodes.make(), nodes.make());
  CHECK(r.first == b);
  CHECK(r.free.count() == 2);
  CHECK(r.free.find(4096, 16) == b);
  CHECK(r.free.find(8192, 16)->address == 4096 + 8192);
  CHECK(r.free.largest() == (1 << 20) - 4096 - 8192);
  const std::size_t spare = nodes.free_count();
  r.release(mid, nodes);
  CHECK(r.free.count() == 1);
  CHECK(r.first->size == 1 << 20);
  CHECK(nodes.free_count() == spare + 2);  // the middle and the tail merged into the first
}

namespace {
/// A node with a field of its own that pieces inherit, and links they must not.
struct tagged_block {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  tagged_block* prev = nullptr;
  tagged_block* next = nullptr;
  tagged_block* free_prev = nullptr;
  tagged_block* free_next = nullptr;
  unsigned band = 0;
  bool free = false;
  void inherit_from(const tagged_block& whole) noexcept { band = whole.band; }
};
} // namespace

TEST_CASE("address_range: split_off gives the new piece what the node inherits, and none of b's list links")
{
  tagged_block sentinel{};
  tagged_block b{.address = 4096, .size = 1024, .free_prev = &sentinel, .free_next = &sentinel, .band = 3, .free = true};
  tagged_block piece{.free_prev = &sentinel, .band = 9, .free = true};  // a recycled node's leftovers
  CHECK(range::split_off(&b, 256, &piece) == &piece);
  CHECK(piece.address == 4096 + 256);
  CHECK(piece.size == 768);
  CHECK(b.size == 256);
  CHECK(piece.band == 3);
  CHECK(piece.free_prev == nullptr);
  CHECK(piece.free_next == nullptr);
  CHECK_FALSE(piece.free);
  CHECK(piece.prev == &b);
  CHECK(b.next == &piece);
}
