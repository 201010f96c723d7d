// stream_ordered's common path on the real driver: on an identified stream an allocate/free pair makes no id
// query, and without check_capture (captures announced) no capture query either; with check_capture every
// call asks the capture query; a plain handle adds an id query an allocation (the lone owner's frees need
// none). Captures are still found (announced, or by the query) and served from private pools, or refused,
// with the capture left valid. The backend below counts the
// layer's queries and passes them to cuda_events.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <thread>

#include <strata/default_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "kernels.cuh"

using namespace strata;

namespace {

/// cuda_events, counting the stream queries stream_ordered makes through it.
struct counted_events : cuda_events {
  struct counts {
    std::uint64_t ids = 0, captures = 0, capture_infos = 0;
  };
  std::shared_ptr<counts> n = std::make_shared<counts>();

  std::uint64_t id_of(cuda::stream_ref s) const
  {
    ++n->ids;
    return cuda_events::id_of(s);
  }
  bool capturing(cuda::stream_ref s) const
  {
    ++n->captures;
    return cuda_events::capturing(s);
  }
  capture_info capture_of(cuda::stream_ref s) const
  {
    ++n->capture_infos;
    return cuda_events::capture_of(s);
  }
};
static_assert(graph_backend<counted_events> && permanent_stream_backend<counted_events>);

using pool = coalescing_pool<device_source>;
using layer_t = stream_ordered<pool, counted_events>;
using mapped_layer_t = stream_ordered<mapped_pool<driver_pages>, counted_events>;

cudaStream_t make_stream()
{
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  return s;
}

layer_t make_layer(layer_t::options opts = {}) { return layer_t{pool{device_source{}, {}}, opts, counted_events{}}; }

mapped_layer_t make_mapped_layer(mapped_layer_t::options opts = {})
{
  int device = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  return mapped_layer_t{mapped_pool<driver_pages>{driver_pages{device}, {}}, opts, counted_events{}};
}

/// `pairs` allocate/free pairs of 256 B to 1 MiB on `s`.
template <class Layer, class Stream>
void pairs_on(Layer& layer, const Stream& s, int pairs)
{
  for (int i = 0; i < pairs; ++i) {
    const std::size_t bytes = std::size_t{256} << (i % 13);
    void* p = layer.allocate_async(bytes, 256, s);
    REQUIRE(p != nullptr);
    layer.deallocate_async(p, bytes, 256, s);
  }
}

/// An identified stream asks no id, and without check_capture nothing at all; a plain handle asks the id
/// (the allocations': the lone owner's frees need none); with check_capture every call asks the capture query.
template <class Layer>
void queries_per_call(Layer layer, bool check_capture)
{
  const std::uint64_t check = check_capture ? 1 : 0;
  cudaStream_t s = make_stream();
  const identified_stream fast = identify(s);
  pairs_on(layer, fast, 100);  // warm: the policy's chunks or mappings are in place
  const auto before = *layer.backend().n;
  pairs_on(layer, fast, 20000);
  CHECK(layer.backend().n->ids == before.ids);
  CHECK(layer.backend().n->captures == before.captures + check * 40000);
  CHECK(layer.backend().n->capture_infos == before.capture_infos);
  CHECK(layer.owner() == fast.id());

  const auto plain_before = *layer.backend().n;
  pairs_on(layer, cuda::stream_ref{s}, 20000);
  CHECK(layer.backend().n->ids == plain_before.ids + 40000);  // every call asks: a handle names whichever stream has it
  CHECK(layer.backend().n->captures == plain_before.captures + check * 40000);

  // The blocks are good memory, used by kernels on the stream.
  void* p = layer.allocate_async(1 << 20, 256, fast);
  strata::testing::check_device_round_trip(p, 1 << 20, 11, s);
  layer.deallocate_async(p, 1 << 20, 256, fast);
  layer.release();
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

} // namespace

TEST_SUITE("gpu")
{
TEST_CASE("stream hot path: without check_capture, no stream query on an identified stream and an id on a plain handle (coalescing_pool)")
{
  queries_per_call(make_layer({.check_capture = false}), false);
}

TEST_CASE("stream hot path: without check_capture, no stream query on an identified stream and an id on a plain handle (mapped_pool)")
{
  queries_per_call(make_mapped_layer({.check_capture = false}), false);
}

TEST_CASE("stream hot path: with check_capture, a capture query a call on identified streams and plain handles alike")
{
  queries_per_call(make_layer(), true);
}

TEST_CASE("stream hot path: asking a capturing stream's id invalidates the capture, so the capture query comes first")
{
  cudaStream_t s = make_stream();
  for (const auto mode : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeRelaxed}) {
    REQUIRE(cudaStreamBeginCapture(s, mode) == cudaSuccess);
    CHECK(cuda_events{}.capturing(s));
    CHECK_THROWS_AS((void)cuda_events{}.id_of(s), cuda_error);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    (void)cudaGetLastError();
    if (graph != nullptr) REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  }
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("stream hot path: an unannounced capture on a plain handle is found and served from a private pool")
{
  layer_t layer = make_layer();
  cudaStream_t s = make_stream(), other = make_stream();
  pairs_on(layer, cuda::stream_ref{s}, 13);
  pairs_on(layer, cuda::stream_ref{other}, 13);
  constexpr std::size_t bytes = 1 << 20;
  void* out = nullptr;
  REQUIRE(cudaMalloc(&out, bytes) == cudaSuccess);

  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  void* tmp = layer.allocate_async(bytes, 256, s);  // the capture query finds the capture; its id is never asked
  strata::testing::fill_kernel<<<64, 256, 0, s>>>(static_cast<std::uint32_t*>(tmp), bytes / 4, 21);
  REQUIRE(cudaMemcpyAsync(out, tmp, bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess);
  layer.deallocate_async(tmp, bytes, 256, s);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);  // nothing the layer did invalidated it
  CHECK(layer.private_pools() == 1);
  CHECK(layer.private_pool_blocks() == 1);

  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  for (int replay = 0; replay < 10; ++replay) {
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    void* mine = layer.allocate_async(bytes, 256, other);  // uncaptured work never gets the graph's block
    CHECK(mine != tmp);
    strata::testing::fill(mine, bytes, 99, other);
    layer.deallocate_async(mine, bytes, 256, other);
  }
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(other) == cudaSuccess);
  CHECK(strata::testing::mismatches(out, bytes, 21) == 0);

  // A call on s sees the capture over: an identified stream asks check_capture's query alone again.
  pairs_on(layer, cuda::stream_ref{s}, 1);
  const auto before = *layer.backend().n;
  pairs_on(layer, identify(s), 100);
  CHECK(layer.backend().n->captures == before.captures + 200);
  CHECK(layer.backend().n->ids == before.ids);
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  layer.release();
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaFree(out) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(other) == cudaSuccess);
}

