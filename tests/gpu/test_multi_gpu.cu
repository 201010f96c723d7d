// Two devices: per_device routing on real GPUs, frees made while another device is current, every source
// allocating on its own device whatever is current, peer reads and writes through each pool kind, and a
// tag's blocks read and written by the peer after sleep and wake. Each test skips with a message on a machine
// with one device (a failure under STRATA_REQUIRE_GPU=2); the bad-peer tests run on one device too.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <strata/adaptor/per_device.hpp>
#include <strata/core/peer_access.hpp>
#include <strata/default_pool.hpp>
#include <strata/pages/driver_pages.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/sleep/tag_scope.hpp>
#include <strata/source/async_source.hpp>
#include <strata/source/device_source.hpp>
#include "kernels.cuh"
#include "multi_gpu.cuh"

using namespace strata;
using strata::testing::device_of;
using strata::testing::fill;
using strata::testing::have_two_devices;
using strata::testing::keep_current_device;
using strata::testing::mismatches;

namespace {
constexpr std::size_t mib = std::size_t{1} << 20;

int current()
{
  int d = -1;
  REQUIRE(cudaGetDevice(&d) == cudaSuccess);
  return d;
}

void make_current(int d) { REQUIRE(cudaSetDevice(d) == cudaSuccess); }

bool can_access(int peer, int owner)
{
  int can = 0;
  REQUIRE(cudaDeviceCanAccessPeer(&can, peer, owner) == cudaSuccess);
  return can != 0;
}

/// A kernel on `peer` writes memory `r` handed out on `owner` and the owner checks it; then the owner writes
/// and the peer reads. `r` is allocated and freed with the owner current.
template <class R>
void peer_round_trip(R& r, int owner, int peer, std::size_t bytes, std::uint32_t seed)
{
  make_current(owner);
  void* p = r.allocate(bytes);
  REQUIRE(p != nullptr);
  CHECK(device_of(p) == owner);
  make_current(peer);
  fill(p, bytes, seed);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  make_current(owner);
  CHECK(mismatches(p, bytes, seed) == 0);
  fill(p, bytes, seed + 1);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  make_current(peer);
  CHECK(mismatches(p, bytes, seed + 1) == 0);
  make_current(owner);
  r.deallocate(p, bytes);
}
} // namespace

