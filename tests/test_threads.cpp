// synchronized and thread_cached under 8 threads hammering one pool with random sizes. Every block is filled
// with its owner's pattern and checked before it is freed (two threads handed overlapping memory would
// overwrite each other's patterns); at a barrier all live blocks are checked for overlap; at the end
// everything is back at the upstream. Then every box that claims thread safety frees, on one thread, blocks
// another thread allocated; thread_cached returns an exiting thread's cache; callbacks that come back into
// a locked box do not deadlock. Also run under ThreadSanitizer by .ci/sanitize.
#include <doctest/doctest.h>

#include <atomic>
#include <barrier>
#include <condition_variable>
#include <deque>
#include <latch>
#include <sstream>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <strata/adaptor/checked.hpp>
#include <strata/adaptor/limit.hpp>
#include <strata/adaptor/recorder.hpp>
#include <strata/adaptor/retry_on_oom.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/adaptor/synchronized.hpp>
#include <strata/adaptor/thread_cached.hpp>
#include <strata/adaptor/tracking.hpp>
#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>
#include "support/invariants.hpp"
#include "support/spy.hpp"

using namespace strata;
using strata::testing::spy;

namespace {

constexpr int thread_count = 8;

struct owned_block {
  unsigned char* p;
  std::size_t bytes;
  unsigned char pattern;
};

/// Each thread allocates and frees at random, filling and checking its blocks; halfway through, all threads
/// stop at a barrier and one checks that no two live blocks, whichever thread owns them, overlap.
template <class Pool>
void hammer(Pool& pool, int operations)
{
  std::mutex live_mutex;
  std::vector<std::vector<owned_block>> live(thread_count);
  std::atomic<int> corrupted{0}, overlaps{0}, misaligned{0};
  std::barrier halfway(thread_count, [&]() noexcept {
    testing::live_set all;
    for (const auto& blocks : live)
      for (const auto& b : blocks)
        if (!all.add({b.p, b.bytes, 256})) ++overlaps;
  });
  auto worker = [&](int id) {
    std::mt19937_64 rng(id * 7919 + 1);
    std::uniform_real_distribution<double> log_size(0, 20);  // 1 B .. 1 MiB, log-uniform
    auto& mine = live[id];
    for (int op = 0; op < operations; ++op) {
      if (op == operations / 2) halfway.arrive_and_wait();
      if (mine.empty() || (mine.size() < 64 && rng() % 2 == 0)) {
        const auto bytes = static_cast<std::size_t>(std::exp2(log_size(rng)));
        auto* p = static_cast<unsigned char*>(pool.allocate(bytes, 256));
        if (!is_aligned(p, 256)) ++misaligned;
        const auto pattern = static_cast<unsigned char>(id * 31 + op);
        std::memset(p, pattern, bytes);
        std::lock_guard lock(live_mutex);
        mine.push_back({p, bytes, pattern});
      } else {
        const std::size_t i = rng() % mine.size();
        const owned_block b = mine[i];
        for (std::size_t k = 0; k < b.bytes; k += 61)
          if (b.p[k] != b.pattern) {
            ++corrupted;
            break;
          }
        {
          std::lock_guard lock(live_mutex);
          mine[i] = mine.back();
          mine.pop_back();
        }
        pool.deallocate(b.p, b.bytes, 256);
      }
    }
    for (const auto& b : mine) pool.deallocate(b.p, b.bytes, 256);
    mine.clear();
  };
  std::vector<std::thread> threads;
  for (int id = 0; id < thread_count; ++id) threads.emplace_back(worker, id);
  for (auto& t : threads) t.join();
  CHECK(corrupted == 0);
  CHECK(overlaps == 0);
  CHECK(misaligned == 0);
}

} // namespace

