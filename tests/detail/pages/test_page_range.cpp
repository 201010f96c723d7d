// detail::page_range: a reserved range's page entries and mapped runs, and the pieces a span is cut into.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include <strata/detail/pages/page_range.hpp>

using strata::detail::page_piece;
using strata::detail::page_range;

namespace {
constexpr std::size_t page = std::size_t{2} << 20;

struct extent {
  std::size_t first, count;
};

/// A range of 64 pages: mapping 0 at pages 2-4, a stale range at 6-7, mapping 1 at page 12.
struct fixture {
  page_range r{.base = 0, .size = 64 * page, .pages = {}, .runs = {}};
  std::vector<extent> mappings{{2, 3}, {12, 1}};
  fixture()
  {
    r.grow(16, page);
    r.runs.reserve_more(3);
    place(2, 3, 0);
    place(6, 2, page_range::stale_mapping);
    place(12, 1, 1);
  }
  void place(std::size_t first, std::size_t count, std::uint32_t slot)
  {
    for (std::size_t p = first; p < first + count; ++p) r.pages[p].mapping = slot;
    r.runs.add(first, count);
  }
};

bool same(const page_piece& a, const page_piece& b) { return a.first == b.first && a.last == b.last && a.slot == b.slot; }
} // namespace

TEST_CASE("page_range: grow doubles up to the range's size and never shrinks")
{
  page_range r{.base = 0, .size = 64 * page, .pages = {}, .runs = {}};
  r.grow(3, page);
  CHECK(r.pages.size() == 3);
  r.grow(4, page);
  CHECK(r.pages.size() == 6);  // doubled
  r.grow(40, page);
  CHECK(r.pages.size() == 40);
  r.grow(41, page);
  CHECK(r.pages.size() == 64);  // doubling stops at the range's end
  r.grow(10, page);
  CHECK(r.pages.size() == 64);
  CHECK(r.pages[63].mapping == page_range::no_mapping);
  CHECK(r.pages[63].live == 0);
}

TEST_CASE("page_range: a span is cut in pieces at mappings, stale ranges, gaps and the entries' end")
{
  fixture f;
  std::vector<page_piece> seen;
  f.r.for_each_piece(0, 40, f.mappings, [&](const page_piece& pc) { seen.push_back(pc); });
  const std::vector<page_piece> expected{{0, 1, page_range::no_mapping}, {2, 4, 0},  {5, 5, page_range::no_mapping},
                                         {6, 7, page_range::stale_mapping}, {8, 11, page_range::no_mapping},
                                         {12, 12, 1},                        {13, 40, page_range::no_mapping}};
  REQUIRE(seen.size() == expected.size());
  for (std::size_t i = 0; i < seen.size(); ++i) CHECK(same(seen[i], expected[i]));
  CHECK(same(f.r.piece_at(3, 3, f.mappings), {3, 3, 0}));   // clipped at the span's end
  CHECK(same(f.r.piece_at(7, 9, f.mappings), {7, 7, page_range::stale_mapping}));
  CHECK(same(f.r.piece_at(20, 30, f.mappings), {20, 30, page_range::no_mapping}));  // past the entries
}

TEST_CASE("page_range: within_one_mapping and gap_at answer the common questions directly")
{
  fixture f;
  CHECK(f.r.within_one_mapping(2, 4, f.mappings));
  CHECK(f.r.within_one_mapping(3, 3, f.mappings));
  CHECK_FALSE(f.r.within_one_mapping(4, 5, f.mappings));  // runs into a gap
  CHECK_FALSE(f.r.within_one_mapping(6, 6, f.mappings));  // a stale range is not a mapping
  CHECK_FALSE(f.r.within_one_mapping(0, 0, f.mappings));
  CHECK_FALSE(f.r.within_one_mapping(30, 30, f.mappings));  // past the entries
  const auto gap = f.r.gap_at(9);
  CHECK(gap.first == 8);
  CHECK(gap.end == 12);
  CHECK(f.r.gap_at(0).first == 0);
  CHECK(f.r.gap_at(0).end == 2);
  CHECK(f.r.gap_at(20).first == 13);
  CHECK(f.r.gap_at(20).end == SIZE_MAX);
}

TEST_CASE("page_range: unmapped_in counts the pages no run covers, as a page-by-page count does, for every span")
{
  fixture f;
  const auto covered = [&](std::size_t p) {
    for (const auto& run : f.r.runs)
      if (p >= run.first && p < run.first + run.count) return true;
    return false;
  };
  int agreed = 0;
  for (std::size_t first = 0; first < 20; ++first) {
    for (std::size_t last = first; last < 20; ++last) {
      std::size_t expected = 0;
      for (std::size_t p = first; p <= last; ++p) expected += covered(p) ? 0 : 1;
      agreed += f.r.unmapped_in(first, last, f.mappings) == expected;
    }
  }
  CHECK(agreed == 20 * 21 / 2);
  CHECK(f.r.unmapped_in(2, 4, f.mappings) == 0);
  CHECK(f.r.unmapped_in(0, 13, f.mappings) == 2 + 1 + 4 + 1);  // pages 0-1, 5, 8-11 and 13
}
