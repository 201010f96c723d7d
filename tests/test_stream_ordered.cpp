// stream_ordered's bookkeeping over a simulated GPU: every hand-out checked against the rule that a block
// freed on stream s reaches another stream only after s's earlier work is done or ordered before it.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <vector>

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

/// Where and when the user freed a block: the work enqueued on that stream before the free may still use it.
struct free_record {
  std::uint64_t stream;
  std::uint64_t ticket;
};

/// Sits between stream_ordered and its policy and checks that a block goes back to the policy (where any
/// stream may get it) only when the work before its last free has completed.
template <class Policy, bool ReportsRoom = false>
class watched : public forward_properties<watched<Policy, ReportsRoom>, Policy> {
public:
  watched(Policy policy, simulated_streams& world, std::map<void*, free_record>& freed)
      : policy_(std::move(policy)), world_(&world), freed_(&freed)
  {}
  void* allocate(std::size_t bytes, std::size_t alignment) { return policy_.allocate(bytes, alignment); }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept
  {
    const auto it = freed_->find(p);
    if (it == freed_->end()) {
      ++unknown_returns;
    } else {
      if (world_->completed(it->second.stream) < it->second.ticket) ++early_returns;
      freed_->erase(it);
    }
    policy_.deallocate(p, bytes, alignment);
  }
  std::size_t good_size(std::size_t bytes, std::size_t alignment) const { return policy_.good_size(bytes, alignment); }
  strata::usage usage() const noexcept { return policy_.usage(); }
  bool has_room_for(std::size_t bytes, std::size_t alignment) const noexcept
    requires ReportsRoom
  {
    return policy_.has_room_for(bytes, alignment);
  }
  friend bool operator==(const watched& a, const watched& b) noexcept { return &a == &b; }

  Policy policy_;
  simulated_streams* world_;
  std::map<void*, free_record>* freed_;
  int early_returns = 0;
  int unknown_returns = 0;
};

using capped_pool = coalescing_pool<ref<spy<simulated_source>>>;
template <bool ReportsRoom>
using checked_layer = stream_ordered<watched<capped_pool, ReportsRoom>, simulated_events>;

/// A layer over a capacity-limited simulated device, with the bookkeeping the checks need. Without room
/// reports the layer hands blocks back whenever it can; with them, only when the policy would grow.
template <bool ReportsRoom = false>
struct rig {
  explicit rig(std::size_t capacity, typename checked_layer<ReportsRoom>::options opts = {})
      : upstream(simulated_source(capacity)),
        layer(watched<capped_pool, ReportsRoom>(capped_pool{ref(upstream), {.initial_chunk = 1 << 20, .max_chunk = 1 << 20}}, world, freed),
              opts, simulated_events(world))
  {}

  void* allocate(std::size_t bytes, cuda::stream_ref s)
  {
    void* p = layer.allocate_async(bytes, 256, s);
    check_handout(p, world.id_of(s));
    return p;
  }
  void free(void* p, std::size_t bytes, cuda::stream_ref s)
  {
    const std::uint64_t id = world.id_of(s);
    freed[p] = {id, world.enqueued(id)};
    layer.deallocate_async(p, bytes, 256, s);
  }
  /// A block the layer hands to stream t: fresh from the policy, or freed earlier and now safe for t.
  void check_handout(void* p, std::uint64_t t)
  {
    const auto it = freed.find(p);
    if (it == freed.end()) return;
    const auto [s, ticket] = it->second;
    const bool safe = s == t || world.completed(s) >= ticket || world.ordered_after(t, s) >= ticket;
    REQUIRE(safe);
    freed.erase(it);
  }

  simulated_streams world;
  std::map<void*, free_record> freed;
  spy<simulated_source> upstream;
  checked_layer<ReportsRoom> layer;
};

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

TEST_CASE("stream_ordered: same-stream reuse is immediate, with no policy call and no event")
{
  simulated_streams world;
  spy<host_source> policy;
  stream_ordered<ref<spy<host_source>>, simulated_events> layer{ref(policy), {}, simulated_events(world)};
  const cuda::stream_ref s = world.create();
  void* first = layer.allocate_async(1000, 256, s);
  world.launch(s);  // a kernel still using the block when it is freed
  layer.deallocate_async(first, 1000, 256, s);
  for (int i = 0; i < 100; ++i) {
    void* again = layer.allocate_async(1000, 256, s);
    CHECK(again == first);
    world.launch(s);
    layer.deallocate_async(again, 1000, 256, s);
  }
  CHECK(policy.allocations() == 1);
  CHECK(world.calls().records == 0);
  CHECK(world.calls().host_waits + world.calls().stream_waits + world.calls().device_waits == 0);
  CHECK(layer.stats().hits == 100);
  CHECK(layer.cached_bytes() == 1024);
}

