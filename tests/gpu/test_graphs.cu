// stream_ordered's private pools on a real GPU: a step that allocates, launches kernels and
// frees is captured into a CUDA graph through stream_ordered<coalescing_pool<device_source>> and through
// default_pool; it is replayed 1,000 times with its result checked after each, with uncaptured work on the
// same pool between replays (and concurrently with them) that must never get the graph's memory; destroying
// the graph and its executable graph returns the blocks (the CUDA user object's destructor); another stream
// allocates normally during a capture; the PyTorch-style API (begin/end_allocate_to_pool, release_pool).
// Run: strata_gpu_tests -tc='graphs:*' (tests/device/graphs.sh).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <strata/default_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "kernels.cuh"

using namespace strata;

namespace {

using chunked_layer = stream_ordered<coalescing_pool<device_source>>;

constexpr std::size_t words = std::size_t{1} << 20;  // 4 MiB per buffer
constexpr std::size_t bytes = words * 4;

cudaStream_t make_stream()
{
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  return s;
}

__device__ inline std::uint32_t pattern(std::uint32_t seed, std::size_t i) { return seed ^ static_cast<std::uint32_t>(i * 2654435761u); }

__global__ void affine_kernel(const std::uint32_t* a, std::uint32_t* b, std::size_t n, std::uint32_t mul, std::uint32_t add)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) b[i] = a[i] * mul + add;
}
__global__ void add_kernel(const std::uint32_t* a, const std::uint32_t* b, std::uint32_t* c, std::size_t n)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) c[i] = a[i] + b[i];
}
/// out must be 17 * in + 12, in being pattern(seed): what step() computes.
__global__ void check_step_kernel(const std::uint32_t* out, std::size_t n, std::uint32_t seed, unsigned long long* bad)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    if (out[i] != pattern(seed, i) * 17u + 12u) atomicAdd(bad, 1ull);
}

/// Where step() put its temporaries, to check nobody else is handed them while the graph lives.
struct step_blocks {
  std::vector<void*> seen;
};

/// The step a training loop would capture: temporaries allocated, used and freed in stream order; the third
/// temporary has the first's shape, so inside the capture it reuses the first's block (freed before it).
template <class Layer>
void step(Layer& layer, const void* in, void* out, cudaStream_t s, step_blocks* blocks = nullptr)
{
  auto* t1 = static_cast<std::uint32_t*>(layer.allocate_async(bytes, 256, s));
  affine_kernel<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(in), t1, words, 3, 1);
  auto* t2 = static_cast<std::uint32_t*>(layer.allocate_async(bytes / 2 * 2 + 4096, 256, s));  // another shape
  affine_kernel<<<256, 256, 0, s>>>(t1, t2, words, 5, 7);
  layer.deallocate_async(t1, bytes, 256, s);
  auto* t3 = static_cast<std::uint32_t*>(layer.allocate_async(bytes, 256, s));
  affine_kernel<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(in), t3, words, 2, 0);
  add_kernel<<<256, 256, 0, s>>>(t2, t3, static_cast<std::uint32_t*>(out), words);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  layer.deallocate_async(t2, bytes / 2 * 2 + 4096, 256, s);
  layer.deallocate_async(t3, bytes, 256, s);
  if (blocks != nullptr) {
    blocks->seen.push_back(t1);
    blocks->seen.push_back(t2);
    blocks->seen.push_back(t3);
  }
}

