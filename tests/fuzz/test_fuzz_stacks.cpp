// The differential fuzzer's short run: every registered stack, a few fixed seeds, every check after every
// step (fuzz/stack_fuzzer.hpp). The long run is tests/fuzz/long_run.sh; libFuzzer's entry is libfuzzer.cpp.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <doctest/doctest.h>

#include "fuzz/stack_fuzzer.hpp"

using namespace strata::testing;

namespace {

/// Seeds per stack: 10, or STRATA_FUZZ_SEEDS (1 to 1000). The sanitizer builds run fewer, since instrumentation
/// slows every step and libFuzzer explores the same stacks under them besides.
std::uint64_t seeds_per_stack()
{
  const char* text = std::getenv("STRATA_FUZZ_SEEDS");
  if (text == nullptr) return 10;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || n < 1 || n > 1000)
    throw std::invalid_argument(std::string("STRATA_FUZZ_SEEDS: ") + text + " is not a number of seeds from 1 to 1000");
  return n;
}

} // namespace

TEST_CASE("fuzz: every stack keeps every box's promises on an adversarial upstream, fixed seeds")
{
  REQUIRE(fuzz_targets().size() >= 70);
  const std::uint64_t seeds = seeds_per_stack();
  std::size_t steps = 0, allocations = 0, refusals = 0;
  for (const auto& target : fuzz_targets()) {
    for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
      const fuzz_report r = target.run({.seed = seed, .operations = 10000});
      INFO(r.summary());
      CHECK(r.ok());
      CHECK(r.allocations > 100);  // a stack that refuses everything fails
      steps += r.operations;
      allocations += r.allocations;
      refusals += r.refusals;
    }
  }
  MESSAGE(steps << " steps, " << allocations << " allocations, " << refusals << " refusals over " << fuzz_targets().size() << " stacks");
  CHECK(refusals > 0);
}

#include <map>
#include <random>

#include <strata/adaptor/retry_on_oom.hpp>
#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/simulated_source.hpp>

using strata::coalescing_pool;
using strata::ref;

TEST_CASE("coalescing_pool over chunks aligned to exactly 256 bytes: aligned requests never overlap, in_use stays exact")
{
  // Random sizes up to 512 MiB, alignments mostly 256 B - 2 KiB and sometimes up to 128 MiB, random frees:
  // the sequence that once handed out a block inside a live one within a few hundred steps.
  std::size_t served = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    adversarial_source upstream(std::size_t{1} << 40);
    coalescing_pool<ref<adversarial_source>> pool{ref(upstream)};
    std::mt19937_64 rng(seed);
    std::map<std::uintptr_t, std::size_t> live;  // address -> bytes
    std::size_t expected_in_use = 0;
    for (int step = 0; step < 1500; ++step) {
      if (live.empty() || rng() % 2 == 0) {
        const std::size_t bytes = 1 + rng() % (std::size_t{1} << (rng() % 30));
        const std::size_t alignment = rng() % 10 == 0 ? std::size_t{1} << (8 + rng() % 20) : std::size_t{256} << (rng() % 4);
        const auto a = reinterpret_cast<std::uintptr_t>(pool.allocate(bytes, alignment));
        REQUIRE(a % alignment == 0);
        const auto next = live.lower_bound(a);
        REQUIRE((next == live.end() || next->first >= a + bytes));
        REQUIRE((next == live.begin() || std::prev(next)->first + std::prev(next)->second <= a));
        live[a] = bytes;
        expected_in_use += pool.good_size(bytes, alignment);
        ++served;
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        pool.deallocate(reinterpret_cast<void*>(it->first), it->second);
        expected_in_use -= pool.good_size(it->second);
        live.erase(it);
      }
      REQUIRE(pool.usage().in_use == expected_in_use);
    }
    for (const auto& [a, bytes] : live) pool.deallocate(reinterpret_cast<void*>(a), bytes);
    pool.release();
    CHECK(upstream.live_bytes() == 0);
    CHECK(upstream.bad_frees() == 0);
  }
  CHECK(served > 3000);
}

