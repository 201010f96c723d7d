#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <random>
#include <tuple>
#include <vector>

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

TEST_CASE("coalescing_pool: set_max_reserved moves the cap of a live pool; idle_bytes is what release hands back")
{
  auto opts = plain<coalescing_pool<simulated_source>>(1 << 20);
  coalescing_pool<simulated_source> pool(simulated_source{}, opts);
  CHECK(pool.max_reserved() == SIZE_MAX);
  void* a = pool.allocate(1 << 20);
  void* b = pool.allocate(2 << 20);
  pool.set_max_reserved(3 << 20);
  CHECK(pool.max_reserved() == std::size_t{3} << 20);
  CHECK_THROWS_AS((void)pool.allocate(1 << 20), out_of_memory);  // the pool holds 3 MiB: nothing more
  CHECK(pool.usage().reserved == std::size_t{3} << 20);
  CHECK(pool.idle_bytes() == 0);
  pool.deallocate(b, 2 << 20);
  CHECK(pool.idle_bytes() == pool.usage().reserved - (std::size_t{1} << 20));  // b's chunk is wholly free
  pool.set_max_reserved(SIZE_MAX);
  void* c = pool.allocate(8 << 20);
  CHECK(pool.usage().reserved >= std::size_t{9} << 20);
  pool.deallocate(c, 8 << 20);
  const std::size_t idle = pool.idle_bytes();
  CHECK(pool.release() == idle);
  CHECK(pool.idle_bytes() == 0);
  pool.deallocate(a, 1 << 20);
  CHECK(pool.idle_bytes() == pool.usage().reserved);
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

TEST_CASE("coalescing_pool: a move assignment gives the assigned-to pool's chunks back; the moved-from pool is empty and usable")
{
  spy<simulated_source> first, second;
  pool_over_spy a{ref(first)};
  pool_over_spy b{ref(second)};
  void* p = a.allocate(100);
  void* q = b.allocate(5000, 4096);
  a.deallocate(p, 100);
  a = std::move(b);
  CHECK(first.outstanding_bytes() == 0);
  CHECK(a.owns(q));
  CHECK(a.usage().in_use == b.good_size(5000));
  CHECK(b.usage().reserved == 0);  // NOLINT(bugprone-use-after-move): specified empty
  CHECK(b.usage().free_blocks == 0);
  CHECK_FALSE(b.owns(q));
  void* r = b.allocate(3000, 1024);  // usable: a chunk of its own from the same source
  CHECK(b.owns(r));
  CHECK(second.outstanding_bytes() == a.usage().reserved + b.usage().reserved);
  b.deallocate(r, 3000);
  a.deallocate(q, 5000);
  CHECK(a.usage().in_use == 0);
  a.release();
  b.release();
  CHECK(second.outstanding_bytes() == 0);
}

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;

/// The chunk sizes the pool holds, in address order.
template <class Pool>
std::vector<std::size_t> chunk_sizes(const Pool& pool)
{
  std::vector<std::size_t> sizes;
  for (const auto& seg : pool.snapshot().segments) sizes.push_back(seg.size);
  return sizes;
}
} // namespace

TEST_CASE("coalescing_pool: a free block of exactly the requested size is used, the pool does not grow")
{
  // 1 MiB + 4 KiB is not a TLSF list boundary: a search rounded up to the next list skips its own list.
  const std::size_t odd = MiB + 4096;
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream), plain(4 * MiB, 4 * MiB)};
  void* a = pool.allocate(odd);
  void* b = pool.allocate(odd);
  void* rest = pool.allocate(4 * MiB - 2 * odd);  // the chunk is full
  REQUIRE(pool.usage().free_blocks == 0);
  pool.deallocate(a, odd);  // a free block of exactly `odd`, its neighbour in use
  CHECK(pool.allocate(odd) == a);
  CHECK(upstream.allocations() == 1);
  CHECK(pool.usage().reserved == 4 * MiB);
  for (void* p : {a, b}) pool.deallocate(p, odd);
  pool.deallocate(rest, 4 * MiB - 2 * odd);
}

