// stream_ordered's pending frees (detail::stream_ordered_impl, "Pending frees"): synchronous frees set aside
// until one device-wide wait, and blocks whose wait fails abandoned, never handed back as if safe.
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

TEST_CASE("stream_ordered: failed waits never hand blocks back as if safe")
{
  simulated_streams world;
  spy<host_source> policy;
  void* cached = nullptr;
  void* unknown = nullptr;
  void* synced = nullptr;
  {
    stream_ordered<ref<spy<host_source>>, simulated_events> layer{ref(policy), {}, simulated_events(world)};
    const cuda::stream_ref owner = world.create(), s = world.create();
    layer.deallocate_async(layer.allocate_async(256, 256, owner), 256, 256, owner);
    cached = layer.allocate_async(1000, 256, s);
    unknown = layer.allocate_async(2000, 256, s);
    synced = layer.allocate(3000, 256);
    world.launch(s);
    layer.deallocate_async(cached, 1000, 256, s);
    world.fail_host_waits(true);  // a sticky error: the GPU may still be using all of them
    // A free on an unknown stream needs a device wait, which fails: abandoned, not handed back.
    layer.deallocate_async(unknown, 2000, 256, cuda::stream_ref{reinterpret_cast<cudaStream_t>(0x999)});
    CHECK(layer.stats().abandoned_blocks == 1);
    CHECK(policy.outstanding_blocks() == 3);  // cached, abandoned, synced: none went back
    layer.deallocate(synced, 3000, 256);
    CHECK_THROWS(layer.release());  // the wait fails: nothing changes
    CHECK(layer.cached_blocks() == 1);
    CHECK(layer.set_aside_blocks() == 1);
    CHECK(policy.outstanding_blocks() == 3);
  }  // destruction: the wait fails again, so the cached and set-aside blocks are abandoned
  CHECK(policy.outstanding_blocks() == 3);
  world.fail_host_waits(false);
  // The test knows they are idle now; the layer asked the policy for whole 256-byte units.
  for (auto [p, n] : {std::pair{cached, 1024}, {unknown, 2048}, {synced, 3072}}) policy.deallocate(p, n, 256);
  CHECK(policy.mismatches() == 0);
}

TEST_CASE("pending frees: synchronous frees wait in a batch, returned to the policy behind one device-wide wait when it fills")
{
  simulated_streams world;
  spy<host_source> policy;
  stream_ordered<ref<spy<host_source>>, simulated_events> layer{ref(policy), {.sync_frees_per_wait = 3}, simulated_events(world)};
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(layer.allocate(4096, 256));
  const auto device_waits = world.calls().device_waits;
  layer.deallocate(blocks[0], 4096, 256);
  layer.deallocate(blocks[1], 4096, 256);
  CHECK(layer.set_aside_blocks() == 2);
  CHECK(policy.outstanding_blocks() == 3);  // none went back: work on any stream may still use them
  CHECK(world.calls().device_waits == device_waits);
  layer.deallocate(blocks[2], 4096, 256);  // the batch is full
  CHECK(layer.set_aside_blocks() == 0);
  CHECK(policy.outstanding_blocks() == 0);
  CHECK(world.calls().device_waits == device_waits + 1);
  CHECK(layer.stats().device_syncs == 1);
}
