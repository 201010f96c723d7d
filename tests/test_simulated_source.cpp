#include <doctest/doctest.h>

#include <strata/source/simulated_source.hpp>
#include "support/conformance.hpp"

using strata::simulated_source;

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
  strata::testing::run_random_workload(r, {.operations = 100'000, .max_alignment = 1 << 20});
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