TEST_CASE("coalescing_pool: of several free blocks in the request's list, the best fit is taken")
{
  const std::size_t odd = MiB + 4096;
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream), plain(8 * MiB, 8 * MiB)};
  void* larger = pool.allocate(odd + 512);
  void* fence1 = pool.allocate(256);
  void* exact = pool.allocate(odd);
  void* fence2 = pool.allocate(256);
  void* rest = pool.allocate(8 * MiB - 2 * odd - 1024);
  REQUIRE(pool.usage().free_blocks == 0);
  pool.deallocate(exact, odd);
  pool.deallocate(larger, odd + 512);  // filed last: first in its list
  CHECK(pool.allocate(odd) == exact);
  CHECK(pool.allocate(odd + 512) == larger);
  CHECK(upstream.allocations() == 1);
  pool.deallocate(exact, odd);
  pool.deallocate(larger, odd + 512);
  for (void* p : {fence1, fence2}) pool.deallocate(p, 256);
  pool.deallocate(rest, 8 * MiB - 2 * odd - 1024);
}

TEST_CASE("coalescing_pool: wholly free chunks go back to the upstream before the pool grows")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream)};
  SUBCASE("one free chunk, too small for the request")
  {
    void* big = pool.allocate(40 * MiB);  // above max_chunk: a chunk of its own
    pool.deallocate(big, 40 * MiB);
    REQUIRE(upstream.outstanding_bytes() == 40 * MiB);
    void* bigger = pool.allocate(100 * MiB);
    CHECK(upstream.frees() == 1);
    CHECK(upstream.outstanding_bytes() == 100 * MiB);
    CHECK(pool.usage().reserved == 100 * MiB);
    CHECK(pool.usage().chunks == 1);
    pool.deallocate(bigger, 100 * MiB);
  }
  SUBCASE("only as many as the new chunk holds: the rest stay for later requests")
  {
    std::vector<void*> blocks;
    for (int i = 0; i < 3; ++i) blocks.push_back(pool.allocate(34 * MiB));
    for (void* p : blocks) pool.deallocate(p, 34 * MiB);
    REQUIRE(pool.usage().chunks == 3);
    void* p = pool.allocate(36 * MiB);
    CHECK(upstream.frees() == 2);  // 34 MiB is not enough for 36, 68 is
    CHECK(pool.usage().chunks == 2);
    CHECK(upstream.outstanding_bytes() == 70 * MiB);
    void* q = pool.allocate(34 * MiB);  // the one kept is used
    CHECK(upstream.allocations() == 4);
    pool.deallocate(p, 36 * MiB);
    pool.deallocate(q, 34 * MiB);
  }
  SUBCASE("a free chunk far larger than the request goes back rather than being carved")
  {
    void* huge = pool.allocate(200 * MiB);
    pool.deallocate(huge, 200 * MiB);
    void* p = pool.allocate(10 * MiB);
    CHECK(upstream.frees() == 1);
    CHECK(upstream.outstanding_bytes() == 10 * MiB);
    pool.deallocate(p, 10 * MiB);
    void* q = pool.allocate(9 * MiB);  // fits the free 10 MiB chunk: no upstream call
    CHECK(upstream.allocations() == 2);
    pool.deallocate(q, 9 * MiB);
  }
  SUBCASE("but a free chunk not much larger is carved")
  {
    void* huge = pool.allocate(200 * MiB);
    pool.deallocate(huge, 200 * MiB);
    void* p = pool.allocate(180 * MiB);
    CHECK(p == huge);
    CHECK(upstream.allocations() == 1);
    pool.deallocate(p, 180 * MiB);
  }
  SUBCASE("switched off, the free chunk stays and the pool grows beside it")
  {
    pool_over_spy keeping{ref(upstream), {.return_free_chunks = false}};
    void* big = keeping.allocate(40 * MiB);
    keeping.deallocate(big, 40 * MiB);
    void* bigger = keeping.allocate(100 * MiB);
    CHECK(upstream.frees() == 0);
    CHECK(keeping.usage().reserved == 140 * MiB);
    keeping.deallocate(bigger, 100 * MiB);
  }
}

