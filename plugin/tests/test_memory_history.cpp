// The torch backend's memory history and snapshot: recordHistory's switches, the trace ring, stack frames
// kept per block, and snapshot segments built from strata's chunk listing with the backend's blocks over it.
#include <doctest/doctest.h>

#include <atomic>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <strata/core/snapshot.hpp>
#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/mapped_pool.hpp>

#include "figures_of.hpp"
#include "memory_history.hpp"

using namespace strata;
using namespace strata::plugin;

namespace {
/// Stands in for PyTorch's gathered Python and C++ frames.
struct frames {
  std::vector<std::string> lines;
  bool operator==(const frames&) const = default;
};

trace_record<frames> rec(trace_action a, std::uintptr_t addr, std::size_t size, frames f = {})
{
  return {a, addr, size, nullptr, {}, 0, std::move(f)};
}
} // namespace

TEST_CASE("memory_history: action names round-trip; an unknown skipped action is refused, settings unchanged")
{
  for (int i = 0; i <= static_cast<int>(trace_action::oom); ++i)
    CHECK(parse_action(action_name(static_cast<trace_action>(i))) == static_cast<trace_action>(i));
  memory_history<frames> h;
  h.configure(true, context_mode::all, 10, false, {});
  CHECK_THROWS_WITH_AS(h.configure(false, context_mode::never, 5, true, {"alloc", "allocate"}), doctest::Contains("'allocate'"),
                       std::invalid_argument);
  CHECK(h.enabled());
  CHECK(h.context_on_free());
}

TEST_CASE("memory_history: nothing is recorded until enabled; the ring keeps the newest max_entries")
{
  memory_history<frames> h;
  h.record(rec(trace_action::alloc, 1, 10));
  CHECK(h.trace().empty());
  CHECK(!h.context_on_alloc());
  h.configure(true, context_mode::alloc, 3, false, {});
  CHECK(h.context_on_alloc());
  CHECK(!h.context_on_free());
  for (std::uintptr_t a = 1; a <= 5; ++a) h.record(rec(trace_action::alloc, a, 10, {{"f" + std::to_string(a)}}));
  REQUIRE(h.trace().size() == 3);
  CHECK(h.trace().front().address == 3);
  CHECK(h.trace().back().context.lines == std::vector<std::string>{"f5"});
  h.configure(true, context_mode::alloc, 2, false, {});  // a smaller ring drops the oldest
  CHECK(h.trace().size() == 2);
  h.configure(true, context_mode::alloc, 2, true, {});  // clear
  CHECK(h.trace().empty());
  h.configure(false, context_mode::all, 2, false, {});
  CHECK(!h.context_on_alloc());
  h.record(rec(trace_action::alloc, 9, 10));
  CHECK(h.trace().empty());
}

TEST_CASE("memory_history: each event keeps the user's metadata and compiled region of its moment, shared, not copied")
{
  memory_history<frames> h;
  h.configure(true, context_mode::alloc, 8, false, {});
  auto phase = std::make_shared<const std::string>("forward");
  auto region = std::make_shared<const std::string>("Torch-Compiled Region: 0/0");
  trace_record<frames> a = rec(trace_action::alloc, 1, 10);
  a.user_metadata = phase;
  a.compile_context = region;
  h.record(std::move(a));
  h.record(rec(trace_action::free_requested, 1, 10));  // metadata cleared meanwhile
  REQUIRE(h.trace().size() == 2);
  REQUIRE(h.trace().front().user_metadata != nullptr);
  CHECK(*h.trace().front().user_metadata == "forward");
  CHECK(h.trace().front().user_metadata.get() == phase.get());
  CHECK(h.trace().front().compile_context.get() == region.get());
  CHECK(h.trace().back().user_metadata == nullptr);
  CHECK(h.trace().back().compile_context == nullptr);
}

