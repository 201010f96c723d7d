// stream_ordered's lookup of a call's stream (detail::stream_ordered_impl, "The stream of a call"), over
// simulated streams: which backend calls a call on a stream makes to learn the stream's id and capture state
// (the simulated world counts each id and capture query, a driver call each on a GPU, and throws if a
// capturing stream's id is asked), and that knowing them from cheaper evidence keeps every capture and reuse
// rule.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include <strata/core/errors.hpp>
#include <strata/detail/block_tags.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/simulated_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>

using namespace strata;

namespace {

using pool_t = coalescing_pool<simulated_source>;

struct rig {
  explicit rig(stream_ordered<pool_t, simulated_events>::options opts = {})
      : layer(pool_t{simulated_source(std::size_t{256} << 20), {.initial_chunk = 1 << 20, .max_chunk = 4 << 20}}, opts, simulated_events(world))
  {}
  /// Backend calls made since the last mark: id queries and capture queries.
  struct counts {
    std::uint64_t ids, captures;
  };
  counts since(const counts& mark) const { return {world.id_queries() - mark.ids, world.capture_queries() - mark.captures}; }
  counts mark() const { return {world.id_queries(), world.capture_queries()}; }

  simulated_streams world;
  stream_ordered<pool_t, simulated_events> layer;
};

/// A tagging policy (tags as mapped_pool has them, all 0 here) that counts what the layer asks it.
struct asked_policy {
  explicit asked_policy(pool_t pool) : pool_(std::move(pool)) {}
  void* allocate(std::size_t bytes, std::size_t alignment) { return ++allocates, pool_.allocate(bytes, alignment); }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept { ++frees, pool_.deallocate(p, bytes, alignment); }
  std::size_t good_size(std::size_t bytes, std::size_t alignment) const { return ++good_sizes, pool_.good_size(bytes, alignment); }
  tag_id tag_of(const void*) const noexcept { return ++tag_questions, tag_id{0}; }
  bool paused(tag_id) const noexcept { return ++tag_questions, false; }
  friend bool operator==(const asked_policy& a, const asked_policy& b) noexcept { return &a == &b; }

  pool_t pool_;
  std::uint64_t allocates = 0, frees = 0;
  mutable std::uint64_t good_sizes = 0, tag_questions = 0;
};
static_assert(detail::tagging_policy<asked_policy> && sized_resource<asked_policy>);

struct asked_rig {
  explicit asked_rig(stream_ordered<asked_policy, simulated_events>::options opts)
      : layer(asked_policy{pool_t{simulated_source(std::size_t{256} << 20), {.initial_chunk = 1 << 20, .max_chunk = 4 << 20}}}, opts,
              simulated_events(world))
  {}
  /// What the policy and the backend were asked since the last mark.
  struct counts {
    std::uint64_t allocates, frees, good_sizes, tag_questions, ids, captures, records, queries;
    counts operator-(const counts& o) const
    {
      return {allocates - o.allocates, frees - o.frees, good_sizes - o.good_sizes, tag_questions - o.tag_questions, ids - o.ids,
              captures - o.captures, records - o.records, queries - o.queries};
    }
  };
  counts mark() const
  {
    const asked_policy& p = layer.policy();
    return {p.allocates, p.frees, p.good_sizes, p.tag_questions, world.id_queries(), world.capture_queries(), world.calls().records,
            world.calls().queries};
  }

  simulated_streams world;
  stream_ordered<asked_policy, simulated_events> layer;
};

/// `pairs` allocate/free pairs of a few sizes on `s` (an identified_stream or a plain handle).
template <class Layer, class Stream>
void pairs_on(Layer& layer, const Stream& s, int pairs)
{
  for (int i = 0; i < pairs; ++i) {
    const std::size_t bytes = std::size_t{256} << (i % 13);  // 256 B to 1 MiB
    void* p = layer.allocate_async(bytes, 256, s);
    REQUIRE(p != nullptr);
    layer.deallocate_async(p, bytes, 256, s);
  }
}

} // namespace