TEST_CASE("coalescing_pool: chunks are sized to the need")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream)};
  std::vector<std::pair<void*, std::size_t>> blocks;
  SUBCASE("large requests: 2, 4, 8, 16, 32 MiB, then 32 MiB chunks; above that a chunk of the request's size")
  {
    for (int i = 0; i < 47; ++i) blocks.emplace_back(pool.allocate(2 * MiB), 2 * MiB);  // 94 MiB
    auto sizes = chunk_sizes(pool);
    std::sort(sizes.begin(), sizes.end());
    CHECK(sizes == std::vector<std::size_t>{2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB, 32 * MiB});
    CHECK(pool.usage().free_blocks == 0);
    blocks.emplace_back(pool.allocate(33 * MiB + 1), 33 * MiB + 1);
    CHECK(pool.usage().reserved == 94 * MiB + 34 * MiB);  // rounded to 2 MiB, as cudaMalloc would take anyway
    CHECK(upstream.allocations() == 7);
  }
  SUBCASE("small requests come from 2 MiB chunks of their own; a large chunk's free space only when they are full")
  {
    blocks.emplace_back(pool.allocate(300 << 10), 300 << 10);  // above small_limit: a large chunk of 2 MiB
    REQUIRE(pool.usage().reserved == 2 * MiB);
    blocks.emplace_back(pool.allocate(1000), 1000);  // no small chunk yet: the large chunk's free space
    CHECK(pool.usage().chunks == 1);
    blocks.emplace_back(pool.allocate((2048 - 300 - 1) << 10), (2048 - 300 - 1) << 10);  // fills the large chunk
    blocks.emplace_back(pool.allocate(1000), 1000);  // nowhere to go: a small chunk
    CHECK(pool.usage().chunks == 2);
    CHECK(pool.usage().reserved == 4 * MiB);
    for (int i = 0; i < 100; ++i) blocks.emplace_back(pool.allocate(4096), 4096);  // room in the small chunk
    CHECK(pool.usage().chunks == 2);
    CHECK(upstream.allocations() == 2);
  }
  SUBCASE("but never a wholly free large chunk: the small block would keep it from going back")
  {
    void* big = pool.allocate(300 << 10);  // a large chunk of 2 MiB
    pool.deallocate(big, 300 << 10);       // wholly free again
    REQUIRE(pool.usage().chunks == 1);
    void* small = pool.allocate(1000);
    CHECK(upstream.frees() == 1);  // the idle large chunk went back before the pool grew a small one
    CHECK(pool.usage().chunks == 1);
    CHECK(pool.usage().reserved == 2 * MiB);
    pool.deallocate(small, 1000);
    pool.release();
    CHECK(pool.usage().reserved == 0);
  }
  SUBCASE("without small_uses_large_free, small requests never take a large chunk's free space")
  {
    pool_over_spy apart{ref(upstream), {.small_uses_large_free = false}};
    void* a = apart.allocate(300 << 10);
    void* b = apart.allocate(1000);
    CHECK(apart.usage().chunks == 2);
    CHECK(apart.usage().reserved == 4 * MiB);
    apart.deallocate(a, 300 << 10);
    apart.deallocate(b, 1000);
  }
  SUBCASE("late in the series a request that fits nowhere gets at most chunk_request_multiple times its size")
  {
    for (std::size_t mib : {2, 4, 8, 16}) blocks.emplace_back(pool.allocate(mib * MiB), mib * MiB);  // each fills its chunk
    REQUIRE(pool.usage().free_blocks == 0);
    blocks.emplace_back(pool.allocate(300 << 10), 300 << 10);  // the series says 32 MiB; 32 x 300 KiB, rounded to 2 MiB
    CHECK(pool.usage().reserved == 30 * MiB + 10 * MiB);
    blocks.emplace_back(pool.allocate(10 * MiB), 10 * MiB);  // nowhere: 32 x the request passes max_chunk
    CHECK(pool.usage().reserved == 40 * MiB + 32 * MiB);
    pool_over_spy uncapped{ref(upstream), {.chunk_request_multiple = 0}};
    std::vector<void*> held;
    for (std::size_t mib : {2, 4, 8, 16}) held.push_back(uncapped.allocate(mib * MiB));
    void* small = uncapped.allocate(300 << 10);
    CHECK(uncapped.usage().reserved == 30 * MiB + 32 * MiB);
    uncapped.deallocate(small, 300 << 10);
    for (std::size_t i = 0; i < held.size(); ++i) uncapped.deallocate(held[i], (std::size_t{2} << i) * MiB);
  }
  SUBCASE("chunk_granularity rounds every chunk, and a chunk never passes max_chunk unless the request does")
  {
    pool_over_spy odd{ref(upstream), {.initial_chunk = 3 * MiB, .max_chunk = 5 * MiB, .small_limit = 0, .chunk_granularity = 4 * MiB}};
    void* a = odd.allocate(MiB);
    void* b = odd.allocate(4 * MiB);
    void* c = odd.allocate(7 * MiB);
    CHECK(chunk_sizes(odd).size() == 3);
    CHECK(odd.usage().reserved == 4 * MiB + 5 * MiB + 8 * MiB);
    odd.deallocate(a, MiB);
    odd.deallocate(b, 4 * MiB);
    odd.deallocate(c, 7 * MiB);
  }
  SUBCASE("an initial_chunk above max_chunk is honoured: every large chunk is that size")
  {
    pool_over_spy first{ref(upstream), {.initial_chunk = 64 * MiB}};
    void* a = first.allocate(MiB);
    void* b = first.allocate(63 * MiB);
    void* c = first.allocate(MiB);
    CHECK(chunk_sizes(first) == std::vector<std::size_t>{64 * MiB, 64 * MiB});
    for (void* p : {a, c}) first.deallocate(p, MiB);
    first.deallocate(b, 63 * MiB);
  }
  for (auto [p, n] : blocks) pool.deallocate(p, n);
}