TEST_SUITE("multi_gpu")
{
TEST_CASE("per_device<default_pool>: blocks come from the current device and go home when freed from the other")
{
  if (!have_two_devices()) return;
  keep_current_device keep;
  default_pools pools;
  void* blocks[2] = {};
  const std::size_t bytes = 8 * mib + 512;
  for (int d = 0; d < 2; ++d) {
    make_current(d);
    blocks[d] = pools.allocate(bytes);
    CHECK(device_of(blocks[d]) == d);
    fill(blocks[d], bytes, 40 + d);
    CHECK(mismatches(blocks[d], bytes, 40 + d) == 0);
    REQUIRE(pools.built(d) != nullptr);
    CHECK(pools.built(d)->owns(blocks[d]));
    CHECK(pools.device_of_block(blocks[d]) == d);
  }
  for (int d = 0; d < 2; ++d) {
    make_current(1 - d);
    pools.deallocate(blocks[d], bytes);  // from the wrong current device
    CHECK(current() == 1 - d);           // left as it was
  }
  pools.release();
  for (int d = 0; d < 2; ++d) {
    CAPTURE(d);
    CHECK(pools.built(d)->policy().usage().used_blocks == 0);
    CHECK(pools.built(d)->policy().physical_bytes() == 0);  // every block went back to its own device's pool
  }
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("per_device<default_pool>: stream-ordered allocations and frees on each device's own stream")
{
  if (!have_two_devices()) return;
  keep_current_device keep;
  default_pools pools;
  cudaStream_t streams[2] = {};
  std::vector<std::pair<void*, int>> blocks;
  for (int d = 0; d < 2; ++d) {
    make_current(d);
    REQUIRE(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking) == cudaSuccess);
    for (int i = 0; i < 16; ++i) {
      void* p = pools.allocate_async((i + 1) * 64 * 1024, 256, cuda::stream_ref{streams[d]});
      CHECK(device_of(p) == d);
      fill(p, (i + 1) * 64 * 1024, i, streams[d]);
      blocks.emplace_back(p, i);
    }
  }
  int checked = 0;
  for (auto [p, i] : blocks) {
    const int d = device_of(p);
    make_current(d);
    checked += mismatches(p, (i + 1) * 64 * 1024, i, streams[d]) == 0;
  }
  CHECK(checked == 32);
  for (auto [p, i] : blocks) {
    const int d = device_of(p);
    make_current(d);  // a stream-ordered free names the block's device's stream, with that device current
    pools.deallocate_async(p, (i + 1) * 64 * 1024, 256, cuda::stream_ref{streams[d]});
  }
  for (int d = 0; d < 2; ++d) {
    make_current(d);
    REQUIRE(cudaStreamSynchronize(streams[d]) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(streams[d]) == cudaSuccess);
  }
  pools.release();
  CHECK(pools.usage().used_blocks == 0);
}

TEST_CASE("per_device<device_source>: frees found by cudaPointerGetAttributes; the cost of each routing")
{
  if (!have_two_devices()) return;
  keep_current_device keep;
  per_device<device_source> sources;
  void* blocks[2] = {};
  for (int d = 0; d < 2; ++d) {
    make_current(d);
    blocks[d] = sources.allocate(mib);
    CHECK(device_of(blocks[d]) == d);
    CHECK(sources.device_of_block(blocks[d]) == d);
  }
  // What routing a free costs: a driver lookup for non-owning stacks, owns() lookups for owning ones.
  constexpr int rounds = 100'000;
  const auto t0 = std::chrono::steady_clock::now();
  int found = 0;
  for (int i = 0; i < rounds; ++i) found += sources.device_of_block(blocks[i & 1]) == (i & 1);
  const auto t1 = std::chrono::steady_clock::now();
  CHECK(found == rounds);
  default_pools pools;
  void* pooled[2] = {};
  for (int d = 0; d < 2; ++d) {
    make_current(d);
    pooled[d] = pools.allocate(mib);
  }
  make_current(0);
  found = 0;
  const auto t2 = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) found += pools.device_of_block(pooled[i & 1]) == (i & 1);
  const auto t3 = std::chrono::steady_clock::now();
  CHECK(found == rounds);
  const auto ns = [](auto a, auto b) { return std::chrono::duration<double, std::nano>(b - a).count() / rounds; };
  MESSAGE("routing a free: cudaPointerGetAttributes " << ns(t0, t1) << " ns, owns() over 2 default_pools " << ns(t2, t3) << " ns");
  for (int d = 0; d < 2; ++d) {
    make_current(1 - d);
    sources.deallocate(blocks[d], mib);
    cudaPointerAttributes a{};
    (void)cudaPointerGetAttributes(&a, blocks[d]);
    (void)cudaGetLastError();
    CHECK(a.type != cudaMemoryTypeDevice);  // really freed (cudaFree)
    pools.deallocate(pooled[d], mib);
  }
}

