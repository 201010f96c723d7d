#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <strata/core/errors.hpp>
#include <strata/pinned/simulated_pinning.hpp>
#include <strata/source/pinning_source.hpp>

#include "support/conformance.hpp"

using namespace strata;

TEST_CASE("pinning_source conforms")
{
  simulated_pinning_host host;
  pinning_source<simulated_pinning> source(simulated_pinning{host});
  testing::check_conformance(source, {.max_alignment = 4096, .rejects_above = 4096, .host_accessible = true, .device_accessible = true});
  CHECK(host.pinned() == 0);
  CHECK(host.mismatched_unpins() == 0);
}

TEST_CASE("pinning_source: pins whole 4 KiB pages, counts what it pinned, and keeps the backend's refusal")
{
  simulated_pinning_host host(64 << 10);
  pinning_source<simulated_pinning> source(simulated_pinning{host});
  void* p = source.allocate(5000);
  CHECK(host.region_at(p) == 8192);
  CHECK(source.stats().pinned == 8192);
  CHECK(source.stats().pins == 1);
  CHECK(source.last_refusal().empty());
  CHECK_THROWS_AS((void)source.allocate(60 << 10), out_of_memory);
  CHECK(source.stats().refusals == 1);
  CHECK(source.last_refusal().find("RLIMIT_MEMLOCK") != std::string::npos);
  CHECK(source.stats().pinned == 8192);
  source.deallocate(p, 5000);
  CHECK(source.stats().pinned == 0);
  CHECK(source.stats().peak_pinned == 8192);
  CHECK(source.stats().unpins == 1);
  CHECK(host.pinned() == 0);
  CHECK_THROWS_AS((void)source.allocate(SIZE_MAX), out_of_memory);
  CHECK(host.pins() == 1);
}

TEST_CASE("simulated_pinning: a region not made of whole pages is refused")
{
  simulated_pinning_host host;
  CHECK_THROWS_AS((void)host.pin(100), std::invalid_argument);
  CHECK_THROWS_AS((void)host.pin(0), std::invalid_argument);
  void* p = host.pin(2 << 20);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % (2 << 20) == 0);  // huge-page aligned from 2 MiB
  host.unpin(p, 4096);                                         // the wrong size: counted, nothing unpinned
  CHECK(host.mismatched_unpins() == 1);
  CHECK(host.pinned() == std::size_t{2} << 20);
  host.unpin(p, 2 << 20);
  CHECK(host.pinned() == 0);
}