TEST_CASE("threads: 8 threads on synchronized<coalescing_pool>")
{
  spy<host_source> upstream;
  {
    synchronized<coalescing_pool<ref<spy<host_source>>>> pool{coalescing_pool<ref<spy<host_source>>>{ref(upstream)}};
    hammer(pool, 20'000);
    CHECK(pool.usage().in_use == 0);
    pool.release();
  }
  CHECK(upstream.outstanding_bytes() == 0);
  CHECK(upstream.mismatches() == 0);
}

TEST_CASE("threads: 8 threads on thread_cached<coalescing_pool>, caches drained at thread exit")
{
  spy<host_source> upstream;
  {
    thread_cached<coalescing_pool<ref<spy<host_source>>>> pool{coalescing_pool<ref<spy<host_source>>>{ref(upstream)}};
    hammer(pool, 20'000);
    // The threads have exited: their caches went back to the shared box.
    CHECK(pool.threads_seen() == 0);
    CHECK(pool.cached().first == 0);
    CHECK(pool.with_lock([](auto& shared) { return shared.usage().in_use; }) == 0);
    pool.release();
    CHECK(pool.with_lock([](auto& shared) { return shared.usage().reserved; }) == 0);
  }
  CHECK(upstream.outstanding_bytes() == 0);
  CHECK(upstream.mismatches() == 0);
}

TEST_CASE("thread_cached: a thread's frees serve its next allocations without the shared box")
{
  spy<host_source> upstream;
  thread_cached<ref<spy<host_source>>> pool{ref(upstream)};
  void* a = pool.allocate(1000);
  const std::size_t fetched = upstream.allocations();  // a refill fetches several blocks at once
  CHECK(fetched > 1);
  pool.deallocate(a, 1000);
  for (int i = 0; i < 1000; ++i) pool.deallocate(pool.allocate(1000), 1000);
  CHECK(upstream.allocations() == fetched);
  // Blocks above the largest class, or aligned above 256, go straight through.
  void* big = pool.allocate(4 << 20);
  void* aligned = pool.allocate(100, 4096);
  CHECK(upstream.holds(big));
  CHECK(upstream.holds(aligned));
  pool.deallocate(big, 4 << 20);
  pool.deallocate(aligned, 100, 4096);
  // Another thread has a cache of its own, returned when it exits.
  std::thread([&] {
    pool.deallocate(pool.allocate(1000), 1000);
    CHECK(pool.threads_seen() == 2);
  }).join();
  CHECK(pool.threads_seen() == 1);
  pool.release();
  CHECK(upstream.outstanding_blocks() == 0);
  CHECK(upstream.mismatches() == 0);
}

TEST_CASE("thread_cached: a full cache hands half its blocks back")
{
  spy<host_source> upstream;
  thread_cached<ref<spy<host_source>>> pool{ref(upstream), {.max_blocks_per_class = 8}};
  std::vector<void*> blocks;
  for (int i = 0; i < 100; ++i) blocks.push_back(pool.allocate(512));
  for (void* p : blocks) pool.deallocate(p, 512);
  CHECK(pool.cached().first <= 8);
  CHECK(upstream.outstanding_blocks() == pool.cached().first);
  pool.release();
  CHECK(upstream.outstanding_blocks() == 0);
}

TEST_CASE("thread_cached: 400 short-lived threads leave nothing parked")
{
  spy<host_source> upstream;
  thread_cached<ref<spy<host_source>>> pool{ref(upstream)};
  std::atomic<std::size_t> served{0};
  for (int round = 0; round < 50; ++round) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
      threads.emplace_back([&, t] {
        std::vector<std::pair<void*, std::size_t>> mine;
        for (int i = 0; i < 20; ++i) {
          const std::size_t bytes = std::size_t{256} << ((t + i) % 10);  // 256 B .. 128 KiB
          mine.emplace_back(pool.allocate(bytes), bytes);
        }
        for (auto [p, bytes] : mine) pool.deallocate(p, bytes);
        served += mine.size();
      });
    for (auto& t : threads) t.join();
  }
  CHECK(served == 400 * 20);
  CHECK(pool.threads_seen() == 0);
  CHECK(pool.cached().first == 0);
  CHECK(upstream.outstanding_blocks() == 0);  // nothing parked, not even before release()
  CHECK(upstream.mismatches() == 0);
}

TEST_CASE("thread_cached: a thread that outlives the box, and a box destroyed while threads hold caches")
{
  spy<host_source> upstream;
  std::latch filled(2), box_gone(1);
  std::vector<std::thread> threads;
  {
    thread_cached<ref<spy<host_source>>> pool{ref(upstream)};
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&] {
        pool.deallocate(pool.allocate(4096), 4096);
        filled.count_down();
        box_gone.wait();  // exits after the box has gone: its cache must not be touched
      });
    filled.wait();
    CHECK(pool.cached().first > 0);
  }
  CHECK(upstream.outstanding_blocks() == 0);
  box_gone.count_down();
  for (auto& t : threads) t.join();
}

