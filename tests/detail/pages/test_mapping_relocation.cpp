#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include <strata/detail/pages/mapping_relocation.hpp>
#include <strata/detail/pages/page_table.hpp>
#include <strata/pages/simulated_pages.hpp>

using namespace strata;

namespace {
constexpr std::size_t page = std::size_t{2} << 20;
constexpr std::size_t range_bytes = std::size_t{1} << 30;
using table_t = detail::page_table<simulated_pages>;
using relocation_t = detail::mapping_relocation<simulated_pages>;
using block = detail::address_block;

/// Two reserved ranges, each one free block, and an idle mapping at pages [2, 6) of range 0.
struct setup {
  table_t table{simulated_pages(page)};
  std::array<detail::block_range, 2> blocks{};
  detail::object_pool<block> nodes;
  std::uint32_t idle_slot = 0;

  setup()
  {
    for (std::uint32_t band = 0; band < 2; ++band) {
      const std::uintptr_t base = table.mappings().reserve(band, range_bytes, range_bytes);
      blocks[band].first = nodes.make(block{.address = base, .size = range_bytes, .free = true});
      blocks[band].free.insert(blocks[band].first);
    }
    auto& r = table.mappings().band(0);
    table.mappings().grow(r, 8);
    table.mappings().map_unmapped(r, 2, 5, 4 * page, 64, [] {});
    table.hold(r, 2, 5);
    table.let_go(r, 2, 5);
    idle_slot = r.pages[2].mapping;
  }
  relocation_t relocation() { return {table.mappings(), blocks, nodes}; }
  std::size_t free_blocks() const { return blocks[0].free.count() + blocks[1].free.count(); }
};
} // namespace

TEST_CASE("mapping_relocation: an idle allocation is mapped where the run needs it; its old range is held out of use")
{
  setup s;
  auto& to = s.table.mappings().band(1);
  s.table.mappings().grow(to, 16);
  const auto done = s.relocation().relocate(to, 10, 13, detail::page_span{10, 13, 10, 13}, 64);
  CHECK(done.covered == 4 * page);
  CHECK(done.bytes == 4 * page);
  CHECK(s.table.mappings().relocations() == 1);
  CHECK(to.pages[10].mapping == s.idle_slot);
  CHECK(s.table.mappings().slot(s.idle_slot).band == 1);
  CHECK(s.table.mappings().band(0).pages[2].mapping == table_t::stale_mapping);
  CHECK(s.table.mappings().stale_bytes() == 4 * page);
  CHECK(s.table.mappings().physical() == 4 * page);  // the same memory, mapped twice
  CHECK(s.table.mappings().backend().bytes_mapped() == 8 * page);
  CHECK(s.table.mappings().backend().is_usable(to.base + 10 * page, 4 * page));
  // The old range's holder is neither free nor live: range 0 is free before and after it.
  const block* holder = detail::address_range::block_over(s.blocks[0].first, s.table.mappings().band(0).base + 2 * page);
  CHECK_FALSE(holder->free);
  CHECK(holder->size == 4 * page);
  CHECK(s.free_blocks() == 3);

  s.relocation().tidy(false);  // no wait has covered it yet: it stays
  CHECK(s.table.mappings().stale_bytes() == 4 * page);
  s.relocation().tidy(true);  // one device wait, then the range goes
  CHECK(s.table.mappings().stale_bytes() == 0);
  CHECK_FALSE(s.table.mappings().has_stale());
  CHECK(s.table.mappings().backend().bytes_mapped() == 4 * page);
  CHECK(s.table.mappings().band(0).pages[2].mapping == table_t::no_mapping);
  CHECK(s.blocks[0].first->size == range_bytes);  // merged back whole
  CHECK(s.free_blocks() == 2);
}

TEST_CASE("mapping_relocation: undo moves the allocations back where they were")
{
  setup s;
  auto& to = s.table.mappings().band(1);
  s.table.mappings().grow(to, 16);
  const std::size_t keep = s.table.mappings().stale_count();
  s.relocation().relocate(to, 0, 3, detail::page_span{0, 3, 0, 3}, 64);
  REQUIRE(s.table.mappings().relocations() == 1);
  s.relocation().undo(keep);
  CHECK(s.table.mappings().relocations() == 0);
  CHECK(s.table.mappings().stale_bytes() == 0);
  CHECK(s.table.mappings().band(0).pages[2].mapping == s.idle_slot);
  CHECK(to.pages[0].mapping == table_t::no_mapping);
  CHECK(s.table.mappings().slot(s.idle_slot).band == 0);
  CHECK(s.table.mappings().backend().bytes_mapped() == 4 * page);
  CHECK(s.table.mappings().backend().is_usable(s.table.mappings().band(0).base + 2 * page, 4 * page));
  CHECK(s.blocks[0].first->size == range_bytes);
}

TEST_CASE("mapping_relocation: nothing moves from the block being carved, nor what does not fit the room")
{
  setup s;
  auto& r = s.table.mappings().band(0);
  s.table.mappings().grow(r, 64);
  // The run is in range 0 and the free block it is cut from covers the idle allocation: it may not move.
  auto done = s.relocation().relocate(r, 20, 23, detail::page_span{20, 23, 0, 40}, 64);
  CHECK(done.covered == 0);
  CHECK(s.table.mappings().relocations() == 0);
  // A run of 2 pages at the end of the request with room for only 3: the 4-page allocation does not fit.
  auto& to = s.table.mappings().band(1);
  s.table.mappings().grow(to, 16);
  s.table.mappings().map_unmapped(to, 3, 3, page, 64, [] {});
  done = s.relocation().relocate(to, 0, 1, detail::page_span{0, 1, 0, 1}, 3);
  CHECK(done.covered == 0);
  CHECK(s.table.mappings().stale_bytes() == 0);
  // With room for 4 (max run 64, nothing mapped after), it covers the run and reaches past it.
  done = s.relocation().relocate(to, 4, 5, detail::page_span{4, 5, 4, 5}, 64);
  CHECK(done.covered == 2 * page);
  CHECK(done.bytes == 4 * page);
  CHECK(to.pages[7].mapping == s.idle_slot);
}
