// stream_ordered's ownership of its policy (detail::stream_ordered_impl, "Ownership of the policy"): which
// stream's frees go straight to the policy, and how the owner's frees are covered by events (one per free,
// none past owner_cover_window, or one on demand for a permanent owner) before another stream takes from the
// policy.
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

// stream_ordered's options::owner_cover_window: without it, once a side stream has shared the layer, every free
// of the main stream records an event. Past the window of owner frees
// that no other stream needed, owner frees carry no event; the next stream to need them waits for the device
// once, then events resume. The default (SIZE_MAX) keeps an event after every owner free.
namespace owner_cover_window_tests {

namespace {

using pool_t = coalescing_pool<ref<simulated_source>>;
using layer_t = stream_ordered<pool_t, simulated_events>;

struct rig {
  explicit rig(std::size_t window)
      : memory(std::size_t{64} << 20), layer(pool_t{ref<simulated_source>(memory), {.initial_chunk = 1 << 20, .max_chunk = 1 << 20}},
                                             options(window), simulated_events(world))
  {
    // a owns the layer (its frees go straight to the policy); b shares it.
    layer.deallocate_async(layer.allocate_async(4096, 256, a), 4096, 256, a);
    layer.deallocate_async(layer.allocate_async(4096, 256, b), 4096, 256, b);
  }
  static layer_t::options options(std::size_t window)
  {
    layer_t::options o;
    o.owner_cover_window = window;
    return o;
  }
  /// n owner allocations and frees, each used by unfinished work on a; returns the events recorded meanwhile.
  std::uint64_t owner_frees(int n)
  {
    const std::uint64_t before = layer.stats().events;
    for (int i = 0; i < n; ++i) {
      void* p = layer.allocate_async(8192, 256, a);
      world.launch(a);
      layer.deallocate_async(p, 8192, 256, a);
    }
    return layer.stats().events - before;
  }
  simulated_streams world;
  simulated_source memory;
  layer_t layer;
  cuda::stream_ref a = world.create(), b = world.create();
};

} // namespace

TEST_CASE("owner_cover_window: by default every owner free carries an event, and another stream waits on the GPU")
{
  rig r(SIZE_MAX);
  CHECK(r.owner_frees(10) == 10);
  const auto syncs = r.layer.stats().device_syncs, orderings = r.layer.stats().orderings;
  void* q = r.layer.allocate_async(65536, 256, r.b);  // a miss: the policy holds a's unfinished frees
  CHECK(r.layer.stats().orderings == orderings + 1);
  CHECK(r.layer.stats().device_syncs == syncs);
  r.layer.deallocate_async(q, 65536, 256, r.b);
}

TEST_CASE("owner_cover_window: past the window owner frees carry no event; the next taker waits for the device once")
{
  rig r(4);
  CHECK(r.owner_frees(10) == 4);  // the window, then none
  CHECK(r.world.completed(r.world.id_of(r.a)) < r.world.enqueued(r.world.id_of(r.a)));  // a's work still runs
  const auto syncs = r.layer.stats().device_syncs, orderings = r.layer.stats().orderings;
  void* q = r.layer.allocate_async(65536, 256, r.b);
  CHECK(r.layer.stats().device_syncs == syncs + 1);  // uncovered frees: the device was waited for
  CHECK(r.layer.stats().orderings == orderings);
  CHECK(r.world.completed(r.world.id_of(r.a)) == r.world.enqueued(r.world.id_of(r.a)));  // so nothing b gets is in use
  r.layer.deallocate_async(q, 65536, 256, r.b);

  // Needed once: the owner's frees carry events again for a window.
  CHECK(r.owner_frees(3) == 3);
  const auto orderings2 = r.layer.stats().orderings, syncs2 = r.layer.stats().device_syncs;
  void* q2 = r.layer.allocate_async(131072, 256, r.b);
  CHECK(r.layer.stats().orderings == orderings2 + 1);  // covered: a GPU-side wait, no host wait
  CHECK(r.layer.stats().device_syncs == syncs2);
  r.layer.deallocate_async(q2, 131072, 256, r.b);
}

TEST_CASE("owner_cover_window: while a route announces a capture, owner frees keep their events")
{
  rig r(4);
  r.layer.begin_allocate_to_pool(7, [](cudaStream_t) { return false; });  // routes nothing, announces a capture
  CHECK(r.owner_frees(10) == 10);
  r.layer.end_allocate_to_pool(7);
  r.layer.release_pool(7);
}

} // namespace owner_cover_window_tests