TEST_CASE("thread_cached: a retry_on_oom callback that flushes every thread's cache (no deadlock)")
{
  // The shared box refuses beyond 256 KiB; two live threads park 4 KiB blocks in their caches, then this
  // thread asks for more than is left. The callback runs inside the shared box's call, under its lock,
  // and calls release(), which takes the lock again and drains the other threads' caches.
  using capped = limit<ref<spy<host_source>>>;
  spy<host_source> upstream;
  thread_cached<retry_on_oom<capped>>* box = nullptr;
  std::atomic<int> callbacks{0};
  thread_cached<retry_on_oom<capped>> pool{retry_on_oom<capped>{capped{ref(upstream), 256 << 10}, [&](std::size_t, int) {
                                             ++callbacks;
                                             box->release();
                                             return true;
                                           }}};
  box = &pool;
  std::latch parked(2), done(1);
  std::vector<std::thread> workers;
  for (int t = 0; t < 2; ++t)
    workers.emplace_back([&] {
      std::vector<void*> mine;
      for (int i = 0; i < 24; ++i) mine.push_back(pool.allocate(4096));
      for (void* p : mine) pool.deallocate(p, 4096);
      parked.count_down();
      done.wait();
    });
  parked.wait();
  const std::size_t parked_bytes = pool.cached().second;
  CHECK(parked_bytes >= 2 * 24 * 4096);
  void* big = pool.allocate(128 << 10);  // cacheable: the refill itself is refused, then rescued
  CHECK(big != nullptr);
  CHECK(callbacks >= 1);
  CHECK(pool.with_lock([](auto& r) { return r.rescued(); }) >= 1);
  void* huge = pool.allocate(100 << 10, 4096);  // not cacheable: the straight path is rescued too
  CHECK(huge != nullptr);
  pool.deallocate(huge, 100 << 10, 4096);
  pool.deallocate(big, 128 << 10);
  done.count_down();
  for (auto& t : workers) t.join();
  pool.release();
  CHECK(upstream.outstanding_blocks() == 0);
  CHECK(upstream.mismatches() == 0);
}

TEST_CASE("synchronized<retry_on_oom>: a callback that calls the outer box again (no deadlock)")
{
  using capped = limit<host_source>;
  synchronized<retry_on_oom<capped>>* box = nullptr;
  std::vector<void*> spares;
  synchronized<retry_on_oom<capped>> pool{retry_on_oom<capped>{capped{host_source{}, 64 << 10}, [&](std::size_t, int) {
                                            if (spares.empty()) return false;
                                            box->deallocate(spares.back(), 16 << 10);  // takes the lock again
                                            spares.pop_back();
                                            return true;
                                          }, 4}};
  box = &pool;
  for (int i = 0; i < 4; ++i) spares.push_back(pool.allocate(16 << 10));
  void* p = pool.allocate(32 << 10);  // needs two spares back
  CHECK(p != nullptr);
  CHECK(spares.size() == 2);
  CHECK(pool.with_lock([](auto& r) { return r.upstream().bytes_in_use(); }) == 64 << 10);
  CHECK_THROWS_AS(pool.allocate(64 << 10), out_of_memory);  // no spares can cover it: the refusal stands
  CHECK(spares.empty());
  pool.deallocate(p, 32 << 10);
  CHECK(pool.with_lock([](auto& r) { return r.upstream().bytes_in_use(); }) == 0);
}

namespace {

/// Producers allocate, consumers on other threads free what they allocated: the hand-over every pipeline
/// does (a loader thread allocates, a worker frees). Returns the blocks handed over and freed.
template <class Box>
std::size_t free_on_other_threads(Box& box, int per_producer = 2000)
{
  constexpr int producers = 4, consumers = 4;
  struct handed {
    void* p;
    std::size_t bytes;
  };
  std::mutex m;
  std::condition_variable ready;
  std::deque<handed> queue;
  int producing = producers;
  std::atomic<std::size_t> freed{0}, mismatched{0};
  std::vector<std::thread> threads;
  for (int id = 0; id < producers; ++id)
    threads.emplace_back([&, id] {
      std::mt19937_64 rng(id + 17);
      for (int i = 0; i < per_producer; ++i) {
        const std::size_t bytes = std::size_t{1} << (rng() % 17);  // 1 B .. 64 KiB
        void* p = box.allocate(bytes);
        static_cast<unsigned char*>(p)[0] = static_cast<unsigned char>(bytes % 251);
        std::lock_guard lock(m);
        queue.push_back({p, bytes});
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
        if (static_cast<unsigned char*>(h.p)[0] != h.bytes % 251) ++mismatched;
        box.deallocate(h.p, h.bytes);
        ++freed;
      }
    });
  for (auto& t : threads) t.join();
  CHECK(mismatched == 0);
  return freed;
}

constexpr std::size_t handed_over = 4 * 2000;

/// A host_source that counts outstanding blocks with atomics: a thread-safe spy.
struct counting_source : host_source {
  std::atomic<long>* outstanding;
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    void* p = host_source::allocate(bytes, alignment);
    ++*outstanding;
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    host_source::deallocate(p, bytes, alignment);
    --*outstanding;
  }
  friend bool operator==(const counting_source&, const counting_source&) noexcept { return true; }
};

} // namespace

