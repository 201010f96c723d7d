// mapped_pool on the CUDA driver's virtual memory management: blocks that span pages are usable from
// kernels; under a physical cap, idle memory is unmapped and remapped while other blocks stay intact; blocks
// freed on one stream and reused on another never race the freeing stream's work, even when the pool must
// unmap and remap memory to serve them or map idle memory at a second address (relocation); peers read
// and write the memory when a second device exists.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include <strata/default_pool.hpp>
#include <strata/pages/driver_pages.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "../support/conformance.hpp"
#include "kernels.cuh"

using namespace strata;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
using device_pool = mapped_pool<driver_pages>;

cudaStream_t make_stream()
{
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  return s;
}

} // namespace

TEST_CASE("driver_pages: the device's granularity, and a bad page size refused")
{
  driver_pages pages;
  CHECK(pages.page_size() >= 2 * mib);
  CHECK(pages.page_size() % (2 * mib) == 0);
  CHECK_THROWS_AS(driver_pages(0, 3 * mib), std::invalid_argument);
}

TEST_CASE("mapped_pool<driver_pages> conforms, and blocks spanning pages are usable from kernels")
{
  device_pool pool;
  testing::check_conformance(pool, {.max_alignment = 1 << 30, .rejects_above = 1 << 30, .device_accessible = true});
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t bytes : {std::size_t{256}, std::size_t{100'000}, 3 * mib + 4, 5 * mib, 70 * mib + 256})
    blocks.push_back({pool.allocate(bytes), bytes});
  std::uint32_t seed = 1;
  for (auto [p, n] : blocks) strata::testing::fill(p, n / 4 * 4, seed++);
  seed = 1;
  for (auto [p, n] : blocks) CHECK(strata::testing::mismatches(p, n / 4 * 4, seed++) == 0);
  for (auto [p, n] : blocks) pool.deallocate(p, n);
  CHECK(pool.release() > 0);
  CHECK(pool.physical_bytes() == 0);
}

TEST_CASE("mapped_pool<driver_pages> under a physical cap: reclaims, relocations and remaps keep every live block intact")
{
  for (const bool relocate : {false, true}) {
    CAPTURE(relocate);
    // Relocating maps one physical allocation at two addresses at once (the stale one out of use): the driver
    // must accept it, and data written through the new address must stay intact.
    device_pool pool{driver_pages{}, {.max_physical = 256 * mib, .reclaim_slack_fraction = 0.0, .relocate_idle = relocate}};
    std::mt19937_64 rng(5);
    struct live_block {
      void* p;
      std::size_t bytes;
      std::uint32_t seed;
    };
    std::vector<live_block> live;
    std::size_t allocations = 0, refusals = 0;
    for (int step = 0; step < 600; ++step) {
      if (live.size() < 24 && (live.empty() || rng() % 3 != 0)) {
        const std::size_t bytes = (std::size_t{1} << (12 + rng() % 14)) + 4 * (rng() % 1000);
        try {
          void* p = pool.allocate(bytes);
          const auto seed = static_cast<std::uint32_t>(step);
          strata::testing::fill(p, bytes / 4 * 4, seed);
          live.push_back({p, bytes, seed});
          ++allocations;
        } catch (const out_of_memory&) {
          ++refusals;  // the cap: legitimate, and the pool must stay consistent
        }
      } else {
        const std::size_t k = rng() % live.size();
        CHECK(strata::testing::mismatches(live[k].p, live[k].bytes / 4 * 4, live[k].seed) == 0);
        pool.deallocate(live[k].p, live[k].bytes);
        live[k] = live.back();
        live.pop_back();
      }
      CHECK(pool.physical_bytes() <= 256 * mib);
    }
    for (const auto& b : live) {
      CHECK(strata::testing::mismatches(b.p, b.bytes / 4 * 4, b.seed) == 0);
      pool.deallocate(b.p, b.bytes);
    }
    CHECK(allocations > 250);
    CHECK(pool.page_calls().unmaps + pool.relocations() > 0);  // the cap forced memory to move
    if (relocate) CHECK(pool.relocations() > 0);
    MESSAGE("relocate " << relocate << ": allocations " << allocations << ", refusals at the cap " << refusals << ", unmaps "
                        << pool.page_calls().unmaps << ", relocations " << pool.relocations() << ", device waits "
                        << pool.page_calls().synchronizes);
    pool.release();
    CHECK(pool.physical_bytes() == 0);
    CHECK(pool.stale_bytes() == 0);
  }
}

TEST_CASE("stream_ordered<mapped_pool>: a block freed on one stream and remapped for another never races")
{
  // Under a 64 MiB cap: a holds x (40 MiB) and y (16 MiB) after it, frees x while its kernel still reads x;
  // b then asks for 44 MiB, which fits neither x's hole nor the cap beside it: the pool must unmap x's memory
  // and map new memory for b. The unmap may only happen once a's kernel is done. Relocating instead, x's
  // memory is mapped again under b's block: b's writes must still come after a's kernel.
  for (const bool relocate : {false, true}) {
    CAPTURE(relocate);
    // (Relocated memory keeps its stale range out of use until a wait, so the layout needs more room: 96 MiB.)
    const std::size_t cap = (relocate ? 96 : 64) * mib;
    stream_ordered<device_pool> layer{device_pool{driver_pages{}, {.max_physical = cap, .reclaim_slack_fraction = 0.0, .relocate_idle = relocate}}};
    const cudaStream_t a = make_stream(), b = make_stream();
    void* out = nullptr;
    REQUIRE(cudaMalloc(&out, 40 * mib) == cudaSuccess);
    for (int round = 0; round < 6; ++round) {
      CAPTURE(round);
      const auto seed = static_cast<std::uint32_t>(100 + round);
      void* x = layer.allocate_async(40 * mib, 256, a);
      void* y = layer.allocate_async(16 * mib, 256, a);
      strata::testing::fill(x, 40 * mib, seed, a);
      strata::testing::sleep_kernel<<<1, 1, 0, a>>>(2'000'000);
      REQUIRE(cudaMemcpyAsync(out, x, 40 * mib, cudaMemcpyDeviceToDevice, a) == cudaSuccess);
      layer.deallocate_async(x, 40 * mib, 256, a);
      void* mine = layer.allocate_async(44 * mib, 256, b);
      strata::testing::fill(mine, 44 * mib, seed + 1000, b);
      REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
      CHECK(strata::testing::mismatches(out, 40 * mib, seed) == 0);
      CHECK(strata::testing::mismatches(mine, 44 * mib, seed + 1000) == 0);
      layer.deallocate_async(mine, 44 * mib, 256, b);
      layer.deallocate_async(y, 16 * mib, 256, a);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      CHECK(layer.policy().physical_bytes() <= cap);
    }
    if (relocate)
      CHECK(layer.policy().relocations() > 0);  // memory really moved under the cap, with no wait
    else
      CHECK(layer.policy().page_calls().unmaps > 0);
    layer.release();
    CHECK(layer.policy().physical_bytes() == 0);
    REQUIRE(cudaFree(out) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(a) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
  }
}

TEST_CASE("default_pool: the recommended stack on streams, and its options checked")
{
  CHECK_THROWS_AS(make_default_pool({.max_fraction = 0.0}), std::invalid_argument);
  CHECK_THROWS_AS(make_default_pool({.max_fraction = 1.5}), std::invalid_argument);
  default_pool pool = make_default_pool({.max_fraction = 0.5});
  const cudaStream_t s = make_stream();
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t bytes : {std::size_t{512}, 1 * mib, 9 * mib + 512, 33 * mib})
    blocks.push_back({pool.allocate_async(bytes, 256, cuda::stream_ref{s}), bytes});
  std::uint32_t seed = 3;
  for (auto [p, n] : blocks) strata::testing::fill(p, n, seed++, s);
  seed = 3;
  for (auto [p, n] : blocks) CHECK(strata::testing::mismatches(p, n, seed++, s) == 0);
  for (auto [p, n] : blocks) pool.deallocate_async(p, n, 256, cuda::stream_ref{s});
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  pool.release();
  CHECK(pool.policy().physical_bytes() == 0);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("mapped_pool: a peer device reads and writes the memory (two devices)")
{
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices < 2) {
    MESSAGE("one device: the peer-access test needs two and is skipped");
    return;
  }
  int can = 0;
  REQUIRE(cudaDeviceCanAccessPeer(&can, 1, 0) == cudaSuccess);
  if (can == 0) {
    CHECK_THROWS_AS(driver_pages(0, 0, {1}), std::invalid_argument);
    return;
  }
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  device_pool pool{driver_pages{0, 0, {1}}};
  void* p = pool.allocate(6 * mib);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  strata::testing::fill(p, 6 * mib, 77);  // a kernel on device 1 writes device 0's memory
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  CHECK(strata::testing::mismatches(p, 6 * mib, 77) == 0);
  pool.deallocate(p, 6 * mib);
}
