#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include <strata/detail/page_table.hpp>
#include <strata/pages/simulated_pages.hpp>

using namespace strata;

namespace {
constexpr std::size_t page = std::size_t{2} << 20;
constexpr std::size_t range_bytes = std::size_t{1} << 30;

/// A page backend that forwards to a simulated device the test keeps, so the device can be looked at after
/// the table that used it is gone.
struct device_ref {
  using page = simulated_pages::page;
  simulated_pages* device = nullptr;
  std::size_t page_size() const noexcept { return device->page_size(); }
  std::uintptr_t reserve(std::size_t bytes, std::size_t alignment) { return device->reserve(bytes, alignment); }
  void unreserve(std::uintptr_t address, std::size_t bytes) noexcept { device->unreserve(address, bytes); }
  page create(std::size_t bytes) { return device->create(bytes); }
  void destroy(page p) noexcept { device->destroy(p); }
  void map(std::uintptr_t address, page p, std::size_t bytes) { device->map(address, p, bytes); }
  void set_access(std::uintptr_t address, std::size_t bytes) { device->set_access(address, bytes); }
  void unmap(std::uintptr_t address, std::size_t bytes) { device->unmap(address, bytes); }
  void synchronize() { device->synchronize(); }
  const page_counters& counts() const noexcept { return device->counts(); }
};
static_assert(page_backend<device_ref>);
using table_t = detail::page_table<device_ref>;

/// Maps pages [first, last] of range 0 (runs of at most `max_run` pages) and counts one live block on them.
void map_and_hold(table_t& t, std::size_t first, std::size_t last, std::size_t max_run = 64)
{
  auto& r = t.band(0);
  if (last >= r.pages.size()) t.grow(r, last + 1);
  const auto census = t.census(r, first, last);
  std::size_t calls = 0;
  t.map_unmapped(r, first, last, census.unmapped * page, max_run, [&] { ++calls; });
  t.hold(r, first, last);
}
} // namespace

TEST_CASE("page_table: runs of unmapped pages get one mapping each, split at the longest run")
{
  simulated_pages device(page);
  table_t t(device_ref{&device});
  t.reserve(0, range_bytes, range_bytes);
  auto& r = t.band(0);
  t.grow(r, 10);
  CHECK(r.pages.size() >= 10);
  CHECK(t.census(r, 0, 9).unmapped == 10);
  std::size_t made = 0;
  t.map_unmapped(r, 2, 6, 5 * page, 2, [&] { ++made; });  // pages 2-3, 4-5, 6
  CHECK(made == 3);
  CHECK(t.mappings_live() == 3);
  CHECK(t.physical() == 5 * page);
  CHECK(device.bytes_alive() == 5 * page);
  CHECK(t.unmapped_pages(r, t.address_of(r, 0), 8 * page) == 3);  // pages 0, 1 and 7
  CHECK(t.page_of(r, t.address_of(r, 4) + 100) == 4);
  CHECK(t.band_of(r.base + page) == 0);
  CHECK(r.pages[2].mapping == r.pages[3].mapping);
  CHECK(r.pages[3].mapping != r.pages[4].mapping);
}

TEST_CASE("page_table: a mapping no live page touches is idle until held again; reclaim gives idle ones back")
{
  simulated_pages device(page);
  table_t t(device_ref{&device});
  t.reserve(0, range_bytes, range_bytes);
  map_and_hold(t, 0, 3);
  map_and_hold(t, 8, 9);
  auto& r = t.band(0);
  CHECK(t.live_pages() == 6);
  t.let_go(r, 0, 3);
  CHECK(t.idle_bytes() == 4 * page);
  CHECK(t.census(r, 0, 3).idle_bytes == 4 * page);
  t.hold(r, 1, 1);  // reused in place
  CHECK(t.idle_bytes() == 0);
  t.let_go(r, 1, 1);
  t.let_go(r, 8, 9);
  CHECK(t.idle_bytes() == 6 * page);
  const auto waits = device.counts().synchronizes;
  t.reclaim(&r, 8, 9, SIZE_MAX, 0);  // pages 8-9 are the request's: they stay
  CHECK(device.counts().synchronizes == waits + 1);
  CHECK(t.physical() == 2 * page);
  CHECK(t.idle_bytes() == 2 * page);
  CHECK(t.census(r, 0, 3).unmapped == 4);
  CHECK(device.bytes_alive() == 2 * page);
  CHECK(t.peak_physical() == 6 * page);
  t.reset_peak();
  CHECK(t.peak_physical() == 2 * page);
}

TEST_CASE("page_table: a failed mapping leaves the table as it was")
{
  simulated_pages device(page);
  table_t t(device_ref{&device});
  t.reserve(0, range_bytes, range_bytes);
  auto& r = t.band(0);
  t.grow(r, 8);
  device.fail_after(simulated_pages::operation::map, 1);  // the second run's map fails
  CHECK_THROWS(t.map_unmapped(r, 0, 3, 4 * page, 2, [] {}));
  CHECK(t.mappings_live() == 0);
  CHECK(t.physical() == 0);
  CHECK(device.bytes_alive() == 0);
  CHECK(t.census(r, 0, 3).unmapped == 4);
}

TEST_CASE("page_table: destroyed or assigned to, it gives every mapping and range back; a move leaves it empty")
{
  simulated_pages device(page);
  {
    table_t t(device_ref{&device});
    t.reserve(0, range_bytes, range_bytes);
    t.reserve(1, range_bytes, range_bytes);
    map_and_hold(t, 0, 4);
    CHECK(device.ranges_reserved() == 2);
    table_t moved(std::move(t));
    CHECK(moved.physical() == 5 * page);
    CHECK(t.physical() == 0);  // NOLINT(bugprone-use-after-move): specified empty
    CHECK(t.mappings_live() == 0);
    CHECK(t.band(0).size == 0);
    simulated_pages other(page);
    table_t fresh(device_ref{&other});
    fresh.reserve(0, range_bytes, range_bytes);
    moved = std::move(fresh);  // the device's mappings and ranges go back first
    CHECK(device.bytes_alive() == 0);
    CHECK(device.bytes_mapped() == 0);
    CHECK(device.ranges_reserved() == 0);
    CHECK(other.ranges_reserved() == 1);
    t.reserve(0, range_bytes, range_bytes);  // the moved-from table is usable
    map_and_hold(t, 0, 0);
    CHECK(device.bytes_alive() == page);
  }
  CHECK(device.bytes_alive() == 0);
  CHECK(device.ranges_reserved() == 0);
}
