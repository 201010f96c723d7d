// Every adaptor is move-assignable where its boxes are, and a move-assignment hands the blocks over.
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
} // namespace

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
