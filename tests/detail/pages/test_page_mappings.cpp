// detail::page_mappings: the physical allocations behind mapped_pool's ranges, over a simulated device the
// test keeps, so what the table gave back can be looked at after it is gone.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include <strata/detail/pages/page_mappings.hpp>
#include <strata/pages/simulated_pages.hpp>

using namespace strata;

namespace {
constexpr std::size_t page = std::size_t{2} << 20;
constexpr std::size_t range_bytes = std::size_t{1} << 30;

/// A page backend that forwards to a simulated device the test keeps; `page_size` may be overridden to
/// check the table's own requirement on it.
struct device_ref {
  using page = simulated_pages::page;
  simulated_pages* device = nullptr;
  std::size_t size_override = 0;
  std::size_t page_size() const noexcept { return size_override != 0 ? size_override : device->page_size(); }
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
using mappings_t = detail::page_mappings<device_ref>;

/// The pieces of pages [first, last] of range 0, as (first, last, mapped) triples.
struct seen {
  std::size_t first, last;
  bool mapped;
  bool operator==(const seen&) const = default;
};
std::vector<seen> pieces(const mappings_t& t, std::size_t first, std::size_t last)
{
  std::vector<seen> out;
  t.for_each_piece(t.band(0), first, last, [&](const mappings_t::piece& pc) { out.push_back({pc.first, pc.last, pc.slot != mappings_t::no_mapping}); });
  return out;
}
} // namespace

TEST_CASE("page_mappings: runs of unmapped pages get one mapping each, split at the longest run")
{
  simulated_pages device(page);
  mappings_t t(device_ref{&device});
  t.reserve(0, range_bytes, range_bytes);
  auto& r = t.band(0);
  t.grow(r, 10);
  CHECK(r.pages.size() >= 10);
  std::size_t made = 0;
  t.map_unmapped(r, 2, 6, 5 * page, 2, [&] { ++made; });  // pages 2-3, 4-5, 6
  CHECK(made == 3);
  CHECK(t.mappings_live() == 3);
  CHECK(t.physical() == 5 * page);
  CHECK(device.bytes_alive() == 5 * page);
  CHECK(device.counts().creates == 3);
  CHECK(pieces(t, 0, 8) == std::vector<seen>{{0, 1, false}, {2, 3, true}, {4, 5, true}, {6, 6, true}, {7, 8, false}});
  CHECK(t.page_of(r, t.address_of(r, 4) + 100) == 4);
  CHECK(t.band_of(r.base + page) == 0);
  CHECK(r.pages[2].mapping == r.pages[3].mapping);
  CHECK(r.pages[3].mapping != r.pages[4].mapping);
  const auto& m = t.slot(r.pages[4].mapping);
  CHECK(m.first == 4);
  CHECK(m.count == 2);
  CHECK(t.bytes_of(m) == 2 * page);
  CHECK(t.page_state_updates() == 5);  // each page's entry written once
  t.map_unmapped(r, 0, 8, 4 * page, 64, [] {});  // only the gaps: pages 0-1 and 7-8
  CHECK(pieces(t, 0, 8).size() == 5);
  CHECK(t.physical() == 9 * page);
}

TEST_CASE("page_mappings: a failed mapping leaves the table as it was")
{
  simulated_pages device(page);
  mappings_t t(device_ref{&device});
  t.reserve(0, range_bytes, range_bytes);
  auto& r = t.band(0);
  t.grow(r, 8);
  device.fail_after(simulated_pages::operation::map, 1);  // the second run's map fails
  CHECK_THROWS(t.map_unmapped(r, 0, 3, 4 * page, 2, [] {}));
  CHECK(t.mappings_live() == 0);
  CHECK(t.physical() == 0);
  CHECK(device.bytes_alive() == 0);
  CHECK(pieces(t, 0, 3) == std::vector<seen>{{0, 3, false}});
  CHECK(r.runs.empty());
  t.map_unmapped(r, 0, 3, 4 * page, 2, [] {});  // the same request succeeds once the device does
  CHECK(t.mappings_live() == 2);
}

TEST_CASE("page_mappings: runs mapped back to back share one access call, a gap between them starts another")
{
  simulated_pages device(page);
  mappings_t t(device_ref{&device});
  t.reserve(0, range_bytes, range_bytes);
  auto& r = t.band(0);
  t.grow(r, 16);
  t.map_unmapped(r, 0, 6, 7 * page, 2, [] {});  // pages 0-1, 2-3, 4-5, 6: four allocations back to back
  CHECK(device.counts().creates == 4);
  CHECK(device.counts().maps == 4);
  CHECK(device.counts().access_calls == 1);
  CHECK(device.is_usable(t.address_of(r, 0), 7 * page));
  t.map_unmapped(r, 0, 10, 4 * page, 2, [] {});  // pages 7-8 and 9-10: one more stretch
  CHECK(device.counts().access_calls == 2);
  t.map_unmapped(r, 12, 12, page, 2, [] {});
  t.map_unmapped(r, 0, 14, 3 * page, 2, [] {});  // pages 11 and 13-14, split by the mapping at page 12
  CHECK(device.counts().creates == 9);
  CHECK(device.counts().access_calls == 5);
  CHECK(device.is_usable(t.address_of(r, 0), 15 * page));
  CHECK(t.physical() == 15 * page);
}

TEST_CASE("page_mappings: a failed access call unmaps and releases every allocation of its stretch")
{
  simulated_pages device(page);
  mappings_t t(device_ref{&device});
  t.reserve(0, range_bytes, range_bytes);
  auto& r = t.band(0);
  t.grow(r, 16);
  t.map_unmapped(r, 4, 4, page, 2, [] {});
  device.fail_after(simulated_pages::operation::set_access, 1);  // pages 0-3 get access, pages 5-8 do not
  CHECK_THROWS_AS(t.map_unmapped(r, 0, 8, 8 * page, 2, [] {}), std::runtime_error);
  CHECK(t.mappings_live() == 1);
  CHECK(t.physical() == page);
  CHECK(device.bytes_alive() == page);
  CHECK(device.bytes_mapped() == page);
  CHECK(device.counts().releases == 4);
  CHECK(t.peak_physical() == 5 * page);  // the stretch that got access counted; the one refused did not
  CHECK(pieces(t, 0, 8) == std::vector<seen>{{0, 3, false}, {4, 4, true}, {5, 8, false}});
  t.map_unmapped(r, 0, 8, 8 * page, 2, [] {});  // the same request succeeds once the device does
  CHECK(device.is_usable(t.address_of(r, 0), 9 * page));
  CHECK(t.physical() == 9 * page);
}

TEST_CASE("page_mappings: destroyed or assigned to, it gives every mapping and range back; a move leaves it empty")
{
  simulated_pages device(page);
  simulated_pages other(page);  // outlives `moved`, which takes other's mappings over below
  {
    mappings_t t(device_ref{&device});
    t.reserve(0, range_bytes, range_bytes);
    t.reserve(1, range_bytes, range_bytes);
    t.grow(t.band(0), 5);
    t.map_unmapped(t.band(0), 0, 4, 5 * page, 64, [] {});
    CHECK(device.ranges_reserved() == 2);
    mappings_t moved(std::move(t));
    CHECK(moved.physical() == 5 * page);
    CHECK(t.physical() == 0);  // NOLINT(bugprone-use-after-move): specified empty
    CHECK(t.mappings_live() == 0);
    CHECK(t.band(0).size == 0);
    mappings_t fresh(device_ref{&other});
    fresh.reserve(0, range_bytes, range_bytes);
    const auto waits = device.counts().synchronizes;
    moved = std::move(fresh);  // the device's mappings and ranges go back first, after one wait
    CHECK(device.counts().synchronizes == waits + 1);
    CHECK(device.bytes_alive() == 0);
    CHECK(device.bytes_mapped() == 0);
    CHECK(device.ranges_reserved() == 0);
    CHECK(other.ranges_reserved() == 1);
    t.reserve(0, range_bytes, range_bytes);  // the moved-from table is usable
    t.grow(t.band(0), 1);
    t.map_unmapped(t.band(0), 0, 0, page, 64, [] {});
    CHECK(device.bytes_alive() == page);
  }
  CHECK(device.bytes_alive() == 0);
  CHECK(device.ranges_reserved() == 0);
}

TEST_CASE("page_mappings: a page size that is not a power of two is refused")
{
  simulated_pages device(page);
  CHECK_THROWS_AS(mappings_t(device_ref{&device, 3 * page}), std::invalid_argument);
  CHECK_NOTHROW(mappings_t(device_ref{&device, 4 * page}));
}
