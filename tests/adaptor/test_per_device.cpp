// per_device over pretend devices: allocation by the current device, frees by the block's device whatever is
// current, lazy and thread-safe construction, release/usage over the built stacks, stream-ordered stacks.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <strata/adaptor/per_device.hpp>
#include <strata/adaptor/synchronized.hpp>
#include <strata/core/ref.hpp>
#include <strata/default_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/simulated_devices.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "support/conformance.hpp"
#include "support/invariants.hpp"
#include "support/spy.hpp"

using namespace strata;
using strata::testing::spy;

namespace {

using device_pool = coalescing_pool<simulated_device_memory>;

struct pool_factory {
  simulated_devices* world;
  device_pool operator()(int device) const
  {
    return device_pool{simulated_device_memory(*world, device), {.initial_chunk = 1 << 20, .max_chunk = 4 << 20}};
  }
};
using pools = per_device<device_pool, pool_factory, simulated_devices::backend>;

pools make_pools(simulated_devices& world) { return pools{pool_factory{&world}, simulated_devices::backend(world)}; }

/// A source that remembers which device was current when each of its calls ran (non-owning: per_device must
/// ask the backend where a pointer lives).
class current_witness : public sync_names<current_witness> {
public:
  current_witness(simulated_devices& world, int device) : memory_(world, device), world_(&world) {}
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    allocate_current.push_back(world_->current());
    return memory_.allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    free_current.push_back(world_->current());
    memory_.deallocate(p, bytes, alignment);
  }
  friend bool operator==(const current_witness& a, const current_witness& b) noexcept { return &a == &b; }
  friend constexpr void get_property(const current_witness&, host_accessible) noexcept {}

  void release() { release_current.push_back(world_->current()); }
  int device() const noexcept { return memory_.device(); }
  std::vector<int> allocate_current, free_current, release_current;

private:
  simulated_device_memory memory_;
  simulated_devices* world_;
};

struct witness_factory {
  simulated_devices* world;
  current_witness operator()(int device) const { return current_witness(*world, device); }
};

/// Switches to a random device before every call, so a workload's frees mostly come from another device.
template <class R>
class device_hopping {
public:
  device_hopping(R& r, simulated_devices& world) : r_(&r), world_(&world) {}
  void* allocate(std::size_t bytes, std::size_t alignment)
  {
    hop();
    return r_->allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept
  {
    hop();
    r_->deallocate(p, bytes, alignment);
  }
  strata::usage usage() const { return r_->usage(); }
  friend bool operator==(const device_hopping& a, const device_hopping& b) noexcept { return &a == &b; }

private:
  void hop() noexcept { world_->make_current(pick_(rng_)); }
  R* r_;
  simulated_devices* world_;
  std::mt19937 rng_{7};
  std::uniform_int_distribution<int> pick_{0, 2};
};

} // namespace

TEST_CASE("per_device: allocations come from the current device's stack, built on first use")
{
  simulated_devices world(3);
  auto p = make_pools(world);
  CHECK(p.devices() == 3);
  for (int d = 0; d < 3; ++d) CHECK(p.built(d) == nullptr);

  world.make_current(1);
  void* a = p.allocate(1000);
  CHECK(world.device_of(a) == 1);
  CHECK(p.built(0) == nullptr);
  REQUIRE(p.built(1) != nullptr);
  CHECK(p.built(1)->owns(a));
  CHECK(p.usage(1).used_blocks == 1);
  CHECK(p.usage(0) == strata::usage{});

  world.make_current(2);
  void* b = p.allocate(3000);
  CHECK(world.device_of(b) == 2);
  CHECK(p.built(2)->owns(b));
  CHECK(p.usage().used_blocks == 2);
  CHECK(p.usage().reserved == p.usage(1).reserved + p.usage(2).reserved);
  CHECK(p.usage().in_use == p.usage(1).in_use + p.usage(2).in_use);

  p.deallocate(a, 1000);
  p.deallocate(b, 3000);
  CHECK(p.usage().used_blocks == 0);
}

