// stream_ordered's bookkeeping over a simulated GPU: every hand-out checked against the rule that a block
// freed on stream s reaches another stream only after s's earlier work is done or ordered before it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>
#include <random>
#include <stdexcept>
#include <vector>

#include <strata/adaptor/checked.hpp>
#include <strata/adaptor/segregator.hpp>
#include <strata/default_pool.hpp>
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

/// Where and when the user freed a range: the work enqueued on that stream before the free may still use it.
struct free_record {
  std::size_t bytes;
  std::uint64_t stream;
  std::uint64_t ticket;
};

/// Passes everything to the policy, with or without its room reports (has_room_for).
template <class Policy, bool ReportsRoom = false>
class watched : public forward_properties<watched<Policy, ReportsRoom>, Policy> {
public:
  explicit watched(Policy policy) : policy_(std::move(policy)) {}
  void* allocate(std::size_t bytes, std::size_t alignment) { return policy_.allocate(bytes, alignment); }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept { policy_.deallocate(p, bytes, alignment); }
  std::size_t good_size(std::size_t bytes, std::size_t alignment) const { return policy_.good_size(bytes, alignment); }
  strata::usage usage() const noexcept { return policy_.usage(); }
  bool has_room_for(std::size_t bytes, std::size_t alignment) const noexcept
    requires ReportsRoom
  {
    return policy_.has_room_for(bytes, alignment);
  }
  friend bool operator==(const watched& a, const watched& b) noexcept { return &a == &b; }

  Policy policy_;
};

using capped_pool = coalescing_pool<ref<spy<simulated_source>>>;
template <bool ReportsRoom>
using checked_layer = stream_ordered<watched<capped_pool, ReportsRoom>, simulated_events>;

/// A layer over a capacity-limited simulated device, and the rule it must keep: memory the user freed on
/// stream s (any part of it, however the policy merged and split it since) reaches stream t only when t is s,
/// or s's work before the free has completed, or t was made to wait for it; it reaches the host (a
/// synchronous allocate) only when that work has completed. A synchronous free is "freed on every stream".
template <bool ReportsRoom = false>
struct rig {
  explicit rig(std::size_t capacity, typename checked_layer<ReportsRoom>::options opts = {})
      : upstream(simulated_source(capacity)),
        layer(watched<capped_pool, ReportsRoom>(capped_pool{ref(upstream), {.initial_chunk = 1 << 20, .max_chunk = 1 << 20}}),
              opts, simulated_events(world))
  {}

  void* allocate(std::size_t bytes, cuda::stream_ref s)
  {
    void* p = layer.allocate_async(bytes, 256, s);
    check_handout(p, bytes, world.id_of(s), /*for_host=*/false);
    return p;
  }
  void* allocate(std::size_t bytes, const identified_stream& s)
  {
    void* p = layer.allocate_async(bytes, 256, s);
    check_handout(p, bytes, s.id(), /*for_host=*/false);
    return p;
  }
  void* allocate_sync(std::size_t bytes)
  {
    void* p = layer.allocate(bytes, 256);
    check_handout(p, bytes, 0, /*for_host=*/true);
    return p;
  }
  void free(void* p, std::size_t bytes, cuda::stream_ref s)
  {
    const std::uint64_t id = world.id_of(s);
    freed.emplace(reinterpret_cast<std::uintptr_t>(p), free_record{layer.good_size(bytes, 256), id, world.enqueued(id)});
    layer.deallocate_async(p, bytes, 256, s);
  }
  void free(void* p, std::size_t bytes, const identified_stream& s)
  {
    freed.emplace(reinterpret_cast<std::uintptr_t>(p), free_record{layer.good_size(bytes, 256), s.id(), world.enqueued(s.id())});
    layer.deallocate_async(p, bytes, 256, s);
  }
  /// Freed after work on any stream: the record names every stream there is.
  void free_sync(void* p, std::size_t bytes, const std::vector<cuda::stream_ref>& streams)
  {
    for (auto s : streams) {
      const std::uint64_t id = world.id_of(s);
      freed.emplace(reinterpret_cast<std::uintptr_t>(p), free_record{layer.good_size(bytes, 256), id, world.enqueued(id)});
    }
    layer.deallocate(p, bytes, 256);
  }
  bool safe_for(const free_record& r, std::uint64_t t, bool for_host) const
  {
    if (world.completed(r.stream) >= r.ticket) return true;
    return !for_host && (r.stream == t || world.ordered_after(t, r.stream) >= r.ticket);
  }
  /// Every freed range overlapping the block must be safe for t; the overlapped parts are then spent (the
  /// block's next free makes records of its own), the parts outside the block still hold.
  void check_handout(void* p, std::size_t bytes, std::uint64_t t, bool for_host)
  {
    const auto begin = reinterpret_cast<std::uintptr_t>(p), end = begin + layer.good_size(bytes, 256);
    std::vector<std::pair<std::uintptr_t, free_record>> remainders;
    auto it = freed.lower_bound(begin > largest ? begin - largest : 0);
    while (it != freed.end() && it->first < end) {
      const auto [start, r] = *it;
      if (start + r.bytes <= begin) {
        ++it;
        continue;
      }
      REQUIRE(safe_for(r, t, for_host));
      ++checked_ranges;
      if (start < begin) remainders.emplace_back(start, free_record{begin - start, r.stream, r.ticket});
      if (start + r.bytes > end) remainders.emplace_back(end, free_record{start + r.bytes - end, r.stream, r.ticket});
      it = freed.erase(it);
    }
    for (const auto& rest : remainders) freed.insert(rest);
  }

  simulated_streams world;
  std::multimap<std::uintptr_t, free_record> freed;
  std::size_t checked_ranges = 0;
  std::size_t largest = std::size_t{64} << 20;  ///< no freed range is longer: how far back an overlap may start
  spy<simulated_source> upstream;
  checked_layer<ReportsRoom> layer;
};

