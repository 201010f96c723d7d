// detail::page_table: which pages live blocks use, and so which mappings are busy or idle; the mappings
// themselves are test_page_mappings.cpp's.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include <strata/detail/pages/page_table.hpp>
#include <strata/pages/simulated_pages.hpp>

using namespace strata;

namespace {
constexpr std::size_t page = std::size_t{2} << 20;
constexpr std::size_t range_bytes = std::size_t{1} << 30;

using table_t = detail::page_table<simulated_pages>;

/// Maps pages [first, last] of range 0 (runs of at most `max_run` pages) and counts one live block on them.
void map_and_hold(table_t& t, std::size_t first, std::size_t last, std::size_t max_run = 64)
{
  auto& r = t.mappings().band(0);
  if (last >= r.pages.size()) t.mappings().grow(r, last + 1);
  const auto census = t.census(r, first, last);
  std::size_t calls = 0;
  t.mappings().map_unmapped(r, first, last, census.unmapped * page, max_run, [&] { ++calls; });
  t.hold(r, first, last);
}
} // namespace

TEST_CASE("page_table: a mapping no live page touches is idle until held again; reclaim gives idle ones back")
{
  table_t t{simulated_pages(page)};
  auto& device = t.mappings().backend();
  t.mappings().reserve(0, range_bytes, range_bytes);
  map_and_hold(t, 0, 3);
  map_and_hold(t, 8, 9);
  auto& r = t.mappings().band(0);
  CHECK(t.live_pages() == 6);
  t.let_go(r, 0, 3);
  CHECK(t.mappings().idle_bytes() == 4 * page);
  CHECK(t.census(r, 0, 3).idle_bytes == 4 * page);
  t.hold(r, 1, 1);  // reused in place
  CHECK(t.mappings().idle_bytes() == 0);
  t.let_go(r, 1, 1);
  t.let_go(r, 8, 9);
  CHECK(t.mappings().idle_bytes() == 6 * page);
  const auto waits = device.counts().synchronizes;
  t.mappings().reclaim(&r, 8, 9, SIZE_MAX, 0);  // pages 8-9 are the request's: they stay
  CHECK(device.counts().synchronizes == waits + 1);
  CHECK(t.mappings().physical() == 2 * page);
  CHECK(t.mappings().idle_bytes() == 2 * page);
  CHECK(t.census(r, 0, 3).unmapped == 4);
  CHECK(device.bytes_alive() == 2 * page);
  CHECK(t.mappings().peak_physical() == 6 * page);
  t.reset_peak();
  CHECK(t.mappings().peak_physical() == 2 * page);
}

TEST_CASE("page_table: holding and letting go a block writes its first and last pages' entries only, whatever its length")
{
  table_t t{simulated_pages(page)};
  t.mappings().reserve(0, range_bytes, range_bytes);
  auto& r = t.mappings().band(0);
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
    CHECK(t.mappings().idle_bytes() == idle_pages * page);
    t.let_go(r, first, last);
    CHECK(t.page_state_updates() - before == 4);
    CHECK(t.live_pages() == 0);
    CHECK(t.mappings().idle_bytes() == 500 * page);
  }
}

TEST_CASE("page_table: randomized blocks over runs of mappings and gaps agree with a page-by-page count")
{
  constexpr std::size_t pages = 300;
  table_t t{simulated_pages(page)};
  t.mappings().reserve(0, range_bytes, range_bytes);
  auto& r = t.mappings().band(0);
  t.mappings().grow(r, pages);
  std::mt19937_64 rng(29);
  for (std::size_t p = 0; p < pages;) {  // runs of 1-9 mapped pages between gaps of 0-3
    const std::size_t run = std::min<std::size_t>(1 + rng() % 9, pages - p);
    if (rng() % 3 != 0) {
      t.mappings().map_unmapped(r, p, p + run - 1, run * page, run, [] {});
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
      const auto& m = t.mappings().slot(r.pages[p].mapping);
      bool busy = false;
      for (std::size_t q = m.first; q < m.first + m.count; ++q) busy = busy || live[q];
      if (!busy) idle += m.count * page;
      p = m.first + m.count;
    }
    REQUIRE(t.live_pages() == live_pages);
    REQUIRE(t.mappings().idle_bytes() == idle);
    const std::size_t a = rng() % pages, b = std::min(pages - 1, a + rng() % 60);
    std::size_t unmapped = 0;
    for (std::size_t p = a; p <= b; ++p) unmapped += !mapped(p);
    REQUIRE(t.census(r, a, b).unmapped == unmapped);
    REQUIRE(t.unmapped_pages(r, t.mappings().address_of(r, a), (b - a + 1) * page) == unmapped);
    ++checks;
  }
  CHECK(holds > 300);
  CHECK(checks > 1000);
}