TEST_CASE("the stream of a call: with check_capture, every call on an identified stream asks the capture state and never the id")
{
  rig r;
  const identified_stream s = r.world.identify(r.world.create());
  pairs_on(r.layer, s, 1);
  const auto before = r.mark();
  pairs_on(r.layer, s, 1000);
  CHECK(r.since(before).ids == 0);
  CHECK(r.since(before).captures == 2000);  // an unannounced capture is found on identified streams too
  r.layer.release();
}

TEST_CASE("the stream of a call: without check_capture, on one identified stream, allocate/free pairs ask no id and no capture state")
{
  rig r({.check_capture = false});
  const identified_stream s = r.world.identify(r.world.create());
  pairs_on(r.layer, s, 1);  // s owns the policy
  const auto before = r.mark();
  pairs_on(r.layer, s, 1000);
  CHECK(r.since(before).ids == 0);
  CHECK(r.since(before).captures == 0);
  CHECK(r.layer.owner() == s.id());
  CHECK(r.world.calls().records == 0);
  CHECK(r.world.calls().queries == 0);

  // A second identified stream, reusing its own cached free (one shape: no miss, so ownership stays with s):
  // still nothing asked on a hit.
  const identified_stream t = r.world.identify(r.world.create());
  r.layer.deallocate_async(r.layer.allocate_async(4096, 256, t), 4096, 256, t);
  const auto hits_before = r.mark();
  const auto hits = r.layer.stats().hits;
  for (int i = 0; i < 1000; ++i) r.layer.deallocate_async(r.layer.allocate_async(4096, 256, t), 4096, 256, t);
  CHECK(r.layer.owner() == s.id());
  CHECK(r.layer.stats().hits == hits + 1000);
  CHECK(r.since(hits_before).ids == 0);
  CHECK(r.since(hits_before).captures == 0);
  r.layer.release();
}

TEST_CASE("the stream of a call: on a plain handle, the id lookup and, with check_capture, the capture query before it")
{
  rig r;
  const cuda::stream_ref s = r.world.create();
  pairs_on(r.layer, s, 1);
  auto before = r.mark();
  pairs_on(r.layer, s, 1000);
  CHECK(r.since(before).ids == 2000);       // every call's: a handle names whichever stream has it now
  CHECK(r.since(before).captures == 2000);  // the only way to find a capture nobody announced

  rig quiet({.check_capture = false});
  const cuda::stream_ref q = quiet.world.create();
  pairs_on(quiet.layer, q, 1);
  before = quiet.mark();
  pairs_on(quiet.layer, q, 1000);
  CHECK(quiet.since(before).ids == 2000);
  CHECK(quiet.since(before).captures == 0);

  // Once another stream shares the layer, every free on a plain handle asks its id again.
  const cuda::stream_ref t = r.world.create();
  pairs_on(r.layer, t, 1);
  before = r.mark();
  pairs_on(r.layer, s, 100);
  CHECK(r.since(before).ids == 200);
}

TEST_CASE("the stream of a call: on a handle whose id cannot be cached, every call asks the capture query and the id once each")
{
  rig r;
  const cuda::stream_ref legacy = simulated_streams::legacy();  // a default stream: a free asks its id too
  pairs_on(r.layer, legacy, 1);
  auto before = r.mark();
  pairs_on(r.layer, legacy, 1000);
  CHECK(r.since(before).ids == 2000);
  CHECK(r.since(before).captures == 2000);

  // Under capture the query answers first and the id is never asked (the world throws if it is): the
  // allocation comes from the capture's pool and its free, on the same plain handle, goes back to it.
  const std::uint64_t capture = r.world.begin_capture(legacy);
  before = r.mark();
  void* a = r.layer.allocate_async(1 << 16, 256, legacy);
  CHECK(r.layer.pool_blocks(capture, /*automatic=*/true) == 1);
  r.layer.deallocate_async(a, 1 << 16, 256, legacy);
  CHECK(r.layer.private_pool_free_blocks() == 1);
  CHECK(r.since(before).ids == 0);
  CHECK(r.since(before).captures == 2);
  CHECK(r.layer.allocate_async(1 << 16, 256, legacy) == a);  // the pool's own free, in the same capture
  r.layer.deallocate_async(a, 1 << 16, 256, legacy);
  r.world.destroy_graph(r.world.end_capture(legacy));
  pairs_on(r.layer, legacy, 2);  // sees the capture over, collects the pool
  CHECK(r.layer.private_pools() == 0);
  CHECK(r.world.captured_records() == 0);
  r.layer.release();
  CHECK(r.layer.policy().usage().in_use == 0);
}

