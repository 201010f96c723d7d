#include <doctest/doctest.h>

#include <cstddef>
#include <new>
#include <stdexcept>
#include <vector>

#include <strata/detail/pages/backup_store.hpp>

using strata::detail::backup_store;

namespace {

/// Pins plain host memory and counts; refuses on request.
struct fake_pins {
  std::size_t pinned = 0, pins = 0, unpins = 0;
  bool refuse = false;
  void* pin(std::size_t bytes)
  {
    if (refuse) throw std::bad_alloc();
    ++pins;
    pinned += bytes;
    return ::operator new(bytes);
  }
  void unpin(void* p, std::size_t bytes) noexcept
  {
    ++unpins;
    pinned -= bytes;
    ::operator delete(p);
  }
};

} // namespace

TEST_CASE("backup_store: one region pinned once serves every later backup that fits")
{
  fake_pins pins;
  backup_store store;
  for (int cycle = 0; cycle < 20; ++cycle) {
    const auto s = store.take(pins, 1000 - static_cast<std::size_t>(cycle));
    CHECK(s.bytes == 1000 - static_cast<std::size_t>(cycle));
    store.at(s)[s.bytes - 1] = 7;  // the room is real memory
    store.give(s);
  }
  CHECK(pins.pins == 1);
  CHECK(store.pinned_bytes() == 1000);
  CHECK(store.release(pins) == 1000);
  CHECK(pins.pinned == 0);
  store.drop(pins);
}

TEST_CASE("backup_store: backups held at once share a region's gaps, first fit; a larger one replaces unused smaller regions")
{
  fake_pins pins;
  backup_store store;
  store.reserve(pins, 1000);
  const auto a = store.take(pins, 400), b = store.take(pins, 500);
  CHECK(a.region == b.region);
  CHECK(b.offset == 400);
  CHECK(store.at(b) == store.at(a) + 400);
  store.give(a);
  const auto c = store.take(pins, 300);  // the gap a left
  CHECK(c.offset == 0);
  const auto d = store.take(pins, 700);  // nothing pinned fits: a region of exactly 700
  CHECK(pins.pins == 2);
  CHECK(store.pinned_bytes() == 1700);
  store.give(b);
  store.give(c);
  store.give(d);
  const auto e = store.take(pins, 2000);  // both regions unused and too small: unpinned first
  CHECK(pins.pinned == 2000);
  CHECK(store.regions() == 1);
  store.give(e);
  CHECK(store.take(pins, 0).bytes == 0);
  store.drop(pins);
  CHECK(pins.pinned == 0);
}

TEST_CASE("backup_store: a refused pin changes nothing held; moves take the regions")
{
  fake_pins pins;
  backup_store store;
  const auto a = store.take(pins, 100);
  pins.refuse = true;
  CHECK_THROWS_AS(store.take(pins, 5000), std::bad_alloc);
  CHECK(store.pinned_bytes() == 100);
  pins.refuse = false;
  backup_store other = std::move(store);
  CHECK(store.pinned_bytes() == 0);
  CHECK(other.pinned_bytes() == 100);
  CHECK(other.release(pins) == 0);  // a is still held
  other.give(a);
  CHECK(other.release(pins) == 100);
  other.drop(pins);
}
