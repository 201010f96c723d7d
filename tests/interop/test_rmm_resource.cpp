// interop/rmm_resource.hpp: a strata stack shared by copies, in the shape RMM's current device resource takes
// (no RMM needed: tests/rmm runs RMM's own tests over it on a GPU).
#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda/memory_resource>

#include <strata/adaptor/checked.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/interop/rmm_resource.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/host_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "support/conformance.hpp"

using namespace strata;

namespace {

/// Host memory that claims to be device memory, so a device-accessible stack runs on the host; it counts the
/// sources alive (copies and moves included) and the bytes out.
struct pretend_device : sync_names<pretend_device> {
  static inline std::atomic<int> alive{0};
  static inline std::atomic<long> bytes_out{0};
  /// The newest source: a stack left undestroyed at exit stays reachable through it (leak checkers agree).
  static inline std::atomic<const void*> newest{nullptr};

  pretend_device() { seen(); }
  pretend_device(const pretend_device&) { seen(); }
  pretend_device(pretend_device&&) noexcept { seen(); }
  pretend_device& operator=(const pretend_device&) = default;
  pretend_device& operator=(pretend_device&&) noexcept = default;
  ~pretend_device() { --alive; }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    void* p = host_.allocate(bytes, alignment);
    bytes_out += static_cast<long>(bytes);
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    host_.deallocate(p, bytes, alignment);
    bytes_out -= static_cast<long>(bytes);
  }
  friend bool operator==(const pretend_device&, const pretend_device&) noexcept { return true; }
  friend constexpr void get_property(const pretend_device&, device_accessible) noexcept {}

private:
  void seen() noexcept
  {
    ++alive;
    newest = this;
  }
  host_source host_;
};

using stack = stream_ordered<coalescing_pool<pretend_device>, simulated_events>;

stack make_stack(simulated_streams& world) { return stack{coalescing_pool<pretend_device>{}, {}, simulated_events(world)}; }

struct oom_elsewhere : std::bad_alloc {
  explicit oom_elsewhere(std::string w) : what_(std::move(w)) {}
  const char* what() const noexcept override { return what_.c_str(); }
  std::string what_;
};
[[noreturn]] void rethrow_elsewhere(const out_of_memory& e) { throw oom_elsewhere(std::string("elsewhere: ") + e.what()); }

std::atomic<bool> pretend_exiting{false};
bool probe_exiting() noexcept { return pretend_exiting.load(); }

} // namespace

static_assert(stream_resource<rmm_resource> && cccl::stream_resource_with<rmm_resource, device_accessible>);
static_assert(answers_to_cccl31_stream_names<rmm_resource> && std::copyable<rmm_resource>);
static_assert(!has_property<rmm_resource, host_accessible>);
static_assert(std::constructible_from<rmm_resource, stack&&>);
// A stack that is not stream-ordered, or not device-accessible, is refused at compile time.
static_assert(!std::constructible_from<rmm_resource, coalescing_pool<pretend_device>&&>);
static_assert(!std::constructible_from<rmm_resource, stream_ordered<coalescing_pool<host_source>, simulated_events>&&>);

