// stream_ordered on real streams: a block freed on one stream while its kernel still runs must never be
// overwritten by another stream's work (race tests), whether the freeing stream owns the policy (the other
// stream is ordered after it) or caches the block (handover, out-of-memory retry); same-stream reuse costs
// nothing upstream; a destroyed stream's reused handle inherits nothing; a synchronous free is safe after work
// on a non-blocking stream; graph capture is refused and leaves the layer healthy.
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "../support/conformance.hpp"
#include "../support/spy.hpp"
#include "kernels.cuh"

using namespace strata;
using strata::testing::spy;

namespace {

using pool = coalescing_pool<device_source>;
using layer_t = stream_ordered<pool>;

constexpr unsigned long long long_kernel_ns = 2'000'000;  // 2 ms: far longer than any host-side allocate

cudaStream_t make_stream()
{
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  return s;
}

/// A pool with room for exactly one block of `bytes`: another stream can only get memory by reusing it.
layer_t tight_layer(std::size_t bytes, std::size_t frees_per_event)
{
  return layer_t{pool{device_source{}, {.initial_chunk = bytes, .max_chunk = bytes, .max_reserved = bytes}},
                 {.frees_per_event = frees_per_event, .bytes_per_event = SIZE_MAX}};
}

/// Stream a writes a pattern, sleeps, copies the buffer to `out`, and frees it; stream b at once allocates
/// the same size and writes its own pattern. If b got the block before a's copy ran, `out` is corrupted.
/// Returns whether b got the very same block.
template <class Stream>
bool race(layer_t& layer, std::size_t bytes, Stream a, Stream b, void* out, std::uint32_t seed)
{
  layer.share(cuda::stream_ref(a));
  layer.share(cuda::stream_ref(b));  // b is known before a frees: a's frees carry events b can wait on
  void* buf = layer.allocate_async(bytes, 256, a);
  const cudaStream_t sa = cuda::stream_ref(a).get(), sb = cuda::stream_ref(b).get();
  strata::testing::fill(buf, bytes, seed, sa);
  strata::testing::sleep_kernel<<<1, 1, 0, sa>>>(long_kernel_ns);
  REQUIRE(cudaMemcpyAsync(out, buf, bytes, cudaMemcpyDeviceToDevice, sa) == cudaSuccess);
  layer.deallocate_async(buf, bytes, 256, a);

  void* mine = layer.allocate_async(bytes, 256, b);
  strata::testing::fill(mine, bytes, seed + 1, sb);
  REQUIRE(cudaStreamSynchronize(sb) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(sa) == cudaSuccess);
  CHECK(strata::testing::mismatches(out, bytes, seed) == 0);
  CHECK(strata::testing::mismatches(mine, bytes, seed + 1) == 0);
  layer.deallocate_async(mine, bytes, 256, b);
  REQUIRE(cudaStreamSynchronize(sb) == cudaSuccess);
  return mine == buf;
}

constexpr std::size_t race_sizes[] = {256, 4096, 1 << 20, 16 << 20};

/// Makes `owner` the stream whose frees go straight to the policy, so that the streams a test races free
/// into their own caches (the handover and out-of-memory paths).
void claim(layer_t& layer, cudaStream_t owner)
{
  layer.deallocate_async(layer.allocate_async(256, 256, owner), 256, 256, owner);
  REQUIRE(cudaStreamSynchronize(owner) == cudaSuccess);
}

} // namespace

