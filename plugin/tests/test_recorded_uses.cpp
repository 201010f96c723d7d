// record_stream's holding of blocks, over the pretend GPU: a block used on another stream is not given back
// before that stream's work at the free is done, and nothing else is delayed.
#include <doctest/doctest.h>

#include <utility>
#include <vector>

#include <strata/stream/simulated_streams.hpp>

#include "recorded_uses.hpp"

using namespace strata;
using namespace strata::plugin;

namespace {

struct freed {
  void* p;
  std::size_t bytes;
  cudaStream_t stream;
};

struct fixture {
  simulated_streams world;
  simulated_events backend{world};
  recorded_uses<simulated_events> uses;
  std::vector<freed> given_back;
  cuda::stream_ref a = world.create(), b = world.create(), c = world.create();
  void* p = reinterpret_cast<void*>(0x100000);

  auto collector()
  {
    return [this](void* q, std::size_t n, cudaStream_t s) { given_back.push_back({q, n, s}); };
  }
};

} // namespace

TEST_CASE("recorded_uses: an unrecorded block is not held")
{
  fixture f;
  CHECK(!f.uses.hold(f.backend, f.p, 256, f.a.get()));
  CHECK(f.world.calls().records == 0);  // nothing recorded, no event made
}

TEST_CASE("recorded_uses: a block recorded on another stream waits for that stream's work at the free")
{
  fixture f;
  f.uses.record(f.p, f.b.get());
  CHECK(f.uses.recorded(f.p));
  f.world.launch(f.b);  // work on b using the block, still running at the free
  REQUIRE(f.uses.hold(f.backend, f.p, 4096, f.a.get()));
  CHECK(f.uses.held_blocks() == 1);
  CHECK(f.uses.held_bytes() == 4096);
  CHECK(!f.uses.recorded(f.p));

  f.uses.reap(f.backend, f.collector());
  CHECK(f.given_back.empty());  // b's work is not done
  f.world.launch(f.b);          // later work on b does not delay it further
  f.world.finish(f.a);          // nor does the allocation stream's
  f.uses.reap(f.backend, f.collector());
  CHECK(f.given_back.empty());

  f.world.finish(f.b);
  f.uses.reap(f.backend, f.collector());
  REQUIRE(f.given_back.size() == 1);
  CHECK(f.given_back[0].p == f.p);
  CHECK(f.given_back[0].bytes == 4096);
  CHECK(f.given_back[0].stream == f.a.get());  // back on its own stream: that stream's order covers the rest
  CHECK(f.uses.held_blocks() == 0);
  CHECK(f.uses.held_bytes() == 0);
  CHECK(f.world.live_events() == f.uses.spare_events());  // the event is kept for the next hold, nothing leaks
  CHECK(f.uses.spare_events() == 1);
  CHECK(f.world.ordered_after(f.world.id_of(f.a), f.world.id_of(f.b)) == 0);  // no stream made to wait
}

TEST_CASE("recorded_uses: several streams; all must be done")
{
  fixture f;
  f.uses.record(f.p, f.b.get());
  f.uses.record(f.p, f.c.get());
  f.uses.record(f.p, f.b.get());  // twice: one event
  f.world.launch(f.b);
  f.world.launch(f.c);
  REQUIRE(f.uses.hold(f.backend, f.p, 256, f.a.get()));
  CHECK(f.world.calls().records == 2);
  f.world.finish(f.b);
  f.uses.reap(f.backend, f.collector());
  CHECK(f.given_back.empty());
  f.world.finish(f.c);
  f.uses.reap(f.backend, f.collector());
  CHECK(f.given_back.size() == 1);
}

TEST_CASE("recorded_uses: recorded on its own free stream only: not held")
{
  fixture f;
  f.uses.record(f.p, f.a.get());
  CHECK(!f.uses.hold(f.backend, f.p, 256, f.a.get()));
  CHECK(f.uses.recorded_blocks() == 0);  // forgotten: the pointer may come back as a new block
}

TEST_CASE("recorded_uses: drain waits on the host for everything held")
{
  fixture f;
  void* q = reinterpret_cast<void*>(0x200000);
  f.uses.record(f.p, f.b.get());
  f.uses.record(q, f.c.get());
  f.world.launch(f.b);
  f.world.launch(f.c);
  REQUIRE(f.uses.hold(f.backend, f.p, 256, f.a.get()));
  REQUIRE(f.uses.hold(f.backend, q, 512, f.a.get()));
  f.uses.drain(f.backend, f.collector());
  CHECK(f.given_back.size() == 2);
  CHECK(f.world.calls().host_waits == 2);
  CHECK(f.world.completed(f.world.id_of(f.b)) == f.world.enqueued(f.world.id_of(f.b)));
  CHECK(f.uses.held_bytes() == 0);
}

TEST_CASE("recorded_uses: a failed drain keeps the block held, never given back as if safe")
{
  fixture f;
  f.uses.record(f.p, f.b.get());
  f.world.launch(f.b);
  REQUIRE(f.uses.hold(f.backend, f.p, 256, f.a.get()));
  f.world.fail_host_waits(true);
  CHECK_THROWS(f.uses.drain(f.backend, f.collector()));
  CHECK(f.given_back.empty());
  CHECK(f.uses.held_blocks() == 1);
  f.world.fail_host_waits(false);
  f.uses.drain(f.backend, f.collector());
  CHECK(f.given_back.size() == 1);
}

