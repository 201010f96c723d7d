// synchronized and thread_cached under 8 threads hammering one pool with random sizes. Every block is filled
// with its owner's pattern and checked before it is freed (two threads handed overlapping memory would
// overwrite each other's patterns); at a barrier all live blocks are checked for overlap; at the end
// everything is back at the upstream. Also run under ThreadSanitizer by .ci/run.
#include <doctest/doctest.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <strata/adaptor/synchronized.hpp>
#include <strata/adaptor/thread_cached.hpp>
#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/host_source.hpp>
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

TEST_CASE("threads: 8 threads on thread_cached<coalescing_pool>, caches drained at release")
{
  spy<host_source> upstream;
  {
    thread_cached<coalescing_pool<ref<spy<host_source>>>> pool{coalescing_pool<ref<spy<host_source>>>{ref(upstream)}};
    hammer(pool, 20'000);
    CHECK(pool.threads_seen() == thread_count);
    const auto [blocks, bytes] = pool.cached();
    CHECK(pool.with_lock([](auto& shared) { return shared.usage().in_use; }) == bytes);  // only caches hold blocks
    pool.release();
    CHECK(pool.cached().first == 0);
    CHECK(pool.with_lock([](auto& shared) { return shared.usage().reserved; }) == 0);
    (void)blocks;
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
  // Another thread has a cache of its own.
  std::thread([&] { pool.deallocate(pool.allocate(1000), 1000); }).join();
  CHECK(pool.threads_seen() == 2);
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