TEST_CASE("coalescing_pool: bad options are refused, naming the value")
{
  using opts = pool_over_spy::options;
  spy<simulated_source> upstream;
  CHECK_THROWS_WITH_AS(pool_over_spy(ref(upstream), opts{.chunk_granularity = 0}), doctest::Contains("chunk_granularity 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(pool_over_spy(ref(upstream), opts{.small_chunk = 0}), doctest::Contains("small_chunk 0"), std::invalid_argument);
  CHECK_NOTHROW(pool_over_spy(ref(upstream), opts{.small_limit = 0, .small_chunk = 0}));
}

TEST_CASE("coalescing_pool: a size it can never serve is out_of_memory; good_size never wraps")
{
  coalescing_pool<simulated_source> pool;
  CHECK(pool.good_size(SIZE_MAX) == SIZE_MAX);
  CHECK(pool.good_size(SIZE_MAX - 255) == SIZE_MAX);
  CHECK(pool.good_size(std::size_t{1} << 56) == std::size_t{1} << 56);
  CHECK(pool.good_size((std::size_t{1} << 56) + 1) == SIZE_MAX);
  CHECK(pool.good_size(1) == 256);
  CHECK(pool.good_size(0) == 0);
  CHECK_THROWS_AS((void)pool.allocate(SIZE_MAX), out_of_memory);
  CHECK_THROWS_AS((void)pool.allocate(SIZE_MAX - 255, 1 << 20), out_of_memory);
  CHECK_FALSE(pool.has_room_for(SIZE_MAX));
  CHECK(pool.usage() == strata::usage{});
}

TEST_CASE("coalescing_pool: a refused growth takes the chunks it handed back again: nothing changed")
{
  spy<simulated_source> upstream;
  pool_over_spy pool{ref(upstream)};
  void* kept = pool.allocate(4096);
  void* big = pool.allocate(40 * MiB);
  pool.deallocate(big, 40 * MiB);
  const auto before = pool.usage();
  const std::size_t outstanding = upstream.outstanding_bytes();
  upstream.refuse_next(1);
  CHECK_THROWS_AS((void)pool.allocate(100 * MiB), out_of_memory);
  CHECK(pool.usage() == before);
  CHECK(upstream.outstanding_bytes() == outstanding);
  CHECK(upstream.mismatches() == 0);
  void* again = pool.allocate(40 * MiB);  // the restored chunk serves it
  CHECK(upstream.outstanding_bytes() == outstanding);
  pool.deallocate(again, 40 * MiB);
  SUBCASE("unless the upstream refuses that too: the chunk stays returned, the pool consistent")
  {
    upstream.refuse_next(2);
    CHECK_THROWS_AS((void)pool.allocate(100 * MiB), out_of_memory);
    CHECK(pool.usage().chunks == 1);
    CHECK(pool.usage().reserved == 2 * MiB);
    CHECK(upstream.outstanding_bytes() == 2 * MiB);
    void* p = pool.allocate(100 * MiB);
    pool.deallocate(p, 100 * MiB);
  }
  pool.deallocate(kept, 4096);
  pool.release();
  CHECK(upstream.outstanding_bytes() == 0);
}
