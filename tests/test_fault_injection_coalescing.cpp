// coalescing_pool under host allocation failures, with the shared injector of
// support/fault_injection.hpp: every allocate of a long random workload is retried with its N-th host
// allocation failing, for every N, and after each failure the pool and its upstream are exactly as before.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <random>
#include <tuple>
#include <vector>

#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include "support/fault_injection.hpp"

using namespace strata;

namespace {
/// One set of lists for every size and chunks of exactly the sizes asked for (as in test_coalescing_pool.cpp).
template <class Pool>
typename Pool::options plain(std::size_t initial_chunk, std::size_t max_chunk = std::size_t{1} << 30)
{
  return {.initial_chunk = initial_chunk, .max_chunk = max_chunk, .small_limit = 0, .chunk_granularity = 256};
}
} // namespace

namespace {
/// An upstream that allocates no host memory itself (addresses from a bump pointer, counters only), so every
/// host allocation the hook sees is the pool's own.
class bump_source {
public:
  static constexpr std::size_t max_alignment = std::size_t{1} << 30;
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    next_ = (next_ + alignment - 1) / alignment * alignment;
    void* p = reinterpret_cast<void*>(next_);
    next_ += bytes;
    outstanding_bytes_ += bytes;
    ++outstanding_blocks_;
    return p;
  }
  void deallocate(void*, std::size_t bytes, std::size_t = default_alignment) noexcept
  {
    outstanding_bytes_ -= bytes;
    --outstanding_blocks_;
  }
  std::size_t outstanding_bytes() const noexcept { return outstanding_bytes_; }
  std::size_t outstanding_blocks() const noexcept { return outstanding_blocks_; }
  friend bool operator==(const bump_source& a, const bump_source& b) noexcept { return &a == &b; }

private:
  std::uintptr_t next_ = std::uintptr_t{1} << 40;
  std::size_t outstanding_bytes_ = 0;
  std::size_t outstanding_blocks_ = 0;
};

/// What must not change when an allocate throws: usage, every chunk's layout (chunks a failed growth took
/// again may sit at new addresses, so offsets and sizes only), the upstream's count.
template <class Pool>
auto observable_state(const Pool& pool, const bump_source& upstream)
{
  std::vector<std::vector<std::tuple<std::size_t, std::size_t, bool>>> layout;
  for (const auto& seg : pool.snapshot().segments) {
    layout.emplace_back();
    for (const auto& b : seg.blocks) layout.back().emplace_back(b.offset, b.size, b.free);
  }
  std::sort(layout.begin(), layout.end());
  return std::tuple(pool.usage(), layout, upstream.outstanding_bytes(), upstream.outstanding_blocks());
}
} // namespace

TEST_CASE("coalescing_pool: a host bad_alloc anywhere in allocate leaves the pool exactly as it was")
{
  using pool_type = coalescing_pool<ref<bump_source>>;
  auto run = [](pool_type::options opts) {
    bump_source upstream;
    pool_type pool{ref(upstream), opts};
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> log_size(8, 27);  // 256 B .. 128 MiB
    std::vector<std::tuple<void*, std::size_t, std::size_t>> live;
    std::size_t faults = 0, allocations = 0;
    for (int step = 0; step < 3000; ++step) {
      if (!live.empty() && (live.size() >= 300 || rng() % 2 == 0)) {
        const std::size_t i = rng() % live.size();
        auto [p, bytes, alignment] = live[i];
        live[i] = live.back();
        live.pop_back();
        pool.deallocate(p, bytes, alignment);
        continue;
      }
      const auto bytes = static_cast<std::size_t>(std::exp2(log_size(rng)));
      const std::size_t alignment = rng() % 10 == 0 ? std::size_t{1} << (8 + rng() % 13) : 256;
      for (long n = 0;; ++n) {
        const auto before = observable_state(pool, upstream);
        void* p = nullptr;
        bool threw = false;
        {
          namespace faults = testing::host_faults;
          faults::counted_section counting;
          faults::arm(static_cast<std::size_t>(n) + 1);
          try {
            p = pool.allocate(bytes, alignment);
          } catch (const std::bad_alloc&) {
            threw = true;
          }
          faults::disarm();
        }
        if (!threw) {
          REQUIRE(p != nullptr);
          live.emplace_back(p, bytes, alignment);
          ++allocations;
          break;
        }
        REQUIRE(testing::host_faults::fired());
        ++faults;
        REQUIRE(observable_state(pool, upstream) == before);
      }
    }
    for (auto [p, bytes, alignment] : live) pool.deallocate(p, bytes, alignment);
    pool.release();
    CHECK(upstream.outstanding_bytes() == 0);
    CHECK(allocations > 1000);
    CHECK(faults > 50);  // the hook found host allocations to fail: map nodes, slabs, rehashes
  };
  SUBCASE("defaults: small and large apart, free chunks handed back before growth") { run({}); }
  SUBCASE("one set of lists, small chunks") { run(plain<pool_type>(1 << 20, 8 << 20)); }
}
