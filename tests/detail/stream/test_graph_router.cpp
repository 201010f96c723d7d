// stream_ordered's private pools for CUDA graphs, over simulated capture (simulated_streams: capture ids,
// graphs, executable graphs, user objects, capture modes). The simulated GPU throws illegal_call for any event
// recorded on a capturing stream and any host wait during capture, and the source below for any cudaMalloc the
// capture mode forbids, so every test also checks that capture is never broken.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <strata/adaptor/checked.hpp>
#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/simulated_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "support/invariants.hpp"

using namespace strata;

namespace {

/// Device memory for the simulated world: growing makes the call cudaMalloc would (illegal under capture
/// unless the thread's capture mode is relaxed), and, when told to, waits for the device first, as a policy
/// that reclaims before growing (mapped_pool) does.
class world_source : public forward_properties<world_source, simulated_source> {
public:
  world_source(simulated_streams& world, simulated_source& memory) : world_(&world), memory_(&memory) {}
  void* allocate(std::size_t bytes, std::size_t alignment)
  {
    world_->unsafe_call("cudaMalloc");
    if (wait_before_growing) world_->wait_device(0);
    return memory_->allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept { memory_->deallocate(p, bytes, alignment); }
  friend bool operator==(const world_source& a, const world_source& b) noexcept { return a.memory_ == b.memory_; }

  bool wait_before_growing = false;

private:
  simulated_streams* world_;
  simulated_source* memory_;
};

using pool_t = coalescing_pool<world_source>;
using layer_t = stream_ordered<pool_t, simulated_events>;

struct rig {
  explicit rig(std::size_t capacity = std::size_t{64} << 20, layer_t::options opts = {})
      : memory(capacity),
        layer(pool_t{world_source(world, memory), {.initial_chunk = 1 << 20, .max_chunk = 1 << 20}}, opts, simulated_events(world))
  {}
  std::size_t in_use() const { return layer.usage().in_use; }
  std::size_t policy_in_use() const { return layer.policy().usage().in_use; }
  world_source& source() { return layer.policy().upstream(); }

