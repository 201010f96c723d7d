// stream_ordered's options::owner_cover_window (issue 15: GPT-2 under the plug-in recorded an event after every
// free of the main stream, because a side stream had shared the layer once). Past the window of owner frees
// that no other stream needed, owner frees carry no event; the next stream to need them waits for the device
// once, then events resume. The default (SIZE_MAX) keeps an event after every owner free.
#include <doctest/doctest.h>

#include <cstdint>

#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/simulated_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>

using namespace strata;

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