TEST_CASE("memory_history: skipped actions are left out; state mode keeps frames with blocks, not the trace")
{
  memory_history<frames> h;
  h.configure(true, context_mode::state, 100, false, {"free_requested"});
  CHECK(h.context_on_alloc());  // gathered for the live block
  CHECK(!h.trace_keeps_alloc_context());
  h.record(rec(trace_action::alloc, 1, 10, {{"where"}}));
  h.record(rec(trace_action::free_requested, 1, 10));
  h.record(rec(trace_action::free_completed, 1, 10));
  REQUIRE(h.trace().size() == 2);
  CHECK(h.trace()[0].context.lines.empty());
  CHECK(h.trace()[1].action == trace_action::free_completed);
}

TEST_CASE("snapshot: strata's JSON is read back exactly; anything else names where it went wrong")
{
  snapshot s;
  s.box = "mapped_pool \"x\"";
  s.segments.push_back({0x100000, 8192, {{0, 4096, false, 3}, {4096, 4096, true, -1}}, {{0, 4096}, {4096, 4096}}});
  s.segments.push_back({0x900000, 2048, {{0, 2048, true, -1}}, {}});
  const snapshot back = parse_snapshot_json(to_json(s));
  CHECK(back.box == s.box);
  REQUIRE(back.segments.size() == 2);
  CHECK(back.segments[0].address == 0x100000);
  CHECK(back.segments[1].address == 0x900000);
  CHECK(back.segments[0].size == 8192);
  CHECK(back.segments[1].size == 2048);
  CHECK(back.segments[0].blocks == s.segments[0].blocks);
  CHECK(back.segments[1].blocks == s.segments[1].blocks);
  CHECK(back.segments[0].mapped == s.segments[0].mapped);
  CHECK(back.segments[1].mapped.empty());
  // The listing and its JSON say the same memory is held.
  CHECK(held_memory_of(back) == held_memory_of(s));
  CHECK(parse_held_memory(to_json(s)) == held_memory{.segments = {{0x900000, 2048}}, .mapped = {{0x100000, 4096}, {0x101000, 4096}}});
  CHECK(parse_snapshot_json("{\"box\":\"\",\"segments\":[]}").segments.empty());
  CHECK_THROWS_WITH_AS(parse_snapshot_json("{\"box\":\"\",\"segments\":[{\"address\":x}]}"), doctest::Contains("offset"),
                       std::invalid_argument);
  CHECK_THROWS_AS(parse_snapshot_json("{\"box\":\"\",\"segments\":[]} extra"), std::invalid_argument);
}

