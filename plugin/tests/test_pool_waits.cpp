// A private pool's parked blocks over the pretend GPU: revived only on the stream they were allocated on, and
// only once the work of every stream they were recorded on (record_stream) before their free has completed;
// deferred while an allocation to a pool is under way; carried to strata with their uses at the pool's release.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <random>
#include <string>
#include <vector>

#include <strata/stream/simulated_streams.hpp>

#include "block_table.hpp"
#include "pool_waits.hpp"

using namespace strata;
using namespace strata::plugin;

namespace {

const pool_id user{0, 1};
const pool_id graph{1, 0};

struct fixture {
  simulated_streams world;
  simulated_events events{world};
  block_table<std::string> t;
  pool_waits<simulated_events> waits;
  cuda::stream_ref a = world.create(), b = world.create(), c = world.create();

  fixture() { t.create_or_incref(user); }
  ~fixture() { waits.destroy(events); }

  void* h(cuda::stream_ref s) const { return s.get(); }
  void alloc(std::uintptr_t address, std::size_t size, cuda::stream_ref s, pool_id p = user)
  {
    t.insert(address, {size, size, s.get(), p, {}, {}});
  }
  /// The backend's free: park, and start the wait unless deferred.
  freed_block<std::string> free(std::uintptr_t address, bool defer = false)
  {
    auto e = t.erase(address, defer);
    REQUIRE(e);
    if (e->parked && e->ticket != 0 && !defer)
      if (!waits.hold(events, address, e->ticket, e->b.uses)) (void)t.settle(address, e->ticket);
    return *e;
  }
  /// The backend's allocation-time settling (no allocation to a pool under way).
  void settle()
  {
    waits.reap(events, [this](std::uintptr_t x, std::uint64_t k) noexcept { (void)t.settle(x, k); });
    for (const auto& f : t.take_deferred())
      if (!waits.hold(events, f.address, f.ticket, f.uses)) (void)t.settle(f.address, f.ticket);
  }
};

} // namespace

TEST_CASE("pool_waits: a parked block is revived on its own stream at once, never on another stream")
{
  fixture f;
  f.alloc(0x1000, 4096, f.a);
  f.world.launch(f.a);  // its work on its own stream: stream order covers the next owner on a
  const auto e = f.free(0x1000);
  CHECK(e.parked);
  CHECK(e.ticket == 0);  // nothing recorded: settled at once
  CHECK(!f.t.revive(user, 4096, 4096, f.h(f.b)));  // another stream would race with a's work
  CHECK(!f.t.revive(user, 4096, 4096, f.h(f.c)));
  const auto again = f.t.revive(user, 4096, 4096, f.h(f.a));
  REQUIRE(again);
  CHECK(*again == 0x1000);
  CHECK(f.world.calls().records == 0);  // no event where none is needed
}

TEST_CASE("pool_waits: a block recorded on a side stream waits for that stream's work at its free")
{
  fixture f;
  f.alloc(0x1000, 1 << 26, f.a);
  f.world.launch(f.b);  // the side stream's work on the block (a sleep, then a fill), still running
  CHECK(f.t.record_use(0x1000, f.h(f.b)));
  CHECK(f.t.record_use(0x1000, f.h(f.a)));  // its own stream: nothing to note
  REQUIRE(f.t.find(0x1000)->uses.size() == 1);
  const auto e = f.free(0x1000);
  CHECK(e.parked);
  CHECK(e.ticket != 0);
  CHECK(f.t.unsettled_blocks() == 1);
  CHECK(f.waits.waiting_blocks() == 1);
  CHECK(f.t.parked_bytes() == std::size_t{1} << 26);  // still the pool's

  f.settle();
  CHECK(!f.t.revive(user, 1 << 26, 1 << 26, f.h(f.a)));  // b still writes it
  f.world.launch(f.b);                                    // later work on b does not delay it
  f.world.finish(f.a);
  f.settle();
  CHECK(!f.t.revive(user, 1 << 26, 1 << 26, f.h(f.a)));

  f.world.finish(f.b);
  f.settle();
  CHECK(f.t.unsettled_blocks() == 0);
  CHECK(f.waits.waiting_blocks() == 0);
  CHECK(!f.t.revive(user, 1 << 26, 1 << 26, f.h(f.b)));  // settled, yet still only for its own stream
  const auto again = f.t.revive(user, 1 << 26, 1 << 26, f.h(f.a));
  REQUIRE(again);
  CHECK(*again == 0x1000);
  CHECK(f.t.find(0x1000)->uses.empty());  // the old uses are over
  CHECK(f.waits.spare_events() == 1);      // the event is kept for the next wait
  CHECK(f.world.live_events() == 1);
}

TEST_CASE("pool_waits: a record_stream outside the pools is left to strata's stack")
{
  fixture f;
  f.t.insert(0x1000, {512, 512, f.h(f.a), {}, {}, {}});
  CHECK(!f.t.record_use(0x1000, f.h(f.b)));
  CHECK(!f.t.record_use(0x9000, f.h(f.b)));  // not live
  CHECK(f.t.find(0x1000)->uses.empty());
}