TEST_CASE("rmm_resource: conforms, synchronously and on streams")
{
  simulated_streams world;
  rmm_resource r(make_stack(world));
  testing::check_conformance(r, {.max_alignment = 1 << 12, .rejects_above = 0, .device_accessible = true});
  testing::run_random_workload(r, {.operations = 10'000, .max_live = 200, .max_alignment = 1 << 12});

  const cuda::stream_ref s = world.create();
  void* p = r.allocate(s, 1000, 256);
  REQUIRE(p != nullptr);
  CHECK(is_aligned(p, 256));
  void* q = r.allocate_async(3000, 512, s);
  CHECK(is_aligned(q, 512));
  r.deallocate(s, p, 1000, 256);
  r.deallocate_async(q, 3000, 512, s);
  CHECK(r.allocate(s, 0, 256) == nullptr);
  r.deallocate(s, nullptr, 0, 256);
}

TEST_CASE("rmm_resource: copies share one stack, which dies with the last copy")
{
  simulated_streams world;
  const int before = pretend_device::alive.load();
  {
    rmm_resource a(make_stack(world));
    CHECK(pretend_device::alive.load() == before + 1);  // the moved-in stack's source; the temporaries are gone
    rmm_resource b = a;
    CHECK(a == b);
    CHECK(a.use_count() == 2);
    rmm_resource other(make_stack(world));
    CHECK_FALSE(a == other);

    void* p = a.allocate_sync(4096, 256);
    CHECK(b.with_stack<stack>([](stack& s) { return s.usage().in_use; }) >= 4096);  // one stack seen by both
    b.deallocate_sync(p, 4096, 256);  // memory from one copy goes back through another
    CHECK(a.with_stack<stack>([](stack& s) { return s.usage().in_use; }) == 0);

    rmm_resource moved(std::move(a));
    CHECK(moved == b);
    void* m = a.allocate_sync(100, 256);  // NOLINT(bugprone-use-after-move): a moved-from copy still serves
    CHECK(m != nullptr);
    a.deallocate_sync(m, 100, 256);
    {
      rmm_resource c = b;
      b = other;  // assignment lets go of one share and takes another
      CHECK(c.use_count() == 3);
      CHECK(b == other);
    }
  }
  CHECK(pretend_device::alive.load() == before);
  CHECK(pretend_device::bytes_out.load() == 0);
}

TEST_CASE("rmm_resource: its stack's interface is reached under the lock, by type")
{
  simulated_streams world;
  using counted = statistics<stack>;
  rmm_resource r(counted(make_stack(world)));
  CHECK(r.type() == typeid(counted));
  void* p = r.allocate_sync(1 << 20, 256);
  CHECK(r.with_stack<counted>([](counted& s) { return s.snapshot_counts().current_bytes; }) == std::size_t{1} << 20);
  r.deallocate_sync(p, 1 << 20, 256);
  CHECK(r.with_stack<counted>([](counted& s) { return s.snapshot_counts().current_bytes; }) == 0);
  CHECK_THROWS_AS(r.with_stack<stack>([](stack&) { return 0; }), std::invalid_argument);
}

TEST_CASE("rmm_resource: out of memory leaves as the installed kind, and leaves it usable")
{
  simulated_streams world;
  rmm_resource r(make_stack(world));
  const std::size_t huge = SIZE_MAX / 2;
  CHECK_THROWS_AS((void)r.allocate_sync(huge, 256), out_of_memory);
  rmm_resource copy = r;
  copy.translate_out_of_memory(&rethrow_elsewhere);  // every copy shares the choice
  try {
    (void)r.allocate(cuda::stream_ref{cudaStream_t{}}, huge, 256);
    FAIL("a request of " << huge << " bytes succeeded");
  } catch (const oom_elsewhere& e) {
    CHECK(std::string(e.what()).find(std::to_string(huge)) != std::string::npos);  // strata's message, kept
  }
  CHECK_THROWS_AS((void)r.allocate_sync(256, 3), std::invalid_argument);  // not out of memory: not translated
  testing::check_still_usable(r);
}

TEST_CASE("rmm_resource: a free the checked stack refuses fails the next allocation, and loses nothing")
{
  simulated_streams world;
  using debugged = checked<stack>;
  rmm_resource r(debugged(make_stack(world)));
  void* p = r.allocate_sync(1000, 256);
  int not_from_it = 0;
  r.deallocate_sync(&not_from_it, 4, 256);  // noexcept: refused, kept
  r.deallocate(cuda::stream_ref{cudaStream_t{}}, p, 1000, 256);
  r.deallocate(cuda::stream_ref{cudaStream_t{}}, p, 1000, 256);  // a double free: refused as well
  try {
    (void)r.allocate_sync(64, 256);
    FAIL("an allocation after a refused free succeeded");
  } catch (const usage_error& e) {
    CHECK(std::string(e.what()).find("refused") != std::string::npos);
  }
  // The report is given once; the stack is as before the refused frees: nothing live, usable.
  void* q = r.allocate_sync(64, 256);
  CHECK(q != nullptr);
  r.deallocate_sync(q, 64, 256);
  CHECK(r.with_stack<debugged>([](debugged& s) { return s.upstream().usage().in_use; }) == 0);
}

TEST_CASE("rmm_resource: several threads at once on an unsynchronized stack")
{
  simulated_streams world;
  rmm_resource r(make_stack(world));
  constexpr int threads = 4, operations = 5'000;
  std::atomic<long> done{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::uniform_int_distribution<std::size_t> size(1, 1 << 16);
      std::vector<std::pair<void*, std::size_t>> live;
      for (int i = 0; i < operations; ++i) {
        if (live.empty() || rng() % 2 == 0) {
          const std::size_t n = size(rng);
          void* p = r.allocate_sync(n, 256);
          if (p != nullptr && is_aligned(p, 256)) ++done;
          live.emplace_back(p, n);
        } else {
          const auto [p, n] = live.back();
          live.pop_back();
          r.deallocate_sync(p, n, 256);
          ++done;
        }
      }
      for (const auto& [p, n] : live) r.deallocate_sync(p, n, 256);
    });
  for (auto& t : pool) t.join();
  CHECK(done.load() == long{threads} * operations);
  const usage u = r.with_stack<stack>([](stack& s) { return s.usage(); });
  CHECK(u.in_use == 0);
}

TEST_CASE("rmm_resource: the last copy let go during process exit leaves the stack undestroyed")
{
  simulated_streams world;
  const int before = pretend_device::alive.load();
  {
    rmm_resource r(make_stack(world));
    r.with_stack<stack>([](stack& s) { s.release(); });
    r.also_exiting_when(&probe_exiting);
    pretend_exiting = true;
  }
  pretend_exiting = false;
  CHECK(pretend_device::alive.load() == before + 1);  // left alone, as RMM's map is at exit
  // Kept reachable from here on, as RMM's map keeps it: a leak checker then sees it kept, not lost.
  static const void* kept = nullptr;
  kept = pretend_device::newest.load();
  CHECK(kept != nullptr);
  {
    rmm_resource r(make_stack(world));
    r.also_exiting_when(&probe_exiting);
  }
  CHECK(pretend_device::alive.load() == before + 1);  // not exiting: destroyed
}

TEST_CASE("rmm_resource: behind CCCL's own wrappers")
{
  simulated_streams world;
  rmm_resource r(make_stack(world));
  cccl::stream_resource_ref<device_accessible> ref{r};
  void* p = cccl::allocate(ref, cuda::stream_ref{cudaStream_t{}}, 512, 256);
  CHECK(p != nullptr);
  cccl::deallocate(ref, cuda::stream_ref{cudaStream_t{}}, p, 512, 256);
#if STRATA_CCCL_WRAPPERS_NEED_COPYABLE
  {
    cuda::mr::any_resource<device_accessible> owned{r};  // what RMM's per-device map holds
    CHECK(r.use_count() == 2);
    void* q = owned.allocate_sync(512, 256);
    r.deallocate_sync(q, 512, 256);
  }
  CHECK(r.use_count() == 1);
#endif
}
