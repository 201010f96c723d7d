// detail::object_pool: host-side nodes in slabs, recycled through a free list whose room always covers every
// node, so recycle() (noexcept) never needs to allocate. Whether it really allocates nothing is checked in the
// fault-injection program, which counts host allocations; here: reuse, capacity and moves.
#include <doctest/doctest.h>

#include <set>
#include <type_traits>
#include <vector>

#include <strata/detail/object_pool.hpp>

using strata::detail::object_pool;

static_assert(std::is_nothrow_move_constructible_v<object_pool<int>> && std::is_nothrow_move_assignable_v<object_pool<int>>);

TEST_CASE("object_pool: nodes are distinct, recycled nodes come back, capacity grows by slabs")
{
  object_pool<int> pool;
  CHECK(pool.capacity() == 0);
  std::vector<int*> nodes;
  for (int i = 0; i < 1000; ++i) nodes.push_back(pool.make(i));
  CHECK(std::set<int*>(nodes.begin(), nodes.end()).size() == nodes.size());
  CHECK(pool.capacity() >= 1000);
  CHECK(pool.free_count() == pool.capacity() - 1000);
  for (int i = 0; i < 1000; ++i) CHECK(*nodes[i] == i);
  const std::size_t capacity = pool.capacity();
  for (int* n : nodes) pool.recycle(n);
  CHECK(pool.free_count() == capacity);
  std::set<int*> again;
  for (int i = 0; i < 1000; ++i) again.insert(pool.make(-i));
  CHECK(pool.capacity() == capacity);  // reused, not grown
  CHECK(again == std::set<int*>(nodes.begin(), nodes.end()));
}

TEST_CASE("object_pool: a moved-from pool is empty and usable")
{
  object_pool<int> a;
  int* n = a.make(5);
  object_pool<int> b(std::move(a));
  CHECK(*n == 5);
  CHECK(a.capacity() == 0);  // NOLINT(bugprone-use-after-move): the rule under test
  CHECK(a.free_count() == 0);
  int* m = a.make(6);
  CHECK(*m == 6);
  b.recycle(n);
  a.recycle(m);
}