TEST_CASE("pool_waits: a free while an allocation to a pool is under way is deferred; its wait starts later")
{
  fixture f;
  f.alloc(0x1000, 4096, f.a);
  (void)f.t.record_use(0x1000, f.h(f.b));
  f.world.launch(f.b);
  const auto e = f.free(0x1000, /*defer=*/true);
  CHECK(e.parked);
  CHECK(e.ticket != 0);
  CHECK(f.world.calls().records == 0);  // no event may be recorded while a capture may run
  CHECK(f.waits.waiting_blocks() == 0);
  CHECK(!f.t.revive(user, 4096, 4096, f.h(f.a)));  // deferred: not reusable, even on its own stream

  f.settle();  // no allocation to a pool under way any more: the wait starts
  CHECK(f.waits.waiting_blocks() == 1);
  CHECK(f.t.take_deferred().empty());
  CHECK(!f.t.revive(user, 4096, 4096, f.h(f.a)));
  f.world.finish(f.b);
  f.settle();
  CHECK(f.t.revive(user, 4096, 4096, f.h(f.a)) == std::optional<std::uintptr_t>{0x1000});
}

TEST_CASE("pool_waits: a use_on_oom pool lends a parked block only on its stream, and only once settled")
{
  fixture f;
  f.t.set_use_on_oom(user, true);
  f.alloc(0x1000, 4096, f.a);
  f.alloc(0x2000, 4096, f.a);
  (void)f.t.record_use(0x2000, f.h(f.b));
  f.world.launch(f.b);
  (void)f.free(0x1000);
  (void)f.free(0x2000);
  CHECK(!f.t.revive_on_oom(4096, 4096, f.h(f.b)));  // neither was allocated on b
  const auto first = f.t.revive_on_oom(4096, 4096, f.h(f.a));
  REQUIRE(first);
  CHECK(*first == 0x1000);                           // the settled one
  CHECK(!f.t.revive_on_oom(4096, 4096, f.h(f.a)));  // 0x2000 waits for b
  f.world.finish(f.b);
  f.settle();
  CHECK(f.t.revive_on_oom(4096, 4096, f.h(f.a)) == std::optional<std::uintptr_t>{0x2000});
}

TEST_CASE("pool_waits: a multi-stream capture's pool reuses nothing across its streams")
{
  fixture f;
  f.t.create_or_incref(graph);
  f.alloc(0x1000, 8192, f.b, graph);  // allocated on the side stream of the capture
  f.alloc(0x3000, 8192, f.a, graph);
  (void)f.t.record_use(0x3000, f.h(f.b));
  (void)f.free(0x1000, /*defer=*/true);
  (void)f.free(0x3000, /*defer=*/true);
  CHECK(!f.t.revive(graph, 8192, 8192, f.h(f.a)));  // b's block is b's; a's was used on b
  CHECK(f.t.revive(graph, 8192, 8192, f.h(f.b)) == std::optional<std::uintptr_t>{0x1000});
}

TEST_CASE("pool_waits: at the pool's release an unsettled block goes to strata with its uses; its late settle is ignored")
{
  fixture f;
  f.alloc(0x1000, 4096, f.a);
  (void)f.t.record_use(0x1000, f.h(f.b));
  f.world.launch(f.b);
  const auto e = f.free(0x1000);
  const auto returned = f.t.release(user);
  REQUIRE(returned.size() == 1);
  CHECK(returned[0].first == 0x1000);
  REQUIRE(returned[0].second.uses.size() == 1);
  CHECK(returned[0].second.uses[0] == f.h(f.b));  // strata's stack must hold it for b
  CHECK(!f.t.known(user));

  // The address comes back into a new pool and is parked there, settled; the old wait must not touch it.
  f.t.create_or_incref(user);
  f.alloc(0x1000, 4096, f.a);
  (void)f.t.record_use(0x1000, f.h(f.c));
  f.world.launch(f.c);
  const auto e2 = f.free(0x1000);
  CHECK(e2.ticket != e.ticket);
  f.world.finish(f.b);
  f.settle();                                        // the first wait ends: its ticket is stale
  CHECK(!f.t.revive(user, 4096, 4096, f.h(f.a)));  // c's work still runs
  f.world.finish(f.c);
  f.settle();
  CHECK(f.t.revive(user, 4096, 4096, f.h(f.a)) == std::optional<std::uintptr_t>{0x1000});
}