TEST_CASE("the stream of a call: a plain handle that names no live stream is refused on allocate and its free returned after a wait")
{
  rig r;
  const cuda::stream_ref s = r.world.create(), other = r.world.create();
  pairs_on(r.layer, other, 1);
  void* p = r.layer.allocate_async(4096, 256, s);
  const std::uint64_t s_id = r.world.id_of(s);
  r.world.launch(s);  // a kernel on p, still running
  const cuda::stream_ref bogus{reinterpret_cast<cudaStream_t>(std::uintptr_t{0x7})};  // never a stream
  CHECK_THROWS_AS(r.layer.allocate_async(4096, 256, bogus), std::invalid_argument);  // the lookup's own error
  const auto syncs = r.layer.stats().device_syncs;
  r.layer.deallocate_async(p, 4096, 256, bogus);  // nothing to order its reuse by: a device-wide wait first
  CHECK(r.layer.stats().device_syncs == syncs + 1);
  CHECK(r.world.completed(s_id) == r.world.enqueued(s_id));
  CHECK(r.world.dead_stream_queries() == 0);
  r.layer.release();
  CHECK(r.layer.policy().usage().in_use == 0);
}

/// simulated_events with its capture query redefined (counted here): the base's joint answer would skip it.
struct recounted_events : simulated_events {
  using simulated_events::simulated_events;
  bool capturing(cuda::stream_ref s) const { return ++*asked, simulated_events::capturing(s); }
  std::shared_ptr<int> asked = std::make_shared<int>(0);
};
static_assert(capture_then_id_backend<simulated_events> && capture_then_id_backend<cuda_events>);
static_assert(!capture_then_id_backend<recounted_events>);  // asked apart: its own capturing() is heard

TEST_CASE("the stream of a call: a backend that redefines a question it inherits a joint answer for is asked apart")
{
  simulated_streams world;
  stream_ordered<pool_t, recounted_events> layer(
      pool_t{simulated_source(std::size_t{64} << 20), {.initial_chunk = 1 << 20, .max_chunk = 4 << 20}}, {}, recounted_events(world));
  pairs_on(layer, simulated_streams::legacy(), 10);
  CHECK(*layer.backend().asked == 20);  // every call's capture query went through it
  CHECK(world.id_queries() == 20);
  layer.release();
}