TEST_CASE("coalescing_pool: a growth that hands a free chunk back serves an aligned request from the right block")
{
  adversarial_source upstream(std::size_t{1} << 34);
  coalescing_pool<ref<adversarial_source>> pool{ref(upstream)};
  void* first = pool.allocate(std::size_t{1} << 20);  // a 2 MiB chunk of its own
  pool.deallocate(first, std::size_t{1} << 20);       // now wholly free: the next growth hands it back
  REQUIRE(upstream.live_chunks() == 1);
  // Too large for that chunk, and aligned beyond the new chunk's 256 bytes: the pool grows, handing the free
  // chunk back, and splits the new chunk's front off to align the block.
  const std::size_t bytes = std::size_t{3} << 20, alignment = 4096;
  void* p = pool.allocate(bytes, alignment);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % alignment == 0);
  CHECK(upstream.live_chunks() == 1);
  CHECK(pool.usage().in_use == pool.good_size(bytes, alignment));
  CHECK(pool.usage().used_blocks == 1);
  void* q = pool.allocate(1000);
  const auto pa = reinterpret_cast<std::uintptr_t>(p), qa = reinterpret_cast<std::uintptr_t>(q);
  CHECK((qa + 1000 <= pa || qa >= pa + bytes));
  pool.deallocate(p, bytes, alignment);
  pool.deallocate(q, 1000);
  CHECK(pool.usage().in_use == 0);
  CHECK(pool.usage().used_blocks == 0);
  pool.release();
  CHECK(upstream.live_bytes() == 0);
  CHECK(upstream.bad_frees() == 0);
}

TEST_CASE("retry_on_oom over a pool: a move assignment after the callback freed blocks hands every chunk back")
{
  using pool_t = strata::size_class_pool<strata::simulated_source>;
  std::vector<std::pair<void*, std::size_t>> kept;
  strata::retry_on_oom<pool_t>* self = nullptr;
  auto free_one = [&](std::size_t, int) {
    if (kept.empty()) return false;
    self->deallocate(kept.back().first, kept.back().second);
    kept.pop_back();
    return true;
  };
  strata::retry_on_oom<pool_t> a{pool_t{strata::simulated_source(std::size_t{64} << 20)}, free_one};
  self = &a;
  for (int k = 0; k < 40; ++k) {
    try {
      kept.emplace_back(a.allocate(std::size_t{3} << 20), std::size_t{3} << 20);
    } catch (const std::bad_alloc&) {
      break;
    }
  }
  CHECK(a.rescued() > 0);  // the callback freed blocks and the retries were served
  const strata::usage held = a.usage();
  strata::retry_on_oom<pool_t> b{pool_t{strata::simulated_source(std::size_t{64} << 20)}, free_one};
  void* own = b.allocate(1000);
  REQUIRE(own != nullptr);
  b = std::move(a);  // b's own chunk goes back to b's old upstream, a's memory moves to b
  CHECK(b.usage() == held);
  CHECK(a.usage() == strata::usage{});
  CHECK(b.upstream().upstream().allocated_bytes() == held.reserved);
  self = &b;
  for (const auto& [p, bytes] : kept) b.deallocate(p, bytes);
  b.release();
  CHECK(b.usage().reserved == 0);
  CHECK(b.upstream().upstream().allocated_bytes() == 0);
}

#include <optional>

#include <strata/adaptor/checked.hpp>
#include <strata/adaptor/segregator.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/source/host_source.hpp>

// Whether a stack is default-constructible is a question with an answer (std::optional and containers ask
// it), never a compile error, whatever sits at the bottom.
using over_reference = strata::checked<strata::statistics<coalescing_pool<ref<adversarial_source>>>>;
static_assert(!std::is_default_constructible_v<over_reference>);
static_assert(!std::is_default_constructible_v<strata::segregator<4096, coalescing_pool<ref<adversarial_source>>, coalescing_pool<strata::host_source>>>);
static_assert(std::is_default_constructible_v<strata::checked<coalescing_pool<strata::host_source>>>);

TEST_CASE("a stack over a reference to its upstream lives in std::optional")
{
  adversarial_source upstream(std::size_t{1} << 30);
  std::optional<over_reference> box;
  box.emplace(strata::statistics<coalescing_pool<ref<adversarial_source>>>(coalescing_pool<ref<adversarial_source>>(ref(upstream))));
  void* p = box->allocate(1000);
  CHECK(upstream.live_bytes() > 0);
  box->deallocate(p, 1000);
  box.reset();
  CHECK(upstream.live_bytes() == 0);
}