TEST_CASE("threads: a block freed on another thread than the one that allocated it")
{
  using pool = coalescing_pool<ref<spy<host_source>>>;
  SUBCASE("host_source")
  {
    std::atomic<long> outstanding{0};
    counting_source source{{}, &outstanding};
    CHECK(free_on_other_threads(source) == handed_over);
    CHECK(outstanding == 0);
  }
  SUBCASE("simulated_source")
  {
    // 4 GiB of address space, not the default 1 TiB: under ThreadSanitizer a 1 TiB reservation can fail to find
    // room among the sanitizer's own ranges (it did in CI once), which would test the sanitizer, not the source.
    simulated_source source{std::size_t{1} << 30, std::size_t{4} << 30};
    // Never touched: a simulated block is not memory. Allocate and free across threads without a write.
    std::vector<std::thread> threads;
    std::mutex m;
    std::vector<void*> blocks;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&] {
        for (int i = 0; i < 1000; ++i) {
          void* p = source.allocate(4096);
          std::lock_guard lock(m);
          blocks.push_back(p);
        }
      });
    for (auto& t : threads) t.join();
    threads.clear();
    CHECK(blocks.size() == 4000);
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (std::size_t i = static_cast<std::size_t>(t); i < blocks.size(); i += 4) source.deallocate(blocks[i], 4096);
      });
    for (auto& t : threads) t.join();
    void* whole = source.allocate(std::size_t{1} << 30);  // the capacity is all free again
    CHECK(whole != nullptr);
    source.deallocate(whole, std::size_t{1} << 30);
  }
  SUBCASE("synchronized")
  {
    spy<host_source> upstream;
    synchronized<pool> box{pool{ref(upstream)}};
    CHECK(free_on_other_threads(box) == handed_over);
    CHECK(box.usage().in_use == 0);
    CHECK(box.usage().used_blocks == 0);
  }
  SUBCASE("thread_cached")
  {
    spy<host_source> upstream;
    {
      thread_cached<pool> box{pool{ref(upstream)}};
      CHECK(free_on_other_threads(box) == handed_over);
      CHECK(box.threads_seen() == 0);  // every thread has exited and returned its cache
      CHECK(box.with_lock([](auto& shared) { return shared.usage().in_use; }) == 0);
    }
    CHECK(upstream.outstanding_blocks() == 0);
    CHECK(upstream.mismatches() == 0);
  }
  SUBCASE("limit, statistics, recorder, tracking, checked over synchronized")
  {
    spy<host_source> upstream;
    std::ostringstream trace;
    using stack = checked<tracking<recorder<statistics<limit<synchronized<pool>>>>>>;
    stack box{tracking<recorder<statistics<limit<synchronized<pool>>>>>{recorder<statistics<limit<synchronized<pool>>>>{
        statistics<limit<synchronized<pool>>>{limit<synchronized<pool>>{synchronized<pool>{pool{ref(upstream)}}, 1 << 30}},
        trace}}};
    CHECK(free_on_other_threads(box) == handed_over);
    CHECK(box.outstanding() == 0);
    auto& tracked = box.upstream();
    CHECK(tracked.live_blocks() == 0);
    auto& recorded = tracked.upstream();
    CHECK(recorded.events() == 2 * handed_over);
    auto& counted = recorded.upstream();
    CHECK(counted.snapshot_counts().current_bytes == 0);
    CHECK(counted.snapshot_counts().total_blocks == handed_over);
    CHECK(counted.upstream().bytes_in_use() == 0);
    CHECK(counted.upstream().upstream().usage().in_use == 0);
  }
}