TEST_CASE("the stream of a call: a lone owner's handle reused by a new stream of another device: the free is the new stream's")
{
  for (const bool check_capture : {true, false}) {
    rig r({.check_capture = check_capture});
    const cuda::stream_ref owner = r.world.create(0), other = r.world.create(0);
    const std::uint64_t owner_id = r.world.id_of(owner);
    pairs_on(r.layer, owner, 1);
    void* x = r.layer.allocate_async(4096, 256, owner);
    r.world.launch(owner);  // the owner's kernel on x, still running
    r.world.destroy(owner);
    const cuda::stream_ref fresh = r.world.create(1);
    REQUIRE(fresh.get() == owner.get());
    const std::uint64_t fresh_id = r.world.id_of(fresh);
    r.world.launch(fresh);  // the new stream's kernel on x (the user passed it over), still running
    const auto before = r.mark();
    r.layer.deallocate_async(x, 4096, 256, fresh);  // the owner's handle, the layer alone: its id is asked
    CHECK(r.since(before).ids == 1);
    CHECK(r.layer.owner() == owner_id);
    CHECK(r.layer.cached_blocks() == 1);  // the new stream's, reused by it alone until its work is known done
    CHECK(r.layer.streams_tracked() == 2);
    // Another stream gets other memory, and a synchronous allocate waits for the new stream's work first.
    void* y = r.layer.allocate_async(4096, 256, other);
    CHECK(y != x);
    void* z = r.layer.allocate(4096, 256);
    CHECK((z != x || r.world.completed(fresh_id) == r.world.enqueued(fresh_id)));
    CHECK(r.world.dead_stream_queries() == 0);
    r.layer.deallocate_async(y, 4096, 256, other);
    r.layer.deallocate(z, 4096, 256);
    r.world.finish_all();
    r.layer.release();
    CHECK(r.layer.policy().usage().in_use == 0);
  }
}

TEST_CASE("the stream of a call: an unannounced capture on a plain handle is found by the query, never by asking the id")
{
  rig r;
  const cuda::stream_ref s = r.world.create(), other = r.world.create();
  const identified_stream si = r.world.identify(s);
  pairs_on(r.layer, s, 1);
  pairs_on(r.layer, other, 1);
  void* before_capture = r.layer.allocate_async(8192, 256, s);
  const std::uint64_t capture = r.world.begin_capture(s);
  void* a = r.layer.allocate_async(1 << 16, 256, s);  // the world throws if the layer asks s's id now
  CHECK(r.layer.pool_blocks(capture, /*automatic=*/true) == 1);
  r.layer.deallocate_async(a, 1 << 16, 256, si);  // a capture is known: the identified stream is asked too
  void* a2 = r.layer.allocate_async(1 << 16, 256, si);
  CHECK(a2 == a);  // the pool's own free, in the same capture and stream
  r.layer.deallocate_async(before_capture, 8192, 256, si);  // from outside, freed under capture: kept for the graph
  CHECK(r.layer.stats().pool_adoptions == 1);
  CHECK(r.layer.pool_blocks(capture, true) == 2);
  CHECK_THROWS_AS(r.layer.release(), usage_error);  // no host wait while it may go on
  void* q = r.layer.allocate_async(4096, 256, other);  // another stream meanwhile: served as usual
  CHECK(r.layer.pool_blocks(capture, true) == 2);
  r.layer.deallocate_async(q, 4096, 256, other);
  r.layer.deallocate_async(a2, 1 << 16, 256, si);
  void* graph = r.world.end_capture(s);
  CHECK(r.world.captured_records() == 0);

  // A call on s sees the capture over: identified calls ask only check_capture's query again, and the
  // graph's end returns its pool.
  pairs_on(r.layer, s, 1);
  const auto after = r.mark();
  pairs_on(r.layer, si, 10);
  CHECK(r.since(after).ids == 0);
  CHECK(r.since(after).captures == 20);
  r.world.destroy_graph(graph);
  pairs_on(r.layer, si, 1);
  CHECK(r.layer.private_pools() == 0);
  r.layer.release();
  CHECK(r.layer.policy().usage().in_use == 0);
}

