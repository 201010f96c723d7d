// core/: concepts (positive and negative), alignment, errors, usage, snapshot, ref, CCCL names.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <type_traits>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/ref.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/cuda_check.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>

namespace {

struct no_deallocate {
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  friend bool operator==(const no_deallocate&, const no_deallocate&) { return true; }
};
struct throwing_deallocate {
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) {}  // not noexcept: a free must never throw
  friend bool operator==(const throwing_deallocate&, const throwing_deallocate&) { return true; }
};
struct not_comparable {
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
};
struct minimal {
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
  friend bool operator==(const minimal&, const minimal&) { return true; }
};

} // namespace

static_assert(!strata::resource<no_deallocate>);
static_assert(!strata::resource<throwing_deallocate>);
static_assert(!strata::resource<not_comparable>);
static_assert(strata::resource<minimal>);
static_assert(!strata::stream_resource<minimal>);
static_assert(!strata::owning_resource<minimal> && !strata::releasable_resource<minimal>);
static_assert(!strata::sized_resource<minimal> && !strata::usage_reporting_resource<minimal>);
static_assert(!strata::has_property<minimal, strata::host_accessible>);
static_assert(strata::resource<strata::ref<strata::host_source>>);
static_assert(strata::has_property<strata::ref<strata::host_source>, strata::host_accessible>);
static_assert(!strata::has_property<strata::ref<strata::host_source>, strata::device_accessible>);
static_assert(strata::owning_resource<strata::ref<strata::simulated_source>>);
static_assert(!strata::owning_resource<strata::ref<strata::host_source>>);
static_assert(std::is_base_of_v<std::bad_alloc, strata::out_of_memory>);
static_assert(std::is_base_of_v<std::logic_error, strata::usage_error>);

TEST_CASE("alignment arithmetic")
{
  using namespace strata;
  CHECK(align_up(0, 256) == 0);
  CHECK(align_up(1, 256) == 256);
  CHECK(align_up(256, 256) == 256);
  CHECK(align_up(257, 256) == 512);
  CHECK(effective_alignment(1) == 256);
  CHECK(effective_alignment(4096) == 4096);
  std::size_t out = 0;
  CHECK_FALSE(checked_align_up(SIZE_MAX, 256, out));
  CHECK(checked_align_up(SIZE_MAX - 255, 256, out));
  CHECK(out == SIZE_MAX - 255);
  CHECK_NOTHROW(check_alignment("box", 256, 256));
  CHECK_THROWS_WITH_AS(check_alignment("box", 3, 256), "box: alignment 3 is not a power of two", std::invalid_argument);
  CHECK_THROWS_WITH_AS(check_alignment("box", 0, 256), "box: alignment 0 is not a power of two", std::invalid_argument);
  CHECK_THROWS_AS(check_alignment("box", 512, 256), std::invalid_argument);
}

TEST_CASE("errors name what went wrong")
{
  const strata::out_of_memory oom("coalescing_pool", 12345, strata::figures(100, 50));
  CHECK(std::string(oom.what()) == "coalescing_pool: out of memory allocating 12345 bytes (reserved 100 bytes, in use 50 bytes)");
  CHECK(oom.requested() == 12345);
  try {
    strata::detail::cuda_check(cudaErrorInvalidValue, "cudaMemcpy");
    FAIL("no exception");
  } catch (const strata::cuda_error& e) {
    CHECK(e.code() == cudaErrorInvalidValue);
    const std::string what = e.what();
    CHECK(what.find("cudaMemcpy") == 0);
    CHECK(what.find("cudaErrorInvalidValue") != std::string::npos);
    CHECK(what.find("test_core.cpp:") != std::string::npos);
  }
  CHECK_NOTHROW(strata::detail::cuda_check(cudaSuccess, "anything"));
}

TEST_CASE("usage figures")
{
  strata::usage u{.reserved = 1000, .in_use = 600, .largest_free = 100, .chunks = 1, .used_blocks = 3, .free_blocks = 2};
  CHECK(u.free() == 400);
  CHECK(u.fragmentation() == doctest::Approx(0.75));
  u.largest_free = 400;
  CHECK(u.fragmentation() == doctest::Approx(0.0));
  CHECK(strata::usage{}.fragmentation() == 0.0);
}

TEST_CASE("snapshot writes JSON")
{
  strata::snapshot s{.box = "pool \"a\"", .segments = {{.address = 4096, .size = 1024, .blocks = {{0, 512, false, -1}, {512, 512, true, 3}}}}};
  CHECK(s.reserved() == 1024);
  CHECK(strata::to_json(s) ==
        R"({"box":"pool \"a\"","segments":[{"address":4096,"size":1024,"blocks":[{"offset":0,"size":512,"free":false,"stream":-1},{"offset":512,"size":512,"free":true,"stream":3}]}]})");
}

TEST_CASE("ref shares one box and forwards its capabilities")
{
  strata::simulated_source sim;
  strata::ref a(sim), b(sim);
  CHECK(a == b);
  void* p = a.allocate(1000);
  CHECK(b.owns(p));
  CHECK(sim.allocated_bytes() == 1024);
  b.deallocate(p, 1000);
  CHECK(sim.allocated_bytes() == 0);
  strata::simulated_source other;
  CHECK_FALSE(a == strata::ref(other));
  void* q = a.allocate_sync(10);
  a.deallocate_sync(q, 10);
  CHECK(sim.allocation_count() == 0);
}

TEST_CASE("cuda::mr::resource_ref wraps a strata resource")
{
  strata::host_source host;
  strata::cccl::synchronous_resource_ref<cuda::mr::host_accessible> r{host};
  void* p = strata::cccl::allocate_sync(r, 100, 256);
  REQUIRE(p != nullptr);
  std::memset(p, 1, 100);
  strata::cccl::deallocate_sync(r, p, 100, 256);
}