TEST_CASE("per_device: a block freed while another device is current goes back to its own stack")
{
  simulated_devices world(2);
  auto p = make_pools(world);
  world.make_current(0);
  void* on0 = p.allocate(5000);
  world.make_current(1);
  void* on1 = p.allocate(7000);
  CHECK(p.device_of_block(on0) == 0);
  CHECK(p.device_of_block(on1) == 1);
  CHECK(p.owns(on0));

  const auto queries = world.pointer_queries();
  p.deallocate(on0, 5000);  // device 1 current
  CHECK(p.usage(0).used_blocks == 0);
  CHECK(p.usage(1).used_blocks == 1);
  world.make_current(0);
  p.deallocate(on1, 7000);
  CHECK(p.usage(1).used_blocks == 0);
  // Owning stacks answer owns(): no free asked where a pointer lives (no cudaPointerGetAttributes).
  CHECK(world.pointer_queries() == queries);
  CHECK(world.current() == 0);  // the caller's current device is left as it was
  int foreign = 0;
  CHECK_FALSE(p.owns(&foreign));
  CHECK(p.device_of_block(&foreign) == -1);
}

TEST_CASE("per_device over non-owning stacks asks where the pointer lives, and frees with its device current")
{
  simulated_devices world(3);
  per_device<current_witness, witness_factory, simulated_devices::backend> p{witness_factory{&world},
                                                                            simulated_devices::backend(world)};
  world.make_current(2);
  void* a = p.allocate(100);
  world.make_current(0);
  void* b = p.allocate(200);
  CHECK(p.built(2)->allocate_current == std::vector<int>{2});
  CHECK(p.built(0)->allocate_current == std::vector<int>{0});

  world.make_current(1);
  const auto queries = world.pointer_queries();
  p.deallocate(a, 100);
  p.deallocate(b, 200);
  CHECK(world.pointer_queries() == queries + 2);  // one query per free
  CHECK(p.built(2)->free_current == std::vector<int>{2});  // each free ran with its block's device current
  CHECK(p.built(0)->free_current == std::vector<int>{0});
  CHECK(world.current() == 1);  // and the caller's device was restored
  CHECK(world.claimed_ranges() == 0);
  CHECK(p.built(1) == nullptr);  // device 1 never allocated: never built

  p.release();  // each built stack releases with its own device current
  CHECK(p.built(0)->release_current == std::vector<int>{0});
  CHECK(p.built(2)->release_current == std::vector<int>{2});
  CHECK(world.current() == 1);

  // A pointer no device knows is ignored (misuse; nothing to free it to).
  int foreign = 0;
  p.deallocate(&foreign, sizeof foreign);
  CHECK(p.device_of_block(&foreign) == -1);
}

TEST_CASE("per_device routes each free to the spy that made the block")
{
  simulated_devices world(2);
  struct spy_factory {
    simulated_devices* world;
    spy<simulated_device_memory> operator()(int d) const { return spy<simulated_device_memory>(simulated_device_memory(*world, d)); }
  };
  per_device<spy<simulated_device_memory>, spy_factory, simulated_devices::backend> p{spy_factory{&world},
                                                                                      simulated_devices::backend(world)};
  std::vector<std::pair<void*, int>> blocks;
  for (int i = 0; i < 20; ++i) {
    world.make_current(i % 2);
    blocks.emplace_back(p.allocate(256 * (i + 1)), i);
  }
  for (auto [q, i] : blocks) {
    world.make_current((i + 1) % 2);  // always from the other device
    p.deallocate(q, 256 * (i + 1));
  }
  for (int d = 0; d < 2; ++d) {
    CAPTURE(d);
    CHECK(p.built(d)->allocations() == 10);
    CHECK(p.built(d)->frees() == 10);
    CHECK(p.built(d)->mismatches() == 0);
    CHECK(p.built(d)->outstanding_blocks() == 0);
  }
}

TEST_CASE("per_device: for_device builds on demand; devices outside the range are named")
{
  simulated_devices world(2);
  auto p = make_pools(world);
  device_pool& one = p.for_device(1);
  CHECK(&one == p.built(1));
  CHECK(&p.for_device(1) == &one);  // built once
  void* q = one.allocate(64);
  CHECK(world.device_of(q) == 1);
  CHECK(p.owns(q));
  world.make_current(0);
  p.deallocate(q, 64);  // freed through per_device while device 0 is current
  CHECK(one.usage().used_blocks == 0);

  for (int bad : {-1, 2, 100}) {
    CAPTURE(bad);
    try {
      (void)p.for_device(bad);
      FAIL("for_device accepted a device outside the range");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find("per_device: device " + std::to_string(bad) + " is not in [0, 2)") == 0);
    }
    CHECK_THROWS_AS((void)p.usage(bad), std::invalid_argument);
    CHECK(p.built(bad) == nullptr);
  }
}

