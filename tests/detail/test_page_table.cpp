#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

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

TEST_CASE("page_table: holding and letting go a block writes its first and last pages' entries only, whatever its length")
{
  simulated_pages device(page);
  table_t t(device_ref{&device});
  t.reserve(0, range_bytes, range_bytes);
  auto& r = t.band(0);
  map_and_hold(t, 0, 499, 64);  // eight mappings
  t.let_go(r, 0, 499);
  struct span {
    std::size_t first, last, idle_pages_held;
  };
  for (const span s : {span{3, 4, 436}, span{3, 130, 308}, span{0, 499, 0}}) {  // 1, 3 and 8 mappings touched
    const auto [first, last, idle_pages] = s;
    const auto before = t.page_state_updates();
    t.hold(r, first, last);
    CHECK(t.live_pages() == last - first + 1);
    CHECK(t.idle_bytes() == idle_pages * page);
    t.let_go(r, first, last);
    CHECK(t.page_state_updates() - before == 4);
    CHECK(t.live_pages() == 0);
    CHECK(t.idle_bytes() == 500 * page);
  }
}

TEST_CASE("page_table: randomized blocks over runs of mappings and gaps agree with a page-by-page count")
{
  constexpr std::size_t pages = 300;
  simulated_pages device(page);
  table_t t(device_ref{&device});
  t.reserve(0, range_bytes, range_bytes);
  auto& r = t.band(0);
  t.grow(r, pages);
  std::mt19937_64 rng(29);
  for (std::size_t p = 0; p < pages;) {  // runs of 1-9 mapped pages between gaps of 0-3
    const std::size_t run = std::min<std::size_t>(1 + rng() % 9, pages - p);
    if (rng() % 3 != 0) {
      t.map_unmapped(r, p, p + run - 1, run * page, run, [] {});
      t.hold(r, p, p + run - 1);  // a new mapping is idle only once a block has let it go
      t.let_go(r, p, p + run - 1);
    }
    p += run + rng() % 4;
  }
  const auto mapped = [&](std::size_t p) { return p < r.pages.size() && r.pages[p].mapping != table_t::no_mapping; };

  std::vector<int> owner(pages * 4, -1);  // which live block holds each quarter page: blocks start and end mid-page, sharing pages
  struct live_block {
    std::size_t first_unit, units;
  };
  std::vector<live_block> blocks;
  const auto span_of = [](const live_block& b) { return std::pair{b.first_unit / 4, (b.first_unit + b.units - 1) / 4}; };
  std::size_t holds = 0, checks = 0;
  for (int step = 0; step < 4000; ++step) {
    if (blocks.empty() || rng() % 2 == 0) {
      const live_block b{static_cast<std::size_t>(rng() % (pages * 4 - 40)), 1 + static_cast<std::size_t>(rng() % 40)};
      const auto [first, last] = span_of(b);
      bool fits = true;
      for (std::size_t u = b.first_unit; u < b.first_unit + b.units; ++u) fits = fits && owner[u] < 0;
      for (std::size_t p = first; p <= last; ++p) fits = fits && mapped(p);
      if (!fits) continue;
      for (std::size_t u = b.first_unit; u < b.first_unit + b.units; ++u) owner[u] = static_cast<int>(blocks.size());
      blocks.push_back(b);
      t.hold(r, first, last);
      ++holds;
    } else {
      const std::size_t i = rng() % blocks.size();
      const auto [first, last] = span_of(blocks[i]);
      t.let_go(r, first, last);
      for (std::size_t u = blocks[i].first_unit; u < blocks[i].first_unit + blocks[i].units; ++u) owner[u] = -1;
      blocks[i] = blocks.back();
      blocks.pop_back();
      for (std::size_t u = 0; u < owner.size(); ++u)
        if (owner[u] == static_cast<int>(blocks.size())) owner[u] = static_cast<int>(i);
    }
    // The page-by-page truth: pages some live block touches, the mappings none of whose pages are touched.
    std::vector<bool> live(pages, false);
    for (std::size_t u = 0; u < owner.size(); ++u) live[u / 4] = live[u / 4] || owner[u] >= 0;
    std::size_t live_pages = 0, idle = 0;
    for (std::size_t p = 0; p < pages; ++p) live_pages += live[p];
    for (std::size_t p = 0; p < pages;) {
      if (!mapped(p)) {
        ++p;
        continue;
      }
      const auto& m = t.slot(r.pages[p].mapping);
      bool busy = false;
      for (std::size_t q = m.first; q < m.first + m.count; ++q) busy = busy || live[q];
      if (!busy) idle += m.count * page;
      p = m.first + m.count;
    }
    REQUIRE(t.live_pages() == live_pages);
    REQUIRE(t.idle_bytes() == idle);
    const std::size_t a = rng() % pages, b = std::min(pages - 1, a + rng() % 60);
    std::size_t unmapped = 0;
    for (std::size_t p = a; p <= b; ++p) unmapped += !mapped(p);
    REQUIRE(t.census(r, a, b).unmapped == unmapped);
    REQUIRE(t.unmapped_pages(r, t.address_of(r, a), (b - a + 1) * page) == unmapped);
    ++checks;
  }
  CHECK(holds > 300);
  CHECK(checks > 1000);
}