unsigned long long* make_counter()
{
  unsigned long long* c = nullptr;
  REQUIRE(cudaMallocManaged(&c, sizeof *c) == cudaSuccess);
  *c = 0;
  return c;
}

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn)
{
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

/// The user object's destructor runs on a CUDA thread some time after the last holder is destroyed: the layer
/// collects its pools at its next call. Polls for up to 5 s until `done(layer)`.
template <class Layer, class Done>
bool collected_until(Layer& layer, Done done)
{
  for (int i = 0; i < 5000; ++i) {
    (void)cudaDeviceSynchronize();  // the destructor runs once the launches using the graph are done
    layer.collect_released_pools();
    if (done(layer)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

template <class Layer>
bool pools_collected(Layer& layer, std::size_t expected_pools)
{
  return collected_until(layer, [&](Layer& l) { return l.private_pools() == expected_pools; });
}

/// The whole scenario over one stack.
template <class Layer>
void capture_and_replay(Layer& layer, const char* name)
{
  INFO("stack: " << name);
  cudaStream_t s = make_stream(), other = make_stream();
  void* in = layer.allocate_async(bytes, 256, s);
  void* out = layer.allocate_async(bytes, 256, s);
  strata::testing::fill(in, bytes, 1, s);
  // Once uncaptured, first: the result is right, and s, the first stream to free, owns the policy, so the
  // step's blocks are back in the policy (mapped, for default_pool): the capture takes them without growing
  // (a pool that must wait for the device to grow cannot do so under capture). Then the other stream, so
  // both are known to the layer before capture and the capture needs no host wait.
  step(layer, in, out, s);
  layer.deallocate_async(layer.allocate_async(bytes, 256, other), bytes, 256, other);
  unsigned long long* bad = make_counter();
  check_step_kernel<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(out), words, 1, bad);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(*bad == 0);
  const std::size_t in_use_before = layer.usage().in_use;

  // Capture in global mode, the strictest: any forbidden call by the layer would invalidate it.
  step_blocks captured;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  step(layer, in, out, s, &captured);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);  // fails if the capture was invalidated
  CHECK(captured.seen[2] == captured.seen[0]);  // the third temporary reused the first, inside the graph
  CHECK(layer.private_pools() == 1);
  CHECK(layer.private_pool_blocks() == 2);
  CHECK(layer.usage().in_use == in_use_before + layer.good_size(bytes) + layer.good_size(bytes / 2 * 2 + 4096));
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);

  const auto stats_before = layer.stats();
  std::size_t checked = 0, uncaptured_blocks = 0, overlapping = 0;
  std::vector<void*> scratch;
  for (std::uint32_t replay = 0; replay < 1000; ++replay) {
    const std::uint32_t seed = 100 + replay;
    strata::testing::fill(in, bytes, seed, s);
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    // Uncaptured work on the same pool while the replay runs: it must never be handed the graph's blocks
    // (the writes below would corrupt the replay's result if it were).
    for (cudaStream_t st : {other, s}) {
      void* p = layer.allocate_async(bytes, 256, st);
      ++uncaptured_blocks;
      for (void* g : captured.seen) overlapping += overlaps(p, bytes, g, bytes + 4096);
      strata::testing::fill(p, bytes, 0xdead0000u + replay, st);
      layer.deallocate_async(p, bytes, 256, st);
    }
    *bad = 0;
    check_step_kernel<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(out), words, seed, bad);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(*bad == 0);
    ++checked;
  }
  REQUIRE(cudaStreamSynchronize(other) == cudaSuccess);
  CHECK(checked == 1000);
  CHECK(uncaptured_blocks == 2000);
  CHECK(overlapping == 0);
  CHECK(layer.stats().pool_misses == stats_before.pool_misses);  // replays allocate nothing
  CHECK(layer.private_pool_blocks() == 2);
  MESSAGE(name << ": 1000 replays checked, " << uncaptured_blocks << " uncaptured blocks, none overlapping the graph's");

  // The graph alone gone: the executable graph still holds the pool.
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  layer.collect_released_pools();
  CHECK(layer.private_pools() == 1);
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(pools_collected(layer, 0));
  CHECK(layer.usage().in_use == in_use_before);
  CHECK(layer.stats().pools_released == 1);
  // The blocks are the common pool's again: the uncaptured step runs right.
  strata::testing::fill(in, bytes, 1, s);
  step(layer, in, out, s);
  *bad = 0;
  check_step_kernel<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(out), words, 1, bad);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(*bad == 0);
  layer.deallocate_async(in, bytes, 256, s);
  layer.deallocate_async(out, bytes, 256, s);
  layer.release();
  CHECK(layer.usage().in_use == 0);
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaFree(bad) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(other) == cudaSuccess);
}

} // namespace

TEST_CASE("graphs: a captured step through stream_ordered<coalescing_pool<device_source>> replays 1,000 times")
{
  chunked_layer layer{coalescing_pool<device_source>{device_source{}, {.initial_chunk = 64 << 20}}};
  capture_and_replay(layer, "stream_ordered<coalescing_pool<device_source>>");
}

TEST_CASE("graphs: a captured step through default_pool replays 1,000 times")
{
  default_pool layer = make_default_pool({.max_fraction = 0.5});
  capture_and_replay(layer, "default_pool");
}