TEST_CASE("stream_ordered: another stream waits for the freeing stream's work or gets other memory")
{
  rig<> r(64 << 20);
  const cuda::stream_ref a = r.world.create(), b = r.world.create();
  void* x = r.allocate(4096, a);
  r.world.launch(a);
  r.free(x, 4096, a);
  void* y = r.allocate(4096, b);  // a's kernel is still running: y must not be x
  CHECK(y != x);
  r.world.finish(a);
  r.layer.deallocate_async(y, 4096, 256, b);
  // A miss on a records an event after x; once a passes it, x goes back to the policy for anyone.
  void* z = r.allocate(8192, a);
  r.world.finish(a);
  void* w = r.allocate(100000, b);  // a miss on b reaps a's completed event
  CHECK(r.layer.policy().early_returns == 0);
  CHECK(r.freed.count(x) == 0);  // x went back to the policy
  r.free(z, 8192, a);
  r.free(w, 100000, b);
}

TEST_CASE("stream_ordered: cached blocks stay with their stream while the policy has room")
{
  rig<true> r(2 << 20);
  const cuda::stream_ref a = r.world.create(), b = r.world.create();
  const std::size_t cycle[] = {4096, 65536, 200000};
  for (int round = 0; round < 50; ++round)
    for (std::size_t bytes : cycle) {
      r.free(r.allocate(bytes, a), bytes, a);
      r.world.launch(a);
      r.world.finish(a);
    }
  CHECK(r.layer.stats().misses == 3);  // once per shape, then every request is a hit
  CHECK(r.layer.cached_blocks() == 3);
  CHECK(r.world.calls().records == 0);
  // Stream b needs more than the policy has free. a's blocks were re-freed since a last recorded an event, so
  // nothing says a is done with them: the policy grows rather than the host waiting.
  void* big = r.allocate(900000, b);
  CHECK(r.layer.cached_blocks() == 3);
  CHECK(r.upstream.allocations() == 2);
  CHECK(r.layer.stats().host_waits == 0);
  // With the device full, the out-of-memory path waits for a's work and hands its blocks back.
  void* second = r.allocate(900000, b);
  CHECK(r.layer.cached_blocks() == 0);
  CHECK(r.layer.stats().host_waits == 1);
  r.free(big, 900000, b);
  r.free(second, 900000, b);
  CHECK(r.layer.policy().early_returns == 0);
}

TEST_CASE("stream_ordered: a stream that keeps caching blocks it does not reuse records events for them")
{
  rig<true> r(64 << 20);
  const cuda::stream_ref a = r.world.create();
  std::vector<void*> held;
  for (int i = 0; i < 24; ++i) held.push_back(r.allocate(4096 * (i + 1), a));
  for (int i = 0; i < 24; ++i) r.free(held[i], 4096 * (i + 1), a);
  CHECK(r.world.calls().records == 2);  // after 8 blocks, then after 16 more (twice the 8 cached then)
  // Recording the second saw the first complete (no work was enqueued): its 8 blocks went back.
  CHECK(r.layer.pending_events() == 1);
  CHECK(r.layer.cached_blocks() == 16);
}

TEST_CASE("stream_ordered: a full policy hands a block over with a stream wait, not a host wait")
{
  rig<> r(1 << 20, {.frees_per_event = 1});
  const cuda::stream_ref a = r.world.create(), b = r.world.create();
  void* x = r.allocate(1 << 20, a);
  const std::uint64_t ticket = r.world.launch(a);
  r.free(x, 1 << 20, a);
  CHECK(r.world.calls().records == 1);
  void* y = r.allocate(1 << 20, b);
  CHECK(y == x);
  CHECK(r.world.ordered_after(r.world.id_of(b), r.world.id_of(a)) == ticket);
  CHECK(r.world.completed(r.world.id_of(a)) < ticket);  // the host never waited
  CHECK(r.layer.stats().handovers == 1);
  CHECK(r.layer.stats().host_waits == 0);
  r.free(y, 1 << 20, b);
}

TEST_CASE("stream_ordered: out of memory with pending frees waits for them and retries once")
{
  rig<> r(1 << 20);
  const cuda::stream_ref a = r.world.create(), b = r.world.create();
  void* x = r.allocate(512 << 10, a);
  void* x2 = r.allocate(512 << 10, a);
  r.world.launch(a);
  r.free(x, 512 << 10, a);
  r.free(x2, 512 << 10, a);  // no event yet: the frees are uncovered
  void* y = r.allocate(1 << 20, b);  // a different shape: only the merged chunk fits
  CHECK(y != nullptr);
  CHECK(r.world.calls().device_waits == 1);
  CHECK(r.layer.stats().host_waits == 1);
  CHECK(r.layer.policy().early_returns == 0);
  // Nothing cached now and the device full: out_of_memory from the policy, the layer still usable.
  CHECK_THROWS_AS(r.allocate(1 << 20, a), out_of_memory);
  r.free(y, 1 << 20, b);
  void* again = r.allocate(1 << 20, a);
  CHECK(again != nullptr);
  r.free(again, 1 << 20, a);
}

TEST_CASE("stream_ordered: a new stream with a destroyed stream's handle does not inherit its blocks")
{
  rig<> r(64 << 20);
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
  CHECK(r.layer.policy().early_returns == 0);
  CHECK(r.layer.streams_tracked() <= 2);
}

