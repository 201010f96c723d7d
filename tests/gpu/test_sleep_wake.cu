// Sleep and wake by tag on the CUDA driver: a paused tag's contents come back byte for byte at the same
// addresses, work queued before the pause finishes first, a hundred cycles hold device and pinned memory flat,
// a CUDA graph captured over the blocks replays after a resume, a graph whose private pool holds a tag's
// memory sleeps and wakes with the tag, a resume without room changes nothing, and pinned backups are
// page-locked in every chunk.
// Run: strata_gpu_tests -tc='sleep_wake:*'
#include <doctest/doctest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include <strata/default_pool.hpp>
#include <strata/pages/driver_pages.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/sleep/pinned_host.hpp>
#include <strata/sleep/tag_scope.hpp>
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

std::size_t device_used()
{
  std::size_t free = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  return total - free;
}

__global__ void add_one_kernel(const std::uint32_t* in, std::uint32_t* out, std::size_t n)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) out[i] = in[i] + 1;
}

__global__ void count_plus_one_mismatches(const std::uint32_t* p, std::size_t n, std::uint32_t seed, unsigned long long* bad)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    if (p[i] != (seed ^ static_cast<std::uint32_t>(i * 2654435761u)) + 1) atomicAdd(bad, 1ull);
}

unsigned long long plus_one_mismatches(const void* p, std::size_t bytes, std::uint32_t seed)
{
  unsigned long long* bad = nullptr;
  REQUIRE(cudaMallocManaged(&bad, sizeof *bad) == cudaSuccess);
  *bad = 0;
  count_plus_one_mismatches<<<256, 256>>>(static_cast<const std::uint32_t*>(p), bytes / 4, seed, bad);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const unsigned long long n = *bad;
  REQUIRE(cudaFree(bad) == cudaSuccess);
  return n;
}

const std::size_t sizes[] = {256, 100'000, 3 * mib + 4, 5 * mib, 70 * mib + 256, 512 * mib};

__global__ void sum_kernel(const std::uint32_t* p, std::size_t n, unsigned long long* sum)
{
  unsigned long long mine = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) mine += p[i];
  atomicAdd(sum, mine);
}

/// What sum_kernel gives over fill(seed)'s pattern plus `plus` in every word.
unsigned long long expected_sum(std::size_t n, std::uint32_t seed, std::uint32_t plus)
{
  unsigned long long sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += static_cast<std::uint32_t>((seed ^ static_cast<std::uint32_t>(i * 2654435761u)) + plus);
  return sum;
}

std::size_t device_free()
{
  std::size_t free = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  return free;
}

/// A step captured through default_pool on `s` under the calling thread's tag: two temporaries from the
/// graph's private pool (the first freed inside the capture, so the pool keeps it free for replays), the
/// output `out = in + 2` left live, and its sum added into `*sum`.
struct pooled_graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  void* out = nullptr;
  void* temp = nullptr;
};

pooled_graph capture_pooled(default_pool& pool, cudaStream_t s, const void* in, std::size_t n, unsigned long long* sum)
{
  pooled_graph g;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  g.temp = pool.allocate_async(n, 256, s);
  add_one_kernel<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(in), static_cast<std::uint32_t*>(g.temp), n / 4);
  g.out = pool.allocate_async(n, 256, s);
  add_one_kernel<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(g.temp), static_cast<std::uint32_t*>(g.out), n / 4);
  pool.deallocate_async(g.temp, n, 256, s);
  sum_kernel<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(g.out), n / 4, sum);
  REQUIRE(cudaStreamEndCapture(s, &g.graph) == cudaSuccess);
  REQUIRE(cudaGraphInstantiate(&g.exec, g.graph, 0) == cudaSuccess);
  pool.deallocate_async(pool.allocate_async(256, 256, s), 256, 256, s);  // a call on s: the layer sees the capture over
  return g;
}

