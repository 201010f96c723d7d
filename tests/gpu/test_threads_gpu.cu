// The thread-safe boxes over real device, pinned, managed and pool-allocated memory: a block allocated and
// written (by a kernel) on one thread is checked (by a kernel) and freed on another, as a loader thread and
// a worker thread do. The host version of each box is in tests/test_threads.cpp.
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <strata/adaptor/statistics.hpp>
#include <strata/adaptor/synchronized.hpp>
#include <strata/adaptor/thread_cached.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/async_source.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/managed_source.hpp>
#include <strata/source/pinned_source.hpp>
#include "kernels.cuh"

using namespace strata;

namespace {

/// Producers allocate and fill, consumers check and free; returns the blocks that arrived intact and freed.
template <class Box>
std::size_t free_on_other_threads(Box& box, int per_producer = 200)
{
  constexpr int producers = 3, consumers = 3;
  struct handed {
    void* p;
    std::size_t bytes;
    std::uint32_t seed;
  };
  std::mutex m;
  std::condition_variable ready;
  std::deque<handed> queue;
  int producing = producers;
  std::atomic<std::size_t> intact{0};
  std::vector<std::thread> threads;
  for (int id = 0; id < producers; ++id)
    threads.emplace_back([&, id] {
      std::mt19937 rng(id + 5);
      for (int i = 0; i < per_producer; ++i) {
        const std::size_t bytes = std::size_t{4096} << (rng() % 8);  // 4 KiB .. 512 KiB
        void* p = box.allocate(bytes);
        const auto seed = static_cast<std::uint32_t>(id * 100'000 + i);
        testing::fill(p, bytes, seed);
        REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
        std::lock_guard lock(m);
        queue.push_back({p, bytes, seed});
        ready.notify_one();
      }
      std::lock_guard lock(m);
      if (--producing == 0) ready.notify_all();
    });
  for (int id = 0; id < consumers; ++id)
    threads.emplace_back([&] {
      for (;;) {
        std::unique_lock lock(m);
        ready.wait(lock, [&] { return !queue.empty() || producing == 0; });
        if (queue.empty()) return;
        const handed h = queue.front();
        queue.pop_front();
        lock.unlock();
        if (testing::mismatches(h.p, h.bytes, h.seed) == 0) ++intact;
        box.deallocate(h.p, h.bytes);
      }
    });
  for (auto& t : threads) t.join();
  return intact;
}

constexpr std::size_t handed_over = 3 * 200;

} // namespace

TEST_SUITE("gpu")
{
TEST_CASE("threads on the GPU: a block freed on another thread than the one that allocated it")
{
  SUBCASE("device_source")
  {
    device_source source;
    CHECK(free_on_other_threads(source) == handed_over);
  }
  SUBCASE("pinned_source")
  {
    pinned_source source;
    CHECK(free_on_other_threads(source) == handed_over);
  }
  SUBCASE("managed_source")
  {
    managed_source source;
    CHECK(free_on_other_threads(source) == handed_over);
  }
  SUBCASE("async_source (synchronous calls)")
  {
    async_source source;
    CHECK(free_on_other_threads(source) == handed_over);
  }
  SUBCASE("synchronized<coalescing_pool<device_source>>, counted by statistics")
  {
    statistics<synchronized<coalescing_pool<device_source>>> box;
    CHECK(free_on_other_threads(box) == handed_over);
    CHECK(box.snapshot_counts().current_blocks == 0);
    CHECK(box.upstream().usage().in_use == 0);
  }
  SUBCASE("thread_cached<coalescing_pool<device_source>>")
  {
    thread_cached<coalescing_pool<device_source>> box;
    CHECK(free_on_other_threads(box) == handed_over);
    CHECK(box.threads_seen() == 0);  // the threads have exited: their caches went back
    CHECK(box.with_lock([](auto& pool) { return pool.usage().in_use; }) == 0);
  }
}
}