TEST_SUITE("gpu")
{
TEST_CASE("stream_ordered: race tests over many sizes and stream pairs")
{
  void* out = nullptr;
  REQUIRE(cudaMalloc(&out, 16 << 20) == cudaSuccess);
  cudaStream_t streams[] = {make_stream(), make_stream(), make_stream(), cudaStreamPerThread};
  const cudaStream_t owner = make_stream();
  std::uint32_t seed = 100;
  SUBCASE("roomy pool: the other stream gets other memory, or the same behind a wait")
  {
    layer_t layer;
    for (std::size_t bytes : race_sizes)
      for (int i = 0; i < 4; ++i) race(layer, bytes, streams[i], streams[(i + 1) % 4], out, seed += 2);
    CHECK(layer.stats().host_waits == 0);
  }
  SUBCASE("tight pool, the freeing stream owns the policy: the other stream is ordered after its free")
  {
    for (std::size_t bytes : race_sizes)
      for (int i = 0; i < 4; ++i) {
        layer_t layer = tight_layer(bytes, 1);
        CHECK(race(layer, bytes, streams[i], streams[(i + 1) % 4], out, seed += 2));
        CHECK(layer.stats().orderings == 1);
        CHECK(layer.stats().host_waits == 0);
      }
  }
  SUBCASE("tight pool, event per free, another stream owns the policy: the block is handed over behind cudaStreamWaitEvent")
  {
    for (std::size_t bytes : race_sizes)
      for (int i = 0; i < 4; ++i) {
        layer_t layer = tight_layer(bytes, 1);
        layer.share(streams[i]);
        layer.share(streams[(i + 1) % 4]);
        claim(layer, owner);
        CHECK(race(layer, bytes, streams[i], streams[(i + 1) % 4], out, seed += 2));
        CHECK(layer.stats().handovers == 1);
        CHECK(layer.stats().host_waits == 0);
      }
  }
  SUBCASE("tight pool, identified streams (no id lookup per call): the same handover")
  {
    for (std::size_t bytes : race_sizes)
      for (int i = 0; i < 4; ++i) {
        layer_t layer = tight_layer(bytes, 1);
        layer.share(streams[i]);
        layer.share(streams[(i + 1) % 4]);
        claim(layer, owner);
        CHECK(race(layer, bytes, identify(streams[i]), identify(streams[(i + 1) % 4]), out, seed += 2));
        CHECK(layer.stats().handovers == 1);
      }
  }
  SUBCASE("tight pool, batched events: out of memory waits for the pending free and retries")
  {
    for (std::size_t bytes : race_sizes)
      for (int i = 0; i < 4; ++i) {
        layer_t layer = tight_layer(bytes, 64);
        layer.share(streams[i]);
        layer.share(streams[(i + 1) % 4]);
        claim(layer, owner);
        CHECK(race(layer, bytes, streams[i], streams[(i + 1) % 4], out, seed += 2));
        CHECK(layer.stats().host_waits == 1);
        CHECK(layer.stats().device_syncs == 1);
      }
  }
  for (int i = 0; i < 3; ++i) REQUIRE(cudaStreamDestroy(streams[i]) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(owner) == cudaSuccess);
  REQUIRE(cudaFree(out) == cudaSuccess);
}

TEST_CASE("stream_ordered: the handover does not block the host")
{
  cudaStream_t a = make_stream(), b = make_stream();
  layer_t layer = tight_layer(1 << 20, 1);
  layer.share(a);
  layer.share(b);
  void* buf = layer.allocate_async(1 << 20, 256, a);
  strata::testing::sleep_kernel<<<1, 1, 0, a>>>(long_kernel_ns * 10);
  layer.deallocate_async(buf, 1 << 20, 256, a);
  void* mine = layer.allocate_async(1 << 20, 256, b);
  CHECK(mine == buf);
  CHECK(layer.stats().orderings == 1);  // a owns the policy: b waits for a's event
  CHECK(cudaStreamQuery(a) == cudaErrorNotReady);  // a's kernel still runs: the host did not wait for it
  CHECK(cudaStreamQuery(b) == cudaErrorNotReady);  // but b waits for it on the device
  (void)cudaGetLastError();
  layer.deallocate_async(mine, 1 << 20, 256, b);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaStreamDestroy(a) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
}

TEST_CASE("stream_ordered: same-stream reuse is immediate, with no new upstream chunk, no event and no wait")
{
  spy<device_source> upstream;
  cudaStream_t s = make_stream();
  {
    stream_ordered<coalescing_pool<ref<spy<device_source>>>> layer{coalescing_pool<ref<spy<device_source>>>{ref(upstream)}};
    const identified_stream fast = identify(s);
    void* first = layer.allocate_async(3 << 20, 256, s);
    void* reused = layer.allocate_async(3 << 20, 256, s);
    layer.deallocate_async(reused, 3 << 20, 256, s);
    const std::size_t chunks = upstream.allocations();
    for (int i = 0; i < 1000; ++i) {
      void* p = i % 2 == 0 ? layer.allocate_async(3 << 20, 256, s) : layer.allocate_async(3 << 20, 256, fast);
      strata::testing::fill(p, 3 << 20, i, s);
      if (i % 2 == 0) layer.deallocate_async(p, 3 << 20, 256, fast);
      else layer.deallocate_async(p, 3 << 20, 256, s);
    }
    layer.deallocate_async(first, 3 << 20, 256, s);
    void* again = layer.allocate_async(3 << 20, 256, s);
    layer.deallocate_async(again, 3 << 20, 256, s);
    CHECK(upstream.allocations() == chunks);
    CHECK(layer.owner() == identify(s).id());
    CHECK(layer.stats().events == 0);  // a stream reusing its own blocks records no events
    CHECK(layer.stats().host_waits == 0);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  }
  CHECK(upstream.outstanding_bytes() == 0);
  CHECK(upstream.mismatches() == 0);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("stream_ordered: destroying a stream with cached blocks, then reusing its handle, is safe")
{
  void* out = nullptr;
  REQUIRE(cudaMalloc(&out, 1 << 20) == cudaSuccess);
  for (std::size_t frees_per_event : {std::size_t{1}, std::size_t{64}}) {
    layer_t layer = tight_layer(1 << 20, frees_per_event);
    cudaStream_t a = make_stream();
    void* buf = layer.allocate_async(1 << 20, 256, a);
    strata::testing::fill(buf, 1 << 20, 77, a);
    strata::testing::sleep_kernel<<<1, 1, 0, a>>>(long_kernel_ns);
    REQUIRE(cudaMemcpyAsync(out, buf, 1 << 20, cudaMemcpyDeviceToDevice, a) == cudaSuccess);
    layer.deallocate_async(buf, 1 << 20, 256, a);
    REQUIRE(cudaStreamDestroy(a) == cudaSuccess);
    cudaStream_t c = make_stream();
    MESSAGE("handle reused: " << (c == a));
    void* mine = layer.allocate_async(1 << 20, 256, c);
    strata::testing::fill(mine, 1 << 20, 78, c);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(strata::testing::mismatches(out, 1 << 20, 77) == 0);
    layer.deallocate_async(mine, 1 << 20, 256, c);
    REQUIRE(cudaStreamSynchronize(c) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(c) == cudaSuccess);
  }
  REQUIRE(cudaFree(out) == cudaSuccess);
}

TEST_CASE("stream_ordered: out of memory with pending frees on another stream succeeds after the retry")
{
  spy<device_source> upstream;
  cudaStream_t a = make_stream(), b = make_stream(), owner = make_stream();
  {
    using spied_pool = coalescing_pool<ref<spy<device_source>>>;
    stream_ordered<spied_pool> layer{spied_pool{ref(upstream), {.initial_chunk = 8 << 20, .max_chunk = 8 << 20, .max_reserved = 8 << 20}}};
    layer.share(a);
    layer.share(b);
    layer.deallocate_async(layer.allocate_async(256, 256, owner), 256, 256, owner);  // a caches its frees
    REQUIRE(cudaStreamSynchronize(owner) == cudaSuccess);
    std::vector<void*> blocks;
    for (int i = 0; i < 8; ++i) blocks.push_back(layer.allocate_async(1 << 20, 256, a));
    strata::testing::sleep_kernel<<<1, 1, 0, a>>>(long_kernel_ns);
    for (void* p : blocks) layer.deallocate_async(p, 1 << 20, 256, a);
    void* big = layer.allocate_async(6 << 20, 256, b);  // another shape: needs the freed blocks merged
    CHECK(big != nullptr);
    CHECK(layer.stats().host_waits == 1);
    CHECK(cudaStreamQuery(a) == cudaSuccess);  // the retry waited for a's work before reusing its blocks
    strata::testing::check_device_round_trip(big, 6 << 20, 5, b);
    CHECK_THROWS_AS(layer.allocate_async(4 << 20, 256, b), out_of_memory);
    layer.deallocate_async(big, 6 << 20, 256, b);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  CHECK(upstream.outstanding_bytes() == 0);
  REQUIRE(cudaStreamDestroy(a) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(owner) == cudaSuccess);
}

/// Eight 1 MiB blocks taken on `owner`; block `marked` is filled with `pattern` and, behind a long kernel,
/// copied to `out`; then all eight are freed on `owner` while that work still runs.
void free_while_busy(layer_t& layer, cudaStream_t owner, void* out, int marked, std::uint32_t pattern)
{
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(layer.allocate_async(1 << 20, 256, owner));
  strata::testing::fill(blocks[marked], 1 << 20, pattern, owner);
  strata::testing::sleep_kernel<<<1, 1, 0, owner>>>(long_kernel_ns);
  REQUIRE(cudaMemcpyAsync(out, blocks[marked], 1 << 20, cudaMemcpyDeviceToDevice, owner) == cudaSuccess);
  for (void* p : blocks) layer.deallocate_async(p, 1 << 20, 256, owner);
}

TEST_CASE("stream_ordered: the owner's frees merge at once; another stream takes them behind a GPU-side wait")
{
  cudaStream_t a = make_stream(), b = make_stream();
  layer_t layer = tight_layer(8 << 20, 8);
  layer.share(b);  // known before a frees
  void* out = nullptr;
  REQUIRE(cudaMalloc(&out, 1 << 20) == cudaSuccess);
  free_while_busy(layer, a, out, 3, 31);
  void* big = layer.allocate_async(8 << 20, 256, b);  // only the merged chunk fits: no host wait needed
  CHECK(layer.stats().host_waits == 0);
  CHECK(layer.stats().orderings == 1);
  CHECK(cudaStreamQuery(a) == cudaErrorNotReady);
  (void)cudaGetLastError();
  strata::testing::fill(big, 8 << 20, 32, b);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(strata::testing::mismatches(out, 1 << 20, 31) == 0);  // a's copy ran before b overwrote the block
  layer.deallocate_async(big, 8 << 20, 256, b);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaFree(out) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(a) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
}

TEST_CASE("stream_ordered: a legacy-stream owner's frees carry no event; another stream records one when it takes them")
{
  const cudaStream_t legacy = cudaStreamLegacy, b = make_stream();
  layer_t layer = tight_layer(8 << 20, 8);
  layer.share(b);  // known before the owner frees: a created owner would now record an event per free
  void* out = nullptr;
  REQUIRE(cudaMalloc(&out, 1 << 20) == cudaSuccess);
  free_while_busy(layer, legacy, out, 5, 41);
  CHECK(layer.owner() == identify(legacy).id());
  CHECK(layer.stats().events == 0);
  void* big = layer.allocate_async(8 << 20, 256, b);  // the merged chunk, behind one event recorded now
  CHECK(layer.stats().events == 1);
  CHECK(layer.stats().orderings == 1);
  CHECK(layer.stats().host_waits == 0);
  CHECK(cudaStreamQuery(legacy) == cudaErrorNotReady);  // the host did not wait for the owner's kernel
  (void)cudaGetLastError();
  strata::testing::fill(big, 8 << 20, 42, b);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(strata::testing::mismatches(out, 1 << 20, 41) == 0);  // the owner's copy ran before b overwrote the block
  CHECK(strata::testing::mismatches(big, 8 << 20, 42) == 0);
  layer.deallocate_async(big, 8 << 20, 256, b);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaFree(out) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
}

TEST_CASE("stream_ordered: a synchronous free after work on a non-blocking stream is safe, as cudaFree is")
{
  void* out = nullptr;
  REQUIRE(cudaMalloc(&out, 1 << 20) == cudaSuccess);
  cudaStream_t n = make_stream(), other = make_stream();
  for (const bool tight : {false, true}) {
    CAPTURE(tight);
    layer_t layer = tight ? tight_layer(1 << 20, 8) : layer_t{};
    void* p = layer.allocate(1 << 20);
    strata::testing::fill(p, 1 << 20, 41, n);
    strata::testing::sleep_kernel<<<1, 1, 0, n>>>(long_kernel_ns * 5);
    REQUIRE(cudaMemcpyAsync(out, p, 1 << 20, cudaMemcpyDeviceToDevice, n) == cudaSuccess);
    layer.deallocate(p, 1 << 20);  // code written for cudaFree: no stream named
    // The next synchronous allocate and the next ones on the legacy and another stream write at once.
    void* q = layer.allocate(1 << 20);
    if (tight) {
      CHECK(q == p);  // only after a device-wide wait: n's kernel is done
      CHECK(cudaStreamQuery(n) == cudaSuccess);
      CHECK(layer.stats().device_syncs >= 1);
    }
    strata::testing::fill(q, 1 << 20, 42, cudaStreamLegacy);
    void* r = tight ? nullptr : layer.allocate_async(1 << 20, 256, cuda::stream_ref{cudaStreamLegacy});
    void* t = tight ? nullptr : layer.allocate_async(1 << 20, 256, other);
    if (!tight) {
      // p comes back only behind a device-wide wait (when the pool would otherwise have grown).
      const bool waited = layer.stats().device_syncs > 0;
      CHECK((waited || (q != p && r != p && t != p)));
      CHECK(layer.set_aside_blocks() == (waited ? 0u : 1u));
      strata::testing::fill(r, 1 << 20, 43, cudaStreamLegacy);
      strata::testing::fill(t, 1 << 20, 44, other);
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(strata::testing::mismatches(out, 1 << 20, 41) == 0);
    layer.deallocate(q, 1 << 20);
    if (!tight) {
      layer.deallocate_async(r, 1 << 20, 256, cuda::stream_ref{cudaStreamLegacy});
      layer.deallocate_async(t, 1 << 20, 256, other);
    }
    layer.release();
    CHECK(layer.set_aside_blocks() == 0);
    CHECK(layer.stats().host_waits == layer.stats().event_syncs + layer.stats().stream_syncs + layer.stats().device_syncs);
  }
  REQUIRE(cudaFree(out) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(n) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(other) == cudaSuccess);
}

TEST_CASE("stream_ordered: graph capture is refused clearly; the capture and the layer stay healthy")
{
  cudaStream_t s = make_stream(), owner = make_stream();
  layer_t layer{pool{}, {.graph_pools = false}};  // with private pools (the default) capture is served: test_graphs.cu
  claim(layer, owner);
  void* before = layer.allocate_async(1 << 20, 256, s);  // live across the capture
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  strata::testing::fill_kernel<<<64, 256, 0, s>>>(static_cast<std::uint32_t*>(before), (1 << 20) / 4, 5);
  CHECK_THROWS_WITH_AS(layer.allocate_async(4 << 20, 256, s), doctest::Contains("captured into a CUDA graph"), usage_error);
  CHECK_THROWS_AS(layer.allocate(4 << 20), usage_error);  // would need a host wait: refused, not attempted
  CHECK_THROWS_AS(layer.release(), usage_error);
  const auto events = layer.stats().events;
  layer.deallocate_async(before, 1 << 20, 256, s);  // inside the capture: abandoned, no event recorded
  CHECK(layer.stats().abandoned_blocks == 1);
  CHECK(layer.stats().events == events);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);  // the capture was not invalidated
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  // The layer is usable on that stream afterwards.
  void* after = layer.allocate_async(4 << 20, 256, s);
  strata::testing::check_device_round_trip(after, 4 << 20, 6, s);
  layer.deallocate_async(after, 4 << 20, 256, s);
  layer.release();
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(owner) == cudaSuccess);
}

TEST_CASE("stream_ordered: the device-wide wait covers every device the layer's streams ran on")
{
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices < 2) {
    MESSAGE("one device: nothing to check");
    return;
  }
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  cudaStream_t on_one = make_stream();
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  // Device 0 memory; a stream of device 1 uses some of it (events are per device: the owner is on device 0).
  cudaStream_t owner = make_stream();
  stream_ordered<pool> layer{pool{}, {.sync_frees_per_wait = 1}};
  claim(layer, owner);
  void* used_there = layer.allocate_async(4096, 256, on_one);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  strata::testing::sleep_kernel<<<1, 1, 0, on_one>>>(long_kernel_ns * 5);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  layer.deallocate_async(used_there, 4096, 256, on_one);  // cached on device 1's stream, no event yet
  void* p = layer.allocate(4096);
  layer.deallocate(p, 4096);  // a batch of one: the wait returns everything, so it must cover device 1
  CHECK(layer.stats().device_syncs >= 2);
  CHECK(cudaStreamQuery(on_one) == cudaSuccess);
  int current = -1;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  CHECK(current == 0);  // the caller's device is restored
  CHECK(layer.cached_blocks() == 0);
  REQUIRE(cudaStreamDestroy(on_one) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(owner) == cudaSuccess);
}

TEST_CASE("stream_ordered over device memory conforms, synchronous and stream-ordered")
{
  stream_ordered<size_class_pool<device_source>> layer;
  testing::check_conformance(layer, {.max_alignment = 1 << 16, .rejects_above = 0, .device_accessible = true});
  testing::run_random_workload(layer, {.operations = 50'000, .max_live = 500, .max_bytes = 4 << 20, .max_alignment = 1 << 12});
  cudaStream_t s = make_stream();
  void* p = layer.allocate_async(1 << 20, 256, s);
  strata::testing::check_device_round_trip(p, 1 << 20, 9, s);
  layer.deallocate_async(p, 1 << 20, 256, s);
  layer.release();
  CHECK(layer.cached_blocks() == 0);
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}
}

TEST_SUITE("gpu")
{
TEST_CASE("identify: the driver's stream ids are the runtime's, for every kind of stream and on a new thread")
{
  cudaStream_t s = make_stream();
  auto runtime_id = [](cudaStream_t h) {
    unsigned long long id = 0;
    REQUIRE(cudaStreamGetId(h, &id) == cudaSuccess);
    return id;
  };
  for (cudaStream_t h : {s, cudaStreamLegacy, cudaStreamPerThread, cudaStream_t{}}) CHECK(identify(h).id() == runtime_id(h));
  CHECK(identify(cudaStreamLegacy).id() != identify(s).id());
  unsigned long long from_thread = 0, per_thread_there = 0;
  std::thread([&] {
    from_thread = identify(s).id();  // no runtime call on this thread yet: the driver may refuse, the runtime answers
    per_thread_there = identify(cudaStreamPerThread).id();
  }).join();
  CHECK(from_thread == runtime_id(s));
  CHECK(per_thread_there != identify(cudaStreamPerThread).id());  // each thread has its own per-thread stream
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}
}