TEST_CASE("per_device builds each stack once when many threads ask at once")
{
  simulated_devices world(4);
  std::atomic<int> built{0};
  struct counting_factory {
    simulated_devices* world;
    std::atomic<int>* built;
    device_pool operator()(int d) const
    {
      built->fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // widen the race window
      return device_pool{simulated_device_memory(*world, d)};
    }
  };
  per_device<device_pool, counting_factory, simulated_devices::backend> p{counting_factory{&world, &built},
                                                                          simulated_devices::backend(world)};
  std::vector<std::thread> threads;
  std::vector<device_pool*> seen(16);
  for (int t = 0; t < 16; ++t) threads.emplace_back([&, t] { seen[t] = &p.for_device(t % 4); });
  for (auto& t : threads) t.join();
  CHECK(built.load() == 4);
  for (int t = 0; t < 16; ++t) CHECK(seen[t] == p.built(t % 4));
}

TEST_CASE("per_device: a factory that throws leaves the device unbuilt, and the next call builds it")
{
  simulated_devices world(2);
  struct flaky_factory {
    simulated_devices* world;
    int* failures_left;
    device_pool operator()(int d) const
    {
      if ((*failures_left)-- > 0) throw out_of_memory("flaky_factory", 0, "on purpose");
      return device_pool{simulated_device_memory(*world, d)};
    }
  };
  int failures = 1;
  per_device<device_pool, flaky_factory, simulated_devices::backend> p{flaky_factory{&world, &failures},
                                                                       simulated_devices::backend(world)};
  CHECK_THROWS_AS((void)p.allocate(100), out_of_memory);
  CHECK(p.built(0) == nullptr);
  void* q = p.allocate(100);
  CHECK(p.built(0) != nullptr);
  p.deallocate(q, 100);
}

TEST_CASE("per_device: release() goes over every built stack; usage() sums them")
{
  simulated_devices world(3);
  auto p = make_pools(world);
  std::vector<void*> blocks;
  for (int d : {0, 2}) {
    world.make_current(d);
    blocks.push_back(p.allocate(3 << 20));
  }
  CHECK(p.usage().chunks == 2);
  CHECK(world.claimed_ranges() == 2);
  world.make_current(1);
  p.release();  // both blocks live: nothing to hand back
  CHECK(world.claimed_ranges() == 2);
  for (void* q : blocks) p.deallocate(q, 3 << 20);
  CHECK(p.usage().reserved > 0);
  p.release();
  CHECK(p.usage() == strata::usage{});
  CHECK(world.claimed_ranges() == 0);  // every chunk went back to its own device's memory
  CHECK(world.current() == 1);
}

TEST_CASE("per_device conforms")
{
  simulated_devices world(2);
  auto p = make_pools(world);
  world.make_current(1);
  testing::check_conformance(p, {.max_alignment = 1 << 20, .rejects_above = 0, .host_accessible = true});
  CHECK(p.built(0) == nullptr);
}