TEST_CASE("snapshot: segments mark live blocks allocated with their frames, held ones active; pool segments stand apart")
{
  snapshot s;
  s.box = "mapped_pool";
  s.segments.push_back({0x100000, 16384, {{0, 4096, false, 1}, {4096, 4096, false, 1}, {8192, 4096, false, 1}, {12288, 4096, true, -1}}});
  s.segments.push_back({0x200000, 4096, {{0, 4096, false, 1}}});
  block_table<frames> t;
  const pool_id graph{1, 0};
  t.create_or_incref(graph);
  t.insert(0x100000, {4096, 4000, reinterpret_cast<void*>(7), {}, {{"model.py:12"}}});
  t.insert(0x102000, {4096, 4096, nullptr, graph, {}});
  (void)t.erase(0x102000);                      // parked in the graph pool
  t.insert(0x200000, {4096, 100, nullptr, graph, {}});
  // 0x101000 is in use in strata but not live in the table: freed, held for another stream.

  const auto segs = snapshot_segments(s, t);
  // The first chunk is cut around the pool's segment: strata's range, the pool's segment, strata's range.
  REQUIRE(segs.size() == 4);
  const auto& a = segs[0];
  CHECK(a.address == 0x100000);
  CHECK(a.total == 8192);
  CHECK(a.pool.none());
  REQUIRE(a.blocks.size() == 2);
  CHECK(a.blocks[0].allocated);
  CHECK(a.blocks[0].requested == 4000);
  CHECK(a.blocks[0].context.lines == std::vector<std::string>{"model.py:12"});
  CHECK(!a.blocks[1].allocated);
  CHECK(a.blocks[1].active);
  CHECK(a.allocated == 4096);
  CHECK(a.active == 8192);
  CHECK(a.requested == 4000);
  CHECK(a.stream == reinterpret_cast<void*>(7));
  const auto& parked = segs[1];
  CHECK(parked.address == 0x102000);
  CHECK(parked.pool == graph);
  CHECK(parked.total == 4096);
  REQUIRE(parked.blocks.size() == 1);
  CHECK(!parked.blocks[0].active);
  CHECK(!parked.large);
  CHECK(segs[2].address == 0x103000);
  CHECK(segs[2].pool.none());
  REQUIRE(segs[2].blocks.size() == 1);
  CHECK(!segs[2].blocks[0].active);
  CHECK(segs[3].pool == graph);
  std::size_t listed = 0;
  for (const auto& seg : segs) listed += seg.total;
  CHECK(listed == 16384 + 4096);  // nothing lost or counted twice

  // A range strata does not list becomes a free block: PyTorch lays blocks end to end.
  snapshot gaps;
  gaps.segments.push_back({0x400000, 8192, {{1024, 1024, false, 1}}});
  const auto tiled = snapshot_segments(gaps, t);
  REQUIRE(tiled[0].blocks.size() == 3);
  CHECK(tiled[0].blocks[0].size == 1024);
  CHECK(!tiled[0].blocks[0].active);
  CHECK(tiled[0].blocks[1].active);
  CHECK(tiled[0].blocks[2].size == 6144);

  const auto only = snapshot_segments(s, t, graph);  // a MemPool's snapshot: its segments only
  REQUIRE(only.size() == 2);
  CHECK(only[0].address == 0x102000);  // its parked segment
  CHECK(only[1].address == 0x200000);
  CHECK(snapshot_segments(s, t, pool_id{0, 9}).empty());
}

TEST_CASE("snapshot: a private pool's segment is listed as its pieces, live ones allocated, parked ones inactive")
{
  snapshot s;
  s.box = "mapped_pool";
  s.segments.push_back({0x100000, 1 << 20, {{0, 1 << 20, false, 1}}});  // strata sees one block: the segment
  s.segments.push_back({0x300000, 4096, {{0, 4096, false, 1}}});
  block_table<frames> t;
  const pool_id user{0, 3};
  t.create_or_incref(user);
  void* const stream = reinterpret_cast<void*>(9);
  t.insert(0x100000, {1 << 20, 1 << 20, stream, user, {}});
  (void)t.erase(0x100000);
  const auto a = t.revive(user, 4000, 4000, stream, {{"layer.py:3"}});
  const auto b = t.revive(user, 8192, 8192, stream);
  REQUIRE(a);
  REQUIRE(b);
  (void)t.erase(*b);  // parked again, merged with the rest
  t.insert(0x300000, {4096, 4096, nullptr, {}, {}});
  const auto segs = snapshot_segments(s, t);
  REQUIRE(segs.size() == 2);
  REQUIRE(segs[0].blocks.size() == 2);
  CHECK(segs[0].blocks[0].size == 4096);
  CHECK(segs[0].blocks[0].allocated);
  CHECK(segs[0].blocks[0].requested == 4000);
  CHECK(segs[0].blocks[0].context.lines == std::vector<std::string>{"layer.py:3"});
  CHECK(segs[0].blocks[1].size == (1 << 20) - 4096);
  CHECK(!segs[0].blocks[1].active);
  CHECK(segs[0].allocated == 4096);
  CHECK(segs[0].pool == user);
  CHECK(segs[0].stream == stream);
  // A segment strata does not hold (a MemPool's own allocator's) is listed from the table alone.
  const auto alone = pool_segment_snapshot(t, *t.segment_at(0x100000));
  CHECK(alone.address == 0x100000);
  CHECK(alone.total == 1 << 20);
  CHECK(alone.pool == user);
  CHECK(!alone.large);
  CHECK(alone.blocks.size() == 2);
  CHECK(alone.allocated == 4096);
  CHECK(!t.segment_at(0x100000 + 4096));
  (void)t.erase(*a);  // every piece parked: still the pool's segment
  const auto only = snapshot_segments(s, t, user);
  REQUIRE(only.size() == 1);
  CHECK(only[0].address == 0x100000);
  CHECK(only[0].pool == user);
  CHECK(only[0].allocated == 0);
}