TEST_CASE("the stream of a call: an announced capture on an identified stream is served from its private pool")
{
  rig r({.check_capture = false});
  const identified_stream s = r.world.identify(r.world.create());
  const identified_stream other = r.world.identify(r.world.create());
  pairs_on(r.layer, s, 1);
  pairs_on(r.layer, other, 1);
  r.layer.begin_allocate_to_pool(7);  // PyTorch's capture_begin: the announcement
  r.world.begin_capture(s.stream());
  const auto before = r.mark();
  void* a = r.layer.allocate_async(1 << 16, 256, s);
  CHECK(r.layer.pool_blocks(7) == 1);
  CHECK(r.since(before).captures >= 1);  // announced: the identified stream is asked too
  CHECK(r.since(before).ids == 0);
  r.layer.deallocate_async(a, 1 << 16, 256, s);
  CHECK(r.layer.allocate_async(1 << 16, 256, s) == a);
  void* b = r.layer.allocate_async(4096, 256, other);  // an uncaptured stream, not routed
  CHECK(r.layer.pool_blocks(7) == 1);
  r.layer.deallocate_async(b, 4096, 256, other);
  r.layer.deallocate_async(a, 1 << 16, 256, s);
  void* graph = r.world.end_capture(s.stream());
  r.layer.end_allocate_to_pool(7);
  CHECK(r.world.captured_records() == 0);

  // The route over: nothing is asked again.
  const auto after = r.mark();
  pairs_on(r.layer, s, 100);
  CHECK(r.since(after).ids == 0);
  CHECK(r.since(after).captures == 0);
  r.world.destroy_graph(graph);
  r.layer.release_pool(7);
  CHECK(r.layer.pool_blocks(7) == 0);
  r.layer.release();
}

TEST_CASE("the stream of a call: a capture first seen through a plain handle makes identified calls ask too, and refuse")
{
  rig r({.graph_pools = false});
  const cuda::stream_ref s = r.world.create();
  const identified_stream si = r.world.identify(s);
  pairs_on(r.layer, si, 1);
  void* live = r.layer.allocate_async(4096, 256, si);
  r.world.begin_capture(s);
  CHECK_THROWS_WITH_AS(r.layer.allocate_async(4096, 256, s), doctest::Contains("captured into a CUDA graph"), usage_error);
  const std::size_t in_use = r.layer.usage().in_use;
  CHECK_THROWS_AS(r.layer.allocate_async(4096, 256, si), usage_error);  // known now: refused, nothing changed
  CHECK(r.layer.usage().in_use == in_use);
  r.layer.deallocate_async(live, 4096, 256, si);  // under capture, no pool to keep it: abandoned, not reused
  CHECK(r.layer.stats().abandoned_blocks == 1);
  r.world.end_capture(s);
  pairs_on(r.layer, si, 1);  // sees the capture over
  const auto after = r.mark();
  pairs_on(r.layer, si, 100);  // served again, each call asking check_capture's query alone
  CHECK(r.since(after).captures == 200);
  CHECK(r.since(after).ids == 0);
  CHECK(r.world.captured_records() == 0);
}

TEST_CASE("the stream of a call: a destroyed stream's handle reused by a new identified stream gets none of its blocks unordered")
{
  rig r;
  const identified_stream owner = r.world.identify(r.world.create());
  pairs_on(r.layer, owner, 1);
  const cuda::stream_ref old_handle = r.world.create();
  const identified_stream old = r.world.identify(old_handle);
  void* x = r.layer.allocate_async(4096, 256, old);
  r.world.launch(old_handle);  // a kernel using x, still running
  r.layer.deallocate_async(x, 4096, 256, old);  // cached on the old stream
  r.world.destroy(old_handle);
  const identified_stream fresh = r.world.identify(r.world.create());
  REQUIRE(fresh.stream().get() == old_handle.get());  // the handle comes back, as the driver's do
  REQUIRE(fresh.id() != old.id());
  const auto before = r.mark();
  void* y = r.layer.allocate_async(4096, 256, fresh);
  CHECK(y != x);  // the old stream's block is not the new stream's
  CHECK(r.since(before).ids == 0);
  r.layer.deallocate_async(y, 4096, 256, fresh);
  CHECK(r.world.dead_stream_queries() == 0);
  r.world.finish_all();
  r.layer.release();
  CHECK(r.layer.cached_blocks() == 0);
}

