#include <doctest/doctest.h>

#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>
#include "support/conformance.hpp"
#include <strata/core/ref.hpp>
#include "support/spy.hpp"

using namespace strata;
using strata::testing::spy;
using pool_over_spy = coalescing_pool<ref<spy<simulated_source>>>;

namespace {
/// One set of lists for every size and chunks of exactly the sizes asked for: the TLSF mechanics alone,
/// without the defaults that keep small requests apart and round chunks to 2 MiB.
template <class Pool = pool_over_spy>
typename Pool::options plain(std::size_t initial_chunk, std::size_t max_chunk = std::size_t{1} << 30)
{
  return {.initial_chunk = initial_chunk, .max_chunk = max_chunk, .small_limit = 0, .chunk_granularity = 256};
}
} // namespace

static_assert(resource<coalescing_pool<host_source>> && owning_resource<coalescing_pool<host_source>>);
static_assert(sized_resource<coalescing_pool<host_source>> && releasable_resource<coalescing_pool<host_source>>);
static_assert(usage_reporting_resource<coalescing_pool<host_source>> && snapshot_resource<coalescing_pool<host_source>>);
static_assert(has_property<coalescing_pool<host_source>, host_accessible>);
static_assert(!has_property<coalescing_pool<simulated_source>, host_accessible>);

TEST_CASE("coalescing_pool conforms")
{
  coalescing_pool<host_source> pool;
  testing::check_conformance(pool, {.max_alignment = 1 << 20, .rejects_above = 1 << 30, .host_accessible = true});
}

TEST_CASE("coalescing_pool: split, merge with both neighbours, reuse")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream), plain(1 << 20)};
  char* a = static_cast<char*>(pool.allocate(1000));
  char* b = static_cast<char*>(pool.allocate(1000));
  char* c = static_cast<char*>(pool.allocate(1000));
  CHECK(b == a + 1024);
  CHECK(c == b + 1024);
  CHECK(pool.usage().free_blocks == 1);
  pool.deallocate(a, 1000);
  pool.deallocate(c, 1000);  // merges with the tail
  CHECK(pool.usage().free_blocks == 2);
  pool.deallocate(b, 1000);  // merges with both: one free block, the whole chunk
  const auto u = pool.usage();
  CHECK(u.free_blocks == 1);
  CHECK(u.largest_free == 1 << 20);
  CHECK(u.fragmentation() == 0.0);
  CHECK(pool.allocate(1 << 20) == a);
  CHECK(upstream.allocations() == 1);
  pool.deallocate(a, 1 << 20);
}

TEST_CASE("coalescing_pool: alignment padding stays free and usable")
{
  coalescing_pool<simulated_source> pool(simulated_source{}, plain<coalescing_pool<simulated_source>>(4 << 20));
  void* first = pool.allocate(256);
  void* aligned = pool.allocate(1000, 1 << 20);
  CHECK(is_aligned(aligned, 1 << 20));
  CHECK(pool.usage().in_use == 256 + 1024);
  void* filler = pool.allocate(4096);  // fits in the padding before the aligned block
  CHECK(static_cast<char*>(filler) < static_cast<char*>(aligned));
  for (void* p : {first, filler}) pool.deallocate(p, p == first ? 256 : 4096);
  pool.deallocate(aligned, 1000, 1 << 20);
  CHECK(pool.usage().free_blocks == 1);
}

