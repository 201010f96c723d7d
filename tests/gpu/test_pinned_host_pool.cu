// pinned_host_pool on a real GPU: host_pinning's one registration per region, its NUMA placement, copies in
// both directions from pooled blocks, reuse only after the copy that read a freed block, and the memlock
// limit named when pinning is refused.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <strata/pinned/host_pinning.hpp>
#include <strata/pinned/pinned_host_pool.hpp>
#include <strata/stream/cuda_events.hpp>
#include "kernels.cuh"

using namespace strata;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

/// The NUMA node holding the page at p (move_pages with no target nodes reports where pages are), -1 if unknown.
int node_of_page(void* p)
{
  void* pages[1] = {p};
  int status[1] = {-1};
  if (::syscall(SYS_move_pages, 0, 1UL, pages, nullptr, status, 0) != 0) return -1;
  return status[0];
}

bool registered(const void* p)
{
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}

} // namespace

TEST_SUITE("gpu")
{
TEST_CASE("host_pinning: one registration at the size asked, huge-page aligned, on the GPU's NUMA node")
{
  host_pinning pinning;
  int device = 0, node = -1;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  if (cudaDeviceGetAttribute(&node, cudaDevAttrHostNumaId, device) != cudaSuccess) {
    (void)cudaGetLastError();
    node = -1;
  }
  CHECK(pinning.numa_node() == node);
  const std::size_t before = host_pinning::pinned_in_process();
  const std::size_t bytes = 64 * MiB + 4096;
  auto* p = static_cast<unsigned char*>(pinning.pin(bytes));
  CHECK(reinterpret_cast<std::uintptr_t>(p) % (2 * MiB) == 0);
  CHECK(host_pinning::pinned_in_process() == before + bytes);
  CHECK(registered(p));
  CHECK(registered(p + bytes - 1));
  if (node >= 0) {
    CHECK(node_of_page(p) == node);
    CHECK(node_of_page(p + bytes - 4096) == node);
  }
  // One registration: a copy of the whole region is one pinned copy, correct end to end.
  std::memset(p, 0x5a, bytes);
  void* device_copy = nullptr;
  REQUIRE(cudaMalloc(&device_copy, bytes) == cudaSuccess);
  REQUIRE(cudaMemcpy(device_copy, p, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  std::memset(p, 0, bytes);
  REQUIRE(cudaMemcpy(p, device_copy, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(p[0] == 0x5a);
  CHECK(p[bytes - 1] == 0x5a);
  REQUIRE(cudaFree(device_copy) == cudaSuccess);
  pinning.unpin(p, bytes);
  CHECK(host_pinning::pinned_in_process() == before);
}

TEST_CASE("pinned_host_pool: copies both ways from pooled blocks, and a block is reused only after its copy")
{
  pinned_host_pool<> pool;
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  const std::size_t bytes = 24 * MiB + 123;
  auto* a = static_cast<std::uint32_t*>(pool.allocate(bytes));
  auto* b = static_cast<std::uint32_t*>(pool.allocate(bytes));
  CHECK(pool.stats().pinned == 2 * pool.good_size(bytes));
  const std::size_t words = bytes / 4;
  for (std::size_t i = 0; i < words; ++i) a[i] = static_cast<std::uint32_t>(i * 2654435761u);
  void* d = nullptr;
  REQUIRE(cudaMalloc(&d, bytes) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(d, a, bytes, cudaMemcpyHostToDevice, s) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(b, d, bytes, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(std::memcmp(a, b, words * 4) == 0);
  strata::testing::check_device_round_trip(b, bytes, 3, s);  // the device uses the host pointer directly

  // The stream is held up, then a copy reads `a`, which is freed at once: `a` is no one's until it ran.
  strata::testing::sleep_kernel<<<1, 1, 0, s>>>(200'000'000);
  REQUIRE(cudaMemcpyAsync(d, a, bytes, cudaMemcpyHostToDevice, s) == cudaSuccess);
  pool.record_use(a, s);
  pool.deallocate(a, bytes);
  CHECK(pool.stats().waiting_blocks == 1);
  void* c = pool.allocate(bytes);
  CHECK(c != a);
  CHECK(pool.stats().host_waits == 0);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  const std::size_t pins = pool.stats().pins;
  void* again = pool.allocate(bytes);
  CHECK(again == a);
  CHECK(pool.stats().pins == pins);
  for (void* p : {again, c, static_cast<void*>(b)}) pool.deallocate(p, bytes);
  CHECK(pool.release() == 3 * pool.good_size(bytes));
  CHECK_FALSE(registered(a));
  REQUIRE(cudaFree(d) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("pinned_host_pool: past RLIMIT_MEMLOCK (honoured) the refusal names the limit and nothing stays pinned")
{
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_MEMLOCK, &saved) == 0);
  rlimit lowered = saved;
  lowered.rlim_cur = 16 * MiB + host_pinning::pinned_in_process();
  if (saved.rlim_cur != RLIM_INFINITY && saved.rlim_cur < lowered.rlim_cur) lowered.rlim_cur = saved.rlim_cur;
  REQUIRE(::setrlimit(RLIMIT_MEMLOCK, &lowered) == 0);
  {
    int device = 0;
    REQUIRE(cudaGetDevice(&device) == cudaSuccess);
    pinned_host_pool<> pool(host_pinning(device, {.honour_memlock = true}), cuda_events{});
    const std::size_t before = host_pinning::pinned_in_process();
    try {
      (void)pool.allocate(lowered.rlim_cur + 4096);
      FAIL("pinning past RLIMIT_MEMLOCK succeeded");
    } catch (const out_of_memory& e) {
      CHECK(std::string(e.what()).find("RLIMIT_MEMLOCK") != std::string::npos);
      CHECK(std::string(e.what()).find(std::to_string(lowered.rlim_cur)) != std::string::npos);
    }
    CHECK(host_pinning::pinned_in_process() == before);
    CHECK(pool.stats().pinned == 0);
    void* p = pool.allocate(4096);  // still usable under the limit
    CHECK(registered(p));
    pool.deallocate(p, 4096);
  }
  REQUIRE(::setrlimit(RLIMIT_MEMLOCK, &saved) == 0);
}
}