TEST_CASE("the stream of a call: a destroyed owner's handle reused by a new identified stream waits for the owner's frees")
{
  rig r;
  const cuda::stream_ref owner_handle = r.world.create();
  const identified_stream owner = r.world.identify(owner_handle);
  void* x = r.layer.allocate_async(4096, 256, owner);
  r.world.launch(owner_handle);
  r.layer.deallocate_async(x, 4096, 256, owner);  // straight to the policy, its kernel still running
  r.world.destroy(owner_handle);
  const identified_stream fresh = r.world.identify(r.world.create());
  REQUIRE(fresh.stream().get() == owner_handle.get());
  const auto syncs = r.layer.stats().device_syncs;
  void* y = r.layer.allocate_async(4096, 256, fresh);
  // The policy may hand x's memory out again only after the old owner's work: here a device-wide wait (its
  // frees carry no event: it was alone), never an event recorded on the reused handle.
  REQUIRE(y == x);  // the policy's first fit: the same block, which is what makes the wait matter
  CHECK(r.layer.stats().device_syncs > syncs);
  CHECK(r.world.completed(owner.id()) == r.world.enqueued(owner.id()));
  CHECK(r.world.calls().records == 0);
  r.layer.deallocate_async(y, 4096, 256, fresh);
  CHECK(r.world.dead_stream_queries() == 0);
}

TEST_CASE("the stream of a call: the owner alone, with captures announced, pays a pair as the policy's allocate and free alone")
{
  asked_rig r({.check_capture = false});
  const identified_stream s = r.world.identify(r.world.create());
  r.layer.deallocate_async(r.layer.allocate_async(4096, 256, s), 4096, 256, s);  // s owns the policy
  auto before = r.mark();
  for (int i = 0; i < 1000; ++i) r.layer.deallocate_async(r.layer.allocate_async(4096, 256, s), 4096, 256, s);
  auto asked = r.mark() - before;
  CHECK(asked.allocates == 1000);
  CHECK(asked.frees == 1000);
  CHECK(asked.good_sizes == 0);      // the shape of the size just asked is remembered (detail::shape_memo)
  CHECK(asked.tag_questions == 0);   // a sleeping tag is the policy's to refuse: not asked
  CHECK(asked.ids + asked.captures + asked.records + asked.queries == 0);
  CHECK(r.layer.stats().misses == 1001);
  CHECK(r.layer.cached_blocks() == 0);

  // A plain handle: its id once per call, nothing else.
  before = r.mark();
  for (int i = 0; i < 100; ++i) r.layer.deallocate_async(r.layer.allocate_async(4096, 256, s.stream()), 4096, 256, s.stream());
  asked = r.mark() - before;
  CHECK(asked.ids == 200);
  CHECK(asked.captures + asked.records + asked.queries + asked.tag_questions == 0);

  // Looking for captures nobody announced: every call asks again.
  asked_rig checked({});
  const identified_stream c = checked.world.identify(checked.world.create());
  checked.layer.deallocate_async(checked.layer.allocate_async(4096, 256, c), 4096, 256, c);
  before = checked.mark();
  for (int i = 0; i < 100; ++i) checked.layer.deallocate_async(checked.layer.allocate_async(4096, 256, c), 4096, 256, c);
  CHECK((checked.mark() - before).captures == 200);
}