TEST_CASE("pool_waits: a checkpoint parks a recorded live block deferred, and revives blocks whatever their state")
{
  fixture f;
  f.alloc(0x1000, 4096, f.a);
  const auto saved = f.t.checkpoint(0, user);
  (void)f.t.record_use(0x1000, f.h(f.b));
  f.world.launch(f.b);
  f.alloc(0x2000, 4096, f.a);
  (void)f.t.record_use(0x2000, f.h(f.b));
  (void)f.t.restore(saved);  // 0x2000 parked: recorded on b, so deferred
  CHECK(f.t.find(0x1000) != nullptr);
  CHECK(f.t.unsettled_blocks() == 1);
  CHECK(!f.t.revive(user, 4096, 4096, f.h(f.a)));
  f.settle();
  f.world.finish(f.b);
  f.settle();
  CHECK(f.t.revive(user, 4096, 4096, f.h(f.a)) == std::optional<std::uintptr_t>{0x2000});
}

TEST_CASE("pool_waits: an event that cannot be recorded is replaced by a host wait; a failed host wait abandons")
{
  struct refusing_events : simulated_events {
    using simulated_events::simulated_events;
    void record(event, cuda::stream_ref) { throw std::runtime_error("cudaEventRecord failed (injected)"); }
  };
  simulated_streams world;
  refusing_events events{world};
  pool_waits<refusing_events> waits;
  const cuda::stream_ref b = world.create();
  const std::vector<void*> streams{b.get()};
  world.launch(b);
  CHECK(!waits.hold(events, 0x1000, 7, streams));  // b waited for on the host: settled at once
  CHECK(world.calls().stream_waits == 1);
  CHECK(waits.waiting_blocks() == 0);
  CHECK(waits.spare_events() == 1);  // the event made for it is kept, not leaked
  world.fail_host_waits(true);
  world.launch(b);
  CHECK(waits.hold(events, 0x2000, 8, streams));  // no event, no host wait: never settled
  CHECK(waits.abandoned_blocks() == 1);
  CHECK(waits.waiting_blocks() == 0);
  CHECK(!waits.hold(events, 0x3000, 9, {}));  // nothing to wait for
  waits.destroy(events);
  CHECK(world.live_events() == 0);
}

TEST_CASE("pool_waits: random traffic over three streams never revives a block before its users' work is done")
{
  std::mt19937_64 rng(40);
  fixture f;
  const cuda::stream_ref streams[] = {f.a, f.b, f.c};
  std::map<void*, std::uint64_t> launched, finished;
  struct owned {
    void* stream;
    std::vector<void*> uses;
  };
  std::map<std::uintptr_t, owned> live;
  // At each free: the range, its stream and what every user stream had launched; memory of the range is safe
  // to hand to its stream once each user finished that far. A later free of an overlapping range replaces it.
  struct free_record {
    std::size_t size;
    void* home;
    std::map<void*, std::uint64_t> need;
  };
  std::map<std::uintptr_t, free_record> freed;
  const auto overlapping = [&](std::uintptr_t a, std::size_t n) {
    std::vector<std::map<std::uintptr_t, free_record>::iterator> out;
    for (auto it = freed.begin(); it != freed.end(); ++it)
      if (it->first < a + n && a < it->first + it->second.size) out.push_back(it);
    return out;
  };
  std::uintptr_t next = 0x100000;
  std::size_t revived = 0, unsafe = 0, ops = 0;
  for (int i = 0; i < 20000; ++i) {
    const int r = static_cast<int>(rng() % 10);
    const cuda::stream_ref s = streams[rng() % 3];
    const bool defer = rng() % 8 == 0;
    if (r < 3) {
      const std::size_t size = 1024 * (1 + rng() % 3);
      if (defer == false) f.settle();
      if (const auto a = f.t.revive(user, size, size, s.get())) {
        ++revived;
        for (const auto& it : overlapping(*a, f.t.find(*a)->size)) {
          if (it->second.home != s.get()) ++unsafe;
          for (const auto& [u, n] : it->second.need)
            if (finished[u] < n) ++unsafe;
        }
        live[*a] = {s.get(), {}};
      } else {
        f.alloc(next, size, s);
        live[next] = {s.get(), {}};
        next += 0x10000;
      }
    } else if (r < 5 && !live.empty()) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      REQUIRE(f.t.record_use(it->first, s.get()));
      if (s.get() != it->second.stream) it->second.uses.push_back(s.get());
    } else if (r < 7) {
      launched[s.get()] = f.world.launch(s);
    } else if (r < 8) {
      f.world.finish(s);
      finished[s.get()] = launched[s.get()];
    } else if (!live.empty()) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      std::map<void*, std::uint64_t> need;
      for (void* u : it->second.uses) need[u] = launched[u];
      const std::size_t size = f.t.find(it->first)->size;
      for (const auto& old : overlapping(it->first, size)) freed.erase(old);
      freed[it->first] = {size, it->second.stream, need};
      const auto e = f.free(it->first, defer);
      if (!e.parked) break;
      live.erase(it);
    }
    ++ops;
  }
  CHECK(ops == 20000);
  CHECK(unsafe == 0);
  CHECK(revived > 1000);  // reuse happens: the rules do not simply refuse it
}