TEST_CASE("stream hot path: an announced capture on an identified stream is routed to its pool")
{
  layer_t layer = make_layer({.check_capture = false});
  cudaStream_t s = make_stream();
  const identified_stream fast = identify(s);
  pairs_on(layer, fast, 13);
  constexpr std::size_t bytes = 1 << 20;
  void* out = nullptr;
  REQUIRE(cudaMalloc(&out, bytes) == cudaSuccess);

  layer.begin_allocate_to_pool(5);  // PyTorch's capture_begin
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  const auto before = *layer.backend().n;
  void* tmp = layer.allocate_async(bytes, 256, fast);
  CHECK(layer.backend().n->ids == before.ids);  // never the id of the capturing stream
  CHECK(layer.backend().n->captures > before.captures);  // announced: asked
  strata::testing::fill_kernel<<<64, 256, 0, s>>>(static_cast<std::uint32_t*>(tmp), bytes / 4, 31);
  REQUIRE(cudaMemcpyAsync(out, tmp, bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess);
  layer.deallocate_async(tmp, bytes, 256, fast);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  layer.end_allocate_to_pool(5);
  CHECK(layer.pool_blocks(5) == 1);

  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  const auto after = *layer.backend().n;
  void* mine = layer.allocate_async(bytes, 256, fast);  // the route over: nothing asked, never the pool's block
  CHECK(mine != tmp);
  CHECK(layer.backend().n->ids == after.ids);
  CHECK(layer.backend().n->captures == after.captures);
  layer.deallocate_async(mine, bytes, 256, fast);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(strata::testing::mismatches(out, bytes, 31) == 0);
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  layer.release_pool(5);
  layer.release();
  CHECK(layer.usage().in_use == 0);
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaFree(out) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("stream hot path: with private pools off, a capture is refused and stays valid; identified calls refuse too")
{
  layer_t layer = make_layer({.graph_pools = false});
  cudaStream_t s = make_stream();
  const identified_stream fast = identify(s);
  pairs_on(layer, fast, 13);
  void* live = layer.allocate_async(4096, 256, fast);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK_THROWS_WITH_AS(layer.allocate_async(4096, 256, s), doctest::Contains("captured into a CUDA graph"), usage_error);
  CHECK_THROWS_AS(layer.allocate_async(4096, 256, fast), usage_error);  // the capture is known now
  CHECK_THROWS_AS(layer.allocate(4096), usage_error);
  layer.deallocate_async(live, 4096, 256, fast);  // under capture: abandoned, never reused
  CHECK(layer.stats().abandoned_blocks == 1);
  strata::testing::sleep_kernel<<<1, 1, 0, s>>>(1000);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  pairs_on(layer, fast, 13);  // sees the capture over
  void* after = layer.allocate_async(4 << 20, 256, fast);
  strata::testing::check_device_round_trip(after, 4 << 20, 6, s);
  layer.deallocate_async(after, 4 << 20, 256, fast);
  layer.release();
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("stream hot path: a new identified stream on a destroyed stream's handle never races its blocks")
{
  layer_t layer = make_layer();
  cudaStream_t owner = make_stream();
  pairs_on(layer, identify(owner), 13);
  constexpr std::size_t bytes = 1 << 20;
  void* out = nullptr;
  REQUIRE(cudaMalloc(&out, bytes) == cudaSuccess);
  int reused = 0;
  for (int round = 0; round < 8; ++round) {
    cudaStream_t old_stream = make_stream();
    const identified_stream old = identify(old_stream);
    void* x = layer.allocate_async(bytes, 256, old);
    strata::testing::fill(x, bytes, 40 + round, old_stream);
    strata::testing::sleep_kernel<<<1, 1, 0, old_stream>>>(2'000'000);
    REQUIRE(cudaMemcpyAsync(out, x, bytes, cudaMemcpyDeviceToDevice, old_stream) == cudaSuccess);
    layer.deallocate_async(x, bytes, 256, old);
    REQUIRE(cudaStreamDestroy(old_stream) == cudaSuccess);  // its work still runs
    cudaStream_t next = make_stream();
    reused += next == old_stream;
    const identified_stream fresh = identify(next);
    CHECK(fresh.id() != old.id());
    void* y = layer.allocate_async(bytes, 256, fresh);
    strata::testing::fill(y, bytes, 0xbad, next);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(strata::testing::mismatches(out, bytes, 40 + round) == 0);  // the old stream's copy saw its own data
    layer.deallocate_async(y, bytes, 256, fresh);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaStreamDestroy(next) == cudaSuccess);
  }
  MESSAGE(reused << " of 8 new streams got the destroyed stream's handle");
  layer.release();
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaFree(out) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(owner) == cudaSuccess);
}

TEST_CASE("stream hot path: a lone owner's handle reused by a new stream: its free is the new stream's")
{
  constexpr std::size_t bytes = 1 << 20;
  void* out = nullptr;
  REQUIRE(cudaMalloc(&out, bytes) == cudaSuccess);
  cudaEvent_t done = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess);
  int reused = 0;
  for (int round = 0; round < 8 && reused == 0; ++round) {  // until the driver hands the handle over
    layer_t layer = make_layer();
    cudaStream_t s = make_stream();
    pairs_on(layer, cuda::stream_ref{s}, 13);  // s owns the policy, alone
    void* x = layer.allocate_async(bytes, 256, s);
    strata::testing::fill(x, bytes, 51 + round, s);
    strata::testing::sleep_kernel<<<1, 1, 0, s>>>(2'000'000);
    REQUIRE(cudaMemcpyAsync(out, x, bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess);
    REQUIRE(cudaEventRecord(done, s) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(s) == cudaSuccess);  // its work still runs
    cudaStream_t t = make_stream();
    reused += t == s;
    REQUIRE(cudaStreamWaitEvent(t, done, 0) == cudaSuccess);  // the user orders t after s's use of x...
    const auto before = *layer.backend().n;
    layer.deallocate_async(x, bytes, 256, t);  // ...and frees it on t
    const auto syncs = layer.stats().device_syncs;
    void* y = layer.allocate_async(bytes, 256, t);
    if (t == s) {
      CHECK(layer.backend().n->ids == before.ids + 2);  // the free asks too: the handle names whichever stream has it
      CHECK(layer.stats().device_syncs == syncs);       // t's own free, reused on t in its order: nothing to wait for
      CHECK(layer.owner() != std::optional<std::uint64_t>(layer.stream_id(cuda::stream_ref{t})));
    }
    strata::testing::fill(y, bytes, 0xbad, t);
    REQUIRE(cudaStreamSynchronize(t) == cudaSuccess);
    CHECK(strata::testing::mismatches(out, bytes, 51 + round) == 0);
    layer.deallocate_async(y, bytes, 256, t);
    layer.release();
    REQUIRE(cudaStreamDestroy(t) == cudaSuccess);
  }
  MESSAGE("the destroyed owner's handle came back " << reused << " time(s)");
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaEventDestroy(done) == cudaSuccess);
  REQUIRE(cudaFree(out) == cudaSuccess);
}
}