unsigned long long replay_sum(const pooled_graph& g, cudaStream_t s, unsigned long long* sum)
{
  *sum = 0;
  REQUIRE(cudaGraphLaunch(g.exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  return *sum;
}

} // namespace

TEST_CASE("sleep_wake: contents come back checksummed identical at the same addresses; a paused tag holds no device memory")
{
  device_pool pool;
  std::vector<std::pair<void*, std::size_t>> blocks;
  {
    tag_scope weights(1);
    for (std::size_t n : sizes) blocks.emplace_back(pool.allocate(n), n);
  }
  void* other = pool.allocate_tagged(2, 64 * mib);
  std::uint32_t seed = 1;
  for (auto [p, n] : blocks) testing::fill(p, n / 4 * 4, seed++);
  testing::fill(other, 64 * mib, 99);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::size_t used_before = device_used();
  const std::size_t held = pool.physical_bytes(1);
  pool.pause({1});
  CHECK(pool.paused(1));
  CHECK(pool.physical_bytes(1) == 0);
  CHECK(device_used() + held <= used_before + 4 * pool.page_size());  // the memory really went back (copy streams may take a little)
  CHECK(testing::mismatches(other, 64 * mib, 99) == 0);          // the other tag runs on
  pool.resume({1});
  seed = 1;
  for (auto [p, n] : blocks) {
    CHECK(pool.owns(p));
    CHECK(testing::mismatches(p, n / 4 * 4, seed++) == 0);
  }
  // Without a backup the addresses come back usable, the contents do not matter.
  pool.pause({1}, /*backup=*/false);
  pool.resume({1});
  for (auto [p, n] : blocks) testing::check_device_round_trip(p, n / 4 * 4);
  for (auto [p, n] : blocks) pool.deallocate(p, n);
  pool.deallocate(other, 64 * mib);
}

TEST_CASE("sleep_wake: kernels queued on several streams before the pause finish, and what they wrote is what comes back")
{
  device_pool pool;
  cudaStream_t streams[3] = {make_stream(), make_stream(), make_stream()};
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(pool.allocate_tagged(3, 96 * mib));
  for (int i = 0; i < 3; ++i) {
    testing::sleep_kernel<<<1, 1, 0, streams[i]>>>(200'000'000ull);  // 0.2 s: the pause comes while they run
    testing::fill(blocks[i], 96 * mib, 40u + static_cast<std::uint32_t>(i), streams[i]);
  }
  pool.pause({3});  // no synchronization by the caller
  pool.resume({3});
  for (int i = 0; i < 3; ++i) CHECK(testing::mismatches(blocks[i], 96 * mib, 40u + static_cast<std::uint32_t>(i)) == 0);
  for (void* p : blocks) pool.deallocate(p, 96 * mib);
  for (auto s : streams) REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("sleep_wake: one pause of two tags waits for the device once; kernels queued on their blocks finish first")
{
  device_pool pool;
  cudaStream_t streams[2] = {make_stream(), make_stream()};
  void* a = pool.allocate_tagged(10, 96 * mib);
  void* b = pool.allocate_tagged(11, 96 * mib);
  for (int i = 0; i < 2; ++i) testing::sleep_kernel<<<1, 1, 0, streams[i]>>>(100'000'000ull);  // still running at the pause
  testing::fill(a, 96 * mib, 81, streams[0]);
  testing::fill(b, 96 * mib, 82, streams[1]);
  const auto waits = pool.page_calls().synchronizes;
  pool.pause({10, 11});
  CHECK(pool.page_calls().synchronizes == waits + 1);
  CHECK(pool.physical_bytes(10) + pool.physical_bytes(11) == 0);
  pool.resume({10, 11});
  CHECK(pool.page_calls().synchronizes == waits + 1);
  CHECK(testing::mismatches(a, 96 * mib, 81) == 0);
  CHECK(testing::mismatches(b, 96 * mib, 82) == 0);
  pool.deallocate(a, 96 * mib);
  pool.deallocate(b, 96 * mib);
  for (auto s : streams) REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("sleep_wake: 100 cycles hold device memory and the pinned backup flat")
{
  device_pool pool;
  std::vector<std::pair<void*, std::size_t>> blocks;
  std::size_t paused_size = 0;
  for (std::size_t n : sizes) {
    blocks.emplace_back(pool.allocate_tagged(4, n), n);
    paused_size += pool.good_size(n);
  }
  std::uint32_t seed = 7;
  for (auto [p, n] : blocks) testing::fill(p, n / 4 * 4, seed++);
  pool.pause({4});
  pool.resume({4});  // the first cycle pins and makes the copy streams
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::size_t used_after_first = device_used();
  std::size_t worst = used_after_first;
  for (int cycle = 0; cycle < 100; ++cycle) {
    pool.pause({4});
    CHECK(pool.backup_bytes() <= paused_size + pool.page_size());
    pool.resume({4});
    worst = std::max(worst, device_used());
  }
  MESSAGE("device memory used after the first cycle " << used_after_first << ", most after any later one " << worst << "; backup "
                                                     << pool.backup_bytes() << " for " << paused_size << " paused");
  CHECK(worst <= used_after_first + pool.page_size());
  CHECK(pool.backup_bytes() <= paused_size + pool.page_size());
  seed = 7;
  for (auto [p, n] : blocks) CHECK(testing::mismatches(p, n / 4 * 4, seed++) == 0);
  for (auto [p, n] : blocks) pool.deallocate(p, n);
  CHECK(pool.release_backup() > 0);
  CHECK(pool.backup_bytes() == 0);
}

TEST_CASE("sleep_wake: a CUDA graph captured over tagged blocks replays identically after resume")
{
  device_pool pool;
  constexpr std::size_t n = 32 * mib;
  void* in = pool.allocate_tagged(5, n);
  void* out = pool.allocate_tagged(5, n);
  cudaStream_t s = make_stream();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  testing::fill_kernel<<<256, 256, 0, s>>>(static_cast<std::uint32_t*>(in), n / 4, 11);
  add_one_kernel<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(in), static_cast<std::uint32_t*>(out), n / 4);
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(plus_one_mismatches(out, n, 11) == 0);
  pool.pause({5}, /*backup=*/false);  // contents dropped: the replay must rebuild them at the same addresses
  pool.resume({5});
  REQUIRE(cudaMemset(out, 0, n) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(plus_one_mismatches(out, n, 11) == 0);
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  pool.deallocate(in, n);
  pool.deallocate(out, n);
}

TEST_CASE("sleep_wake: a graph's private pool captured under a tag sleeps and wakes with it; replays give the same sum")
{
  default_pool pool = make_default_pool();
  cudaStream_t s = make_stream();
  constexpr std::size_t n = 128 * mib;
  unsigned long long* sum = nullptr;
  REQUIRE(cudaMallocManaged(&sum, sizeof *sum) == cudaSuccess);
  void* in = nullptr;
  pooled_graph g;
  {
    tag_scope engine(8);
    in = pool.allocate_async(n, 256, s);
    testing::fill(in, n, 13, s);
    g = capture_pooled(pool, s, in, n, sum);
  }
  CHECK(pool.policy().tag_of(g.out) == 8);
  CHECK(pool.policy().tag_of(g.temp) == 8);
  const unsigned long long want = expected_sum(n / 4, 13, 2);
  CHECK(replay_sum(g, s, sum) == want);
  const std::size_t pools = pool.private_pools(), blocks = pool.private_pool_blocks(), free_blocks = pool.private_pool_free_blocks();
  REQUIRE(blocks == 2);
  REQUIRE(free_blocks == 1);

  const std::size_t free_before = device_free();
  pause(pool, {8});
  const std::size_t free_asleep = device_free();
  MESSAGE("device free " << free_before << " before the pause, " << free_asleep << " while tag 8 sleeps");
  CHECK(free_asleep + 4 * pool.policy().page_size() >= free_before + 3 * n);  // the input, the graph's output and its free temporary
  CHECK(pool.policy().physical_bytes(8) == 0);
  CHECK(pool.private_pools() == pools);
  CHECK(pool.private_pool_blocks() == blocks);
  CHECK(pool.private_pool_free_blocks() == free_blocks);

  resume(pool, {8});
  CHECK(pool.private_pool_blocks() == blocks);
  CHECK(replay_sum(g, s, sum) == want);
  CHECK(replay_sum(g, s, sum) == want);
  // Without a backup the replay rebuilds everything but the input, which the graph only reads.
  pause(pool, {8}, /*backup=*/false);
  resume(pool, {8});
  testing::fill(in, n, 13, s);
  CHECK(replay_sum(g, s, sum) == want);

  REQUIRE(cudaGraphExecDestroy(g.exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(g.graph) == cudaSuccess);
  pool.deallocate_async(g.out, n, 256, s);
  pool.deallocate_async(in, n, 256, s);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaFree(sum) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("sleep_wake: a graph captured under tag 0 replays unchanged while another tag sleeps and wakes")
{
  default_pool pool = make_default_pool();
  cudaStream_t s = make_stream();
  constexpr std::size_t n = 64 * mib, other_bytes = 512 * mib;
  unsigned long long* sum = nullptr;
  REQUIRE(cudaMallocManaged(&sum, sizeof *sum) == cudaSuccess);
  void* in = pool.allocate_async(n, 256, s);
  testing::fill(in, n, 17, s);
  const pooled_graph g = capture_pooled(pool, s, in, n, sum);
  CHECK(pool.policy().tag_of(g.out) == 0);
  void* other = nullptr;
  {
    tag_scope engine(9);
    other = pool.allocate_async(other_bytes, 256, s);
    testing::fill(other, other_bytes, 23, s);
  }
  const unsigned long long want = expected_sum(n / 4, 17, 2);
  CHECK(replay_sum(g, s, sum) == want);
  const std::size_t blocks = pool.private_pool_blocks(), held0 = pool.policy().physical_bytes(0);

  const std::size_t free_before = device_free();
  pause(pool, {9});
  CHECK(device_free() + 4 * pool.policy().page_size() >= free_before + other_bytes);
  CHECK(replay_sum(g, s, sum) == want);  // tag 0's graph runs on while tag 9 sleeps
  CHECK(pool.policy().physical_bytes(0) == held0);
  resume(pool, {9});
  CHECK(replay_sum(g, s, sum) == want);
  CHECK(pool.private_pool_blocks() == blocks);
  CHECK(testing::mismatches(other, other_bytes, 23, s) == 0);

  REQUIRE(cudaGraphExecDestroy(g.exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(g.graph) == cudaSuccess);
  for (auto [p, bytes] : {std::pair{g.out, n}, std::pair{in, n}, std::pair{other, other_bytes}}) pool.deallocate_async(p, bytes, 256, s);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaFree(sum) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("sleep_wake: resume without room is out_of_memory naming the tag; nothing is lost and a later resume succeeds")
{
  device_pool pool;
  constexpr std::size_t n = 1024 * mib;
  void* p = pool.allocate_tagged(6, n);
  testing::fill(p, n, 21);
  pool.pause({6});
  std::size_t free = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  void* hog = nullptr;
  REQUIRE(cudaMalloc(&hog, free - 512 * mib) == cudaSuccess);  // leaves less than the tag needs
  bool refused = false;
  try {
    pool.resume({6});
  } catch (const out_of_memory& e) {
    refused = true;
    MESSAGE(e.what());
    CHECK(std::string(e.what()).find("tag 6") != std::string::npos);
  }
  CHECK(refused);
  CHECK(pool.paused(6));
  CHECK(pool.physical_bytes(6) == 0);
  REQUIRE(cudaFree(hog) == cudaSuccess);
  pool.resume({6});
  CHECK(testing::mismatches(p, n, 21) == 0);
  pool.deallocate(p, n);
}

TEST_CASE("sleep_wake: default_pool returns blocks cached on other streams before the pause; the live ones come back")
{
  default_pool pool = make_default_pool();
  cudaStream_t a = make_stream(), b = make_stream();
  std::vector<void*> kept;
  {
    tag_scope engine(7);
    for (int i = 0; i < 4; ++i) {
      kept.push_back(pool.allocate_async(48 * mib, 256, a));
      testing::fill(kept.back(), 48 * mib, 60u + static_cast<std::uint32_t>(i), a);
    }
    void* scratch = pool.allocate_async(32 * mib, 256, b);
    testing::fill(scratch, 32 * mib, 5, b);
    pool.deallocate_async(scratch, 32 * mib, 256, b);  // cached by the stream layer for b
  }
  pause(pool, {7});
  CHECK(pool.cached_blocks() == 0);
  CHECK(pool.policy().physical_bytes(7) == 0);
  CHECK(pool.policy().paused_bytes(7) == 4 * 48 * mib);
  resume(pool, {7});
  for (int i = 0; i < 4; ++i) CHECK(testing::mismatches(kept[static_cast<std::size_t>(i)], 48 * mib, 60u + static_cast<std::uint32_t>(i), a) == 0);
  for (void* p : kept) pool.deallocate_async(p, 48 * mib, 256, a);
  REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(a) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
}

TEST_CASE("sleep_wake: pin_host memory is page-locked in every chunk, and driver_pages copies across the chunks' seams")
{
  constexpr std::size_t n = 200 * mib + 4096;  // four registrations, the last partly used
  auto* host = static_cast<unsigned char*>(pin_host(n));
  REQUIRE(host != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(host) % pinned_host_layout::chunk == 0);
  for (std::size_t off = 0; off < n; off += pinned_host_layout::chunk) {
    cudaPointerAttributes attr{};
    REQUIRE(cudaPointerGetAttributes(&attr, host + off) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeHost);
  }
  device_pool pool;
  void* a = pool.allocate(n);
  void* b = pool.allocate(n);
  testing::fill(a, n, 31);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  pool.backend().copy_to_host(host + 256, reinterpret_cast<std::uintptr_t>(a), n - 256);  // off the seams on purpose
  pool.backend().finish_copies();
  pool.backend().copy_to_device(reinterpret_cast<std::uintptr_t>(b), host + 256, n - 256);
  pool.backend().finish_copies();
  CHECK(testing::mismatches(b, n - 256, 31) == 0);
  pool.deallocate(a, n);
  pool.deallocate(b, n);
  unpin_host(host, n);
}
