// Managed memory with prefetch and advice, pinned pools, and registered host memory (a file in /dev/shm),
// each used by kernels. Managed memory stays far below the card's free memory.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <strata/adaptor/prefetch.hpp>
#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/managed_source.hpp>
#include <strata/source/pinned_source.hpp>
#include <strata/source/registered_host_source.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "../support/conformance.hpp"
#include "kernels.cuh"

using namespace strata;

namespace {

struct location {
  int type = -1;
  int id = -1;
};

location last_prefetch(const void* p, std::size_t bytes)
{
  location where;
  REQUIRE(cudaMemRangeGetAttribute(&where.type, sizeof(int), cudaMemRangeAttributeLastPrefetchLocationType, p, bytes) == cudaSuccess);
  REQUIRE(cudaMemRangeGetAttribute(&where.id, sizeof(int), cudaMemRangeAttributeLastPrefetchLocationId, p, bytes) == cudaSuccess);
  return where;
}

location preferred(const void* p, std::size_t bytes)
{
  location where;
  REQUIRE(cudaMemRangeGetAttribute(&where.type, sizeof(int), cudaMemRangeAttributePreferredLocationType, p, bytes) == cudaSuccess);
  REQUIRE(cudaMemRangeGetAttribute(&where.id, sizeof(int), cudaMemRangeAttributePreferredLocationId, p, bytes) == cudaSuccess);
  return where;
}

using managed_pool = coalescing_pool<managed_source>;

} // namespace

TEST_SUITE("gpu")
{
TEST_CASE("prefetch: the block, and only the block, is prefetched to the stream's device and advised")
{
  int device = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  prefetch<managed_pool> pool{managed_pool{managed_source{}, {.initial_chunk = 64 << 20}}, {.preferred_location = device}};
  REQUIRE(pool.enabled());  // H100/H200 on Linux: concurrent managed access
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  char* block = static_cast<char*>(pool.allocate_async(16 << 20, 256, s));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  const location fetched = last_prefetch(block, 16 << 20);
  CHECK(fetched.type == cudaMemLocationTypeDevice);
  CHECK(fetched.id == device);
  CHECK(preferred(block, 16 << 20).type == cudaMemLocationTypeDevice);
  // The rest of the 64 MiB chunk was neither prefetched nor advised.
  char* rest = block + (16 << 20);
  CHECK(last_prefetch(rest, 32 << 20).type != cudaMemLocationTypeDevice);
  CHECK(preferred(rest, 32 << 20).type != cudaMemLocationTypeDevice);
  strata::testing::check_device_round_trip(block, 16 << 20, 11, s);
  // Explicit migration to the host and back.
  prefetch_to_host(block, 16 << 20, s);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(last_prefetch(block, 16 << 20).type == cudaMemLocationTypeHost);
  CHECK(reinterpret_cast<std::uint32_t*>(block)[5] == (11u ^ static_cast<std::uint32_t>(5 * 2654435761u)));  // host reads
  prefetch_to_device(block, 16 << 20, device, s);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(last_prefetch(block, 16 << 20).id == device);
  pool.deallocate_async(block, 16 << 20, 256, s);
  CHECK(pool.upstream().usage().in_use == 0);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("prefetch over a stream-ordered managed pool; read-mostly and accessed-by advice")
{
  int device = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  using so = stream_ordered<managed_pool>;
  prefetch<so> pool{so{managed_pool{managed_source{}, {.initial_chunk = 32 << 20}}}, {.accessed_by = device, .read_mostly = true}};
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  void* p = pool.allocate_async(4 << 20, 256, s);
  int read_mostly = 0;
  REQUIRE(cudaMemRangeGetAttribute(&read_mostly, sizeof read_mostly, cudaMemRangeAttributeReadMostly, p, 4 << 20) == cudaSuccess);
  CHECK(read_mostly == 1);
  strata::testing::check_device_round_trip(p, 4 << 20, 12, s);
  pool.deallocate_async(p, 4 << 20, 256, s);
  testing::check_conformance(pool, {.max_alignment = 1 << 16, .rejects_above = 0, .host_accessible = true,
                                    .device_accessible = true, .huge = 0});
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("pinned pools: kernels and the host use the same blocks")
{
  size_class_pool<pinned_source> staging;
  coalescing_pool<pinned_source> large{pinned_source{}, {.initial_chunk = 64 << 20}};
  static_assert(has_property<decltype(staging), host_accessible> && has_property<decltype(large), device_accessible>);
  for (auto [p, n] : {std::pair{staging.allocate(4096), std::size_t{4096}}, std::pair{large.allocate(48 << 20), std::size_t{48} << 20}}) {
    auto* words = static_cast<std::uint32_t*>(p);
    strata::testing::fill(p, n, 21);  // a kernel writes
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(words[n / 4 - 1] == (21u ^ static_cast<std::uint32_t>((n / 4 - 1) * 2654435761u)));  // the host reads
    for (std::size_t i = 0; i < n / 4; ++i) words[i] = 22u ^ static_cast<std::uint32_t>(i * 2654435761u);  // the host writes
    CHECK(strata::testing::mismatches(p, n, 22) == 0);  // a kernel reads
  }
  testing::check_conformance(staging, {.max_alignment = 1 << 16, .rejects_above = 0, .host_accessible = true, .device_accessible = true, .huge = 0});
}

TEST_CASE("registered_host_source: a file in /dev/shm, read and written by a kernel")
{
  const std::string path = "/dev/shm/strata_test_" + std::to_string(::getpid());
  constexpr std::size_t bytes = 8 << 20;
  {
    // The file's contents, written through the file system before it is mapped.
    std::vector<std::uint32_t> words(bytes / 4);
    for (std::size_t i = 0; i < words.size(); ++i) words[i] = 31u ^ static_cast<std::uint32_t>(i * 2654435761u);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::pwrite(fd, words.data(), bytes, 0) == static_cast<ssize_t>(bytes));
    ::close(fd);
  }
  {
    registered_host_source file = registered_host_source::map_file(path, bytes);
    coalescing_pool<ref<registered_host_source>> pool{ref(file), {.initial_chunk = bytes, .max_chunk = bytes, .max_reserved = bytes}};
    CHECK(strata::testing::mismatches(file.data(), bytes, 31) == 0);  // a kernel reads the file
    void* block = pool.allocate(1 << 20);
    CHECK(file.owns(block));
    strata::testing::fill(block, 1 << 20, 32);  // a kernel writes into the file
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK_THROWS_AS(pool.allocate(bytes), out_of_memory);  // one region only
    pool.deallocate(block, 1 << 20);
    pool.release();
    file.release();
    CHECK(file.data() == nullptr);
  }
  // What the kernel wrote is in the file.
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  std::vector<std::uint32_t> back(bytes / 4);
  REQUIRE(::pread(fd, back.data(), bytes, 0) == static_cast<ssize_t>(bytes));
  ::close(fd);
  const std::size_t block_offset = 0;  // the pool carved its first block at the region's start
  CHECK(back[block_offset + 7] == (32u ^ static_cast<std::uint32_t>(7 * 2654435761u)));
  CHECK(back[(2 << 20) / 4] == (31u ^ static_cast<std::uint32_t>(((2 << 20) / 4) * 2654435761u)));  // untouched
  ::unlink(path.c_str());
}
}