TEST_CASE("memory_history: turning recording off drops the trace, clear or not")
{
  memory_history<frames> h;
  h.configure(true, context_mode::all, 10, false, {});
  for (std::uintptr_t a = 1; a <= 4; ++a) h.record(rec(trace_action::alloc, a, 10));
  REQUIRE(h.trace().size() == 4);
  h.configure(true, context_mode::alloc, 10, false, {});  // still on, not cleared: kept
  CHECK(h.trace().size() == 4);
  h.configure(false, context_mode::never, 10, false, {});
  CHECK(h.trace().empty());
  CHECK(!h.enabled());
  h.configure(true, context_mode::all, 10, false, {});  // on again: starts empty
  h.record(rec(trace_action::free_requested, 7, 10));
  REQUIRE(h.trace().size() == 1);
  CHECK(h.trace().front().address == 7);
}

TEST_CASE("segment_ledger: adopting reports nothing; then every change is a free, then an allocation")
{
  segment_ledger l;
  CHECK(!l.adopted());
  snapshot s{.box = "pool", .segments = {{.address = 0x1000, .size = 0x100, .blocks = {}, .mapped = {}}, {.address = 0x4000, .size = 0x200, .blocks = {}, .mapped = {}}}};
  l.adopt(s);
  CHECK(l.adopted());
  CHECK(l.update(s).empty());
  // One segment grows in place, one goes, one comes.
  snapshot t{.box = "pool", .segments = {{.address = 0x9000, .size = 0x300, .blocks = {}, .mapped = {}}, {.address = 0x1000, .size = 0x180, .blocks = {}, .mapped = {}}}};
  const auto changes = l.update(t);
  using c = segment_ledger::change;
  const std::vector<c> expected = {{trace_action::segment_free, 0x1000, 0x100}, {trace_action::segment_free, 0x4000, 0x200},
                                   {trace_action::segment_alloc, 0x1000, 0x180}, {trace_action::segment_alloc, 0x9000, 0x300}};
  CHECK(changes == expected);
  CHECK(l.known().size() == 2);
  l.forget();
  CHECK(!l.adopted());
  CHECK(l.known().empty());
}

TEST_CASE("segment_ledger: random segment sets; replaying the changes rebuilds every set")
{
  std::mt19937 rng(5);
  segment_ledger l;
  std::map<std::uintptr_t, std::size_t> replayed;
  int changes = 0;
  for (int round = 0; round < 300; ++round) {
    snapshot s{.box = "pool", .segments = {}};
    std::map<std::uintptr_t, std::size_t> truth;
    for (int k = 0; k < 12; ++k)
      if (rng() % 2 == 0) {
        const std::uintptr_t a = 0x100000u * static_cast<std::uintptr_t>(k + 1);
        const std::size_t n = 0x1000u * (1 + rng() % 3);
        truth[a] = n;
        s.segments.push_back({.address = a, .size = n, .blocks = {}, .mapped = {}});
      }
    for (const auto& ch : l.update(s)) {
      ++changes;
      if (ch.action == trace_action::segment_free) {
        REQUIRE(replayed.count(ch.address) == 1);
        CHECK(replayed[ch.address] == ch.size);
        replayed.erase(ch.address);
      } else {
        REQUIRE(ch.action == trace_action::segment_alloc);
        CHECK(replayed.count(ch.address) == 0);
        replayed[ch.address] = ch.size;
      }
    }
    CHECK(replayed == truth);
  }
  CHECK(changes > 1000);
}

