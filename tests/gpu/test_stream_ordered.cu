// stream_ordered on real streams: a block freed on one stream while its kernel still runs must never be
// overwritten by another stream's work (race tests), same-stream reuse costs nothing upstream, a destroyed
// stream's reused handle inherits nothing, and out-of-memory with pending frees succeeds after the retry.
#include <doctest/doctest.h>

#include <thread>

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

} // namespace

TEST_SUITE("gpu")
{
TEST_CASE("stream_ordered: race tests over many sizes and stream pairs")
{
  void* out = nullptr;
  REQUIRE(cudaMalloc(&out, 16 << 20) == cudaSuccess);
  cudaStream_t streams[] = {make_stream(), make_stream(), make_stream(), cudaStreamPerThread};
  std::uint32_t seed = 100;
  SUBCASE("roomy pool: the other stream gets other memory")
  {
    layer_t layer;
    for (std::size_t bytes : race_sizes)
      for (int i = 0; i < 4; ++i) race(layer, bytes, streams[i], streams[(i + 1) % 4], out, seed += 2);
    CHECK(layer.stats().host_waits == 0);
  }
  SUBCASE("tight pool, event per free: the block is handed over behind cudaStreamWaitEvent")
  {
    for (std::size_t bytes : race_sizes)
      for (int i = 0; i < 4; ++i) {
        layer_t layer = tight_layer(bytes, 1);
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
        CHECK(race(layer, bytes, identify(streams[i]), identify(streams[(i + 1) % 4]), out, seed += 2));
        CHECK(layer.stats().handovers == 1);
      }
  }
  SUBCASE("tight pool, batched events: out of memory waits for the pending free and retries")
  {
    for (std::size_t bytes : race_sizes)
      for (int i = 0; i < 4; ++i) {
        layer_t layer = tight_layer(bytes, 64);
        CHECK(race(layer, bytes, streams[i], streams[(i + 1) % 4], out, seed += 2));
        CHECK(layer.stats().host_waits == 1);
      }
  }
  for (int i = 0; i < 3; ++i) REQUIRE(cudaStreamDestroy(streams[i]) == cudaSuccess);
  REQUIRE(cudaFree(out) == cudaSuccess);
}

TEST_CASE("stream_ordered: the handover does not block the host")
{
  cudaStream_t a = make_stream(), b = make_stream();
  layer_t layer = tight_layer(1 << 20, 1);
  void* buf = layer.allocate_async(1 << 20, 256, a);
  strata::testing::sleep_kernel<<<1, 1, 0, a>>>(long_kernel_ns * 10);
  layer.deallocate_async(buf, 1 << 20, 256, a);
  void* mine = layer.allocate_async(1 << 20, 256, b);
  CHECK(mine == buf);
  CHECK(cudaStreamQuery(a) == cudaErrorNotReady);  // a's kernel still runs: the host did not wait for it
  CHECK(cudaStreamQuery(b) == cudaErrorNotReady);  // but b waits for it on the device
  (void)cudaGetLastError();
  layer.deallocate_async(mine, 1 << 20, 256, b);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaStreamDestroy(a) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
}

TEST_CASE("stream_ordered: same-stream reuse returns the block at once, with no new upstream chunk")
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
      CHECK(p == reused);
      strata::testing::fill(p, 3 << 20, i, s);
      if (i % 2 == 0) layer.deallocate_async(p, 3 << 20, 256, fast);
      else layer.deallocate_async(p, 3 << 20, 256, s);
    }
    layer.deallocate_async(first, 3 << 20, 256, s);
    void* again = layer.allocate_async(3 << 20, 256, s);
    CHECK(again == first);
    layer.deallocate_async(again, 3 << 20, 256, s);
    CHECK(upstream.allocations() == chunks);
    CHECK(layer.stats().hits == 1001);
    CHECK(layer.pending_events() == 0);  // a stream reusing its own blocks records no events
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
  cudaStream_t a = make_stream(), b = make_stream();
  {
    using spied_pool = coalescing_pool<ref<spy<device_source>>>;
    stream_ordered<spied_pool> layer{spied_pool{ref(upstream), {.initial_chunk = 8 << 20, .max_chunk = 8 << 20, .max_reserved = 8 << 20}}};
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
