// Bad input, end to end: every box gets every bad argument (alignment 0, 3, larger than it supports; sizes
// 0, 1, SIZE_MAX, SIZE_MAX/2; null frees); checked<R>'s reports of misuse are in adaptor/test_checked.cpp.
// Each must end in the documented outcome — a clear exception naming the box, or a no-op — and afterwards
// the randomized checker still passes and everything is back at the upstream.
#include <doctest/doctest.h>

#include <climits>
#include <sstream>
#include <string>

#include <strata/adaptor/checked.hpp>
#include <strata/adaptor/fallback.hpp>
#include <strata/adaptor/limit.hpp>
#include <strata/adaptor/recorder.hpp>
#include <strata/adaptor/retry_on_oom.hpp>
#include <strata/adaptor/segregator.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/adaptor/synchronized.hpp>
#include <strata/adaptor/thread_cached.hpp>
#include <strata/adaptor/tracking.hpp>
#include <strata/core/ref.hpp>
#include <strata/policy/arena.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "fuzz/adversarial_source.hpp"
#include "support/invariants.hpp"
#include "support/spy.hpp"

using namespace strata;
using strata::testing::spy;

namespace {

/// Feeds `r` every bad argument; `box` is the name its exceptions must carry (the box that checks).
template <class R>
void feed_bad_arguments(R& r, const std::string& box)
{
  for (std::size_t a : {std::size_t{0}, std::size_t{3}, std::size_t{1000}, std::size_t{1} << 62}) {
    CAPTURE(a);
    try {
      (void)r.allocate(256, a);
      FAIL("alignment " << a << " was accepted");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find(box) != std::string::npos);
      CHECK(std::string(e.what()).find(std::to_string(a)) != std::string::npos);
    }
  }
  CHECK(r.allocate(0, 256) == nullptr);
  r.deallocate(nullptr, 0, 256);
  r.deallocate(nullptr, 4096, 256);
  void* one = r.allocate(1, 256);
  REQUIRE(one != nullptr);
  CHECK(is_aligned(one, 256));
  for (std::size_t bytes : {SIZE_MAX, SIZE_MAX / 2, SIZE_MAX - 255}) {
    CAPTURE(bytes);
    try {
      (void)r.allocate(bytes, 256);
      FAIL("a request of " << bytes << " bytes succeeded");
    } catch (const out_of_memory& e) {
      CHECK(std::string(e.what()).find(std::to_string(bytes)) != std::string::npos);
    }
  }
  r.deallocate(one, 1, 256);
  // Still intact: the randomized checker passes.
  testing::run_random_workload(r, {.operations = 5'000, .max_live = 100, .max_bytes = 1 << 18, .max_alignment = 256});
}

template <class Box>
void check_box(const std::string& box, auto make)
{
  spy<simulated_source> upstream{simulated_source(std::size_t{1} << 32)};
  {
    Box r = make(ref(upstream));
    feed_bad_arguments(r, box);
  }
  CHECK(upstream.outstanding_bytes() == 0);
  CHECK(upstream.mismatches() == 0);
}

using up = ref<spy<simulated_source>>;

} // namespace

TEST_CASE("bad arguments to every box: clear exceptions, no-ops, nothing lost")
{
  SUBCASE("simulated_source") { check_box<up>("simulated_source", [](up u) { return u; }); }
  SUBCASE("arena") { check_box<arena<up>>("arena", [](up u) { return arena<up>{u}; }); }
  SUBCASE("size_class_pool") { check_box<size_class_pool<up>>("size_class_pool", [](up u) { return size_class_pool<up>{u}; }); }
  SUBCASE("buddy_pool") { check_box<buddy_pool<up>>("buddy_pool", [](up u) { return buddy_pool<up>{u}; }); }
  SUBCASE("coalescing_pool") { check_box<coalescing_pool<up>>("coalescing_pool", [](up u) { return coalescing_pool<up>{u}; }); }
  SUBCASE("stream_ordered")
  {
    static simulated_streams world;
    using so = stream_ordered<coalescing_pool<up>, simulated_events>;
    check_box<so>("stream_ordered", [](up u) { return so{coalescing_pool<up>{u}, {}, simulated_events(world)}; });
  }
  // Adaptors leave argument checks to the box below them, whose name the exception carries.
  using pool = coalescing_pool<up>;
  SUBCASE("limit") { check_box<limit<pool>>("coalescing_pool", [](up u) { return limit<pool>{pool{u}, std::size_t{1} << 30}; }); }
  SUBCASE("statistics") { check_box<statistics<pool>>("coalescing_pool", [](up u) { return statistics<pool>{pool{u}}; }); }
  SUBCASE("tracking") { check_box<tracking<pool>>("coalescing_pool", [](up u) { return tracking<pool>{pool{u}}; }); }
  SUBCASE("synchronized") { check_box<synchronized<pool>>("coalescing_pool", [](up u) { return synchronized<pool>{pool{u}}; }); }
  SUBCASE("thread_cached") { check_box<thread_cached<pool>>("coalescing_pool", [](up u) { return thread_cached<pool>{pool{u}}; }); }
  SUBCASE("retry_on_oom")
  {
    check_box<retry_on_oom<pool>>("coalescing_pool", [](up u) { return retry_on_oom<pool>{pool{u}, [](std::size_t, int) { return true; }, 3}; });
  }
  SUBCASE("fallback")
  {
    using f = fallback<pool, host_source>;  // the secondary refuses the huge requests too
    check_box<f>("coalescing_pool", [](up u) { return f{pool{u}, host_source{}}; });
  }
  SUBCASE("segregator")
  {
    using s = segregator<4096, size_class_pool<up>, pool>;
    // Alignments above 256 go to size classes' direct path; the message names whichever box checked.
    check_box<s>("_pool", [](up u) { return s{size_class_pool<up>{u}, pool{u}}; });
  }
}

namespace {

/// A box whose good_size is only defined for sizes it can serve: asked about more, it records the question
/// (where a real pool would shift past 64 bits or wrap). Its good_size of a large request wraps, as an
/// unchecked `align_up` does.
struct fragile_sizes : host_source {
  std::size_t* bad_questions;
  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const
  {
    if (bytes > (std::size_t{1} << 48) || alignment > (std::size_t{1} << 48)) ++*bad_questions;
    return (bytes + 4095) & ~std::size_t{4095};  // wraps to 0 near SIZE_MAX
  }
  friend bool operator==(const fragile_sizes&, const fragile_sizes&) noexcept { return true; }
};

} // namespace

TEST_CASE("limit: a size no box can serve is out_of_memory, without asking the upstream's good_size")
{
  std::size_t bad_questions = 0;
  for (std::size_t cap : {std::size_t{1} << 30, SIZE_MAX}) {
    CAPTURE(cap);
    limit<fragile_sizes> r{fragile_sizes{{}, &bad_questions}, cap};
    for (std::size_t bytes : {SIZE_MAX, SIZE_MAX / 2, SIZE_MAX - 4095, std::size_t{1} << 63, (std::size_t{1} << 56) + 1}) {
      CAPTURE(bytes);
      CHECK_THROWS_WITH_AS(r.allocate(bytes), doctest::Contains("limit"), out_of_memory);
      CHECK(r.bytes_in_use() == 0);
    }
    void* p = r.allocate(100);
    CHECK(r.bytes_in_use() == 4096);
    r.deallocate(p, 100);
    CHECK(r.bytes_in_use() == 0);
  }
  CHECK(bad_questions == 0);
  // The pools' own good_size at the extremes is theirs to keep defined; under a limit they are not asked.
  limit<buddy_pool<host_source>> buddy{buddy_pool<host_source>{}, SIZE_MAX};
  limit<coalescing_pool<host_source>> coalescing{coalescing_pool<host_source>{}, SIZE_MAX};
  for (std::size_t bytes : {SIZE_MAX, SIZE_MAX / 2, std::size_t{1} << 63}) {
    CHECK_THROWS_AS(buddy.allocate(bytes), out_of_memory);
    CHECK_THROWS_AS(coalescing.allocate(bytes), out_of_memory);
  }
  CHECK(buddy.bytes_in_use() == 0);
  CHECK(coalescing.bytes_in_use() == 0);
}

TEST_CASE("limit: an alignment the upstream cannot honour is its invalid_argument, not out_of_memory")
{
  limit<buddy_pool<host_source>> buddy{buddy_pool<host_source>{}, std::size_t{1} << 20};
  CHECK_THROWS_WITH_AS(buddy.allocate(256, std::size_t{1} << 40), doctest::Contains("buddy_pool: alignment 1099511627776"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(buddy.allocate(SIZE_MAX, std::size_t{1} << 40), doctest::Contains("buddy_pool"), std::invalid_argument);
  CHECK_THROWS_AS(buddy.allocate(256, 3), std::invalid_argument);
  CHECK(buddy.bytes_in_use() == 0);
  limit<coalescing_pool<host_source>> small{coalescing_pool<host_source>{}, 4096};
  CHECK_THROWS_AS(small.allocate(256, std::size_t{1} << 60), std::invalid_argument);
  CHECK_THROWS_AS(small.allocate(8192), out_of_memory);  // a plain refusal stays one
  // An alignment the upstream honours only with slack it cannot fit under the cap is a refusal.
  limit<size_class_pool<host_source>> classes{size_class_pool<host_source>{}, 4096};
  void* p = classes.allocate(100, 4096);
  CHECK(is_aligned(p, 4096));
  classes.deallocate(p, 100, 4096);
  CHECK(classes.bytes_in_use() == 0);
}

namespace {

using aligned_256 = ref<testing::adversarial_source>;  // aligns to exactly 256 bytes, as CUDA's sources do
using capped_pool = coalescing_pool<aligned_256>;

capped_pool capped(testing::adversarial_source& up, std::size_t max_reserved)
{
  return capped_pool(aligned_256(up), {.max_reserved = max_reserved});
}

/// Over an upstream of `capacity` that aligns to 256 bytes, a box capped at 64 MiB: an alignment of 128 MiB
/// can never be honoured (std::invalid_argument, from allocate(0, a) too), one of 32 MiB can (its slack fits
/// under the cap) but not while the upstream has under 48 MiB to give (out_of_memory). Nothing moves.
template <class Box>
void says_what_the_pool_says(Box& box, testing::adversarial_source& up)
{
  const std::size_t held = up.live_bytes();
  CHECK_THROWS_WITH_AS(box.allocate(1 << 20, std::size_t{128} << 20), doctest::Contains("coalescing_pool"), std::invalid_argument);
  CHECK_THROWS_AS(box.allocate(0, std::size_t{128} << 20), std::invalid_argument);
  CHECK(box.allocate(0, std::size_t{32} << 20) == nullptr);
  CHECK_THROWS_AS(box.allocate(std::size_t{16} << 20, std::size_t{32} << 20), out_of_memory);
  CHECK(up.live_bytes() == held);
}

} // namespace

TEST_CASE("an alignment no chunk can honour is invalid_argument in every composition; one that does not fit now, out_of_memory")
{
  constexpr std::size_t cap = std::size_t{64} << 20, capacity = std::size_t{40} << 20;
  std::size_t compositions = 0;
  {
    testing::adversarial_source up(capacity);
    capped_pool pool = capped(up, cap);
    CHECK(pool.largest_alignment() == cap);
    says_what_the_pool_says(pool, up);
    ++compositions;
  }
  {
    testing::adversarial_source up(capacity);
    limit<capped_pool> box{capped(up, cap), std::size_t{1} << 30};
    says_what_the_pool_says(box, up);
    ++compositions;
  }
  {
    testing::adversarial_source up(capacity);
    retry_on_oom<capped_pool> box{capped(up, cap), [](std::size_t, int) { return false; }};
    says_what_the_pool_says(box, up);
    ++compositions;
  }
  {
    testing::adversarial_source up(capacity), other(capacity);
    fallback<capped_pool, capped_pool> box{capped(up, cap), capped(other, cap)};
    says_what_the_pool_says(box, up);
    CHECK(other.live_bytes() == 0);
    ++compositions;
  }
  {
    // The stream layer, with the lone owner's recent frees kept, asked by a stream it has not seen: the
    // alignment is refused before that stream's arrival hands the recent frees back.
    testing::adversarial_source up(capacity);
    simulated_streams world;
    stream_ordered<capped_pool, simulated_events>::options opts{};
    opts.reuse_recent_frees = true;
    stream_ordered<capped_pool, simulated_events> box{capped(up, cap), opts, simulated_events(world)};
    const cuda::stream_ref a = world.create(), b = world.create();
    box.deallocate_async(box.allocate_async(4096, 256, a), 4096, 256, a);
    REQUIRE(box.cached_blocks() == 1);
    const std::size_t held = up.live_bytes();
    CHECK_THROWS_AS(box.allocate_async(1 << 20, std::size_t{128} << 20, b), std::invalid_argument);
    CHECK_THROWS_AS(box.allocate(1 << 20, std::size_t{128} << 20), std::invalid_argument);  // the legacy stream
    CHECK_THROWS_AS(box.allocate(0, std::size_t{128} << 20), std::invalid_argument);
    CHECK(box.cached_blocks() == 1);  // still the owner's, unmerged
    CHECK(box.streams_tracked() == 1);
    CHECK(up.live_bytes() == held);
    // Out of memory may hand idle memory back on the way (docs/architecture.md): it is still out_of_memory.
    CHECK_THROWS_AS(box.allocate_async(std::size_t{16} << 20, std::size_t{32} << 20, b), out_of_memory);
    CHECK(up.live_bytes() <= held);
    ++compositions;
  }
  CHECK(compositions == 5);
}

namespace {

/// Uses a moved-from box the ways a program might by mistake: each call either works on an empty box or is
/// a usage_error; nothing crashes.
template <class Box>
void use_after_move(Box& moved_from)
{
  moved_from.deallocate(nullptr, 0);
  try {
    void* none = moved_from.allocate(0);
    CHECK(none == nullptr);
    void* p = moved_from.allocate(1000);
    CHECK(p != nullptr);
    moved_from.deallocate(p, 1000);
  } catch (const usage_error& e) {
    CHECK(std::string(e.what()).find("moved from") != std::string::npos);
  }
}

template <class Box>
void check_moved_from(auto make)
{
  spy<host_source> upstream;
  {
    Box a = make(ref(upstream));
    void* p = a.allocate(4096);
    Box b = std::move(a);
    use_after_move(a);
    b.deallocate(p, 4096);
    Box c = make(ref(upstream));
    c = std::move(b);
    use_after_move(b);
    testing::run_random_workload(c, {.operations = 2'000, .max_live = 50, .max_bytes = 1 << 16, .max_alignment = 256});
  }
  CHECK(upstream.outstanding_bytes() == 0);
  CHECK(upstream.mismatches() == 0);
}

using host_up = ref<spy<host_source>>;
using host_pool = coalescing_pool<host_up>;

} // namespace

TEST_CASE("moved-from adaptors: empty and usable, or a usage_error; never a crash")
{
  SUBCASE("limit") { check_moved_from<limit<host_pool>>([](host_up u) { return limit<host_pool>{host_pool{u}, 1 << 30}; }); }
  SUBCASE("statistics") { check_moved_from<statistics<host_pool>>([](host_up u) { return statistics<host_pool>{host_pool{u}}; }); }
  SUBCASE("tracking") { check_moved_from<tracking<host_pool>>([](host_up u) { return tracking<host_pool>{host_pool{u}}; }); }
  SUBCASE("recorder")
  {
    static std::ostringstream out;
    check_moved_from<recorder<host_pool>>([](host_up u) { return recorder<host_pool>{host_pool{u}, out}; });
    spy<host_source> upstream;
    recorder<host_pool> a{host_pool{ref(upstream)}, out}, b = std::move(a);
    CHECK(a.events() == 0);
    CHECK_THROWS_WITH_AS(a.allocate(1), doctest::Contains("recorder: used after being moved from"), usage_error);
  }
  SUBCASE("retry_on_oom")
  {
    check_moved_from<retry_on_oom<host_pool>>(
        [](host_up u) { return retry_on_oom<host_pool>{host_pool{u}, [](std::size_t, int) { return false; }}; });
  }
  SUBCASE("retry_on_oom: a moved-from box has no callback and refuses as its upstream does")
  {
    spy<host_source> upstream;
    retry_on_oom<host_up> a{ref(upstream), [](std::size_t, int) { return true; }}, b = std::move(a);
    upstream.refuse_next(1);
    CHECK_THROWS_AS(a.allocate(100), out_of_memory);
  }
  SUBCASE("synchronized") { check_moved_from<synchronized<host_pool>>([](host_up u) { return synchronized<host_pool>{host_pool{u}}; }); }
  SUBCASE("thread_cached")
  {
    check_moved_from<thread_cached<host_pool>>([](host_up u) { return thread_cached<host_pool>{host_pool{u}}; });
    spy<host_source> upstream;
    thread_cached<host_pool> a{host_pool{ref(upstream)}}, b = std::move(a);
    CHECK_THROWS_WITH_AS(a.allocate(1), doctest::Contains("thread_cached: used after being moved from"), usage_error);
    CHECK(a.cached().first == 0);
    CHECK(a.threads_seen() == 0);
    a.release();
  }
  SUBCASE("segregator")
  {
    using s = segregator<2048, host_pool, host_pool>;
    check_moved_from<s>([](host_up u) { return s{host_pool{u}, host_pool{u}}; });
  }
  SUBCASE("fallback")
  {
    using f = fallback<host_pool, host_pool>;
    check_moved_from<f>([](host_up u) { return f{host_pool{u}, host_pool{u}}; });
  }
}