namespace {
/// A page-mapped pool's listing as strata's JSON gives it: one reserved range per band, each with its mapped
/// ranges (offset, size) from the range's address.
std::string page_mapped_listing(const std::vector<std::pair<std::size_t, std::size_t>>& small_mapped,
                                const std::vector<std::pair<std::size_t, std::size_t>>& large_mapped, std::size_t extent = 0x4000000)
{
  const auto band = [&](std::uintptr_t base, const std::vector<std::pair<std::size_t, std::size_t>>& mapped) {
    std::string out = "{\"address\":" + std::to_string(base) + ",\"size\":" + std::to_string(extent) + ",\"blocks\":[],\"mapped\":[";
    for (std::size_t i = 0; i < mapped.size(); ++i)
      out += (i == 0 ? "" : ",") + std::string("{\"offset\":") + std::to_string(mapped[i].first) + ",\"size\":" + std::to_string(mapped[i].second) + "}";
    return out + "]}";
  };
  return "{\"box\":\"mapped_pool\",\"segments\":[" + band(0x10000000, small_mapped) + "," + band(0x80000000, large_mapped) + "]}";
}
} // namespace

TEST_CASE("segment_ledger: a page-mapped pool reports each range it maps and unmaps, never its reserved ranges")
{
  constexpr std::size_t mib2 = 0x200000;
  segment_ledger l;
  l.adopt(parse_held_memory(page_mapped_listing({{0, mib2}}, {})));
  CHECK(l.known().empty());  // the reservations are no memory of their own
  REQUIRE(l.known_mapped().size() == 1);
  CHECK(l.known_mapped().at(0x10000000) == mib2);
  using c = segment_ledger::change;
  // Pages mapped next to the first range: the reservation is unchanged, so only the new range is reported.
  std::vector<c> changes = l.update(parse_held_memory(page_mapped_listing({{0, mib2}, {mib2, 4 * mib2}}, {{0, 32 * mib2}})));
  CHECK(changes == std::vector<c>{{trace_action::segment_map, 0x10000000 + mib2, 4 * mib2}, {trace_action::segment_map, 0x80000000, 32 * mib2}});
  // The page table grows (the listed extent doubles) with nothing mapped or unmapped: nothing to report.
  CHECK(l.update(parse_held_memory(page_mapped_listing({{0, mib2}, {mib2, 4 * mib2}}, {{0, 32 * mib2}}, 0x8000000))).empty());
  // A reclaim unmaps the first range and the large one; an idle allocation mapped a second time appears.
  changes = l.update(parse_held_memory(page_mapped_listing({{mib2, 4 * mib2}, {16 * mib2, 4 * mib2}}, {})));
  CHECK(changes == std::vector<c>{{trace_action::segment_unmap, 0x10000000, mib2}, {trace_action::segment_unmap, 0x80000000, 32 * mib2},
                                  {trace_action::segment_map, 0x10000000 + 16 * mib2, 4 * mib2}});
  // A page-mapped listing that does not carry its mapped ranges reports nothing, not its reservations.
  CHECK(parse_held_memory("{\"box\":\"mapped_pool\",\"segments\":[{\"address\":4096,\"size\":8192,\"blocks\":[]}]}") == held_memory{});
  // A chunked stack's listing: its chunks are its segments.
  const held_memory chunks = parse_held_memory("{\"box\":\"coalescing_pool\",\"segments\":[{\"address\":4096,\"size\":8192,\"blocks\":[]}]}");
  CHECK(chunks.segments == held_ranges{{4096, 8192}});
  CHECK(chunks.mapped.empty());
}