TEST_CASE("page_table: a block over two pages of one mapping counts an edge on each and two busy pages")
{
  table_t t{simulated_pages(page)};
  t.mappings().reserve(0, range_bytes, range_bytes);
  auto& r = t.mappings().band(0);
  map_and_hold(t, 0, 3);
  t.let_go(r, 0, 3);
  CHECK(t.mappings().idle_bytes() == 4 * page);
  t.hold(r, 1, 2);  // a small block across a page boundary
  t.hold(r, 2, 2);  // another on its last page
  CHECK(t.live_pages() == 2);
  CHECK(t.mappings().idle_bytes() == 0);
  t.let_go(r, 1, 2);
  CHECK(t.live_pages() == 1);  // page 2 still has a live block
  CHECK(t.mappings().idle_bytes() == 0);
  t.let_go(r, 2, 2);
  CHECK(t.live_pages() == 0);
  CHECK(t.mappings().idle_bytes() == 4 * page);
  CHECK(t.peak_live_pages() == 4);
}

TEST_CASE("page_table: census and unmapped_pages see mappings, gaps and the end of the table")
{
  table_t t{simulated_pages(page)};
  t.mappings().reserve(0, range_bytes, range_bytes);
  auto& r = t.mappings().band(0);
  map_and_hold(t, 2, 5);   // busy
  map_and_hold(t, 8, 8);
  t.let_go(r, 8, 8);       // idle
  const auto c = t.census(r, 0, 9);
  CHECK(c.unmapped == 5);  // pages 0, 1, 6, 7 and 9
  CHECK(c.idle_bytes == page);
  CHECK(t.census(r, 3, 4).unmapped == 0);
  CHECK(t.census(r, 3, 4).idle_bytes == 0);
  CHECK(t.unmapped_pages(r, t.mappings().address_of(r, 2) + 256, page) == 0);           // within one mapping
  CHECK(t.unmapped_pages(r, t.mappings().address_of(r, 5) + 256, page) == 1);           // runs into page 6
  CHECK(t.unmapped_pages(r, t.mappings().address_of(r, 1000), 3 * page) == 3);          // past the table's end
}

TEST_CASE("page_table: pages_ahead reaches the wanted run over free unmapped pages, never into a mapping")
{
  table_t t{simulated_pages(page)};
  t.mappings().reserve(0, range_bytes, range_bytes);
  auto& r = t.mappings().band(0);
  map_and_hold(t, 10, 11);
  using span = detail::page_span;
  CHECK(t.pages_ahead(r, span{3, 4, 0, 20}, 8, 64) == 5);    // pages 5-9: the mapping at page 10 stops it
  CHECK(t.pages_ahead(r, span{3, 4, 0, 6}, 8, 64) == 2);     // the free block ends at page 6
  CHECK(t.pages_ahead(r, span{3, 4, 0, 20}, 2, 64) == 0);    // the run already has two pages
  CHECK(t.pages_ahead(r, span{10, 11, 10, 20}, 8, 64) == 0); // mapped: nothing to map
  CHECK(t.pages_ahead(r, span{0, 4, 0, 100}, 3, 4) == 2);    // runs split at 4 pages: the last one has 1
  t.mappings().grow(r, 14);                                             // as the pool does for the span first
  CHECK(t.pages_ahead(r, span{12, 13, 12, 100}, 8, 64) == 6);
  CHECK(r.pages.size() >= 20);                               // grown to cover them
}

TEST_CASE("page_table: a reclaim that keeps spares hands them to the next mappings of their length")
{
  table_t t{simulated_pages(page)};
  auto& device = t.mappings().backend();
  t.mappings().reserve(0, range_bytes, range_bytes);
  auto& r = t.mappings().band(0);
  map_and_hold(t, 0, 1, 2);
  map_and_hold(t, 4, 6, 3);
  t.let_go(r, 0, 1);
  t.let_go(r, 4, 6);
  t.mappings().reclaim(nullptr, 0, 0, SIZE_MAX, 0, /*keep_spares=*/true);
  CHECK(t.mappings().physical() == 0);
  CHECK(t.mappings().spare_count() == 2);
  CHECK(device.bytes_alive() == 5 * page);  // unmapped, not released
  const auto creates = device.counts().creates;
  t.mappings().grow(r, 12);
  t.mappings().map_unmapped(r, 10, 11, 2 * page, 64, [] {});  // the two-page spare
  CHECK(device.counts().creates == creates);
  CHECK(t.mappings().spare_count() == 1);
  CHECK(t.mappings().physical() == 2 * page);
  t.mappings().grow(r, 21);
  t.mappings().map_unmapped(r, 20, 20, page, 64, [] {});  // no one-page spare: a new allocation
  CHECK(device.counts().creates == creates + 1);
  t.mappings().drop_spares();
  CHECK(t.mappings().spare_count() == 0);
  CHECK(device.bytes_alive() == 3 * page);
}
