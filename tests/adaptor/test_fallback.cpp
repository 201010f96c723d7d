// fallback: the secondary serves what the primary refuses, and every free reaches the tier that served it.
// It passes the conformance suite and the randomized checker; spy upstreams see every call it makes.
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

static_assert(has_property<fallback<host_pool, host_source>, host_accessible>);
static_assert(!has_property<fallback<coalescing_pool<simulated_source>, host_source>, host_accessible>);  // only shared ones
static_assert(owning_resource<fallback<host_pool, host_pool>> && !owning_resource<fallback<host_pool, host_source>>);

TEST_CASE("fallback conforms")
{
  fallback<host_pool, host_pool> r{host_pool{}, host_pool{}};
  testing::check_conformance(r, host_limits);
  testing::run_random_workload(r, small_workload);
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