// stream_ordered with a permanent owner (the legacy default stream, whose handle never dies): its frees carry
// no event; a stream that needs them records one on the owner at that moment and waits for it on the GPU.
// Why (docs/memory.md): on the two-stream ViT trace the owner recorded an event after every free for a side
// stream that rarely took from the policy.
namespace owner_on_demand_tests {

namespace {

using pool_t = coalescing_pool<ref<simulated_source>>;
using layer_t = stream_ordered<pool_t, simulated_events>;

static_assert(permanent_stream_backend<simulated_events> && permanent_stream_backend<cuda_events>);
static_assert(event_backend<simulated_events>);

/// An event backend without the capability: everything but permanent/record_on.
struct plain_events {
  using event = simulated_events::event;
  simulated_events inner;
  std::uint64_t id_of(cuda::stream_ref s) const { return inner.id_of(s); }
  event make_event() { return inner.make_event(); }
  void destroy_event(event e) const noexcept { inner.destroy_event(e); }
  void record(event e, cuda::stream_ref s) { inner.record(e, s); }
  bool done(event e) { return inner.done(e); }
  void wait_host(event e) { inner.wait_host(e); }
  void order_after(cuda::stream_ref s, event e) { inner.order_after(s, e); }
  void wait_stream(cuda::stream_ref s) { inner.wait_stream(s); }
  void wait_device(int d) { inner.wait_device(d); }
  int device_of(cuda::stream_ref s) const { return inner.device_of(s); }
  bool capturing(cuda::stream_ref s) const { return inner.capturing(s); }
};
static_assert(event_backend<plain_events> && !permanent_stream_backend<plain_events>);

/// The legacy stream `l` owns the layer (it frees first); stream `b` shares it. Every block b takes is checked
/// against the owner's frees it overlaps: each must be complete or ordered before b's later work.
template <class Backend>
struct rig {
  rig()
      : memory(std::size_t{64} << 20),
        layer(pool_t_for{ref<simulated_source>(memory), {.initial_chunk = 1 << 20, .max_chunk = 1 << 20}}, {}, make_backend())
  {
    layer.deallocate_async(layer.allocate_async(4096, 256, l), 4096, 256, l);
    layer.deallocate_async(layer.allocate_async(4096, 256, b), 4096, 256, b);
    REQUIRE(layer.owner() == world.id_of(l));
  }
  using pool_t_for = pool_t;
  Backend make_backend()
  {
    if constexpr (std::is_same_v<Backend, simulated_events>) return simulated_events(world);
    else return Backend{simulated_events(world)};
  }
  /// n owner allocations and frees, each used by unfinished work on l; returns the events recorded meanwhile.
  std::uint64_t owner_frees(int n)
  {
    const std::uint64_t before = layer.stats().events;
    for (int i = 0; i < n; ++i) {
      void* p = layer.allocate_async(block, 256, l);
      world.launch(l);
      freed[reinterpret_cast<std::uintptr_t>(p)] = world.enqueued(world.id_of(l));
      layer.deallocate_async(p, block, 256, l);
    }
    return layer.stats().events - before;
  }
  /// b's allocation, checked against every owner free it overlaps.
  void* take(std::size_t bytes)
  {
    void* q = layer.allocate_async(bytes, 256, b);
    const auto begin = reinterpret_cast<std::uintptr_t>(q);
    const std::uint64_t lid = world.id_of(l), bid = world.id_of(b);
    for (const auto& [start, ticket] : freed)
      if (start < begin + bytes && begin < start + block) {
        CHECK((world.completed(lid) >= ticket || world.ordered_after(bid, lid) >= ticket));
        ++checked;
      }
    return q;
  }
  static constexpr std::size_t block = 8192;
  simulated_streams world;
  simulated_source memory;
  stream_ordered<pool_t, Backend> layer;
  cuda::stream_ref l = simulated_streams::legacy(), b = world.create();
  std::map<std::uintptr_t, std::uint64_t> freed;
  int checked = 0;
};

} // namespace

TEST_CASE("stream_ordered: a legacy-stream owner's frees carry no event; a taker records one then and waits on the GPU")
{
  rig<simulated_events> r;
  CHECK(r.owner_frees(10) == 0);
  CHECK(r.world.completed(r.world.id_of(r.l)) < r.world.enqueued(r.world.id_of(r.l)));  // l's work still runs
  const auto before = r.layer.stats();
  const auto records = r.world.calls().records;
  void* q = r.take(65536);  // a miss: the policy holds l's unfinished frees, merged
  CHECK(r.checked > 0);
  CHECK(r.layer.stats().orderings == before.orderings + 1);  // b waits on the GPU...
  CHECK(r.world.calls().records == records + 1);             // ...for one event recorded now, on l
  CHECK(r.layer.stats().host_waits == before.host_waits);    // and the host waited for nothing
  CHECK(r.world.completed(r.world.id_of(r.l)) < r.world.enqueued(r.world.id_of(r.l)));
  r.layer.deallocate_async(q, 65536, 256, r.b);

  // Later owner frees are again covered only when needed: one more event for the next take.
  CHECK(r.owner_frees(5) == 0);
  void* q2 = r.take(131072);
  CHECK(r.layer.stats().events == before.events + 2);
  CHECK(r.layer.stats().host_waits == before.host_waits);
  r.layer.deallocate_async(q2, 131072, 256, r.b);
}

TEST_CASE("stream_ordered: a created-stream owner's frees still carry their events (its handle may die)")
{
  simulated_streams world;
  simulated_source memory(std::size_t{64} << 20);
  stream_ordered<pool_t, simulated_events> layer(pool_t{ref<simulated_source>(memory), {.initial_chunk = 1 << 20, .max_chunk = 1 << 20}},
                                                 {}, simulated_events(world));
  const cuda::stream_ref a = world.create(), b = world.create();
  layer.deallocate_async(layer.allocate_async(4096, 256, a), 4096, 256, a);
  layer.deallocate_async(layer.allocate_async(4096, 256, b), 4096, 256, b);
  const auto events = layer.stats().events;
  for (int i = 0; i < 6; ++i) {
    void* p = layer.allocate_async(8192, 256, a);
    world.launch(a);
    layer.deallocate_async(p, 8192, 256, a);
  }
  CHECK(layer.stats().events == events + 6);
}

TEST_CASE("stream_ordered: without the backend capability a legacy owner's frees carry events")
{
  rig<plain_events> r;
  CHECK(r.owner_frees(7) == 7);
  const auto orderings = r.layer.stats().orderings, host_waits = r.layer.stats().host_waits;
  void* q = r.take(65536);
  CHECK(r.checked > 0);
  CHECK(r.layer.stats().orderings == orderings + 1);
  CHECK(r.layer.stats().host_waits == host_waits);
  r.layer.deallocate_async(q, 65536, 256, r.b);
}

TEST_CASE("stream_ordered: while a route announces a capture, a legacy owner's frees carry their events")
{
  rig<simulated_events> r;
  r.layer.begin_allocate_to_pool(7, [](cudaStream_t) { return false; });  // routes nothing, announces a capture
  CHECK(r.owner_frees(6) == 6);
  r.layer.end_allocate_to_pool(7);
  r.layer.release_pool(7);
  CHECK(r.owner_frees(6) == 0);  // the route gone: on demand again
  void* q = r.take(65536);
  CHECK(r.checked > 0);
  r.layer.deallocate_async(q, 65536, 256, r.b);
}

} // namespace owner_on_demand_tests