TEST_CASE("stream hot path: the legacy stream's remembered id is the driver's, on every thread and after a device switch")
{
  const cuda::stream_ref legacy{cudaStreamLegacy};
  const std::uint64_t driver = identify(legacy).id();
  for (int i = 0; i < 3; ++i) CHECK(cuda_events{}.id_of(legacy) == driver);
  CHECK(cuda_events{}.id_of(cuda::stream_ref{cudaStream_t{}}) == driver);  // handle 0 names it in this compilation mode
  std::uint64_t on_thread = 0, fresh_thread_driver = 1;
  std::thread([&] {
    on_thread = cuda_events{}.id_of(legacy);  // no context current yet on this thread: asked, which binds one
    fresh_thread_driver = identify(legacy).id();
  }).join();
  CHECK(on_thread == fresh_thread_driver);
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices > 1) {
    int current = 0;
    REQUIRE(cudaGetDevice(&current) == cudaSuccess);
    REQUIRE(cudaSetDevice(current == 0 ? 1 : 0) == cudaSuccess);
    const std::uint64_t other = cuda_events{}.id_of(legacy);
    CHECK(other == identify(legacy).id());
    CHECK(other != driver);  // another context's legacy stream
    REQUIRE(cudaSetDevice(current) == cudaSuccess);
    CHECK(cuda_events{}.id_of(legacy) == driver);
  }
}