TEST_CASE("segment_ledger: a page-mapped pool's reserved ranges are never reported as segments, however they grow")
{
  segment_ledger l;
  l.adopt(snapshot{});
  const snapshot reserved{.box = "mapped_pool", .segments = {{.address = 0x10000000, .size = 0x4000000, .blocks = {}, .mapped = {}}}};
  CHECK(l.update(reserved).empty());
  const snapshot grown{.box = "mapped_pool", .segments = {{.address = 0x10000000, .size = 0x8000000, .blocks = {}, .mapped = {}}}};
  CHECK(l.update(grown).empty());
  CHECK(l.known().empty());
  // Pages mapped into the grown range, and a second band reserved: only the mapped range is reported.
  const std::vector<mapped_range> first{{.offset = 0x200000, .size = 0x400000}};
  const snapshot mapped{.box = "mapped_pool",
                        .segments = {{.address = 0x10000000, .size = 0x8000000, .blocks = {}, .mapped = first},
                                     {.address = 0x80000000, .size = 0x4000000, .blocks = {}, .mapped = {}}}};
  using c = segment_ledger::change;
  CHECK(l.update(mapped) == std::vector<c>{{trace_action::segment_map, 0x10200000, 0x400000}});
  // Both ranges grow again, the mapping unchanged: nothing to report.
  const snapshot regrown{.box = "mapped_pool",
                         .segments = {{.address = 0x10000000, .size = 0x10000000, .blocks = {}, .mapped = first},
                                      {.address = 0x80000000, .size = 0x8000000, .blocks = {}, .mapped = {}}}};
  CHECK(l.update(regrown).empty());
  CHECK(l.known().empty());
  CHECK(l.known_mapped() == held_ranges{{0x10200000, 0x400000}});
  // The box is what keeps them out: the same ranges in a chunked stack's listing are segments of their own.
  snapshot chunked = regrown;
  chunked.box = "coalescing_pool";
  chunked.segments[0].mapped.clear();
  CHECK(held_memory_of(chunked).segments == held_ranges{{0x10000000, 0x10000000}, {0x80000000, 0x8000000}});
}

TEST_CASE("segment_ledger: a relocation is a SEGMENT_MAP of its new range and tidying a SEGMENT_UNMAP of the stale one, "
          "seen because the page figures move where no other segment figure does")
{
  constexpr std::size_t mib = std::size_t{1} << 20;
  // The plug-in's default reclaim (relocate_idle) over a pretend device; stale ranges past 4 MiB are tidied.
  mapped_pool<simulated_pages> pool{simulated_pages{}, {.small_limit = mib, .min_mapping = 0, .relocate_idle = true,
                                                        .stale_address_limit = 4 * mib}};
  // The pool's device figures, as the plug-in fills them (device_stack.hpp's read, device_figures_of).
  const auto figures = [&pool] {
    strata_device_figures f{};
    f.reserved = pool.usage().reserved;
    f.chunks = pool.usage().chunks;
    f.device_allocs = pool.page_calls().creates;
    f.device_frees = pool.page_calls().releases;
    f.page_maps = pool.page_calls().maps;
    f.page_unmaps = pool.page_calls().unmaps;
    return f;
  };
  const auto memory_figures = [](const strata_device_figures& f) {
    return std::array<std::uint64_t, 4>{f.reserved, f.chunks, f.device_allocs, f.device_frees};
  };
  using c = segment_ledger::change;
  segment_ledger l;
  // Two idle 4 MiB holes between live fences: an 8 MiB request fits neither, so their memory moves to it.
  void* a1 = pool.allocate(4 * mib);
  void* f1 = pool.allocate(2 * mib);
  void* a2 = pool.allocate(4 * mib);
  void* f2 = pool.allocate(2 * mib);
  pool.deallocate(a1, 4 * mib);
  pool.deallocate(a2, 4 * mib);
  l.adopt(held_memory_of(pool.snapshot()));
  const strata_device_figures before = figures();
  void* b = pool.allocate(8 * mib);
  REQUIRE(pool.relocations() >= 1);
  const strata_device_figures moved = figures();
  CHECK(memory_figures(moved) == memory_figures(before));          // no memory taken or given back...
  CHECK(segment_figures_of(moved) != segment_figures_of(before));  // ...but the listing is read again
  std::vector<c> changes = l.update(held_memory_of(pool.snapshot()));
  REQUIRE(!changes.empty());
  std::size_t mapped_at_b = 0;
  for (const c& ch : changes) {
    CHECK(ch.action == trace_action::segment_map);  // the stale ranges still map the memory: nothing unmapped yet
    CHECK(ch.address >= reinterpret_cast<std::uintptr_t>(b));
    CHECK(ch.address + ch.size <= reinterpret_cast<std::uintptr_t>(b) + 8 * mib);
    mapped_at_b += ch.size;
  }
  CHECK(mapped_at_b == 8 * mib);
  // Past the stale limit, the next allocation tidies: the stale ranges are unmapped, again with no memory moved.
  void* d = pool.allocate(2 * mib);
  const strata_device_figures tidied = figures();
  CHECK(pool.stale_bytes() == 0);
  CHECK(tidied.page_unmaps > moved.page_unmaps);
  changes = l.update(held_memory_of(pool.snapshot()));
  std::size_t unmapped = 0;
  for (const c& ch : changes) {
    if (ch.action != trace_action::segment_unmap) continue;
    const bool at_a1 = ch.address >= reinterpret_cast<std::uintptr_t>(a1) && ch.address + ch.size <= reinterpret_cast<std::uintptr_t>(a1) + 4 * mib;
    const bool at_a2 = ch.address >= reinterpret_cast<std::uintptr_t>(a2) && ch.address + ch.size <= reinterpret_cast<std::uintptr_t>(a2) + 4 * mib;
    CHECK((at_a1 || at_a2));
    unmapped += ch.size;
  }
  CHECK(unmapped == 8 * mib);
  for (auto [p, n] : {std::pair{b, 8 * mib}, std::pair{d, 2 * mib}, std::pair{f1, 2 * mib}, std::pair{f2, 2 * mib}}) pool.deallocate(p, n);
}

