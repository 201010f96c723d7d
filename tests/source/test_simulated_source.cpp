#include <doctest/doctest.h>

#include <strata/source/simulated_source.hpp>
#include "support/conformance.hpp"

using strata::simulated_source;
using strata::is_aligned;

TEST_CASE("simulated_source conforms")
{
  simulated_source r;
  strata::testing::check_conformance(r, {.max_alignment = std::size_t{1} << 30, .rejects_above = std::size_t{1} << 40});
}

TEST_CASE("simulated_source enforces its capacity and stays usable")
{
  simulated_source r(1 << 20);
  void* a = r.allocate(600 << 10);
  CHECK_THROWS_WITH_AS((void)r.allocate(600 << 10),
                       "simulated_source: out of memory allocating 614400 bytes (capacity 1048576 bytes, in use 614400 bytes)",
                       strata::out_of_memory);
  void* b = r.allocate(400 << 10);
  CHECK(r.allocated_bytes() == 1000 << 10);
  CHECK(r.peak_bytes() == 1000 << 10);
  r.deallocate(a, 600 << 10);
  r.deallocate(b, 400 << 10);
  CHECK(r.allocated_bytes() == 0);
  CHECK(r.peak_bytes() == 1000 << 10);
  r.reset_peak();
  CHECK(r.peak_bytes() == 0);
}

TEST_CASE("simulated_source reuses and merges freed ranges")
{
  simulated_source r(simulated_source::unlimited, 1 << 20);  // 1 MiB of address space in all
  void* a = r.allocate(256 << 10);
  void* b = r.allocate(256 << 10);
  void* c = r.allocate(512 << 10);
  CHECK_THROWS_AS((void)r.allocate(256), strata::out_of_memory);
  r.deallocate(b, 256 << 10);
  r.deallocate(a, 256 << 10);
  void* d = r.allocate(512 << 10);  // only possible if a and b merged
  CHECK(d == a);
  r.deallocate(c, 512 << 10);
  r.deallocate(d, 512 << 10);
  void* whole = r.allocate(1 << 20);
  CHECK(whole != nullptr);
  r.deallocate(whole, 1 << 20);
}

TEST_CASE("simulated_source random workload returns every byte")
{
  simulated_source r;
  const auto result = strata::testing::run_random_workload(r, {.operations = 100'000, .max_alignment = 1 << 20});
  CHECK(result.allocations > 45'000);  // about half the operations; none refused
  CHECK(r.allocated_bytes() == 0);
  CHECK(r.allocation_count() == 0);
}

TEST_CASE("simulated_source moves")
{
  simulated_source a;
  void* p = a.allocate(1000);
  simulated_source b(std::move(a));
  CHECK(b.owns(p));
  CHECK_FALSE(a.owns(p));
  b.deallocate(p, 1000);
  CHECK(b.allocated_bytes() == 0);
}

TEST_CASE("simulated_source can round like cudaMalloc")
{
  using strata::simulated_source;
  simulated_source exact;
  simulated_source rounding(simulated_source::unlimited, std::size_t{1} << 40, simulated_source::rounding::like_cudamalloc);
  const std::size_t mib = std::size_t{1} << 20;
  CHECK(rounding.rounded_size(mib) == mib);                  // below 2 MiB: 256-byte steps
  CHECK(rounding.rounded_size(2 * mib) == 2 * mib);
  CHECK(rounding.rounded_size(2 * mib + 1) == 4 * mib);
  CHECK(exact.rounded_size(2 * mib + 1) == 2 * mib + 256);
  void* p = rounding.allocate(5 * mib);
  CHECK(rounding.allocated_bytes() == 6 * mib);
  void* q = rounding.allocate(3000);
  CHECK(rounding.allocated_bytes() == 6 * mib + 3072);
  rounding.deallocate(p, 5 * mib);
  rounding.deallocate(q, 3000);
  CHECK(rounding.allocated_bytes() == 0);
  simulated_source capped(8 * mib, std::size_t{1} << 30, simulated_source::rounding::like_cudamalloc);
  void* a = capped.allocate(4 * mib + 1);  // takes 6 MiB of the 8
  CHECK_THROWS_AS((void)capped.allocate(3 * mib), strata::out_of_memory);
  capped.deallocate(a, 4 * mib + 1);
}

TEST_CASE("simulated_source: owns means inside a live allocation, not inside the reserved range")
{
  simulated_source r;
  char* a = static_cast<char*>(r.allocate(1000));  // takes 1024
  char* b = static_cast<char*>(r.allocate(4096));
  CHECK(r.owns(a));
  CHECK(r.owns(a + 999));
  CHECK(r.owns(a + 1023));  // rounding belongs to the allocation
  CHECK(r.owns(b + 4095));
  r.deallocate(a, 1000);
  CHECK_FALSE(r.owns(a));  // freed: still in the range, no longer handed out
  CHECK_FALSE(r.owns(a + 500));
  CHECK(r.owns(b));
  CHECK_FALSE(r.owns(b + 4096));  // the free range after the last allocation
  CHECK_FALSE(r.owns(nullptr));
  int on_the_stack = 0;
  CHECK_FALSE(r.owns(&on_the_stack));
  r.deallocate(b, 4096);
  CHECK_FALSE(r.owns(b));
}

TEST_CASE("simulated_source: a moved-from source is empty and usable")
{
  simulated_source a(std::size_t{1} << 20);
  void* p = a.allocate(1000);
  simulated_source b(std::move(a));
  CHECK(a.allocated_bytes() == 0);  // NOLINT(bugprone-use-after-move): the rule under test
  CHECK_FALSE(a.owns(p));
  // It reserves a fresh range, keeps its capacity, and honours alignments as before (no "0 bytes" error).
  void* q = a.allocate(1000, 4096);
  CHECK(is_aligned(q, 4096));
  CHECK(a.owns(q));
  CHECK_FALSE(b.owns(q));
  CHECK_THROWS_AS((void)a.allocate(std::size_t{2} << 20), strata::out_of_memory);
  a.deallocate(q, 1000);
  simulated_source c;
  c = std::move(b);
  CHECK(c.owns(p));
  void* r = b.allocate(256);  // NOLINT(bugprone-use-after-move)
  CHECK(b.owns(r));
  b.deallocate(r, 256);
  c.deallocate(p, 1000);
  CHECK(c.allocated_bytes() == 0);
}

TEST_CASE("simulated_source: capacity refusals are the only refusals of a random workload")
{
  const std::size_t capacity = std::size_t{16} << 20;
  simulated_source r(capacity);
  const auto result = strata::testing::run_random_workload(
    r, {.operations = 20'000, .max_live = 200, .max_bytes = 4 << 20},
    true, strata::testing::refusal_if([&](std::size_t bytes, std::size_t) { return r.allocated_bytes() + r.rounded_size(bytes) > capacity; }));
  CHECK(result.refusals > 0);  // 200 blocks of up to 4 MiB do not fit in 16 MiB
  CHECK(result.allocations > 5'000);
  CHECK(r.allocated_bytes() == 0);
}