TEST_CASE("per_device: random allocations and frees, each from a random current device")
{
  simulated_devices world(3);
  auto p = make_pools(world);
  device_hopping hopping(p, world);
  const auto result = testing::run_random_workload(hopping, {.operations = 20'000, .max_live = 300, .max_bytes = 1 << 18});
  CHECK(result.frees == result.allocations);
  CHECK(p.usage().used_blocks == 0);
  for (int d = 0; d < 3; ++d) CHECK(p.built(d) != nullptr);
}

TEST_CASE("per_device over stream_ordered stacks: stream-ordered frees from another device reach the block's stack")
{
  simulated_devices world(2);
  simulated_streams streams;
  using layer = stream_ordered<device_pool, simulated_events>;
  struct layer_factory {
    simulated_devices* world;
    simulated_streams* streams;
    layer operator()(int d) const
    {
      return layer{device_pool{simulated_device_memory(*world, d)}, {}, simulated_events(*streams)};
    }
  };
  per_device<layer, layer_factory, simulated_devices::backend> p{layer_factory{&world, &streams},
                                                                 simulated_devices::backend(world)};
  static_assert(stream_resource<decltype(p)> && owning_resource<decltype(p)> && releasable_resource<decltype(p)>);
  const cuda::stream_ref s0 = streams.create(0), s1 = streams.create(1);
  world.make_current(0);
  void* a = p.allocate_async(4096, 256, s0);
  world.make_current(1);
  void* b = p.allocate_async(4096, 256, s1);
  CHECK(world.device_of(a) == 0);
  CHECK(world.device_of(b) == 1);
  p.deallocate_async(a, 4096, 256, s1);  // freed on device 1's stream, device 1 current
  CHECK(p.built(0)->usage().used_blocks == 0);
  CHECK(p.built(1)->usage().used_blocks == 1);
  world.make_current(0);
  p.deallocate(s0, b, 4096, 256);  // the CCCL 3.1 spelling
  CHECK(p.usage().used_blocks == 0);
  streams.finish_all();
  p.release();
  CHECK(p.usage().reserved == 0);
}

TEST_CASE("per_device moves hand every stack over")
{
  simulated_devices world(2);
  auto a = make_pools(world);
  void* q = a.allocate(1000);
  device_pool* stack = a.built(0);
  pools b(std::move(a));
  CHECK(b.built(0) == stack);
  CHECK(b.owns(q));
  CHECK(a.devices() == 0);  // NOLINT(bugprone-use-after-move): the rule under test
  CHECK_FALSE(a.owns(q));
  CHECK_THROWS_WITH_AS((void)a.allocate(10), doctest::Contains("moved from"), std::invalid_argument);
  b.deallocate(q, 1000);
  a = std::move(b);
  CHECK(a.built(0) == stack);
}

TEST_CASE("per_device over synchronized stacks: threads allocate on their device and free from another")
{
  simulated_devices world(2);
  using locked = synchronized<device_pool>;
  struct locked_factory {
    simulated_devices* world;
    locked operator()(int d) const { return locked(device_pool{simulated_device_memory(*world, d)}); }
  };
  per_device<locked, locked_factory, simulated_devices::backend> p{locked_factory{&world}, simulated_devices::backend(world)};
  constexpr int threads = 4, rounds = 2000;
  std::atomic<int> routed_home{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < rounds; ++i) {
        const int device = static_cast<int>(rng() % 2);
        world.make_current(device);  // per thread, as cudaSetDevice
        const std::size_t bytes = 256 + rng() % 100'000;
        void* q = p.allocate(bytes);
        routed_home += world.device_of(q) == device;
        mine.emplace_back(q, bytes);
        if (mine.size() > 16) {
          world.make_current(1 - device);  // free from the other device
          const auto [old, old_bytes] = mine.front();
          mine.erase(mine.begin());
          p.deallocate(old, old_bytes);
        }
      }
      for (auto [q, bytes] : mine) p.deallocate(q, bytes);
    });
  for (auto& w : workers) w.join();
  CHECK(routed_home.load() == threads * rounds);
  CHECK(p.usage().used_blocks == 0);
  CHECK(p.usage(0).in_use == 0);
  CHECK(p.usage(1).in_use == 0);
}

TEST_CASE("per_device over the recommended stack's planning twin routes every free by owns(), never by a query")
{
  simulated_devices world(2);
  simulated_streams streams;
  struct planning_factory {
    simulated_streams* streams;
    planning_pool operator()(int) const
    {
      return planning_pool{mapped_pool<simulated_pages>{simulated_pages{}}, {}, simulated_events(*streams)};
    }
  };
  per_device<planning_pool, planning_factory, simulated_devices::backend> p{planning_factory{&streams},
                                                                            simulated_devices::backend(world)};
  std::vector<std::pair<void*, int>> blocks;
  for (int i = 0; i < 200; ++i) {
    world.make_current(i % 2);
    blocks.emplace_back(p.allocate(4096 * (i + 1)), i % 2);
  }
  for (auto [q, d] : blocks) CHECK(p.device_of_block(q) == d);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    world.make_current(1 - blocks[i].second);  // from the other device
    p.deallocate(blocks[i].first, 4096 * (i + 1));
  }
  CHECK(world.pointer_queries() == 0);
  streams.finish_all();
  p.release();
  CHECK(p.built(0)->policy().physical_bytes() == 0);
  CHECK(p.built(1)->policy().physical_bytes() == 0);
}
