// What must not allocate, counted by the fault-injection program's operator new: the noexcept paths
// (constructions, moves, recycling, a source's frees) allocate nothing, so host out-of-memory cannot reach
// them; and the data structures' inserts that do allocate leave them unchanged when that allocation fails.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <new>
#include <random>
#include <utility>
#include <vector>

#include <strata/detail/object_pool.hpp>
#include <strata/detail/pointer_map.hpp>
#include <strata/policy/arena.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/simulated_source.hpp>
#include "support/fault_injection.hpp"

using namespace strata;
namespace hf = strata::testing::host_faults;

namespace {
/// Host allocations f makes on this thread.
template <class F>
std::size_t host_allocations_of(F&& f)
{
  hf::arm(0);
  {
    hf::counted_section counted;
    f();
  }
  return hf::counted();
}

const void* address(std::uint64_t k) { return reinterpret_cast<const void*>(k << 8); }
} // namespace

TEST_CASE("the injector counts host allocations and fails the one it is told to")
{
  CHECK(host_allocations_of([] {
          int* volatile p = new int(1);  // volatile: the compiler may not elide the pair
          delete p;
        }) == 1);
  CHECK(host_allocations_of([] {
          std::vector<int> v(10);
          int* volatile data = v.data();  // the buffer escapes: clang may not elide the allocation
          (void)data;
        }) == 1);
  hf::arm(2);
  {
    hf::counted_section counted;
    int* volatile first = new int(1);
    int* volatile second = nullptr;
    CHECK_THROWS_AS(second = new int(2), std::bad_alloc);
    CHECK(hf::fired());
    CHECK(second == nullptr);
    delete first;
  }
  hf::disarm();
}

TEST_CASE("pointer_map: construction and moves allocate nothing; a failed insert changes nothing")
{
  using map = detail::pointer_map<std::uintptr_t>;
  map filled;
  for (std::uint64_t k = 1; k <= 100; ++k) filled.insert(address(k), k);
  CHECK(host_allocations_of([&] {
          map empty;
          map moved(std::move(filled));
          filled = std::move(moved);
          empty = std::move(moved);
        }) == 0);
  CHECK(filled.size() == 100);
  // Inserts until one needs to grow the table, with that growth failing.
  for (std::uint64_t k = 101;; ++k) {
    const map copy = filled;
    hf::arm(1);
    bool threw = false;
    try {
      hf::counted_section counted;
      filled.insert(address(k), k);
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    hf::disarm();
    if (!threw) continue;
    CHECK(filled.size() == copy.size());
    CHECK_FALSE(filled.contains(address(k)));
    for (std::uint64_t j = 1; j < k; ++j) CHECK(*filled.find(address(j)) == j);
    filled.insert(address(k), k);  // and it still works
    CHECK(*filled.find(address(k)) == k);
    break;
  }
}

TEST_CASE("object_pool: recycle allocates nothing; a failed growth changes nothing")
{
  detail::object_pool<int> pool;
  std::vector<int*> nodes;
  for (int i = 0; i < 600; ++i) nodes.push_back(pool.make(i));
  CHECK(host_allocations_of([&] {
          for (int* n : nodes) pool.recycle(n);
        }) == 0);
  nodes.clear();
  for (int i = 0; i < 768; ++i) nodes.push_back(pool.make(i));  // every node in use: the next make grows
  const std::size_t capacity = pool.capacity();
  for (std::size_t n = 1;; ++n) {
    hf::arm(n);
    bool threw = false;
    int* node = nullptr;
    try {
      hf::counted_section counted;
      node = pool.make(1);
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    hf::disarm();
    if (!threw) {
      pool.recycle(node);
      break;
    }
    CHECK(pool.capacity() == capacity);
    CHECK(pool.free_count() == 0);
  }
  CHECK(host_allocations_of([&] {
          for (int* n : nodes) pool.recycle(n);
        }) == 0);
}

TEST_CASE("pools' moves allocate nothing")
{
  size_class_pool<simulated_source> classes;
  buddy_pool<simulated_source> buddies{simulated_source{}, {.region_size = 1 << 20}};
  arena<simulated_source> bump;
  void* a = classes.allocate(1000);
  void* b = buddies.allocate(1000);
  void* c = bump.allocate(1000);
  CHECK(host_allocations_of([&] {
          size_class_pool<simulated_source> classes2(std::move(classes));
          classes = std::move(classes2);
          buddy_pool<simulated_source> buddies2(std::move(buddies));
          buddies = std::move(buddies2);
          arena<simulated_source> bump2(std::move(bump));
          bump = std::move(bump2);
        }) == 0);
  classes.deallocate(a, 1000);
  buddies.deallocate(b, 1000);
  bump.deallocate(c, 1000);
}

TEST_CASE("simulated_source: frees allocate nothing, whatever the order")
{
  simulated_source source;
  std::mt19937_64 rng(3);
  std::vector<std::pair<void*, std::size_t>> live;
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 50; ++i) {
      const std::size_t bytes = 256 + rng() % (1 << 20);
      live.emplace_back(source.allocate(bytes, std::size_t{256} << (rng() % 6)), bytes);
    }
    std::shuffle(live.begin(), live.end(), rng);
    const std::size_t keep = live.size() / 3;
    CHECK(host_allocations_of([&] {
            while (live.size() > keep) {
              source.deallocate(live.back().first, live.back().second);
              live.pop_back();
            }
          }) == 0);
  }
  for (auto [p, bytes] : live) source.deallocate(p, bytes);
  CHECK(source.allocated_bytes() == 0);
}