TEST_CASE("graphs: a capture on one stream while another stream allocates and frees normally")
{
  // return_free_chunks off: handing a chunk back calls cudaFree, which synchronizes the device and so is
  // refused while any stream captures (in every capture mode); growing calls only cudaMalloc (relaxed).
  chunked_layer layer{coalescing_pool<device_source>{device_source{}, {.initial_chunk = 64 << 20, .return_free_chunks = false}}};
  cudaStream_t captured = make_stream(), worker = make_stream();
  for (cudaStream_t st : {captured, worker}) layer.deallocate_async(layer.allocate_async(bytes, 256, st), bytes, 256, st);
  unsigned long long* const bad_count = make_counter();
  REQUIRE(cudaStreamBeginCapture(captured, cudaStreamCaptureModeGlobal) == cudaSuccess);
  std::set<void*> in_graph;
  void* kept = layer.allocate_async(bytes, 256, captured);  // the graph's output, freed after it is gone
  in_graph.insert(kept);
  strata::testing::fill(kept, bytes, 5, captured);
  std::size_t worker_blocks = 0, clashes = 0;
  // Counted on the device: a host wait, cudaMallocManaged or cudaFree here would invalidate the global capture.
  unsigned long long* const worker_bad = bad_count;
  for (int i = 0; i < 200; ++i) {
    void* g = layer.allocate_async(bytes, 256, captured);
    in_graph.insert(g);
    strata::testing::fill(g, bytes, static_cast<std::uint32_t>(i), captured);
    layer.deallocate_async(g, bytes, 256, captured);
    // The worker's own blocks, different sizes so the policy grows now and then (cudaMalloc in relaxed mode).
    const std::size_t n = bytes + static_cast<std::size_t>(i % 7) * (1 << 20);
    void* w = layer.allocate_async(n, 256, worker);
    ++worker_blocks;
    for (void* p : in_graph) clashes += overlaps(w, n, p, bytes);
    strata::testing::fill(w, n, 9000u + i, worker);
    strata::testing::count_mismatches_kernel<<<256, 256, 0, worker>>>(static_cast<const std::uint32_t*>(w), n / 4, 9000u + i,
                                                                      worker_bad);
    layer.deallocate_async(w, n, 256, worker);
  }
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(captured, &graph) == cudaSuccess);  // the capture survived the worker
  REQUIRE(cudaStreamSynchronize(worker) == cudaSuccess);
  CHECK(worker_blocks == 200);
  CHECK(clashes == 0);
  CHECK(*worker_bad == 0);  // the worker's kernels really ran on its blocks, during the capture
  REQUIRE(cudaFree(bad_count) == cudaSuccess);
  CHECK(layer.private_pool_blocks() == 2);  // kept, and one block reused by every in-graph temporary
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, captured) == cudaSuccess);
  CHECK(strata::testing::mismatches(kept, bytes, 5, captured) == 0);
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  // Released, but `kept` is still live, so the pool stays: wait for the release itself (the pool count is 1
  // before it as after it; waiting on the count raced the destructor's thread under compute-sanitizer).
  CHECK(collected_until(layer, [](auto& l) { return l.stats().pools_released == 1; }));
  CHECK(layer.private_pools() == 1);
  CHECK(layer.private_pool_free_blocks() == 0);
  layer.deallocate_async(kept, bytes, 256, captured);
  CHECK(layer.private_pools() == 0);
  layer.release();
  CHECK(layer.usage().in_use == 0);
  REQUIRE(cudaStreamDestroy(captured) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(worker) == cudaSuccess);
}