TEST_CASE("the stream of a call: the owner alone keeping its recent frees pays a repeated pair as a push and a pop")
{
  asked_rig r({.check_capture = false, .reuse_recent_frees = true});
  const identified_stream s = r.world.identify(r.world.create());
  r.layer.deallocate_async(r.layer.allocate_async(4096, 256, s), 4096, 256, s);  // s owns the policy
  auto before = r.mark();
  for (int i = 0; i < 1000; ++i) r.layer.deallocate_async(r.layer.allocate_async(4096, 256, s), 4096, 256, s);
  auto asked = r.mark() - before;
  CHECK(asked.allocates + asked.frees == 0);  // the block freed last serves the next allocation of its shape
  CHECK(asked.good_sizes == 0);
  CHECK(asked.tag_questions == 3000);         // the freed block's tag and whether it sleeps; at reuse, whether it sleeps
  CHECK(asked.ids + asked.captures + asked.records + asked.queries == 0);
  CHECK(r.layer.stats().misses == 1);
  CHECK(r.layer.stats().hits == 1000);
  CHECK(r.layer.cached_blocks() == 1);

  // A plain handle: its id once per call.
  before = r.mark();
  for (int i = 0; i < 100; ++i) r.layer.deallocate_async(r.layer.allocate_async(4096, 256, s.stream()), 4096, 256, s.stream());
  asked = r.mark() - before;
  CHECK(asked.ids == 200);
  CHECK(asked.captures + asked.records + asked.queries + asked.allocates + asked.frees == 0);

  // Another shape: the recent frees merge into the policy before it is asked.
  before = r.mark();
  void* big = r.layer.allocate_async(1 << 20, 256, s);
  asked = r.mark() - before;
  CHECK(asked.frees == 1);
  CHECK(asked.allocates == 1);
  CHECK(r.layer.cached_blocks() == 0);
  r.layer.deallocate_async(big, 1 << 20, 256, s);

  // Another stream shares the layer: they go back first, as the owner's frees, and no more are kept.
  const identified_stream t = r.world.identify(r.world.create());
  REQUIRE(r.layer.cached_blocks() == 1);
  r.layer.deallocate_async(r.layer.allocate_async(4096, 256, t), 4096, 256, t);
  CHECK(r.layer.stats().device_syncs == 1);  // the owner's frees carried no event: the newcomer waits once
  before = r.mark();
  pairs_on(r.layer, s, 10);
  CHECK((r.mark() - before).frees == 10);
}

TEST_CASE("the stream of a call: the owner alone leaves its short path when a capture is announced or another stream shares the layer")
{
  asked_rig r({.check_capture = false});
  const identified_stream s = r.world.identify(r.world.create());
  pairs_on(r.layer, s, 13);

  // Announced: the owner's allocation under capture comes from the private pool, and no event is recorded.
  r.layer.begin_allocate_to_pool(7);
  r.world.begin_capture(s.stream());
  auto before = r.mark();
  void* a = r.layer.allocate_async(1 << 16, 256, s);
  CHECK(r.layer.pool_blocks(7) == 1);
  CHECK((r.mark() - before).captures >= 1);
  r.layer.deallocate_async(a, 1 << 16, 256, s);  // kept for the graph
  CHECK(r.layer.pool_blocks(7) == 1);
  void* graph = r.world.end_capture(s.stream());
  r.layer.end_allocate_to_pool(7);
  CHECK(r.world.captured_records() == 0);

  // A private pool lives: calls still look at it (a block freed later may be the pool's).
  before = r.mark();
  pairs_on(r.layer, s, 10);
  CHECK((r.mark() - before).tag_questions > 0);
  r.world.destroy_graph(graph);
  r.layer.release_pool(7);
  r.layer.release();
  REQUIRE(r.layer.private_pools() == 0);
  before = r.mark();
  pairs_on(r.layer, s, 10);
  CHECK((r.mark() - before).tag_questions == 0);  // quiet again

  // Another stream shares the layer: from now on every owner free carries an event, so t can wait for it.
  const identified_stream t = r.world.identify(r.world.create());
  r.layer.deallocate_async(r.layer.allocate_async(4096, 256, t), 4096, 256, t);
  void* x = r.layer.allocate_async(1 << 20, 256, s);
  r.world.launch(s.stream());
  before = r.mark();
  r.layer.deallocate_async(x, 1 << 20, 256, s);
  CHECK((r.mark() - before).records == 1);
  void* y = r.layer.allocate_async(1 << 20, 256, t);
  CHECK(r.layer.stats().orderings >= 1);  // t waits for s's free on the GPU before taking from the policy
  r.layer.deallocate_async(y, 1 << 20, 256, t);
  r.world.finish_all();
  r.layer.release();
}