TEST_CASE("each source allocates on its own device while another device is current")
{
  if (!have_two_devices()) return;
  keep_current_device keep;
  for (int d = 0; d < 2; ++d) {
    CAPTURE(d);
    const int other = 1 - d;
    make_current(other);
    const auto round_trip_on_own_device = [&](void* p, std::size_t bytes, std::uint32_t seed) {
      CHECK(device_of(p) == d);
      CHECK(current() == other);
      make_current(d);
      fill(p, bytes, seed);
      CHECK(mismatches(p, bytes, seed) == 0);
      make_current(other);
    };
    {
      device_source source(d);
      void* p = source.allocate(mib);
      round_trip_on_own_device(p, mib, 1);
      source.deallocate(p, mib);
    }
    {
      coalescing_pool<device_source> pool{device_source(d)};
      void* p = pool.allocate(mib);
      round_trip_on_own_device(p, mib, 2);
      pool.deallocate(p, mib);
    }
    {
      async_source source({.device = d});
      CHECK(source.device() == d);
      void* p = source.allocate(mib);  // the pool's device's legacy stream, not the current device's
      round_trip_on_own_device(p, mib, 3);
      source.deallocate(p, mib);
      make_current(d);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      CHECK(source.used_bytes() == 0);
      make_current(other);
      async_source borrowed = async_source::default_pool(d);
      CHECK(borrowed.device() == d);
      void* q = borrowed.allocate(mib);
      round_trip_on_own_device(q, mib, 4);
      borrowed.deallocate(q, mib);
    }
    {
      mapped_pool<driver_pages> pool{driver_pages(d)};
      void* p = pool.allocate(3 * mib);
      round_trip_on_own_device(p, 3 * mib, 5);
      pool.deallocate(p, 3 * mib);
      pool.release();
      CHECK(pool.physical_bytes() == 0);
    }
    {
      default_pool pool = make_default_pool({.device = d, .max_fraction = 0.5});
      void* p = pool.allocate(5 * mib);
      round_trip_on_own_device(p, 5 * mib, 6);
      pool.deallocate(p, 5 * mib);
      pool.release();
    }
    CHECK(current() == other);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("an out-of-memory on another device leaves the caller's current device as it was")
{
  if (!have_two_devices()) return;
  keep_current_device keep;
  make_current(0);
  std::size_t free_bytes = 0, total = 0;
  make_current(1);
  REQUIRE(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess);
  make_current(0);
  device_source on1(1);
  CHECK_THROWS_AS((void)on1.allocate(total * 2), out_of_memory);
  CHECK(current() == 0);
  async_source pool1({.device = 1});
  CHECK_THROWS_AS((void)pool1.allocate(total * 2), out_of_memory);
  CHECK(current() == 0);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("peer access through each pool kind: a kernel on one device reads and writes another's memory")
{
  if (!have_two_devices()) return;
  keep_current_device keep;
  for (const auto [owner, peer] : {std::pair{0, 1}, std::pair{1, 0}}) {
    CAPTURE(owner);
    CAPTURE(peer);
    if (!can_access(peer, owner)) {
      CHECK_THROWS_AS(device_source(owner, {peer}), peer_access_error);
      CHECK_THROWS_AS(async_source({.device = owner, .peers = {peer}}), peer_access_error);
      CHECK_THROWS_AS(driver_pages(owner, 0, {peer}), peer_access_error);
      MESSAGE("no peer path from device " << peer << " to device " << owner << ": the errors were checked instead");
      continue;
    }
    {
      coalescing_pool<device_source> pool{device_source(owner, {peer})};
      peer_round_trip(pool, owner, peer, 4 * mib, 100);
      device_source again(owner, {peer});  // enabling twice is not an error
      CHECK(cudaGetLastError() == cudaSuccess);
    }
    {
      async_source source({.device = owner, .peers = {peer}});
      peer_round_trip(source, owner, peer, 4 * mib, 200);
      source.grant({peer});  // granting twice is not an error
    }
    {
      mapped_pool<driver_pages> pool{driver_pages(owner, 0, {peer})};
      peer_round_trip(pool, owner, peer, 6 * mib, 300);
    }
    {
      default_pool pool = make_default_pool({.device = owner, .max_fraction = 0.5, .peers = {peer}});
      peer_round_trip(pool, owner, peer, 10 * mib, 400);
      pool.release();
    }
  }
  CHECK(cudaGetLastError() == cudaSuccess);
}
TEST_CASE("mapped_pool::add_peer after the fact: the peer reaches blocks mapped before the grant and after it")
{
  if (!have_two_devices()) return;
  keep_current_device keep;
  for (const auto [owner, peer] : {std::pair{0, 1}, std::pair{1, 0}}) {
    CAPTURE(owner);
    CAPTURE(peer);
    make_current(owner);
    default_pool pool = make_default_pool({.device = owner, .max_fraction = 0.5});
    if (!can_access(peer, owner)) {
      CHECK_THROWS_AS(pool.policy().add_peer(peer), peer_access_error);
      CHECK_FALSE(pool.policy().backend().grants(peer));
      continue;
    }
    void* before = pool.allocate(6 * mib);  // mapped for the owner alone
    CHECK(pool.policy().add_peer(peer));
    CHECK_FALSE(pool.policy().add_peer(peer));
    make_current(peer);
    fill(before, 6 * mib, 500);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    make_current(owner);
    CHECK(mismatches(before, 6 * mib, 500) == 0);
    pool.deallocate(before, 6 * mib);
    peer_round_trip(pool, owner, peer, 40 * mib, 600);  // new mappings name the peer too
    pool.release();
  }
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("sleep_wake with a peer: after resume the peer reads and writes a tag's blocks, contents identical on both devices")
{
  if (!have_two_devices()) return;
  keep_current_device keep;
  const int owner = 0, peer = 1;
  if (!can_access(peer, owner)) {
    MESSAGE("no peer path from device " << peer << " to device " << owner << ": skipped");
    return;
  }
  const std::size_t sizes[] = {256, 3 * mib + 4, 70 * mib + 256, 256 * mib};
  auto each_block = [&](auto&& pool, auto&& pause_tag, auto&& resume_tag, std::uint32_t seed) {
    make_current(owner);
    std::vector<std::pair<void*, std::size_t>> blocks;
    {
      tag_scope weights(3);
      for (std::size_t n : sizes) blocks.emplace_back(pool.allocate(n / 4 * 4), n / 4 * 4);
    }
    make_current(peer);  // the peer writes the contents that must survive the pause
    std::uint32_t s = seed;
    for (auto [p, n] : blocks) fill(p, n, s++);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    make_current(owner);
    pause_tag();
    resume_tag();
    s = seed;
    for (auto [p, n] : blocks) CHECK(mismatches(p, n, s++) == 0);  // on the owner
    make_current(peer);
    s = seed;
    for (auto [p, n] : blocks) {
      CHECK(mismatches(p, n, s) == 0);  // on the peer: access granted again on the new mappings
      fill(p, n, s + 100);              // and written from there
      ++s;
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    make_current(owner);
    s = seed;
    for (auto [p, n] : blocks) CHECK(mismatches(p, n, 100 + s++) == 0);
    for (auto [p, n] : blocks) pool.deallocate(p, n);
  };
  {
    mapped_pool<driver_pages> pool{driver_pages(owner, 0, {peer})};
    each_block(pool, [&] { pool.pause({3}); CHECK(pool.physical_bytes(3) == 0); }, [&] { pool.resume({3}); }, 500);
  }
  {
    default_pool pool = make_default_pool({.device = owner, .max_fraction = 0.5, .peers = {peer}});
    each_block(pool, [&] { pause(pool, {3}); CHECK(pool.policy().physical_bytes(3) == 0); }, [&] { resume(pool, {3}); }, 600);
    pool.release();
  }
  CHECK(cudaGetLastError() == cudaSuccess);
}
} // TEST_SUITE("multi_gpu")

TEST_CASE("a peer that does not exist is a peer_access_error naming it, and changes nothing")
{
  keep_current_device keep;
  const int devices = strata::testing::device_count();
  const int missing = devices + 3;
  const auto names_peer = [&](const peer_access_error& e) {
    CHECK(e.peer() == missing);
    CHECK(e.device() == 0);
    CHECK(std::string(e.what()).find("device " + std::to_string(missing) + " cannot access device 0") != std::string::npos);
  };
  try {
    device_source source(0, {missing});
    FAIL("device_source accepted a missing peer");
  } catch (const peer_access_error& e) {
    names_peer(e);
  }
  try {
    async_source source({.device = 0, .peers = {missing}});
    FAIL("async_source accepted a missing peer");
  } catch (const peer_access_error& e) {
    names_peer(e);
  }
  try {
    driver_pages pages(0, 0, {missing});
    FAIL("driver_pages accepted a missing peer");
  } catch (const peer_access_error& e) {
    names_peer(e);
  }
  CHECK_THROWS_AS(make_default_pool({.device = 0, .peers = {missing}}), std::invalid_argument);
  device_source self(0, {0});  // the device itself is no peer: skipped
  async_source self_pool({.device = 0, .peers = {0}});
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(current() == 0);
}