TEST_CASE("graphs: the PyTorch-style API routes capturing streams to a pool, shared by two graphs, released at the end")
{
  default_pool layer = make_default_pool({.max_fraction = 0.5});
  cudaStream_t s = make_stream();
  void* in = layer.allocate_async(bytes, 256, s);
  void* out = layer.allocate_async(bytes, 256, s);
  step(layer, in, out, s);  // warm
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  const std::size_t in_use_before = layer.usage().in_use;
  // PyTorch's filter: the stream is capturing (it asks cudaStreamGetCaptureInfo, as here).
  auto capturing = [](cudaStream_t st) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(st, &status) == cudaSuccess && status == cudaStreamCaptureStatusActive;
  };
  constexpr std::uint64_t pool = 42;
  cudaGraph_t graphs[2] = {};
  cudaGraphExec_t execs[2] = {};
  step_blocks blocks[2];
  for (int g = 0; g < 2; ++g) {
    layer.begin_allocate_to_pool(pool, capturing);
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    step(layer, in, out, s, &blocks[g]);
    REQUIRE(cudaStreamEndCapture(s, &graphs[g]) == cudaSuccess);
    layer.end_allocate_to_pool(pool);
    REQUIRE(cudaGraphInstantiate(&execs[g], graphs[g], 0) == cudaSuccess);
  }
  CHECK(blocks[1].seen == blocks[0].seen);  // the second graph reused the first's blocks: one shared pool
  CHECK(layer.private_pools() == 1);
  CHECK(layer.pool_blocks(pool) == 2);
  unsigned long long* bad = make_counter();
  for (std::uint32_t r = 0; r < 100; ++r) {  // the graphs sharing the pool replay in capture order
    strata::testing::fill(in, bytes, r, s);
    REQUIRE(cudaGraphLaunch(execs[r % 2], s) == cudaSuccess);
    check_step_kernel<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(out), words, r, bad);
  }
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(*bad == 0);
  for (int g = 0; g < 2; ++g) {
    REQUIRE(cudaGraphExecDestroy(execs[g]) == cudaSuccess);
    REQUIRE(cudaGraphDestroy(graphs[g]) == cudaSuccess);
  }
  layer.release_pool(pool);
  CHECK(layer.private_pools() == 0);
  CHECK(layer.usage().in_use == in_use_before);
  layer.deallocate_async(in, bytes, 256, s);
  layer.deallocate_async(out, bytes, 256, s);
  layer.release();
  REQUIRE(cudaFree(bad) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("graphs: growing the policy under global capture")
{
  SUBCASE("coalescing_pool<device_source>: cudaMalloc in relaxed mode, the capture stays valid")
  {
    chunked_layer layer{coalescing_pool<device_source>{device_source{}, {.initial_chunk = 2 << 20, .max_chunk = 2 << 20}}};
    cudaStream_t s = make_stream();
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    void* p = layer.allocate_async(bytes * 4, 256, s);  // larger than any chunk: a new one, under capture
    strata::testing::fill(p, bytes * 4, 77, s);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    CHECK(strata::testing::mismatches(p, bytes * 4, 77, s) == 0);
    REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
    REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
    layer.deallocate_async(p, bytes * 4, 256, s);
    CHECK(pools_collected(layer, 0));
    layer.release();
    CHECK(layer.usage().in_use == 0);
    REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  }
  SUBCASE("default_pool from cold: either it grows (cuMemCreate/cuMemMap relaxed) or it refuses clearly, unchanged")
  {
    default_pool layer = make_default_pool({.max_fraction = 0.5});
    cudaStream_t s = make_stream();
    const auto before = layer.usage();
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    void* p = nullptr;
    bool refused = false;
    try {
      p = layer.allocate_async(bytes, 256, s);
      strata::testing::fill(p, bytes, 78, s);
    } catch (const usage_error& e) {
      refused = true;
      MESSAGE("default_pool refused to grow under capture: " << e.what());
      CHECK(std::string(e.what()).find("captured") != std::string::npos);
      CHECK(layer.usage().reserved == before.reserved);
      CHECK(layer.private_pools() == 0);
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(s, &graph);
    if (!refused) {
      MESSAGE("default_pool grew under global capture: the capture " << (ended == cudaSuccess ? "stayed valid" : "was invalidated"));
      REQUIRE(ended == cudaSuccess);
      cudaGraphExec_t exec = nullptr;
      REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
      REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
      CHECK(strata::testing::mismatches(p, bytes, 78, s) == 0);
      REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
      layer.deallocate_async(p, bytes, 256, s);
    }
    if (graph != nullptr) REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
    (void)cudaGetLastError();
    // A call on s: the layer asks about a stream only in calls on it, so it now sees the capture ended (else
    // host waits stay refused until the graph's user object has run, if one was attached).
    if (refused) layer.deallocate_async(layer.allocate_async(256, 256, s), 256, 256, s);
    CHECK(pools_collected(layer, 0));
    layer.release();
    CHECK(layer.usage().in_use == 0);
    REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  }
}

TEST_CASE("graphs: a stream destroyed after its capture is never asked about; host waits wait for its graph's end")
{
  chunked_layer layer{coalescing_pool<device_source>{device_source{}, {.initial_chunk = 2 << 20, .max_chunk = 2 << 20}}};
  cudaStream_t s = make_stream(), t = make_stream();
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  void* p = layer.allocate_async(bytes, 256, s);
  strata::testing::fill(p, bytes, 9, s);
  layer.deallocate_async(p, bytes, 256, s);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);  // the graph lives on
  void* q = layer.allocate_async(bytes, 256, t);
  strata::testing::check_device_round_trip(q, bytes, 10, t);
  layer.deallocate_async(q, bytes, 256, t);
  // The layer cannot know the capture ended without asking s (undefined: a crash on current drivers), so a
  // host wait is refused, nothing asked and nothing changed...
  CHECK_THROWS_WITH_AS(layer.release(), doctest::Contains("host wait"), usage_error);
  CHECK(cudaGetLastError() == cudaSuccess);
  // ... until the graph's end says so.
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(pools_collected(layer, 0));
  layer.release();
  CHECK(layer.usage().in_use == 0);
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaStreamDestroy(t) == cudaSuccess);
}