TEST_CASE("recorded_uses: under capture nothing is held and no event is recorded")
{
  fixture f;
  f.uses.record(f.p, f.b.get());
  f.world.launch(f.b);
  f.world.begin_capture(f.b);
  // Recorded on a capturing stream, freed on an uncaptured one: its use is in the graph, replayed at every
  // launch. An event there would be a node of the user's graph (legal, but never queryable), a host wait is
  // illegal: abandoned, never reused.
  CHECK(f.uses.hold(f.backend, f.p, 256, f.a.get()));
  CHECK(f.uses.abandoned_blocks() == 1);
  CHECK(f.uses.held_blocks() == 0);
  CHECK(f.world.captured_records() == 0);
  CHECK(f.world.calls().host_waits == 0);
  CHECK(f.world.live_events() == f.uses.spare_events());
  f.world.end_capture(f.b);

  // Freed on a capturing stream: not held (false), so the caller's stream_ordered files it in the capture's
  // private pool; nothing recorded, nothing waited for, nothing abandoned.
  fixture h;
  h.uses.record(h.p, h.b.get());
  h.world.launch(h.b);
  h.world.begin_capture(h.a);
  CHECK(!h.uses.hold(h.backend, h.p, 256, h.a.get()));
  CHECK(!h.uses.recorded(h.p));
  CHECK(h.uses.held_blocks() == 0);
  CHECK(h.uses.abandoned_blocks() == 0);
  CHECK(h.world.captured_records() == 0);
  CHECK(h.world.calls().records == 0);
  CHECK(h.world.calls().host_waits == 0);
  h.world.end_capture(h.a);

  // A stream destroyed before the free: neither an event nor a wait is possible; abandoned as well.
  fixture g;
  cuda::stream_ref gone = g.world.create();
  g.uses.record(g.p, gone.get());
  g.world.destroy(gone);
  CHECK(g.uses.hold(g.backend, g.p, 256, g.a.get()));
  CHECK(g.uses.abandoned_blocks() == 1);
  CHECK(g.world.live_events() == g.uses.spare_events());
}

TEST_CASE("recorded_uses: events are reused, and destroy() gives every one back")
{
  fixture f;
  int returned = 0;
  for (int i = 0; i < 100; ++i) {
    f.uses.record(f.p, f.b.get());
    f.uses.record(f.p, f.c.get());
    f.world.launch(f.b);
    REQUIRE(f.uses.hold(f.backend, f.p, 256, f.a.get()));
    f.world.finish(f.b);
    f.world.finish(f.c);
    f.uses.reap(f.backend, [&](void*, std::size_t, cudaStream_t) { ++returned; });
  }
  CHECK(returned == 100);
  CHECK(f.world.live_events() == 2);  // two streams' worth, made once
  CHECK(f.world.calls().records == 200);
  f.uses.record(f.p, f.b.get());
  f.world.launch(f.b);
  REQUIRE(f.uses.hold(f.backend, f.p, 256, f.a.get()));  // one held with its event at destruction
  f.uses.destroy(f.backend);
  CHECK(f.world.live_events() == 0);
  CHECK(f.uses.held_blocks() == 0);
  CHECK(f.uses.spare_events() == 0);
}

TEST_CASE("recorded_uses: reap asks one event per stream with work pending, and still frees what is done")
{
  // The plug-in reaps at every allocation; asking every held block's events each time cost an event
  // query per held block per allocation. Events on one stream complete in order, so after b's first pending
  // event the later blocks waiting on b need no query.
  fixture f;
  void* q = reinterpret_cast<void*>(0x200000);
  void* r = reinterpret_cast<void*>(0x300000);
  f.uses.record(f.p, f.b.get());
  f.world.launch(f.b);
  REQUIRE(f.uses.hold(f.backend, f.p, 256, f.a.get()));
  f.uses.record(q, f.b.get());
  f.world.launch(f.b);
  REQUIRE(f.uses.hold(f.backend, q, 512, f.a.get()));
  f.uses.record(r, f.c.get());
  f.world.launch(f.c);
  REQUIRE(f.uses.hold(f.backend, r, 1024, f.a.get()));

  const auto queries = f.world.calls().queries;
  f.uses.reap(f.backend, f.collector());
  CHECK(f.world.calls().queries == queries + 2);  // p's (pending: q is not asked) and r's
  CHECK(f.given_back.empty());

  f.world.finish(f.c);  // c's work is done, b's is not: r goes back past the blocks still waiting on b
  f.uses.reap(f.backend, f.collector());
  REQUIRE(f.given_back.size() == 1);
  CHECK(f.given_back[0].p == r);

  f.world.finish(f.b);
  f.uses.reap(f.backend, f.collector());
  REQUIRE(f.given_back.size() == 3);
  CHECK(f.given_back[1].p == f.p);
  CHECK(f.given_back[2].p == q);
  CHECK(f.uses.held_blocks() == 0);
  CHECK(f.uses.held_bytes() == 0);
}

TEST_CASE("recorded_uses: a block recorded on a stream that is done and one that is not stays held")
{
  fixture f;
  void* q = reinterpret_cast<void*>(0x200000);
  f.uses.record(f.p, f.b.get());
  f.uses.record(f.p, f.c.get());
  f.world.launch(f.b);
  f.world.launch(f.c);
  REQUIRE(f.uses.hold(f.backend, f.p, 256, f.a.get()));
  f.uses.record(q, f.c.get());
  f.world.launch(f.c);
  REQUIRE(f.uses.hold(f.backend, q, 256, f.a.get()));
  f.world.finish(f.b);
  f.uses.reap(f.backend, f.collector());
  CHECK(f.given_back.empty());  // p waits for c; q (on c, recorded later) is not asked
  f.world.finish(f.c);
  f.uses.reap(f.backend, f.collector());
  CHECK(f.given_back.size() == 2);
}