TEST_CASE("segment_ledger: random mapped ranges and chunks; replaying the events rebuilds the memory held")
{
  std::mt19937 rng(9);
  segment_ledger l;
  held_memory replayed;
  int maps = 0, unmaps = 0;
  for (int round = 0; round < 300; ++round) {
    held_memory truth;
    for (int k = 0; k < 12; ++k) {
      const std::uintptr_t a = 0x100000u * static_cast<std::uintptr_t>(k + 1);
      const std::size_t n = 0x1000u * (1 + rng() % 3);
      if (rng() % 2 == 0) (k % 3 == 0 ? truth.segments : truth.mapped)[a] = n;
    }
    for (const auto& ch : l.update(truth)) {
      const bool mapping = ch.action == trace_action::segment_map || ch.action == trace_action::segment_unmap;
      held_ranges& side = mapping ? replayed.mapped : replayed.segments;
      if (ch.action == trace_action::segment_free || ch.action == trace_action::segment_unmap) {
        REQUIRE(side.count(ch.address) == 1);  // only what was reported is taken back, at its size
        CHECK(side[ch.address] == ch.size);
        side.erase(ch.address);
        unmaps += mapping ? 1 : 0;
      } else {
        CHECK(side.count(ch.address) == 0);
        side[ch.address] = ch.size;
        maps += mapping ? 1 : 0;
      }
    }
    CHECK(replayed == truth);
  }
  CHECK(maps > 300);
  CHECK(unmaps > 300);
}

TEST_CASE("tracker_list: a tracker may raise events of its own on its thread; other threads wait, none is lost")
{
  tracker_list<int> trackers;
  CHECK(!trackers.any());
  std::atomic<int> seen{0}, nested{0};
  trackers.attach([&](const int& e) {
    ++seen;
    if (e == 1) trackers.call(2);  // a tracker that allocates: its own event comes back on this thread
    if (e == 2) ++nested;
  });
  CHECK(trackers.any());
  trackers.call(1);
  CHECK(seen == 2);
  CHECK(nested == 1);
  // Attached during a call: called from the next event on.
  int late = 0;
  tracker_list<int> growing;
  growing.attach([&](const int& e) {
    if (e == 0) growing.attach([&](const int&) { ++late; });
  });
  growing.call(0);
  CHECK(late == 0);
  growing.call(5);
  CHECK(late == 1);
  // Threads at once, each also raising a nested event.
  seen = 0;
  nested = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) trackers.call(1);
    });
  for (auto& t : threads) t.join();
  CHECK(seen == 4000);
  CHECK(nested == 2000);
}
