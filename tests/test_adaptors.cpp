// The adaptors that route and count: fallback, segregator, limit, statistics, retry_on_oom, tracking,
// recorder. Each passes the conformance suite and the randomized checker, and its own behaviour is checked
// against spy upstreams that see every call.
#include <doctest/doctest.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <type_traits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <strata/adaptor/fallback.hpp>
#include <strata/adaptor/limit.hpp>
#include <strata/adaptor/prefetch.hpp>
#include <strata/adaptor/recorder.hpp>
#include <strata/adaptor/retry_on_oom.hpp>
#include <strata/adaptor/segregator.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/adaptor/synchronized.hpp>
#include <strata/adaptor/thread_cached.hpp>
#include <strata/adaptor/tracking.hpp>
#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "support/conformance.hpp"
#include "support/spy.hpp"

using namespace strata;
using strata::testing::spy;

namespace {
using host_pool = coalescing_pool<host_source>;
using spied_pool = coalescing_pool<ref<spy<host_source>>>;
constexpr testing::conformance_limits host_limits{.max_alignment = 1 << 16, .rejects_above = 0, .host_accessible = true};
constexpr testing::workload small_workload{.operations = 20'000, .max_live = 300, .max_bytes = 1 << 20, .max_alignment = 1 << 12};
} // namespace

// Forwarded properties and capabilities, positive and negative.
static_assert(has_property<fallback<host_pool, host_source>, host_accessible>);
static_assert(!has_property<fallback<coalescing_pool<simulated_source>, host_source>, host_accessible>);  // only shared ones
static_assert(owning_resource<fallback<host_pool, host_pool>> && !owning_resource<fallback<host_pool, host_source>>);
static_assert(sized_resource<segregator<4096, size_class_pool<host_source>, host_pool>>);
static_assert(!sized_resource<segregator<4096, host_source, host_pool>>);
static_assert(stream_resource<limit<stream_ordered<host_pool>>> && !stream_resource<limit<host_pool>>);
static_assert(owning_resource<statistics<host_pool>> && usage_reporting_resource<statistics<host_pool>>);
static_assert(!owning_resource<statistics<host_source>>);
static_assert(releasable_resource<tracking<host_pool>> && sized_resource<recorder<host_pool>>);
static_assert(stream_resource<retry_on_oom<stream_ordered<host_pool>>>);
static_assert(cccl::stream_resource<statistics<stream_ordered<host_pool>>>);

TEST_CASE("adaptors conform")
{
  SUBCASE("fallback")
  {
    fallback<host_pool, host_pool> r{host_pool{}, host_pool{}};
    testing::check_conformance(r, host_limits);
    testing::run_random_workload(r, small_workload);
  }
  SUBCASE("segregator")
  {
    segregator<4096, size_class_pool<host_source>, host_pool> r;
    testing::check_conformance(r, host_limits);
    testing::run_random_workload(r, small_workload);
  }
  SUBCASE("limit")
  {
    limit<host_pool> r{host_pool{}, std::size_t{1} << 30};
    testing::check_conformance(r, host_limits);
    testing::run_random_workload(r, small_workload);
    CHECK(r.bytes_in_use() == 0);
  }
  SUBCASE("statistics")
  {
    statistics<host_pool> r;
    testing::check_conformance(r, host_limits);
    testing::run_random_workload(r, small_workload);
    CHECK(r.snapshot_counts().current_bytes == 0);
  }
  SUBCASE("retry_on_oom")
  {
    retry_on_oom<host_pool> r{host_pool{}, [](std::size_t, int) { return false; }};
    testing::check_conformance(r, host_limits);
    testing::run_random_workload(r, small_workload);
  }
  SUBCASE("tracking")
  {
    tracking<host_pool> r;
    testing::check_conformance(r, host_limits);
    testing::run_random_workload(r, small_workload);
    CHECK(r.live_blocks() == 0);
  }
  SUBCASE("recorder")
  {
    std::ostringstream trace;
    recorder<host_pool> r{host_pool{}, trace};
    testing::check_conformance(r, host_limits);
    testing::run_random_workload(r, small_workload);
  }
}

TEST_CASE("fallback: the secondary serves what the primary refuses; frees go to the owner")
{
  spy<host_source> first_up, second_up;
  using tier = coalescing_pool<ref<spy<host_source>>>;
  fallback<tier, tier> r{tier{ref(first_up), {.initial_chunk = 1 << 20, .max_chunk = 1 << 20, .max_reserved = 1 << 20}},
                         tier{ref(second_up)}};
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(r.allocate(256 << 10));  // 4 fit in the primary
  CHECK(r.served_by_primary() == 4);
  CHECK(r.served_by_secondary() == 4);
  for (void* p : blocks) CHECK(r.owns(p));
  CHECK(r.primary().owns(blocks[0]));
  CHECK(r.secondary().owns(blocks[7]));
  for (void* p : blocks) r.deallocate(p, 256 << 10);
  CHECK(r.primary().usage().in_use == 0);
  CHECK(r.secondary().usage().in_use == 0);
  // Both refuse: the secondary's out_of_memory, and nothing counted.
  second_up.refuse_above(1 << 20);
  CHECK_THROWS_AS(r.allocate(8 << 20), out_of_memory);
  CHECK(r.served_by_secondary() == 4);
  // A bad alignment is not out-of-memory: it is not retried on the secondary.
  CHECK_THROWS_WITH_AS(r.allocate(100, 3), doctest::Contains("coalescing_pool"), std::invalid_argument);
  CHECK(second_up.allocations() == 1);
}

TEST_CASE("segregator: sizes route by the threshold, frees by the same test")
{
  spy<host_source> small_up, large_up;
  segregator<4096, ref<spy<host_source>>, ref<spy<host_source>>> r{ref(small_up), ref(large_up)};
  void* a = r.allocate(4096);
  void* b = r.allocate(4097);
  CHECK(small_up.holds(a));
  CHECK(large_up.holds(b));
  r.deallocate(a, 4096);
  r.deallocate(b, 4097);
  CHECK(small_up.outstanding_blocks() + large_up.outstanding_blocks() == 0);
  CHECK(small_up.mismatches() + large_up.mismatches() == 0);
}

TEST_CASE("limit: refuses past the cap, naming it; counts good sizes; gives the bytes back on free")
{
  spy<host_source> up;
  limit<coalescing_pool<ref<spy<host_source>>>> r{spied_pool{ref(up)}, 1 << 20};
  void* a = r.allocate(1000);  // counts as 1024, the pool's good size
  CHECK(r.bytes_in_use() == 1024);
  void* b = r.allocate((1 << 20) - 1024);
  CHECK_THROWS_WITH_AS(r.allocate(1), doctest::Contains("limit 1048576 bytes"), out_of_memory);
  CHECK(r.bytes_in_use() == 1 << 20);
  r.deallocate(a, 1000);
  void* c = r.allocate(1000);
  r.deallocate(b, (1 << 20) - 1024);
  r.deallocate(c, 1000);
  CHECK(r.bytes_in_use() == 0);
  // An upstream failure refunds the charge.
  up.refuse_next(1);
  CHECK_THROWS_AS(r.allocate(8 << 20), out_of_memory);
  CHECK(r.bytes_in_use() == 0);
  CHECK_THROWS_AS((limit<host_source>::fraction_of_device(host_source{}, 1.5)), std::invalid_argument);
  CHECK_THROWS_AS((limit<host_source>::fraction_of_device(host_source{}, 0.0)), std::invalid_argument);
}

TEST_CASE("statistics: current, peak and total counts; resettable peaks; nested scopes")
{
  statistics<host_source> r;
  void* a = r.allocate(1000);
  void* b = r.allocate(3000);
  r.deallocate(a, 1000);
  auto c = r.snapshot_counts();
  CHECK(c == statistics<host_source>::counts{.current_bytes = 3000, .current_blocks = 1, .peak_bytes = 4000, .peak_blocks = 2,
                                             .total_bytes = 4000, .total_blocks = 2});
  r.reset_peaks();
  CHECK(r.snapshot_counts().peak_bytes == 3000);
  {
    auto outer = r.open_scope();
    void* d = r.allocate(500);
    {
      auto inner = r.open_scope();
      void* e = r.allocate(10'000);
      r.deallocate(e, 10'000);
      const auto in = inner.so_far();
      CHECK(in.allocated_bytes == 10'000);
      CHECK(in.freed_blocks == 1);
      CHECK(in.peak_bytes == 13'500);  // what was in use when it opened, plus its own
    }
    r.deallocate(d, 500);
    const auto out = outer.so_far();
    CHECK(out.allocated_bytes == 10'500);
    CHECK(out.allocated_blocks == 2);
    CHECK(out.freed_bytes == 10'500);
    CHECK(out.peak_bytes == 13'500);  // the inner phase's peak counts for the outer one
  }
  r.deallocate(b, 3000);
  CHECK(r.snapshot_counts().current_bytes == 0);
  CHECK(r.snapshot_counts().total_blocks == 4);
}

TEST_CASE("retry_on_oom: the callback runs on out-of-memory and the request is retried")
{
  spy<host_source> up;
  std::vector<std::pair<std::size_t, int>> calls;
  retry_on_oom<ref<spy<host_source>>> r{ref(up), [&](std::size_t bytes, int attempt) {
                                          calls.emplace_back(bytes, attempt);
                                          return true;
                                        },
                                        2};
  up.refuse_next(2);
  void* p = r.allocate(777);
  CHECK(p != nullptr);
  CHECK(calls == std::vector<std::pair<std::size_t, int>>{{777, 1}, {777, 2}});
  CHECK(r.rescued() == 1);
  r.deallocate(p, 777);
  up.refuse_next(3);  // more failures than retries: the last one propagates
  CHECK_THROWS_AS(r.allocate(777), out_of_memory);
  up.refuse_next(0);
  retry_on_oom<ref<spy<host_source>>> gives_up{ref(up), [](std::size_t, int) { return false; }, 5};
  up.refuse_next(1);
  CHECK_THROWS_AS(gives_up.allocate(1), out_of_memory);
  CHECK(up.outstanding_blocks() == 0);
  CHECK_THROWS_AS((retry_on_oom<host_source>{host_source{}, {}}), std::invalid_argument);
}

TEST_CASE("tracking: live allocations with tags and streams; a leak report on demand and at destruction")
{
  std::ostringstream at_exit;
  simulated_streams world;
  {
    using so = stream_ordered<host_pool, simulated_events>;
    tracking<so> r{so{host_pool{}, {}, simulated_events(world)}, {.report_at_destruction = true, .report_to = &at_exit}};
    const cuda::stream_ref s = world.create();
    void* a = r.allocate(100);
    void* b = nullptr;
    {
      auto phase = r.tag("forward");
      b = r.allocate_async(2000, 256, s);
    }
    void* c = r.allocate(300);
    const auto live = r.live();
    REQUIRE(live.size() == 3);
    CHECK(live[0].pointer == a);
    CHECK(live[1].tag == "forward");
    CHECK(live[1].stream == reinterpret_cast<std::uintptr_t>(s.get()));
    CHECK(live[2].tag.empty());
    r.deallocate(a, 100);
    const std::string report = r.report();
    CHECK(report.find("2 live allocation(s), 2300 bytes") != std::string::npos);
    CHECK(report.find("tag forward: 1 allocation(s), 2000 bytes") != std::string::npos);
    r.deallocate(c, 300);
    (void)b;  // left live on purpose: reported at destruction
  }
  CHECK(at_exit.str().find("1 live allocation(s), 2000 bytes") != std::string::npos);
}

TEST_CASE("recorder: writes the trace format of bench/traces/README.md, which replays to the same peak")
{
  std::ostringstream out;
  simulated_streams world;
  using so = stream_ordered<host_pool, simulated_events>;
  std::size_t live = 0, peak = 0;
  {
    recorder<so> r{so{host_pool{}, {}, simulated_events(world)}, out};
    const cuda::stream_ref s1 = world.create(), s2 = world.create();
    std::vector<std::pair<void*, std::size_t>> blocks;
    for (int i = 0; i < 50; ++i) {
      const std::size_t bytes = 1000 + 37 * i;
      blocks.emplace_back(i % 3 == 0 ? r.allocate(bytes) : r.allocate_async(bytes, 256, i % 3 == 1 ? s1 : s2), bytes);
      live += bytes;
      peak = std::max(peak, live);
      if (i % 4 == 3) {
        r.deallocate(blocks.front().first, blocks.front().second);
        live -= blocks.front().second;
        blocks.erase(blocks.begin());
      }
    }
    for (auto [p, n] : blocks) r.deallocate(p, n);
    CHECK(r.events() == 100);
  }
  std::istringstream in(out.str());
  std::string line;
  std::getline(in, line);
  CHECK(line == "op,id,bytes,stream");
  std::map<std::uint64_t, std::size_t> open;
  std::size_t replay_live = 0, replay_peak = 0, lines = 0;
  std::set<std::uint64_t> streams;
  while (std::getline(in, line)) {
    ++lines;
    char op = 0;
    std::uint64_t id = 0, stream = 0;
    std::size_t bytes = 0;
    REQUIRE(std::sscanf(line.c_str(), "%c,%lu,%zu,%lu", &op, &id, &bytes, &stream) == 4);
    streams.insert(stream);
    if (op == 'a') {
      CHECK(open.emplace(id, bytes).second);
      replay_live += bytes;
      replay_peak = std::max(replay_peak, replay_live);
    } else {
      REQUIRE(op == 'f');
      REQUIRE(open.count(id) == 1);
      CHECK(open[id] == bytes);
      replay_live -= bytes;
      open.erase(id);
    }
  }
  CHECK(lines == 100);
  CHECK(open.empty());
  CHECK(replay_peak == peak);
  CHECK(streams == std::set<std::uint64_t>{0, 1, 2});
  CHECK_THROWS_AS((recorder<host_source>{host_source{}, std::string("/nonexistent-dir/trace.csv")}), std::invalid_argument);
}

namespace {

/// A host source that knows its live allocations: owns(p) in the one meaning (concepts.hpp), so it can be
/// a fallback's primary while a pool over the same source is the secondary.
class live_host_source : public sync_names<live_host_source> {
public:
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    void* p = host_source{}.allocate(bytes, alignment);
    if (p != nullptr) {
      std::lock_guard lock(mutex_);
      live_[p] = bytes;
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    {
      std::lock_guard lock(mutex_);
      const auto it = live_.find(p);
      if (it == live_.end() || it->second != bytes) {
        ++bad_frees_;
        return;
      }
      live_.erase(it);
    }
    host_source{}.deallocate(p, bytes, alignment);
  }
  bool owns(const void* p) const noexcept
  {
    std::lock_guard lock(mutex_);
    auto it = live_.upper_bound(const_cast<void*>(p));
    if (it == live_.begin()) return false;
    --it;
    return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second;
  }
  std::size_t live() const
  {
    std::lock_guard lock(mutex_);
    return live_.size();
  }
  std::size_t bad_frees() const noexcept { return bad_frees_; }
  friend bool operator==(const live_host_source& a, const live_host_source& b) noexcept { return &a == &b; }
  friend constexpr void get_property(const live_host_source&, host_accessible) noexcept {}

private:
  mutable std::mutex mutex_;
  std::map<void*, std::size_t> live_;
  std::size_t bad_frees_ = 0;
};

} // namespace

namespace {

/// fallback<limit<source>, pool over the same source>: the pool's blocks lie inside chunks the source
/// handed out, so the source claims them too; every free must still reach the tier that served it.
template <class Source>
void check_source_then_pool(Source& source)
{
  using primary = limit<ref<Source>>;
  using secondary = coalescing_pool<ref<Source>>;
  fallback<primary, secondary> r{primary{ref(source), 64 << 10}, secondary{ref(source)}};
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (int i = 0; i < 40; ++i) blocks.emplace_back(r.allocate(4096), 4096);  // 16 from the primary, then the pool
  CHECK(r.served_by_primary() == 16);
  CHECK(r.served_by_secondary() == 24);
  CHECK(r.primary().owns(blocks.back().first));  // inside the chunk it handed to the pool: the hard case
  CHECK(r.secondary().owns(blocks.back().first));
  CHECK(!r.secondary().owns(blocks.front().first));
  for (std::size_t i = 0; i < blocks.size(); i += 2) r.deallocate(blocks[i].first, blocks[i].second);
  for (std::size_t i = 1; i < blocks.size(); i += 2) r.deallocate(blocks[i].first, blocks[i].second);
  CHECK(r.primary().bytes_in_use() == 0);  // never underflowed: it saw exactly its own 16 frees
  CHECK(r.secondary().usage().in_use == 0);
  CHECK(r.secondary().usage().used_blocks == 0);
  r.secondary().release();
}

} // namespace

TEST_CASE("fallback: a source as primary, a pool over the same source as secondary: every free routed right")
{
  SUBCASE("a source that knows its live allocations")
  {
    live_host_source source;
    check_source_then_pool(source);
    CHECK(source.bad_frees() == 0);
    CHECK(source.live() == 0);
  }
  SUBCASE("simulated_source")
  {
    simulated_source source{std::size_t{1} << 30};
    check_source_then_pool(source);
    void* whole = source.allocate(std::size_t{1} << 30);  // everything came back to it, and only once
    CHECK(whole != nullptr);
    source.deallocate(whole, std::size_t{1} << 30);
  }
  SUBCASE("the other way round: a pool over the source first, the source itself second")
  {
    live_host_source source;
    using pool = limit<coalescing_pool<ref<live_host_source>>>;
    fallback<pool, ref<live_host_source>> r{pool{coalescing_pool<ref<live_host_source>>{ref(source)}, 64 << 10}, ref(source)};
    std::vector<void*> blocks;
    for (int i = 0; i < 40; ++i) blocks.push_back(r.allocate(4096));
    CHECK(r.served_by_primary() == 16);
    CHECK(r.served_by_secondary() == 24);
    for (void* p : blocks) r.deallocate(p, 4096);
    CHECK(r.primary().bytes_in_use() == 0);
    CHECK(source.bad_frees() == 0);
    r.primary().upstream().release();
    CHECK(source.live() == 0);
  }
}

// Every adaptor is move-assignable where its boxes are (so stream_ordered<adaptor>, which assigns its policy,
// is too), and not where they are not.
namespace {
using movable_pool = coalescing_pool<host_source>;
struct pinned_box : host_source {  // a box that cannot be assigned
  pinned_box() = default;
  pinned_box(pinned_box&&) noexcept = default;
  pinned_box& operator=(pinned_box&&) = delete;
};
template <class R>
constexpr bool assignable = std::is_nothrow_move_assignable_v<R> && std::is_nothrow_move_constructible_v<R>;
} // namespace
static_assert(assignable<movable_pool>);
static_assert(assignable<limit<movable_pool>> && !std::is_move_assignable_v<limit<pinned_box>>);
static_assert(assignable<statistics<movable_pool>> && !std::is_move_assignable_v<statistics<pinned_box>>);
static_assert(assignable<tracking<movable_pool>> && !std::is_move_assignable_v<tracking<pinned_box>>);
static_assert(assignable<recorder<movable_pool>> && !std::is_move_assignable_v<recorder<pinned_box>>);
static_assert(assignable<retry_on_oom<movable_pool>> && !std::is_move_assignable_v<retry_on_oom<pinned_box>>);
static_assert(assignable<synchronized<movable_pool>> && !std::is_move_assignable_v<synchronized<pinned_box>>);
static_assert(assignable<thread_cached<movable_pool>> && assignable<thread_cached<pinned_box>>);  // held on the heap
static_assert(assignable<segregator<4096, movable_pool, movable_pool>>);
static_assert(!std::is_move_assignable_v<segregator<4096, movable_pool, pinned_box>>);
static_assert(assignable<fallback<movable_pool, host_source>> && !std::is_move_assignable_v<fallback<movable_pool, pinned_box>>);
static_assert(assignable<prefetch<movable_pool>> && !std::is_move_assignable_v<prefetch<pinned_box>>);

TEST_CASE("adaptors: move-assignment hands the blocks over, also inside stream_ordered")
{
  auto exercise = [](auto make) {
    auto a = make();
    auto b = make();
    void* p = a.allocate(1000);
    b = std::move(a);  // b's old box goes; a's box (and p) now belong to b
    b.deallocate(p, 1000);
    void* q = b.allocate(3000);
    CHECK(q != nullptr);
    b.deallocate(q, 3000);
  };
  exercise([] { return limit<movable_pool>{movable_pool{}, 1 << 20}; });
  exercise([] { return statistics<movable_pool>{}; });
  exercise([] { return tracking<movable_pool>{}; });
  std::ostringstream out;
  exercise([&] { return recorder<movable_pool>{movable_pool{}, out}; });
  exercise([] { return retry_on_oom<movable_pool>{movable_pool{}, [](std::size_t, int) { return false; }}; });
  exercise([] { return synchronized<movable_pool>{}; });
  exercise([] { return thread_cached<movable_pool>{}; });
  exercise([] { return segregator<4096, movable_pool, movable_pool>{}; });
  exercise([] { return fallback<movable_pool, host_source>{movable_pool{}, host_source{}}; });

  simulated_streams world;
  using layer = stream_ordered<limit<movable_pool>, simulated_events>;
  layer x{limit<movable_pool>{movable_pool{}, 1 << 20}, {}, simulated_events(world)};
  layer y{limit<movable_pool>{movable_pool{}, 1 << 20}, {}, simulated_events(world)};
  void* p = x.allocate(1000);
  y = std::move(x);
  y.deallocate(p, 1000);
  y.release();
  CHECK(y.policy().bytes_in_use() == 0);
}