TEST_CASE("stream_ordered: a synchronous allocate of a cached block waits for the default stream")
{
  simulated_streams world;
  spy<host_source> policy;
  stream_ordered<ref<spy<host_source>>, simulated_events> layer{ref(policy), {}, simulated_events(world)};
  void* p = layer.allocate(5000);
  world.launch(simulated_streams::legacy());
  layer.deallocate(p, 5000);
  void* q = layer.allocate(5000);
  CHECK(q == p);
  CHECK(world.calls().stream_waits == 1);
  CHECK(world.completed(0) == world.enqueued(0));
  layer.deallocate(q, 5000);
}

TEST_CASE("stream_ordered: the per-thread default stream and stream 0 are streams of their own")
{
  simulated_streams world;
  stream_ordered<coalescing_pool<host_source>, simulated_events> layer{coalescing_pool<host_source>{}, {}, simulated_events(world)};
  void* a = layer.allocate_async(3000, 256, cuda::stream_ref{cudaStreamPerThread});
  world.launch(cuda::stream_ref{cudaStreamPerThread});
  layer.deallocate_async(a, 3000, 256, cuda::stream_ref{cudaStreamPerThread});
  void* b = layer.allocate_async(3000, 256, cuda::stream_ref{cudaStream_t{}});  // the legacy stream
  CHECK(b != a);
  void* c = layer.allocate_async(3000, 256, cuda::stream_ref{cudaStreamPerThread});
  CHECK(c == a);
  layer.deallocate_async(b, 3000, 256, cuda::stream_ref{cudaStream_t{}});
  layer.deallocate_async(c, 3000, 256, cuda::stream_ref{cudaStreamPerThread});
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
  // A free on a stream the backend does not know: the layer waits for the device and returns it directly.
  void* p = layer.allocate_async(100, 256, s);
  layer.deallocate_async(p, 100, 256, cuda::stream_ref{reinterpret_cast<cudaStream_t>(0x999)});
  CHECK(policy.outstanding_blocks() == 0);
  CHECK(world.calls().device_waits == 1);
}

TEST_CASE("stream_ordered: moving hands over the cached blocks and events")
{
  simulated_streams world;
  spy<host_source> policy;
  {
    stream_ordered<ref<spy<host_source>>, simulated_events> first{ref(policy), {.frees_per_event = 1}, simulated_events(world)};
    const cuda::stream_ref s = world.create();
    void* p = first.allocate_async(1000, 256, s);
    world.launch(s);
    first.deallocate_async(p, 1000, 256, s);
    auto second = std::move(first);
    CHECK(first.cached_blocks() == 0);
    CHECK(second.cached_blocks() == 1);
    CHECK(second.pending_events() == 1);
    CHECK(second.allocate_async(1000, 256, s) == p);
    second.deallocate_async(p, 1000, 256, s);
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
    std::size_t refusals = 0;
    auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
    for (int step = 0; step < 20'000; ++step) {
      const int what = percent(rng);
      if (what < 40 && live.size() < 200) {
        const std::size_t si = pick(streams.size());
        const std::size_t bytes = percent(rng) < 80 ? shapes[pick(6)] : 1 + pick(2 << 20);
        void* p = nullptr;
        try {
          p = r.allocate(bytes, streams[si]);
        } catch (const out_of_memory&) {
          ++refusals;
          continue;
        }
        REQUIRE(is_aligned(p, 256));
        REQUIRE(overlap.add({p, bytes, 256}));
        live.push_back({p, bytes, si});
      } else if (what < 80 && !live.empty()) {
        const std::size_t i = pick(live.size());
        const block b = live[i];
        live[i] = live.back();
        live.pop_back();
        for (std::size_t k = 0; k < overlap.size(); ++k)
          if (overlap.blocks()[k].p == b.p) {
            overlap.take(k);
            break;
          }
        // Mostly freed on the allocating stream, sometimes on another (the user ordered them).
        const std::size_t on = percent(rng) < 80 ? b.stream : pick(streams.size());
        r.free(b.p, b.bytes, streams[on]);
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
      // Accounting: the policy's live bytes are the user's plus the layer's cache, exactly.
      std::size_t user_bytes = 0;
      for (const auto& b : live) user_bytes += r.layer.good_size(b.bytes, 256);
      REQUIRE(r.layer.usage().in_use == user_bytes);
      REQUIRE(r.layer.policy().usage().in_use == user_bytes + r.layer.cached_bytes());
      REQUIRE(r.layer.policy().early_returns == 0);
      REQUIRE(r.layer.policy().unknown_returns == 0);
    }
    MESSAGE("refusals: " << refusals << ", hits " << r.layer.stats().hits << ", misses " << r.layer.stats().misses
                         << ", handovers " << r.layer.stats().handovers << ", host waits " << r.layer.stats().host_waits);
    CHECK(r.layer.stats().hits > 1000);
    for (const auto& b : live) r.free(b.p, b.bytes, streams[b.stream]);
    r.layer.release();
    CHECK(r.layer.cached_blocks() == 0);
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