  simulated_streams world;
  simulated_source memory;
  layer_t layer;
};

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn)
{
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

} // namespace

TEST_CASE("graph pools: a captured step reuses its own frees, replays allocate nothing, and the graph's end returns its blocks")
{
  rig r;
  const cuda::stream_ref s = r.world.create(), other = r.world.create();
  // Warm the layer on both streams (the owner and a sharer), outside capture.
  r.layer.deallocate_async(r.layer.allocate_async(4096, 256, s), 4096, 256, s);
  r.layer.deallocate_async(r.layer.allocate_async(4096, 256, other), 4096, 256, other);
  const std::size_t in_use_before = r.in_use(), policy_before = r.policy_in_use();
  const auto calls_before = r.world.calls();

  const std::uint64_t capture = r.world.begin_capture(s);
  r.layer.share(s);  // e.g. PyTorch's record_stream during capture: no id asked of the capturing stream
  void* a = r.layer.allocate_async(1 << 16, 256, s);  // the step's temporary
  void* out = r.layer.allocate_async(4096, 256, s);   // the step's output, freed after capture
  r.world.launch(s);
  r.layer.deallocate_async(a, 1 << 16, 256, s);
  void* a2 = r.layer.allocate_async(1 << 16, 256, s);  // same capture, same stream: the pool's own free
  CHECK(a2 == a);
  r.layer.deallocate_async(a2, 1 << 16, 256, s);
  void* graph = r.world.end_capture(s);

  CHECK(r.layer.private_pools() == 1);
  CHECK(r.layer.pool_blocks(capture, /*automatic=*/true) == 2);
  CHECK(r.layer.stats().pool_hits == 1);
  CHECK(r.layer.stats().pool_misses == 2);
  // Nothing capture forbids: no event recorded, queried or waited for, no host wait (the world would throw).
  CHECK(r.world.calls().records == calls_before.records);
  CHECK(r.world.calls().queries == calls_before.queries);
  CHECK(r.world.calls().host_waits + r.world.calls().device_waits + r.world.calls().stream_waits ==
        calls_before.host_waits + calls_before.device_waits + calls_before.stream_waits);
  // Pool blocks are in use, free or not: the graph uses them at every replay.
  CHECK(r.in_use() == in_use_before + r.layer.good_size(1 << 16) + r.layer.good_size(4096));

  const std::uint64_t exec = r.world.instantiate(graph);
  const std::size_t policy_with_graph = r.policy_in_use();
  for (int i = 0; i < 1000; ++i) r.world.launch_graph(exec, s);
  CHECK(r.world.replays() == 1000);
  CHECK(r.policy_in_use() == policy_with_graph);  // nothing allocated at replay

  // Uncaptured work on both streams between replays never gets the graph's memory.
  std::vector<std::pair<void*, cuda::stream_ref>> others;
  for (int i = 0; i < 20; ++i)
    for (auto st : {s, other}) {
      void* p = r.layer.allocate_async(1 << 16, 256, st);
      CHECK_FALSE(overlaps(p, 1 << 16, a, 1 << 16));
      CHECK_FALSE(overlaps(p, 1 << 16, out, 4096));
      others.emplace_back(p, st);
    }
  for (auto [p, st] : others) r.layer.deallocate_async(p, 1 << 16, 256, st);

  // The output, freed outside capture, stays the pool's (the graph writes it at every replay).
  r.layer.deallocate_async(out, 4096, 256, s);
  CHECK(r.layer.pool_blocks(capture, true) == 2);
  void* fresh = r.layer.allocate_async(4096, 256, other);
  CHECK(fresh != out);
  r.layer.deallocate_async(fresh, 4096, 256, other);

  r.world.destroy_graph(graph);  // the executable graph still holds the pool
  (void)r.layer.allocate_async(0, 256, s);
  r.layer.deallocate_async(r.layer.allocate_async(256, 256, s), 256, 256, s);
  CHECK(r.layer.private_pools() == 1);
  r.world.destroy_exec(exec);  // the last holder: the user object's destructor posts the pool
  CHECK(r.layer.private_pools() == 1);  // collected at the layer's next call
  r.layer.deallocate_async(r.layer.allocate_async(256, 256, s), 256, 256, s);
  CHECK(r.layer.private_pools() == 0);
  CHECK(r.layer.stats().pools_released == 1);
  CHECK(r.in_use() == in_use_before);
  r.layer.release();
  CHECK(r.policy_in_use() == 0);
  CHECK(policy_before <= policy_with_graph);
  CHECK(r.world.live_graphs() == 0);
}

TEST_CASE("graph pools: a block freed inside the capture is reused only in the same stream order")
{
  rig r;
  const cuda::stream_ref s = r.world.create(), joined = r.world.create(), outside = r.world.create();
  r.layer.deallocate_async(r.layer.allocate_async(256, 256, outside), 256, 256, outside);
  r.world.begin_capture(s);
  r.world.join_capture(joined, s);
  void* a = r.layer.allocate_async(8192, 256, s);
  r.layer.deallocate_async(a, 8192, 256, s);
  void* b = r.layer.allocate_async(8192, 256, joined);  // another stream of the capture: not ordered after the free
  CHECK(b != a);
  void* c = r.layer.allocate_async(8192, 256, outside);  // not in the capture at all
  CHECK(c != a);
  CHECK(c != b);
  void* d = r.layer.allocate_async(8192, 256, s);
  CHECK(d == a);
  r.layer.deallocate_async(b, 8192, 256, joined);
  r.layer.deallocate_async(d, 8192, 256, s);
  r.layer.deallocate_async(c, 8192, 256, outside);
  void* graph = r.world.end_capture(s);
  CHECK(r.layer.private_pool_blocks() == 2);
  CHECK(r.layer.private_pool_free_blocks() == 2);
  // A later capture is another pool: it never gets the live graph's blocks.
  r.world.begin_capture(s);
  void* e = r.layer.allocate_async(8192, 256, s);
  CHECK(e != a);
  CHECK(e != b);
  r.layer.deallocate_async(e, 8192, 256, s);
  r.world.destroy_graph(r.world.end_capture(s));
  r.world.destroy_graph(graph);
  r.layer.release();
  CHECK(r.layer.private_pools() == 0);
  CHECK(r.policy_in_use() == 0);
}

TEST_CASE("graph pools: a capture on one stream while other streams allocate and free normally")
{
  rig r;
  const cuda::stream_ref owner = r.world.create(), worker = r.world.create(), captured = r.world.create();
  for (auto st : {owner, worker, captured}) r.layer.deallocate_async(r.layer.allocate_async(4096, 256, st), 4096, 256, st);
  r.world.begin_capture(captured);
  const std::size_t before = r.in_use();
  std::set<void*> graph_blocks;
  std::vector<void*> live_in_graph;
  const std::uint64_t hits_before = r.layer.stats().hits;
  for (int i = 0; i < 50; ++i) {
    void* g = r.layer.allocate_async(4096, 256, captured);
    graph_blocks.insert(g);
    for (auto st : {owner, worker}) {
      void* p = r.layer.allocate_async(4096, 256, st);
      CHECK(graph_blocks.count(p) == 0);
      r.world.launch(st);
      r.layer.deallocate_async(p, 4096, 256, st);
    }
    if (i % 2 == 1) r.layer.deallocate_async(g, 4096, 256, captured);  // reused by the capture's next one
    else live_in_graph.push_back(g);
  }
  CHECK(r.layer.stats().hits > hits_before);  // the other streams kept reusing their own frees
  CHECK(graph_blocks.size() == 26);  // 25 live, and one reused by every odd step
  CHECK(r.layer.private_pool_blocks() == 26);
  void* graph = r.world.end_capture(captured);
  for (int i = 0; i < 10; ++i) {  // after capture: the other streams still never get the graph's blocks
    void* p = r.layer.allocate_async(4096, 256, worker);
    CHECK(graph_blocks.count(p) == 0);
    r.layer.deallocate_async(p, 4096, 256, worker);
  }
  r.world.destroy_graph(graph);
  r.layer.collect_released_pools();
  CHECK(r.layer.private_pools() == 1);  // released, but the live blocks are still the user's
  CHECK(r.layer.private_pool_free_blocks() == 0);
  CHECK(r.in_use() == before + 25 * r.layer.good_size(4096));
  for (void* g : live_in_graph) r.layer.deallocate_async(g, 4096, 256, worker);  // the common way now
  CHECK(r.layer.private_pools() == 0);
  CHECK(r.in_use() == before);
  r.layer.release();
  CHECK(r.policy_in_use() == 0);
}

TEST_CASE("graph pools: the PyTorch-style API routes by filter, stops, and releases")
{
  rig r;
  const cuda::stream_ref s = r.world.create(), t = r.world.create();
  for (auto st : {s, t}) r.layer.deallocate_async(r.layer.allocate_async(4096, 256, st), 4096, 256, st);
  const std::size_t before = r.in_use();
  // Pool 7 serves stream s, captured or not (what a filter may ask for); t is never routed.
  r.layer.begin_allocate_to_pool(7, [s](cudaStream_t h) { return h == s.get(); });
  void* routed = r.layer.allocate_async(4096, 256, s);
  void* plain = r.layer.allocate_async(4096, 256, t);
  CHECK(r.layer.pool_blocks(7) == 1);
  r.world.begin_capture(s);
  void* captured = r.layer.allocate_async(1 << 20, 256, s);
  r.layer.deallocate_async(captured, 1 << 20, 256, s);
  CHECK(r.layer.allocate_async(1 << 20, 256, s) == captured);  // same capture, same stream
  void* graph = r.world.end_capture(s);
  CHECK(r.layer.private_pools() == 1);  // routed: no automatic pool for that capture
  r.layer.end_allocate_to_pool(7);
  void* after = r.layer.allocate_async(4096, 256, s);  // routing stopped: the common path
  CHECK(r.layer.pool_blocks(7) == 2);
  r.layer.deallocate_async(routed, 4096, 256, s);  // back into pool 7, not to s's cache
  CHECK(r.layer.private_pool_free_blocks() == 1);
  r.layer.deallocate_async(after, 4096, 256, s);
  r.layer.deallocate_async(plain, 4096, 256, t);
  r.world.destroy_graph(graph);
  // Release: the free block goes back; the live one (the capture's block) when it is freed.
  r.layer.release_pool(7);
  CHECK(r.layer.private_pool_free_blocks() == 0);
  CHECK(r.layer.private_pools() == 1);
  CHECK(r.in_use() == before + r.layer.good_size(1 << 20));
  r.layer.deallocate_async(captured, 1 << 20, 256, s);
  CHECK(r.layer.private_pools() == 0);
  CHECK(r.in_use() == before);
  CHECK(r.layer.stats().pools_released == 1);
  r.layer.release();
  CHECK(r.policy_in_use() == 0);

  // The default filter: every capturing stream, and nothing else.
  r.layer.begin_allocate_to_pool(8);
  void* uncaptured = r.layer.allocate_async(4096, 256, t);
  CHECK(r.layer.pool_blocks(8) == 0);
  r.world.begin_capture(t);
  void* in_graph = r.layer.allocate_async(4096, 256, t);
  CHECK(r.layer.pool_blocks(8) == 1);
  r.layer.deallocate_async(uncaptured, 4096, 256, t);  // a block from outside, freed under capture: joins pool 8
  CHECK(r.layer.pool_blocks(8) == 2);
  CHECK(r.layer.stats().pool_adoptions == 1);
  r.layer.deallocate_async(in_graph, 4096, 256, t);
  r.world.destroy_graph(r.world.end_capture(t));
  r.layer.end_allocate_to_pool(8);
  r.layer.release_pool(8);
  r.layer.release_pool(12345);  // unknown: ignored
  CHECK(r.layer.private_pools() == 0);
  r.layer.release();
  CHECK(r.policy_in_use() == 0);
}

TEST_CASE("graph pools: begin_allocate_to_pool waits once for pending frees, outside capture")
{
  rig r;
  const cuda::stream_ref s = r.world.create(), t = r.world.create();
  void* p = r.layer.allocate_async(4096, 256, s);
  r.layer.deallocate_async(r.layer.allocate_async(4096, 256, t), 4096, 256, t);
  r.world.launch(s);
  r.layer.deallocate_async(p, 4096, 256, s);  // s's work may still use it
  const auto waits = r.layer.stats().host_waits;
  r.layer.begin_allocate_to_pool(1);
  CHECK(r.layer.stats().host_waits > waits);
  CHECK(r.layer.cached_blocks() == 0);
  r.layer.end_allocate_to_pool(1);
  r.layer.release_pool(1);
}

TEST_CASE("graph pools: failures under capture change nothing and leave the layer usable")
{
  SUBCASE("the user object cannot be attached")
  {
    rig r;
    const cuda::stream_ref s = r.world.create();
    r.layer.deallocate_async(r.layer.allocate_async(4096, 256, s), 4096, 256, s);
    const std::size_t before = r.in_use(), policy_before = r.policy_in_use();
    r.world.begin_capture(s);
    r.world.fail_user_objects(true);
    CHECK_THROWS_AS(r.layer.allocate_async(4096, 256, s), std::runtime_error);
    CHECK(r.layer.private_pools() == 0);
    CHECK(r.in_use() == before);
    CHECK(r.policy_in_use() == policy_before);
    r.world.fail_user_objects(false);
    void* p = r.layer.allocate_async(4096, 256, s);
    CHECK(r.layer.private_pools() == 1);
    r.layer.deallocate_async(p, 4096, 256, s);
    r.world.destroy_graph(r.world.end_capture(s));
    r.layer.release();
    CHECK(r.policy_in_use() == 0);
  }
  SUBCASE("growing under global capture: allowed by relaxing the thread's mode; refused clearly for a policy that waits")
  {
    rig r;
    const cuda::stream_ref s = r.world.create();
    r.world.begin_capture(s, /*global*/ 0);
    void* grown = r.layer.allocate_async(3 << 20, 256, s);  // a new chunk: cudaMalloc, made legal (relaxed)
    CHECK(grown != nullptr);
    CHECK(r.world.exchange_capture_mode(0) == 0);  // and the thread's mode restored
    const std::size_t pools = r.layer.private_pool_blocks(), reserved = r.layer.policy().usage().reserved;
    r.source().wait_before_growing = true;
    CHECK_THROWS_WITH_AS(r.layer.allocate_async(5 << 20, 256, s), doctest::Contains("could not grow while a stream is being captured"),
                         usage_error);
    CHECK(r.layer.private_pool_blocks() == pools);
    CHECK(r.layer.policy().usage().reserved == reserved);
    r.source().wait_before_growing = false;
    r.layer.deallocate_async(grown, 3 << 20, 256, s);
    CHECK(r.layer.allocate_async(3 << 20, 256, s) == grown);
    r.layer.deallocate_async(grown, 3 << 20, 256, s);
    r.world.destroy_graph(r.world.end_capture(s));
    r.layer.release();
    CHECK(r.policy_in_use() == 0);
  }
  SUBCASE("every capture mode: growth allowed, the thread's own mode restored, even a relaxed one")
  {
    for (const int capture_mode : {0, 1, 2})
      for (const int thread_mode : {0, 1, 2}) {
        CAPTURE(capture_mode);
        CAPTURE(thread_mode);
        rig r;
        const cuda::stream_ref s = r.world.create();
        r.world.exchange_capture_mode(thread_mode);
        r.world.begin_capture(s, capture_mode);
        void* p = r.layer.allocate_async(2 << 20, 256, s);  // a new chunk each time: a fresh rig
        CHECK(r.world.exchange_capture_mode(thread_mode) == thread_mode);
        r.layer.deallocate_async(p, 2 << 20, 256, s);
        r.world.destroy_graph(r.world.end_capture(s));
        r.world.exchange_capture_mode(0);
        r.layer.release();
        CHECK(r.policy_in_use() == 0);
      }
  }
  SUBCASE("out of memory under capture")
  {
    rig r(4 << 20);
    const cuda::stream_ref s = r.world.create();
    r.world.begin_capture(s);
    void* p = r.layer.allocate_async(2 << 20, 256, s);
    const std::size_t blocks = r.layer.private_pool_blocks(), in_use = r.in_use();
    CHECK_THROWS_AS(r.layer.allocate_async(8 << 20, 256, s), out_of_memory);
    CHECK(r.layer.private_pool_blocks() == blocks);
    CHECK(r.in_use() == in_use);
    r.layer.deallocate_async(p, 2 << 20, 256, s);
    r.world.destroy_graph(r.world.end_capture(s));
    r.layer.release();
    CHECK(r.policy_in_use() == 0);
  }
  SUBCASE("a failed first allocation of a capture, then a good one: the graph is watched once")
  {
    rig r(4 << 20);
    const cuda::stream_ref s = r.world.create();
    r.world.begin_capture(s);
    void* graph = r.world.capture_of(s).graph;
    CHECK_THROWS_AS(r.layer.allocate_async(8 << 20, 256, s), out_of_memory);
    CHECK(r.layer.private_pools() == 0);
    CHECK_THROWS_AS(r.layer.allocate_async(8 << 20, 256, s), out_of_memory);
    void* p = r.layer.allocate_async(2 << 20, 256, s);
    CHECK(r.layer.private_pools() == 1);
    CHECK(r.world.user_objects(graph) == 1);  // one user object: the pool is released once
    r.layer.deallocate_async(p, 2 << 20, 256, s);
    r.world.destroy_graph(r.world.end_capture(s));
    r.layer.collect_released_pools();
    CHECK(r.layer.private_pools() == 0);
    r.layer.release();
    CHECK(r.policy_in_use() == 0);
  }
  SUBCASE("graph pools off: refused, nothing changed")
  {
    rig r(64 << 20, {.graph_pools = false});
    const cuda::stream_ref s = r.world.create();
    r.world.begin_capture(s);
    CHECK_THROWS_WITH_AS(r.layer.allocate_async(4096, 256, s), doctest::Contains("no private pool can serve it"), usage_error);
    CHECK(r.layer.private_pools() == 0);
    r.world.end_capture(s);
  }
}

TEST_CASE("graph pools: a stream destroyed after its capture is never asked about again")
{
  rig r;
  const cuda::stream_ref t = r.world.create();
  const auto capture_a_step = [&r](cuda::stream_ref s) {  // one block allocated and freed inside the capture
    r.world.begin_capture(s);
    void* p = r.layer.allocate_async(4096, 256, s);
    r.layer.deallocate_async(p, 4096, 256, s);
    return r.world.end_capture(s);
  };
  SUBCASE("its graph alive: host waits stay refused (asking is undefined); its graph's end ends that")
  {
    const cuda::stream_ref s = r.world.create();
    void* graph = capture_a_step(s);
    r.world.destroy(s);
    r.layer.deallocate_async(r.layer.allocate_async(4096, 256, t), 4096, 256, t);
    CHECK_THROWS_AS(r.layer.release(), usage_error);
    CHECK_THROWS_AS(r.layer.allocate(4096, 256), usage_error);
    CHECK(r.world.dead_stream_queries() == 0);
    r.world.destroy_graph(graph);
    r.layer.collect_released_pools();
    r.layer.release();
    CHECK(r.policy_in_use() == 0);
  }
  SUBCASE("a call on the live stream after its capture forgets it: no more mode exchanges, host waits allowed")
  {
    const cuda::stream_ref s = r.world.create();
    void* graph = capture_a_step(s);
    r.layer.deallocate_async(r.layer.allocate_async(1 << 16, 256, s), 1 << 16, 256, s);  // seen not capturing
    r.world.destroy(s);
    const std::size_t exchanges = r.world.mode_exchanges();
    r.layer.deallocate_async(r.layer.allocate_async(3 << 20, 256, t), 3 << 20, 256, t);  // the policy grows
    CHECK(r.world.mode_exchanges() == exchanges);
    r.layer.release();  // no capture known: allowed while the graph lives
    CHECK(r.world.dead_stream_queries() == 0);
    r.world.destroy_graph(graph);
    r.layer.release();
    CHECK(r.policy_in_use() == 0);
  }
  SUBCASE("explicit mode: the route's end (after the capture's) forgets it")
  {
    const cuda::stream_ref s = r.world.create();
    r.layer.begin_allocate_to_pool(7);
    void* graph = capture_a_step(s);
    r.world.destroy(s);
    CHECK_THROWS_AS(r.layer.release(), usage_error);
    r.layer.end_allocate_to_pool(7);
    r.layer.release();
    CHECK(r.world.dead_stream_queries() == 0);
    r.world.destroy_graph(graph);
    r.layer.release_pool(7);
    r.layer.release();
    CHECK(r.policy_in_use() == 0);
  }
}

TEST_CASE("stream_ordered: the device-wide wait covers the policy's device, not merely the current one")
{
  /// A policy that says which device its memory lives on.
  struct on_device_3 : coalescing_pool<simulated_source> {
    using coalescing_pool<simulated_source>::coalescing_pool;
    int device() const noexcept { return 3; }
  };
  simulated_streams world;
  stream_ordered<on_device_3, simulated_events> layer{on_device_3{simulated_source(64 << 20)}, {.sync_frees_per_wait = 1},
                                                      simulated_events(world)};
  const cuda::stream_ref s = world.create(1);
  void* p = layer.allocate_async(4096, 256, s);
  layer.deallocate(p, 4096, 256);  // a synchronous free: one device-wide wait before the block is reused
  std::vector<int> waited = world.device_waits();
  std::sort(waited.begin(), waited.end());
  CHECK(waited == std::vector<int>{0, 1, 3});  // the legacy stream's device, s's, and the memory's
  CHECK(detail::resource_device(layer.policy()) == 3);
  CHECK(detail::resource_device(coalescing_pool<simulated_source>{}) == std::nullopt);
}

TEST_CASE("graph pools: an explicit pool shared by two captures reuses across them on one stream, as PyTorch does")
{
  rig r;
  const cuda::stream_ref s = r.world.create(), t = r.world.create();
  r.layer.begin_allocate_to_pool(5);
  r.world.begin_capture(s);
  void* first = r.layer.allocate_async(4096, 256, s);
  r.layer.deallocate_async(first, 4096, 256, s);
  void* g1 = r.world.end_capture(s);
  r.world.begin_capture(s);
  CHECK(r.layer.allocate_async(4096, 256, s) == first);  // the later graph, same stream: PyTorch's sharing
  r.layer.deallocate_async(first, 4096, 256, s);
  void* g2 = r.world.end_capture(s);
  r.world.begin_capture(t);
  void* other = r.layer.allocate_async(4096, 256, t);  // another stream: not ordered after s's graphs
  CHECK(other != first);
  r.layer.deallocate_async(other, 4096, 256, t);
  void* g3 = r.world.end_capture(t);
  r.layer.end_allocate_to_pool(5);
  CHECK(r.layer.private_pools() == 1);  // no automatic pool was made for the three captures
  for (void* g : {g1, g2, g3}) r.world.destroy_graph(g);
  r.layer.release_pool(5);
  r.layer.release();
  CHECK(r.policy_in_use() == 0);
}

TEST_CASE("graph pools: randomized captures, replays, frees and graph ends keep every pool to its graph")
{
  rig r(std::size_t{96} << 20);
  std::mt19937_64 rng(17);
  std::uniform_int_distribution<int> percent(0, 99);
  auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
  const std::size_t shapes[] = {256, 1000, 4096, 65536, 300000};
  const std::vector<cuda::stream_ref> streams{r.world.create(), r.world.create(), r.world.create(), r.world.create()};
  struct block {
    void* p;
    std::size_t bytes;
    std::size_t stream;
    std::uint64_t capture;  ///< the capture it was allocated in (0: none)
  };
  struct graph {
    void* handle = nullptr;
    std::uint64_t exec = 0;
    bool graph_alive = true, exec_alive = false;
    std::vector<std::pair<std::uintptr_t, std::size_t>> ranges;  ///< every block the graph was given or freed
  };
  std::map<std::uint64_t, graph> graphs;        // by capture id, while the graph or an exec lives
  std::map<std::size_t, std::uint64_t> active;  // capturing stream -> capture id
  // Ended captures the layer may still think going on: no call on their stream since, their graph alive (the
  // layer never asks a stream outside a call on it, so host waits stay refused for them).
  std::map<std::size_t, std::uint64_t> unseen_ends;
  std::size_t stale_refusals = 0;
  std::vector<block> live;
  testing::live_set overlap;
  std::size_t served = 0, captured_allocations = 0, in_graph_frees = 0, graph_ends = 0, replays = 0, refusals = 0;

  auto held_by_other_graph = [&](void* p, std::size_t bytes, std::uint64_t mine) {
    for (const auto& [id, g] : graphs)
      if (id != mine)
        for (const auto& [start, n] : g.ranges)
          if (overlaps(p, r.layer.good_size(bytes), reinterpret_cast<void*>(start), n)) return true;
    return false;
  };
  auto capture_of = [&](std::size_t si) -> std::uint64_t {
    const auto it = active.find(si);
    return it == active.end() ? 0 : it->second;
  };
  auto check_usage = [&] {
    std::size_t user = 0, user_in_pools = 0;
    for (const auto& b : live) {
      user += r.layer.good_size(b.bytes);
      if (b.capture != 0) user_in_pools += r.layer.good_size(b.bytes);
    }
    REQUIRE(r.in_use() == user + r.layer.private_pool_bytes() - user_in_pools);
  };

  for (int step = 0; step < 20'000; ++step) {
    const int what = percent(rng);
    if (what < 40 && live.size() < 150) {
      const std::size_t si = pick(streams.size());
      const std::size_t bytes = percent(rng) < 80 ? shapes[pick(5)] : 1 + pick(1 << 20);
      const std::uint64_t cap = capture_of(si);
      void* p = nullptr;
      try {
        p = r.layer.allocate_async(bytes, 256, streams[si]);
      } catch (const out_of_memory&) {
        ++refusals;
        continue;
      } catch (const usage_error&) {  // a host wait needed while another stream captures: refused, not made
        REQUIRE((!active.empty() || !unseen_ends.empty()));
        ++refusals;
        unseen_ends.erase(si);
        continue;
      }
      unseen_ends.erase(si);
      ++served;
      REQUIRE(overlap.add({p, bytes, 256}));
      REQUIRE_FALSE(held_by_other_graph(p, bytes, cap));
      if (cap != 0) {
        ++captured_allocations;
        graphs[cap].ranges.emplace_back(reinterpret_cast<std::uintptr_t>(p), r.layer.good_size(bytes));
      }
      live.push_back({p, bytes, si, cap});
    } else if (what < 75 && !live.empty()) {
      const std::size_t i = pick(live.size());
      const block b = live[i];
      // A block of a capture is freed in that capture on its stream, or after it ended on any stream; any
      // other block on its own stream (a capture may be going on there: then it joins the capture's pool).
      std::size_t si = b.stream;
      if (b.capture != 0 && capture_of(b.stream) != b.capture) {
        si = pick(streams.size());
        if (capture_of(si) != 0) continue;
      }
      live[i] = live.back();
      live.pop_back();
      REQUIRE(overlap.remove(b.p));
      if (const std::uint64_t cap = capture_of(si); cap != 0) {
        ++in_graph_frees;
        graphs[cap].ranges.emplace_back(reinterpret_cast<std::uintptr_t>(b.p), r.layer.good_size(b.bytes));
      } else {
        r.world.launch(streams[si]);
      }
      r.layer.deallocate_async(b.p, b.bytes, 256, streams[si]);
      unseen_ends.erase(si);
    } else if (what < 80) {  // a capture begins on one of two streams
      const std::size_t si = 2 + pick(2);
      if (active.contains(si)) continue;
      const std::uint64_t id = r.world.begin_capture(streams[si]);
      active[si] = id;
      graphs[id].handle = nullptr;
      // The layer learns of a capture at its first call on the capturing stream; until then another stream's
      // growth would call cudaMalloc in the thread's own mode (invalidating a global capture, as any cudaMalloc
      // does). A captured step starts with its allocations, as here.
      void* first = r.layer.allocate_async(256, 256, streams[si]);
      ++served;
      ++captured_allocations;
      REQUIRE(overlap.add({first, 256, 256}));
      REQUIRE_FALSE(held_by_other_graph(first, 256, id));
      graphs[id].ranges.emplace_back(reinterpret_cast<std::uintptr_t>(first), r.layer.good_size(256));
      live.push_back({first, 256, si, id});
    } else if (what < 85 && !active.empty()) {  // a capture ends; its graph is often instantiated
      const auto it = std::next(active.begin(), static_cast<std::ptrdiff_t>(pick(active.size())));
      graph& g = graphs[it->second];
      g.handle = r.world.end_capture(streams[it->first]);
      unseen_ends[it->first] = it->second;
      if (percent(rng) < 70) {
        g.exec = r.world.instantiate(g.handle);
        g.exec_alive = true;
      }
      active.erase(it);
    } else if (what < 92) {  // replays, or the end of a graph or an exec
      std::vector<std::uint64_t> ended;
      for (auto& [id, g] : graphs) {
        if (g.handle == nullptr) continue;  // still capturing
        if (g.exec_alive && percent(rng) < 50) {
          r.world.launch_graph(g.exec, streams[pick(2)]);
          ++replays;
        }
        if (percent(rng) < 10) {
          if (g.exec_alive && percent(rng) < 50) {
            r.world.destroy_exec(g.exec);
            g.exec_alive = false;
          } else if (g.graph_alive) {
            r.world.destroy_graph(g.handle);
            g.graph_alive = false;
          }
          if (!g.exec_alive && !g.graph_alive) ended.push_back(id);
        }
      }
      for (const std::uint64_t id : ended) {
        std::erase_if(unseen_ends, [id](const auto& e) { return e.second == id; });
        graphs.erase(id);  // its blocks may go to anyone from the layer's next call on
        ++graph_ends;
      }
    } else if (what < 97) {
      r.world.finish(streams[pick(streams.size())]);
    } else if (active.empty() && unseen_ends.empty()) {
      r.layer.release();
    } else if (active.empty()) {  // only ended captures whose streams were not seen since: refused, nothing asked
      r.layer.collect_released_pools();  // what release() does first
      const std::size_t before = r.in_use();
      CHECK_THROWS_AS(r.layer.release(), usage_error);
      CHECK(r.in_use() == before);
      ++stale_refusals;
    }
    check_usage();
  }
  MESSAGE("served " << served << " (" << captured_allocations << " under capture), in-graph frees " << in_graph_frees
                    << ", graph ends " << graph_ends << ", replays " << replays << ", refusals " << refusals
                    << ", pool hits " << r.layer.stats().pool_hits << ", adoptions " << r.layer.stats().pool_adoptions);
  CHECK(r.world.dead_stream_queries() == 0);
  CHECK(r.world.captured_records() == 0);  // legal in CUDA, but the layer never records for a capturing stream
  CHECK(stale_refusals > 0);
  CHECK(served > 5000);
  CHECK(captured_allocations > 1000);
  CHECK(in_graph_frees > 500);
  CHECK(graph_ends > 20);
  CHECK(replays > 100);
  CHECK(r.layer.stats().pool_hits > 100);
  CHECK(r.layer.stats().pool_adoptions > 10);
  CHECK(refusals < served / 100);  // a host wait forbidden by a capture lets the policy grow instead

  for (auto& [si, id] : active) graphs[id].handle = r.world.end_capture(streams[si]);
  for (auto& [id, g] : graphs) {
    if (g.exec_alive) r.world.destroy_exec(g.exec);
    if (g.graph_alive) r.world.destroy_graph(g.handle);
  }
  for (const auto& b : live) r.layer.deallocate_async(b.p, b.bytes, 256, streams[0]);
  r.layer.release();
  CHECK(r.layer.private_pools() == 0);
  CHECK(r.in_use() == 0);
  CHECK(r.policy_in_use() == 0);
  CHECK(r.world.live_graphs() == 0);
}

TEST_CASE("checked over stream_ordered under capture: no id asked of the capturing stream, no false report")
{
  simulated_streams world;
  using so = stream_ordered<coalescing_pool<simulated_source>, simulated_events>;
  checked<so> r{so{coalescing_pool<simulated_source>{simulated_source(64 << 20)}, {}, simulated_events(world)}};
  const cuda::stream_ref s = world.create();
  void* before = r.allocate_async(4096, 256, s);  // s known to the layer before its capture
  world.begin_capture(s);
  void* inside = r.allocate_async(4096, 256, s);  // the world throws if anyone asks s's id now
  r.deallocate_async(inside, 4096, 256, s);
  void* again = r.allocate_async(4096, 256, s);
  CHECK(again == inside);
  void* graph = world.end_capture(s);
  r.deallocate_async(again, 4096, 256, s);    // after capture, on the same stream: the same id, no report
  r.deallocate_async(before, 4096, 256, s);
  CHECK_THROWS_AS(r.deallocate_async(before, 4096, 256, s), usage_error);  // still a checker: a double free
  world.destroy_graph(graph);
  r.upstream().release();
  CHECK(r.upstream().private_pools() == 0);
}

namespace {
/// An event backend that cannot query captures (no capture_of, no user objects): not a graph_backend.
struct plain_backend {
  using event = std::size_t;
  simulated_streams* w;
  std::uint64_t id_of(cuda::stream_ref s) const { return w->id_of(s); }
  event make_event() { return w->make_event(); }
  void destroy_event(event e) const noexcept { w->destroy_event(e); }
  void record(event e, cuda::stream_ref s) { w->record(e, s); }
  bool done(event e) { return w->done(e); }
  void wait_host(event e) { w->wait_host(e); }
  void order_after(cuda::stream_ref s, event e) { w->order_after(s, e); }
  void wait_stream(cuda::stream_ref s) { w->wait_stream(s); }
  void wait_device(int d) { w->wait_device(d); }
  int device_of(cuda::stream_ref s) const { return w->device_of(s); }
  bool capturing(cuda::stream_ref s) const { return w->capturing(s); }
};
static_assert(event_backend<plain_backend> && !graph_backend<plain_backend>);
template <class L>
concept routes_to_pools = requires(L& l) { l.begin_allocate_to_pool(std::uint64_t{1}); };
static_assert(graph_backend<simulated_events>);
} // namespace

TEST_CASE("graph pools need a graph_backend: without one, capture is refused and nothing is faked")
{
  simulated_streams world;
  stream_ordered<coalescing_pool<simulated_source>, plain_backend> layer{coalescing_pool<simulated_source>{simulated_source(64 << 20)}, {},
                                                                          plain_backend{&world}};
  const cuda::stream_ref s = world.create();
  layer.deallocate_async(layer.allocate_async(1000, 256, s), 1000, 256, s);
  world.begin_capture(s);
  CHECK_THROWS_WITH_AS(layer.allocate_async(1000, 256, s), doctest::Contains("no private pool can serve it"), usage_error);
  world.end_capture(s);
  layer.release_pool(3);  // nothing to release: harmless
  CHECK(layer.private_pools() == 0);
  static_assert(!routes_to_pools<decltype(layer)>);
  static_assert(routes_to_pools<layer_t>);
}

TEST_CASE("graph pools: with check_capture off, streams are asked about capture only while a capture is announced")
{
  rig r(std::size_t{64} << 20, {.check_capture = false});
  const cuda::stream_ref s = r.world.create(), t = r.world.create();
  void* before_capture = r.layer.allocate_async(4096, 256, s);
  int served = 0;
  for (int i = 0; i < 100; ++i) {
    for (auto st : {s, t}) {
      void* p = r.layer.allocate_async(8192, 256, st);
      served += p != nullptr;
      r.layer.deallocate_async(p, 8192, 256, st);
    }
  }
  CHECK(served == 200);
  CHECK(r.world.capture_queries() == 0);  // nothing announced: no call asks

  // Announced (PyTorch's capture_begin): every call asks again, and the capture is served as with checks on.
  r.layer.begin_allocate_to_pool(3);
  r.world.begin_capture(s);
  void* in_graph = r.layer.allocate_async(1 << 20, 256, s);
  CHECK(r.layer.pool_blocks(3) == 1);
  r.layer.deallocate_async(before_capture, 4096, 256, s);  // a block from outside, freed under capture: joins pool 3
  CHECK(r.layer.pool_blocks(3) == 2);
  CHECK(r.layer.stats().pool_adoptions == 1);
  CHECK_THROWS_AS(r.layer.release(), usage_error);  // no host wait while the capture goes on
  CHECK(r.world.capture_queries() >= 2);
  r.layer.deallocate_async(in_graph, 1 << 20, 256, s);
  void* graph = r.world.end_capture(s);
  r.layer.end_allocate_to_pool(3);
  r.world.destroy_graph(graph);
  r.layer.release_pool(3);
  // A call on s sees its capture ended; then nothing is asked any more.
  r.layer.deallocate_async(r.layer.allocate_async(4096, 256, s), 4096, 256, s);
  const std::uint64_t asked = r.world.capture_queries();
  for (int i = 0; i < 10; ++i) r.layer.deallocate_async(r.layer.allocate_async(4096, 256, t), 4096, 256, t);
  CHECK(r.world.capture_queries() == asked);
  CHECK(r.layer.private_pools() == 0);
  r.layer.release();
  CHECK(r.policy_in_use() == 0);
}