/// Makes stream `owner` the owner: the first stream to free.
template <class Rig>
void make_owner(Rig& r, cuda::stream_ref owner)
{
  r.free(r.allocate(256, owner), 256, owner);
  REQUIRE(r.layer.owner() == r.world.id_of(owner));
}

} // namespace

static_assert(stream_resource<stream_ordered<coalescing_pool<host_source>>>);
static_assert(owning_resource<stream_ordered<coalescing_pool<host_source>>>);
static_assert(sized_resource<stream_ordered<coalescing_pool<host_source>>>);
static_assert(usage_reporting_resource<stream_ordered<coalescing_pool<host_source>>>);
static_assert(!owning_resource<stream_ordered<host_source>> && !sized_resource<stream_ordered<host_source>>);
static_assert(has_property<stream_ordered<coalescing_pool<host_source>>, host_accessible>);
static_assert(cccl::stream_resource<stream_ordered<coalescing_pool<host_source>>>);
static_assert(!stream_resource<coalescing_pool<host_source>>);

TEST_CASE("stream_ordered conforms (synchronous path on the simulated default stream)")
{
  simulated_streams world;
  stream_ordered<coalescing_pool<host_source>, simulated_events> layer{coalescing_pool<host_source>{}, {}, simulated_events(world)};
  testing::check_conformance(layer, {.max_alignment = 1 << 16, .rejects_above = 0, .host_accessible = true});
  testing::run_random_workload(layer, {.operations = 20'000, .max_live = 300, .max_alignment = 1 << 12});
  // Size classes add alignment slack to large blocks: a good size that is not its own good size.
  stream_ordered<size_class_pool<host_source>, simulated_events> classes{size_class_pool<host_source>{}, {}, simulated_events(world)};
  testing::check_conformance(classes, {.max_alignment = 1 << 16, .rejects_above = 0, .host_accessible = true});
  testing::run_random_workload(classes, {.operations = 20'000, .max_live = 300, .max_bytes = 4 << 20, .max_alignment = 1 << 12});
}

TEST_CASE("stream_ordered: with one stream the policy sees exactly the calls it would see alone")
{
  // The layer must cost no memory. The same random single-stream workload through the bare pool and
  // through the layer: the same addresses, the same upstream calls, the same peak.
  auto run = [](auto&& allocate, auto&& deallocate) {
    std::mt19937_64 rng(7);
    std::vector<std::pair<void*, std::size_t>> live;
    std::vector<void*> addresses;
    for (int step = 0; step < 20'000; ++step) {
      if (live.empty() || (live.size() < 300 && rng() % 2 == 0)) {
        const std::size_t bytes = 1 + rng() % (rng() % 4 == 0 ? (4 << 20) : 8192);
        live.emplace_back(allocate(bytes), bytes);
        addresses.push_back(live.back().first);
      } else {
        const std::size_t i = rng() % live.size();
        deallocate(live[i].first, live[i].second);
        live[i] = live.back();
        live.pop_back();
      }
    }
    for (auto [p, bytes] : live) deallocate(p, bytes);
    return addresses;
  };
  spy<simulated_source> bare_upstream(simulated_source(std::size_t{1} << 34));
  coalescing_pool<ref<spy<simulated_source>>> bare{ref(bare_upstream)};
  const auto bare_addresses = run([&](std::size_t n) { return bare.allocate(n, 256); },
                                  [&](void* p, std::size_t n) { bare.deallocate(p, n, 256); });
  simulated_streams world;
  const cuda::stream_ref s = world.create();
  spy<simulated_source> layered_upstream(simulated_source(std::size_t{1} << 34));
  stream_ordered<coalescing_pool<ref<spy<simulated_source>>>, simulated_events> layer{
    coalescing_pool<ref<spy<simulated_source>>>{ref(layered_upstream)}, {}, simulated_events(world)};
  const auto layered_addresses = run(
    [&](std::size_t n) {
      void* p = layer.allocate_async(n, 256, s);
      world.launch(s);  // work still running on every block when it is freed
      return p;
    },
    [&](void* p, std::size_t n) { layer.deallocate_async(p, n, 256, s); });
  CHECK(layered_addresses.size() > 5000);
  REQUIRE(layered_addresses.size() == bare_addresses.size());
  std::size_t same_place = 0;  // each source reserves its own address range: compare offsets into it
  for (std::size_t i = 0; i < bare_addresses.size(); ++i)
    same_place += static_cast<char*>(layered_addresses[i]) - static_cast<char*>(layered_addresses[0]) ==
                  static_cast<char*>(bare_addresses[i]) - static_cast<char*>(bare_addresses[0]);
  CHECK(same_place == bare_addresses.size());
  CHECK(layered_upstream.allocations() == bare_upstream.allocations());
  CHECK(layer.cached_blocks() == 0);
  CHECK(world.calls().records == 0);
  CHECK(layer.stats().host_waits == 0);
  CHECK(world.calls().host_waits + world.calls().stream_waits + world.calls().device_waits == 0);
}

TEST_CASE("stream_ordered: a route opened while the owner's recent frees are kept waits for them, so its graph never races them")
{
  rig<> r(64 << 20, {.check_capture = false, .reuse_recent_frees = true});
  const cuda::stream_ref a = r.world.create();
  make_owner(r, a);
  r.layer.release();  // every free known complete: the policy is clean
  void* x = r.allocate(4096, a);
  r.world.launch(a);
  r.free(x, 4096, a);  // kept: a's kernel may still be using x
  REQUIRE(r.layer.cached_blocks() == 1);
  r.layer.begin_allocate_to_pool(7);
  CHECK(r.layer.cached_blocks() == 0);
  CHECK(r.world.completed(r.world.id_of(a)) == r.world.enqueued(r.world.id_of(a)));
  r.layer.end_allocate_to_pool(7);
}

TEST_CASE("stream_ordered: another stream waits on the GPU for the owner's frees before taking from the policy")
{
  rig<> r(64 << 20);
  const cuda::stream_ref a = r.world.create(), b = r.world.create();
  make_owner(r, a);
  void* x = r.allocate(4096, a);
  r.world.launch(a);
  r.free(x, 4096, a);  // straight to the policy: a's kernel may still be using x; no other stream yet, no event
  CHECK(r.layer.cached_blocks() == 0);
  CHECK(r.world.calls().records == 0);
  // b is the first other stream: a's frees so far carry no event, and a's handle may be dead by now (it is
  // never touched from another stream's call), so b's first request waits for the device once.
  void* y = r.allocate(4096, b);  // checked: y may overlap x only after the wait
  CHECK(r.layer.stats().device_syncs == 1);
  CHECK(r.world.completed(r.world.id_of(a)) == r.world.enqueued(r.world.id_of(a)));
  // From now on a's frees carry events, and b waits for them on the GPU, never on the host.
  void* x2 = r.allocate(8192, a);
  const std::uint64_t ticket = r.world.launch(a);
  r.free(x2, 8192, a);
  CHECK(r.world.calls().records == 1);
  void* z = r.allocate(8192, b);  // checked: if z overlaps x2, b was made to wait for a
  CHECK(r.world.ordered_after(r.world.id_of(b), r.world.id_of(a)) == ticket);
  CHECK(r.layer.stats().orderings == 1);
  CHECK(r.layer.stats().host_waits == 1);
  // No new frees from a: b's next request needs no new ordering.
  void* z2 = r.allocate(8192, b);
  CHECK(r.layer.stats().orderings == 1);
  // Once a's event is seen complete, nobody needs to wait for those frees.
  r.world.finish(a);
  r.free(r.allocate(512, a), 512, a);
  r.world.finish(a);
  r.layer.deallocate_async(y, 4096, 256, b);
  r.layer.deallocate_async(z, 8192, 256, b);
  r.layer.deallocate_async(z2, 8192, 256, b);
  void* w = r.allocate(100000, b);
  CHECK(r.layer.stats().orderings == 1);  // the newest event was done when queried: no wait needed
  CHECK(r.layer.stats().host_waits == 1);
  CHECK(r.checked_ranges > 0);
  r.free(w, 100000, b);
}

TEST_CASE("stream_ordered: a stream other than the owner reuses its own frees at once; others get them when safe")
{
  simulated_streams world;
  spy<host_source> policy;
  stream_ordered<ref<spy<host_source>>, simulated_events> layer{ref(policy), {}, simulated_events(world)};
  const cuda::stream_ref owner = world.create(), s = world.create(), t = world.create();
  layer.deallocate_async(layer.allocate_async(256, 256, owner), 256, 256, owner);
  void* first = layer.allocate_async(1000, 256, s);
  world.launch(s);  // a kernel still using the block when it is freed
  layer.deallocate_async(first, 1000, 256, s);
  for (int i = 0; i < 100; ++i) {
    void* again = layer.allocate_async(1000, 256, s);
    CHECK(again == first);
    world.launch(s);
    layer.deallocate_async(again, 1000, 256, s);
  }
  CHECK(policy.allocations() == 2);
  CHECK(world.calls().records == 0);  // the owner's free came before another stream: s's first miss waited instead
  CHECK(layer.stats().device_syncs == 1);
  CHECK(layer.stats().orderings == 0);
  CHECK(layer.stats().hits == 100);
  CHECK(layer.cached_bytes() == 1024);
  // t misses: s's block is not safe for t yet, so t gets other memory, and s's miss records an event.
  void* other = layer.allocate_async(1000, 256, t);
  CHECK(other != first);
  CHECK(layer.cached_blocks() == 1);
  // s misses: the owner's frees are done and s has been freeing more, so s becomes the owner and its block goes
  // to the policy (safe for s itself); t then has to wait for s's work before taking from the policy.
  void* s_other = layer.allocate_async(2000, 256, s);
  CHECK(layer.owner() == world.id_of(s));
  CHECK(layer.cached_blocks() == 0);
  void* t_more = layer.allocate_async(3000, 256, t);
  CHECK(world.ordered_after(world.id_of(t), world.id_of(s)) == world.enqueued(world.id_of(s)));
  CHECK(layer.stats().orderings == 1);
  CHECK(layer.stats().host_waits == 1);  // only the one at the first other stream
  for (auto [p, n, on] : {std::tuple{other, 1000, t}, {s_other, 2000, s}, {t_more, 3000, t}}) layer.deallocate_async(p, n, 256, on);
}

TEST_CASE("stream_ordered: a stream that keeps caching blocks it does not reuse records events for them")
{
  rig<true> r(64 << 20);
  const cuda::stream_ref owner = r.world.create(), a = r.world.create();
  make_owner(r, owner);
  std::vector<void*> held;
  for (int i = 0; i < 24; ++i) held.push_back(r.allocate(4096 * (i + 1), a));
  const auto before = r.world.calls().records;
  for (int i = 0; i < 24; ++i) r.free(held[i], 4096 * (i + 1), a);
  CHECK(r.world.calls().records - before == 2);  // after 8 blocks, then after 16 more (twice the 8 cached then)
  // Recording the second saw the first complete (no work was enqueued): its 8 blocks went back.
  CHECK(r.layer.pending_events() == 1);
  CHECK(r.layer.cached_blocks() == 16);
}

TEST_CASE("stream_ordered: a full policy hands a cached block over with a stream wait, not a host wait")
{
  rig<> r(1 << 20, {.frees_per_event = 1});
  const cuda::stream_ref owner = r.world.create(), a = r.world.create(), b = r.world.create();
  make_owner(r, owner);
  r.layer.release();  // the owner's chunk goes back: the device has room for one 1 MiB chunk
  const auto waits = r.layer.stats().host_waits;
  void* x = r.allocate(1 << 20, a);
  const std::uint64_t ticket = r.world.launch(a);
  r.free(x, 1 << 20, a);
  CHECK(r.world.calls().records == 1);
  void* y = r.allocate(1 << 20, b);
  CHECK(y == x);
  CHECK(r.world.ordered_after(r.world.id_of(b), r.world.id_of(a)) == ticket);
  CHECK(r.world.completed(r.world.id_of(a)) < ticket);  // the host never waited
  CHECK(r.layer.stats().handovers == 1);
  CHECK(r.layer.stats().host_waits == waits);
  r.free(y, 1 << 20, b);
}

TEST_CASE("stream_ordered: out of memory with pending frees waits for them and retries once")
{
  rig<> r(1 << 20);
  const cuda::stream_ref owner = r.world.create(), a = r.world.create(), b = r.world.create();
  make_owner(r, owner);
  r.layer.release();
  const auto device_waits = r.world.calls().device_waits;
  const auto host_waits = r.layer.stats().host_waits;
  void* x = r.allocate(512 << 10, a);
  void* x2 = r.allocate(512 << 10, a);
  r.world.launch(a);
  r.free(x, 512 << 10, a);
  r.free(x2, 512 << 10, a);  // no event yet: the frees are uncovered
  void* y = r.allocate(1 << 20, b);  // a different shape: only the merged chunk fits
  CHECK(y != nullptr);
  CHECK(r.world.calls().device_waits == device_waits + 1);
  CHECK(r.layer.stats().host_waits == host_waits + 1);
  // Nothing cached now and the device full: out_of_memory from the policy, the layer still usable.
  CHECK_THROWS_AS(r.allocate(1 << 20, a), out_of_memory);
  r.free(y, 1 << 20, b);
  r.world.finish(b);
  void* again = r.allocate(1 << 20, a);
  CHECK(again != nullptr);
  r.free(again, 1 << 20, a);
}

TEST_CASE("stream_ordered: a new stream with a destroyed stream's handle does not inherit its blocks")
{
  rig<> r(64 << 20);
  const cuda::stream_ref owner = r.world.create();
  make_owner(r, owner);
  const cuda::stream_ref old_stream = r.world.create();
  const std::uint64_t old_id = r.world.id_of(old_stream);
  void* x = r.allocate(4096, old_stream);
  r.world.launch(old_stream);
  r.free(x, 4096, old_stream);
  r.world.destroy(old_stream);
  const cuda::stream_ref reused = r.world.create();
  REQUIRE(reused.get() == old_stream.get());  // the same handle, a different stream
  void* y = r.allocate(4096, reused);
  CHECK(y != x);
  r.world.finish_id(old_id);  // the destroyed stream's work completes; its blocks can now be reclaimed
  r.free(y, 4096, reused);
  r.layer.release();
  CHECK(r.layer.cached_blocks() == 0);
  CHECK(r.layer.streams_tracked() <= 3);
}

TEST_CASE("stream_ordered: a free on the lone owner's handle, now another device's stream, is ordered before a synchronous allocate")
{
  // The handle a destroyed owner had names a new stream of another device at once; a free on it is that
  // stream's, whose work a wait for the owner's devices would not cover.
  for (const bool check_capture : {true, false}) {
    typename checked_layer<false>::options opts{};
    opts.check_capture = check_capture;
    rig<> r(64 << 20, opts);
    const cuda::stream_ref owner = r.world.create(0);
    make_owner(r, owner);
    void* x = r.allocate(4096, owner);
    r.world.finish_all();
    r.world.destroy(owner);
    const cuda::stream_ref reused = r.world.create(1);
    REQUIRE(reused.get() == owner.get());
    r.world.launch(reused);  // x's last use, on device 1
    r.free(x, 4096, reused);
    void* y = r.allocate_sync(4096);  // check_handout: x's memory only once that work completed
    CHECK(r.checked_ranges >= 1);
    r.free_sync(y, 4096, {reused});
  }
}

TEST_CASE("stream_ordered: a destroyed owner's frees are waited for on the device before another stream takes them")
{
  rig<> r(64 << 20);
  const cuda::stream_ref owner = r.world.create(), b = r.world.create();
  make_owner(r, owner);
  void* x = r.allocate(4096, owner);
  r.world.launch(owner);
  r.free(x, 4096, owner);
  r.world.destroy(owner);
  const cuda::stream_ref reused = r.world.create();  // owner's handle, another stream: no event may go there
  REQUIRE(reused.get() == owner.get());
  void* y = r.allocate(4096, b);
  CHECK(r.world.calls().records == 0);
  CHECK(r.layer.stats().device_syncs >= 1);
  CHECK(r.layer.owner() != std::optional<std::uint64_t>(r.world.id_of(reused)));
  r.free(y, 4096, b);
}

TEST_CASE("stream_ordered: a synchronous allocate gets a block no work is still using")
{
  rig<> r(64 << 20);
  const cuda::stream_ref legacy = simulated_streams::legacy();
  void* p = r.allocate(5000, legacy);
  r.world.launch(legacy);
  r.free(p, 5000, legacy);  // legacy owns the policy: p goes straight back
  void* q = r.allocate_sync(5000);  // checked: ready for the host
  CHECK(r.layer.stats().event_syncs + r.layer.stats().device_syncs == 1);  // one host wait (no event covers p)
  CHECK(r.world.completed(0) == r.world.enqueued(0));
  r.layer.deallocate(q, 5000, 256);
  // Cached on a stream that is not the owner: a reuse waits for that stream.
  rig<> other(64 << 20);
  make_owner(other, other.world.create());
  void* c = other.allocate(7000, legacy);
  other.world.launch(legacy);
  other.free(c, 7000, legacy);
  void* d = other.allocate_sync(7000);
  CHECK(d == c);
  CHECK(other.layer.stats().stream_syncs == 1);
  other.layer.deallocate(d, 7000, 256);
}

TEST_CASE("stream_ordered: a synchronous free is safe for work on any stream, as cudaFree is")
{
  rig<true> r(64 << 20, {.sync_frees_per_wait = 4});
  const cuda::stream_ref non_blocking = r.world.create(), other = r.world.create();
  const std::vector<cuda::stream_ref> all{simulated_streams::legacy(), non_blocking, other};
  void* p = r.allocate_sync(1 << 16);
  r.world.launch(non_blocking);  // a slow kernel on a non-blocking stream uses p
  r.free_sync(p, 1 << 16, all);
  CHECK(r.layer.set_aside_blocks() == 1);
  // The next allocations, synchronous or on any stream, must not get p while that kernel runs (checked).
  void* q = r.allocate_sync(1 << 16);
  void* s = r.allocate(1 << 16, simulated_streams::legacy());
  void* t = r.allocate(1 << 16, other);
  CHECK((q != p && s != p && t != p));
  CHECK(r.layer.stats().host_waits == 0);
  // A batch of set-aside frees is returned behind one wait per device.
  for (void* b : {q, s, t}) r.free_sync(b, 1 << 16, all);
  CHECK(r.layer.set_aside_blocks() == 0);
  CHECK(r.layer.stats().device_syncs == 1);
  CHECK(r.world.completed(r.world.id_of(non_blocking)) == r.world.enqueued(r.world.id_of(non_blocking)));
  void* again = r.allocate_sync(1 << 16);  // now p may come back
  r.free_sync(again, 1 << 16, all);
  // When the policy would grow, set-aside frees are waited for first: a whole 1 MiB chunk set aside is reused.
  void* whole = r.allocate_sync(1 << 20);
  r.free_sync(whole, 1 << 20, all);
  const std::size_t chunks = r.upstream.allocations();
  const auto device_syncs = r.layer.stats().device_syncs;
  void* big = r.allocate(1 << 20, other);
  CHECK(big == whole);
  CHECK(r.upstream.allocations() == chunks);
  CHECK(r.layer.stats().device_syncs == device_syncs + 1);
  r.free(big, 1 << 20, other);
}

TEST_CASE("stream_ordered: the device-wide wait covers every device whose streams used the layer")
{
  rig<> r(64 << 20, {.sync_frees_per_wait = 1});
  const cuda::stream_ref on_zero = r.world.create(0), on_one = r.world.create(1);
  r.free(r.allocate(4096, on_zero), 4096, on_zero);
  void* p = r.allocate(4096, on_one);  // the first other stream: one wait for on_zero's earlier frees
  r.world.launch(on_one);
  const std::size_t earlier = r.world.device_waits().size();
  r.layer.deallocate(p, 4096, 256);
  auto waited = std::vector<int>(r.world.device_waits().begin() + static_cast<std::ptrdiff_t>(earlier), r.world.device_waits().end());
  std::sort(waited.begin(), waited.end());
  CHECK(waited == std::vector<int>{0, 1});
  CHECK(r.world.completed(r.world.id_of(on_one)) == r.world.enqueued(r.world.id_of(on_one)));
}

TEST_CASE("stream_ordered: events are made on their stream's device, whichever device is current")
{
  // The world refuses an event of one device recorded on another device's stream, as cudaEventRecord does.
  rig<> r(64 << 20, {.frees_per_event = 1});
  const cuda::stream_ref on_zero = r.world.create(0), on_one = r.world.create(1), on_two = r.world.create(2);
  make_owner(r, on_zero);
  for (int round = 0; round < 20; ++round)
    for (auto s : {on_one, on_two, on_zero}) {
      void* p = r.allocate(4096 + 256 * static_cast<std::size_t>(round % 3), s);
      r.world.launch(s);
      r.free(p, 4096 + 256 * static_cast<std::size_t>(round % 3), s);
    }
  r.world.set_current_device(1);
  for (auto s : {on_two, on_zero}) r.free(r.allocate(8192, s), 8192, s);
  CHECK(r.layer.stats().events > 20);
  CHECK(r.world.calls().records == r.layer.stats().events);  // every record on all three devices' streams held
  r.world.finish_all();
  r.layer.release();
  CHECK(r.layer.cached_blocks() == 0);
}

TEST_CASE("stream_ordered: with graph pools off, graph capture is refused clearly and leaves the layer usable")
{
  rig<> r(64 << 20, {.graph_pools = false});  // private pools: tests/detail/stream/test_graph_router.cpp
  const cuda::stream_ref owner = r.world.create(), s = r.world.create();
  make_owner(r, owner);
  void* before = r.allocate(4096, s);
  r.world.launch(s);
  r.free(before, 4096, s);
  const auto waits_before = r.world.calls().host_waits + r.world.calls().stream_waits + r.world.calls().device_waits;
  r.world.begin_capture(s);
  CHECK_THROWS_WITH_AS(r.allocate(1 << 16, s), doctest::Contains("captured into a CUDA graph"), usage_error);
  void* live = r.allocate(4096, owner);
  r.layer.deallocate_async(live, 4096, 256, s);  // a free inside the capture: the graph may use it any time later
  CHECK(r.layer.stats().abandoned_blocks == 1);
  // A synchronous allocate would have to wait on the host: refused, not attempted.
  for (int i = 0; i < 8; ++i) r.free(r.allocate(100 + 512 * i, owner), 100 + 512 * i, owner);
  CHECK_THROWS_AS(r.allocate_sync(1 << 16), usage_error);
  CHECK_THROWS_AS(r.layer.release(), usage_error);
  // (the world itself fails any event recorded or host wait made while s captures)
  CHECK(r.world.calls().host_waits + r.world.calls().stream_waits + r.world.calls().device_waits == waits_before);
  r.world.end_capture(s);
  void* after = r.allocate(1 << 16, s);
  r.free(after, 1 << 16, s);
  r.layer.release();
  CHECK(r.layer.cached_blocks() == 0);
}

TEST_CASE("stream_ordered: stats count every host wait the backend made")
{
  rig<> r(1 << 20, {.sync_frees_per_wait = 2});
  const cuda::stream_ref a = r.world.create(), b = r.world.create();
  make_owner(r, a);
  for (int i = 0; i < 50; ++i) {
    void* p = r.allocate(4096 * (1 + i % 5), i % 3 == 0 ? b : a);
    r.world.launch(a);
    if (i % 4 == 0) r.free_sync(p, 4096 * (1 + i % 5), {simulated_streams::legacy(), a, b});
    else r.free(p, 4096 * (1 + i % 5), i % 2 == 0 ? a : b);
    void* q = r.allocate_sync(8192 + 256 * i);
    r.free_sync(q, 8192 + 256 * i, {simulated_streams::legacy(), a, b});
  }
  r.layer.release();
  const auto& st = r.layer.stats();
  CHECK(st.host_waits > 0);
  CHECK(st.host_waits == st.event_syncs + st.stream_syncs + st.device_syncs);
  CHECK(st.event_syncs == r.world.calls().host_waits);
  CHECK(st.stream_syncs == r.world.calls().stream_waits);
  CHECK(st.device_syncs == r.world.calls().device_waits);
}

TEST_CASE("stream_ordered: a per-thread default stream's identified_stream used on another thread is looked up again")
{
  rig<> r(64 << 20);
  const identified_stream mine = r.world.identify(cuda::stream_ref{cudaStreamPerThread});
  CHECK(mine.bound_thread() == std::this_thread::get_id());
  make_owner(r, r.world.create());
  std::uint64_t theirs = 0;
  void* p = nullptr;
  std::thread([&] {
    theirs = r.world.id_of(cuda::stream_ref{cudaStreamPerThread});
    CHECK(!mine.valid_here());
    p = r.layer.allocate_async(4096, 256, mine);  // on this thread, cudaStreamPerThread is this thread's stream
    r.world.launch(cuda::stream_ref{cudaStreamPerThread});
    r.layer.deallocate_async(p, 4096, 256, mine);
  }).join();
  CHECK(theirs != mine.id());
  // Filed under the other thread's stream: this thread's per-thread stream must not take it in stream order.
  void* q = r.layer.allocate_async(4096, 256, mine);
  CHECK(q != p);
  CHECK(r.layer.stats().hits == 0);
  r.layer.deallocate_async(q, 4096, 256, mine);
}

TEST_CASE("stream_ordered: bad arguments are clear exceptions and change nothing")
{
  simulated_streams world;
  spy<host_source> policy;
  stream_ordered<ref<spy<host_source>>, simulated_events> layer{ref(policy), {}, simulated_events(world)};
  const cuda::stream_ref s = world.create();
  CHECK_THROWS_WITH_AS(layer.allocate_async(100, 3, s), doctest::Contains("stream_ordered: alignment 3"), std::invalid_argument);
  CHECK_THROWS_AS(layer.allocate_async(100, 256, cuda::stream_ref{reinterpret_cast<cudaStream_t>(0x999)}), std::invalid_argument);
  CHECK(layer.allocate_async(0, 256, s) == nullptr);
  layer.deallocate_async(nullptr, 0, 256, s);
  CHECK(policy.allocations() == 0);
  CHECK_THROWS_AS((stream_ordered<host_source, simulated_events>{{}, {.frees_per_event = 0}, simulated_events(world)}),
                  std::invalid_argument);
  CHECK_THROWS_AS((stream_ordered<host_source, simulated_events>{{}, {.sync_frees_per_wait = 0}, simulated_events(world)}),
                  std::invalid_argument);
  // A free on a stream the backend does not know: the layer waits for the device and returns it directly.
  void* p = layer.allocate_async(100, 256, s);
  layer.deallocate_async(p, 100, 256, cuda::stream_ref{reinterpret_cast<cudaStream_t>(0x999)});
  CHECK(policy.outstanding_blocks() == 0);
  CHECK(world.calls().device_waits == 1);
}

TEST_CASE("stream_ordered: moving hands over the cached blocks, events and ownership")
{
  simulated_streams world;
  spy<host_source> policy;
  {
    stream_ordered<ref<spy<host_source>>, simulated_events> first{ref(policy), {.frees_per_event = 1}, simulated_events(world)};
    const cuda::stream_ref owner = world.create(), s = world.create();
    first.deallocate_async(first.allocate_async(256, 256, owner), 256, 256, owner);
    void* p = first.allocate_async(1000, 256, s);
    world.launch(s);
    first.deallocate_async(p, 1000, 256, s);
    auto second = std::move(first);
    CHECK(first.cached_blocks() == 0);
    CHECK(!first.owner());
    CHECK(second.cached_blocks() == 1);
    CHECK(second.pending_events() == 1);
    CHECK(second.owner() == world.id_of(owner));
    CHECK(second.allocate_async(1000, 256, s) == p);
    second.deallocate_async(p, 1000, 256, s);
    // The moved-from layer is empty and usable.
    void* fresh = first.allocate_async(500, 256, s);
    first.deallocate_async(fresh, 500, 256, s);
  }
  CHECK(policy.outstanding_blocks() == 0);
  CHECK(policy.mismatches() == 0);
  CHECK(world.live_events() == 0);
}

TEST_CASE("stream_ordered: randomized streams, frees and completions keep every invariant")
{
  auto run = [](auto& r, std::size_t frees_per_event) {
    std::mt19937_64 rng(frees_per_event);
    std::uniform_int_distribution<int> percent(0, 99);
    const std::size_t shapes[] = {256, 1000, 4096, 65536, 300000, 1 << 20};
    std::vector<cuda::stream_ref> streams{simulated_streams::legacy(), r.world.create(), r.world.create()};
    std::vector<std::uint64_t> ids;  // of every stream ever created, to let destroyed ones finish
    for (auto s : streams) ids.push_back(r.world.id_of(s));
    struct block {
      void* p;
      std::size_t bytes;
      std::size_t stream;
    };
    std::vector<block> live;
    testing::live_set overlap;
    std::size_t refusals = 0, served = 0;
    auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
    for (int step = 0; step < 20'000; ++step) {
      const int what = percent(rng);
      if (what < 40 && live.size() < 200) {
        const std::size_t si = pick(streams.size());
        const std::size_t bytes = percent(rng) < 80 ? shapes[pick(6)] : 1 + pick(2 << 20);
        const bool sync = percent(rng) < 5;
        void* p = nullptr;
        try {
          p = sync ? r.allocate_sync(bytes) : r.allocate(bytes, streams[si]);
        } catch (const out_of_memory&) {
          ++refusals;
          continue;
        }
        ++served;
        REQUIRE(is_aligned(p, 256));
        REQUIRE(overlap.add({p, bytes, 256}));
        live.push_back({p, bytes, sync ? 0 : si});
      } else if (what < 80 && !live.empty()) {
        const std::size_t i = pick(live.size());
        const block b = live[i];
        live[i] = live.back();
        live.pop_back();
        REQUIRE(overlap.remove(b.p));
        // Mostly freed on the allocating stream, sometimes on another (the user ordered them), sometimes
        // synchronously (after work on any stream).
        const int how = percent(rng);
        if (how < 5) r.free_sync(b.p, b.bytes, streams);
        else r.free(b.p, b.bytes, streams[how < 80 ? b.stream : pick(streams.size())]);
      } else if (what < 90) {
        r.world.launch(streams[pick(streams.size())]);
      } else if (what < 96) {
        r.world.finish_id(ids[pick(ids.size())]);
      } else if (what < 98 && streams.size() > 2) {
        // Destroy a stream (never the default one): its blocks move to others first.
        const std::size_t si = 1 + pick(streams.size() - 1);
        for (auto& b : live)
          if (b.stream == si) b.stream = 0;
          else if (b.stream == streams.size() - 1) b.stream = si;
        r.world.destroy(streams[si]);
        streams[si] = streams.back();
        streams.pop_back();
      } else if (streams.size() < 6) {
        streams.push_back(r.world.create());
        ids.push_back(r.world.id_of(streams.back()));
      }
      // Accounting: the policy's live bytes are the user's plus the layer's cache and set-aside frees, exactly.
      std::size_t user_bytes = 0;
      for (const auto& b : live) user_bytes += r.layer.good_size(b.bytes, 256);
      REQUIRE(r.layer.usage().in_use == user_bytes);
    }
    MESSAGE("served " << served << ", refusals: " << refusals << ", hits " << r.layer.stats().hits << ", misses "
                      << r.layer.stats().misses << ", handovers " << r.layer.stats().handovers << ", orderings "
                      << r.layer.stats().orderings << ", host waits " << r.layer.stats().host_waits);
    CHECK(served > 5000);
    CHECK(refusals < served / 10);
    CHECK(r.layer.stats().hits > 200);
    CHECK(r.layer.stats().orderings > 10);
    CHECK(r.checked_ranges > 1000);
    for (const auto& b : live) r.free(b.p, b.bytes, streams[b.stream]);
    r.layer.release();
    CHECK(r.layer.cached_blocks() == 0);
    CHECK(r.layer.set_aside_blocks() == 0);
    CHECK(r.layer.policy().policy_.usage().in_use == 0);
    r.layer.policy().policy_.release();
    CHECK(r.upstream.outstanding_bytes() == 0);
    CHECK(r.upstream.mismatches() == 0);
  };
  for (const std::size_t frees_per_event : {std::size_t{1}, std::size_t{8}}) {
    CAPTURE(frees_per_event);
    rig<false> hands_back_eagerly(24 << 20, {.frees_per_event = frees_per_event});
    run(hands_back_eagerly, frees_per_event);
    rig<true> hands_back_when_needed(24 << 20, {.frees_per_event = frees_per_event});
    run(hands_back_when_needed, frees_per_event);
  }
}

TEST_CASE("stream_ordered: captures announced, one stream alone for a while, then joined, destroyed and reborn: every hand-out safe")
{
  // The lone owner's short path (no capture looked for) runs until other streams come; a destroyed stream's
  // handle comes back for a new stream, the owner's included.
  for (const auto& [identified, recent] : {std::pair{true, false}, std::pair{false, false}, std::pair{true, true}, std::pair{false, true}}) {
    CAPTURE(identified);
    CAPTURE(recent);
    rig<true> r(24 << 20, {.check_capture = false, .reuse_recent_frees = recent});
    std::mt19937_64 rng(identified ? 11 : 12);
    std::uniform_int_distribution<int> percent(0, 99);
    auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
    const std::size_t shapes[] = {256, 1000, 4096, 65536, 300000, 1 << 20};
    std::vector<identified_stream> streams{r.world.identify(r.world.create())};
    struct block {
      void* p;
      std::size_t bytes;
      std::size_t stream;
    };
    std::vector<block> live;
    std::size_t served = 0, reborn = 0;
    auto allocate = [&](std::size_t bytes, const identified_stream& s) { return identified ? r.allocate(bytes, s) : r.allocate(bytes, s.stream()); };
    auto free = [&](const block& b, const identified_stream& s) { identified ? r.free(b.p, b.bytes, s) : r.free(b.p, b.bytes, s.stream()); };
    for (int step = 0; step < 20'000; ++step) {
      if (step == 3'000) {  // alone so far: nothing cached but its recent frees, no event, no capture query, an id only for a plain handle
        CHECK((r.layer.stats().hits > 0) == recent);
        CHECK(r.world.calls().records == 0);
        CHECK(r.world.capture_queries() == 0);
        CHECK((r.world.id_queries() == 0) == identified);
      }
      const int what = percent(rng);
      if (what < 45 && live.size() < 200) {
        const std::size_t si = pick(streams.size());
        const std::size_t bytes = percent(rng) < 80 ? shapes[pick(6)] : 1 + pick(2 << 20);
        void* p = nullptr;
        try {
          p = allocate(bytes, streams[si]);
        } catch (const out_of_memory&) {
          continue;
        }
        ++served;
        live.push_back({p, bytes, si});
      } else if (what < 88 && !live.empty()) {
        const std::size_t i = pick(live.size());
        const block b = live[i];
        live[i] = live.back();
        live.pop_back();
        free(b, streams[percent(rng) < 90 ? b.stream : pick(streams.size())]);
      } else if (what < 94) {
        r.world.launch(streams[pick(streams.size())].stream());
      } else if (what < 97) {
        r.world.finish_id(streams[pick(streams.size())].id());
      } else if (what < 98 && step >= 3'000) {  // the first steps: one stream alone
        // Reborn: the stream is destroyed, its work still running, and the next stream gets its handle; the
        // user hands its live blocks to the new stream.
        const std::size_t si = pick(streams.size());
        r.world.destroy(streams[si].stream());
        const identified_stream fresh = r.world.identify(r.world.create());
        REQUIRE(fresh.stream().get() == streams[si].stream().get());
        streams[si] = fresh;
        ++reborn;
      } else if (step >= 6'000 && streams.size() < 4) {
        streams.push_back(r.world.identify(r.world.create()));
      }
      std::size_t user_bytes = 0;
      for (const auto& b : live) user_bytes += r.layer.good_size(b.bytes, 256);
      REQUIRE(r.layer.usage().in_use == user_bytes);
    }
    CHECK(served > 5000);
    CHECK(reborn > 10);
    CHECK(streams.size() > 1);
    CHECK(r.checked_ranges > 1000);
    CHECK(r.world.dead_stream_queries() == 0);
    for (const auto& b : live) free(b, streams[b.stream]);
    r.world.finish_all();
    r.layer.release();
    CHECK(r.layer.cached_blocks() == 0);
    CHECK(r.layer.policy().policy_.usage().in_use == 0);
  }
}

TEST_CASE("checked over stream_ordered: streams compared by id, a bounded free record, misuse never terminates")
{
  simulated_streams world;
  using so = stream_ordered<coalescing_pool<host_source>, simulated_events>;
  checked<so> r{so{coalescing_pool<host_source>{}, {}, simulated_events(world)}, {.remembered_frees = 4}};
  // Handle 0 and cudaStreamLegacy are one stream: no false report.
  void* p = r.allocate_async(4096, 256, cuda::stream_ref{cudaStream_t{}});
  r.deallocate_async(p, 4096, 256, cuda::stream_ref{cudaStreamLegacy});
  // A destroyed stream's handle reused by a new stream is another stream: the free there is reported.
  const cuda::stream_ref old_stream = world.create();
  void* q = r.allocate_async(4096, 256, old_stream);
  world.destroy(old_stream);
  const cuda::stream_ref reused = world.create();
  REQUIRE(reused.get() == old_stream.get());
  CHECK_THROWS_WITH_AS(r.deallocate_async(q, 4096, 256, reused), doctest::Contains("never recorded as used there"), usage_error);
  r.record_use(q, reused);
  r.deallocate_async(q, 4096, 256, reused);
  // Misuse through the CCCL 3.1 name throws like deallocate (it used to call std::terminate).
  void* a = r.allocate_sync(1000, 256);
  CHECK_THROWS_WITH_AS(r.deallocate_sync(a, 999, 256), doctest::Contains("freed with 999 bytes"), usage_error);
  // Alignments that are no alignment at all are reported, even for a block allocated with <= 256.
  CHECK_THROWS_WITH_AS(r.deallocate_sync(a, 1000, 0), doctest::Contains("alignment 0, not a power of two"), usage_error);
  CHECK_THROWS_WITH_AS(r.deallocate(a, 1000, 3), doctest::Contains("alignment 3, not a power of two"), usage_error);
  r.deallocate_sync(a, 1000, 256);
  CHECK_THROWS_WITH_AS(r.deallocate_sync(a, 1000, 256), doctest::Contains("double free"), usage_error);
  // The freed-address record is bounded: the oldest frees are forgotten first.
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(r.allocate(512 * (i + 1), 256));
  for (int i = 0; i < 10; ++i) r.deallocate(blocks[i], 512 * (i + 1), 256);
  CHECK(r.remembered_frees() == 4);
  CHECK_THROWS_WITH_AS(r.deallocate(blocks[9], 5120, 256), doctest::Contains("double free"), usage_error);
  CHECK_THROWS_WITH_AS(r.deallocate(blocks[0], 512, 256), doctest::Contains("never handed out"), usage_error);
  CHECK(r.outstanding() == 0);
}