TEST_CASE("coalescing_pool: randomized invariants")
{
  SUBCASE("simulated_source, log-uniform 256 B .. 64 MiB, alignments to 1 MiB")
  {
    spy<simulated_source> upstream;
    {
      pool_over_spy pool{ref(upstream)};
      testing::run_random_workload(pool, {.operations = 100'000, .max_live = 2000, .min_bytes = 256, .max_bytes = 64 << 20, .max_alignment = 1 << 20});
      CHECK(pool.usage().free_blocks == pool.usage().chunks);  // all merged back: one free block a chunk
      pool.release();
      CHECK(upstream.outstanding_bytes() == 0);
    }
    CHECK(upstream.mismatches() == 0);
  }
  SUBCASE("host_source, uniform 1 B .. 1 MiB")
  {
    spy<host_source> upstream;
    {
      coalescing_pool<ref<spy<host_source>>> pool{ref(upstream)};
      testing::run_random_workload(pool, {.operations = 100'000, .max_live = 1000, .log_uniform = false});
    }
    CHECK(upstream.outstanding_bytes() == 0);
    CHECK(upstream.mismatches() == 0);
  }
}

TEST_CASE("coalescing_pool: growth is geometric, and falls back to the smallest chunk that fits")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream), plain(1 << 20, 8 << 20)};
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (int i = 0; i < 6; ++i) blocks.emplace_back(pool.allocate(1 << 20), 1 << 20);
  // chunks of 1, 2, 4 MiB so far; the next would be 8 MiB
  CHECK(pool.usage().reserved == 7 << 20);
  upstream.refuse_above(3 << 20);  // the upstream cannot give 8 MiB any more...
  blocks.emplace_back(pool.allocate(2 << 20), 2 << 20);  // ...so a 2 MiB chunk is taken instead
  CHECK(pool.usage().reserved == 9 << 20);
  upstream.refuse_above(1 << 20);
  const auto before = pool.usage();
  CHECK_THROWS_WITH_AS((void)pool.allocate(2 << 20), doctest::Contains("coalescing_pool: out of memory allocating 2097152 bytes (reserved 9437184 bytes"), out_of_memory);
  CHECK(pool.usage() == before);  // unchanged
  for (auto [p, n] : blocks) pool.deallocate(p, n);
}

TEST_CASE("coalescing_pool: max_reserved caps what it takes")
{
  auto opts = plain<coalescing_pool<simulated_source>>(1 << 20);
  opts.max_reserved = 3 << 20;
  coalescing_pool<simulated_source> pool(simulated_source{}, opts);
  void* a = pool.allocate(1 << 20);
  void* b = pool.allocate(2 << 20);
  CHECK_THROWS_AS((void)pool.allocate(256), out_of_memory);
  pool.deallocate(a, 1 << 20);
  pool.deallocate(b, 2 << 20);
}

TEST_CASE("coalescing_pool: release returns exactly the wholly free chunks")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream), plain(1 << 20, 1 << 20)};
  std::vector<void*> blocks;
  for (int i = 0; i < 40; ++i) blocks.push_back(pool.allocate(200 << 10));  // 5 a chunk: 8 chunks
  CHECK(pool.usage().chunks == 8);
  for (int i = 0; i < 40; ++i)
    if (i % 10 != 0) pool.deallocate(blocks[i], 200 << 10);  // chunks 0, 2, 4, 6 keep one block
  const std::size_t returned = pool.release();
  CHECK(returned == 4 << 20);
  CHECK(pool.usage().chunks == 4);
  CHECK(upstream.outstanding_bytes() == 4 << 20);
  for (int i = 0; i < 40; i += 10) CHECK(pool.owns(blocks[i]));
  for (int i = 0; i < 40; i += 10) pool.deallocate(blocks[i], 200 << 10);
  CHECK(pool.release() == 4 << 20);
  CHECK(upstream.outstanding_bytes() == 0);
}

TEST_CASE("coalescing_pool: snapshot lists every block of every chunk, as JSON too")
{
  coalescing_pool<simulated_source> pool(simulated_source{}, plain<coalescing_pool<simulated_source>>(1 << 20));
  void* a = pool.allocate(1000);
  void* b = pool.allocate(3000);
  pool.deallocate(a, 1000);
  const auto s = pool.snapshot();
  REQUIRE(s.segments.size() == 1);
  REQUIRE(s.segments[0].blocks.size() == 3);
  CHECK(s.segments[0].blocks[0] == block_info{0, 1024, true, -1});
  CHECK(s.segments[0].blocks[1] == block_info{1024, 3072, false, -1});
  CHECK(s.segments[0].blocks[2] == block_info{4096, (1 << 20) - 4096, true, -1});
  CHECK(to_json(s).find("{\"offset\":1024,\"size\":3072,\"free\":false,\"stream\":-1}") != std::string::npos);
  pool.deallocate(b, 3000);
}

TEST_CASE("coalescing_pool: moves hand over the chunks")
{
  spy<simulated_source> upstream;
  pool_over_spy a{ref(upstream)};
  void* p = a.allocate(100);
  pool_over_spy b(std::move(a));
  CHECK(b.owns(p));
  CHECK_FALSE(a.owns(p));
  b.deallocate(p, 100);
  b.release();
  CHECK(upstream.outstanding_bytes() == 0);
}
