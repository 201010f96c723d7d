// detail::mapping_slots: mapping records by slot, recycled, and the queue of idle slots oldest first.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include <strata/detail/pages/mapping_slots.hpp>

namespace {
using slots_t = strata::detail::mapping_slots<int>;
using record = slots_t::record;

std::vector<std::uint32_t> queued(const slots_t& s)
{
  return {s.idle.begin() + static_cast<std::ptrdiff_t>(s.idle_head), s.idle.end()};
}
} // namespace

TEST_CASE("mapping_slots: a removed slot is empty and reused by the next record")
{
  slots_t s;
  s.reserve(3);
  const auto a = s.add(record{.page = 1, .first = 0, .count = 2});
  const auto b = s.add(record{.page = 2, .first = 4, .count = 1});
  CHECK(a != b);
  CHECK(s.mappings_live == 2);
  CHECK(s.mappings[b].page == 2);
  s.remove(a);
  CHECK(s.mappings_live == 1);
  CHECK(s.mappings[a].count == 0);
  const auto c = s.add(record{.page = 3, .first = 8, .count = 4});
  CHECK(c == a);
  CHECK(s.mappings[c].page == 3);
  CHECK(s.mappings.size() == 2);
}

TEST_CASE("mapping_slots: the idle queue gives slots back oldest first and empties once drained")
{
  slots_t s;
  s.reserve(4);
  for (int i = 0; i < 4; ++i) s.add(record{.page = i, .count = 1});
  s.list_idle(2);
  s.list_idle(0);
  s.list_idle(std::vector<std::uint32_t>{3});
  CHECK(s.mappings[2].listed);
  CHECK_FALSE(s.mappings[1].listed);
  CHECK(queued(s) == std::vector<std::uint32_t>{2, 0, 3});
  REQUIRE(s.has_queued());
  CHECK(s.next_queued() == 2);
  s.pop_queued();
  CHECK(s.next_queued() == 0);
  s.pop_queued();
  s.pop_queued();
  CHECK_FALSE(s.has_queued());
  CHECK(s.idle.empty());  // drained: the taken entries are dropped
  CHECK(s.idle_head == 0);
}

TEST_CASE("mapping_slots: within the room reserved, adding, listing and removing never reallocate")
{
  slots_t s;
  s.reserve(8);
  for (int i = 0; i < 8; ++i) s.list_idle(s.add(record{.page = i, .count = 1}));
  const auto* records = s.mappings.data();
  const auto* queue = s.idle.data();
  const std::size_t capacity = s.idle.capacity();
  for (int round = 0; round < 50; ++round) {
    std::vector<std::uint32_t> taken;
    for (int i = 0; i < 3; ++i) {
      taken.push_back(s.next_queued());
      s.pop_queued();
    }
    const auto rest = queued(s);
    for (auto slot : taken) {  // taken and filed again: the queue compacts in place once it is full
      s.remove(slot);
      const auto again = s.add(record{.page = round, .count = 1});
      REQUIRE(again == slot);  // the slot just freed
      s.list_idle(again);
    }
    auto expected = rest;
    expected.insert(expected.end(), taken.begin(), taken.end());
    REQUIRE(queued(s) == expected);
  }
  CHECK(s.mappings.data() == records);
  CHECK(s.idle.data() == queue);
  CHECK(s.idle.capacity() == capacity);
  CHECK(s.mappings_live == 8);
}
