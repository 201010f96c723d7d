// What the stream layer adds to an allocate+free pair on one stream, without a GPU: each policy alone, then
// under stream_ordered over simulated streams (an identified stream with captures announced, as the plug-in
// runs it, and a plain handle). The simulated backend answers a plain handle's id lookup from a std::map, not
// the driver, so that row times the layer's own work around the lookup, not cuStreamGetId. Google Benchmark.
#include <benchmark/benchmark.h>

#include <cstddef>

#include <strata/default_pool.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/host_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>

namespace {

using strata::host_source;
using strata::mapped_pool;
using strata::simulated_events;
using strata::simulated_pages;
using strata::simulated_streams;
using size_classes = strata::size_class_pool<host_source>;
using mapped = mapped_pool<simulated_pages>;
template <class Policy>
using layered = strata::stream_ordered<Policy, simulated_events>;

constexpr std::size_t mib = std::size_t{1} << 20;

size_classes make_policy(size_classes*) { return size_classes{host_source{}}; }
mapped make_policy(mapped*) { return mapped{simulated_pages{2 * mib, std::size_t{8} << 30}}; }

template <class Pool, class Stream>
void run_pairs(benchmark::State& state, Pool& pool, const Stream& stream)
{
  const auto bytes = static_cast<std::size_t>(state.range(0));
  pool.deallocate_async(pool.allocate_async(bytes, 256, stream), bytes, 256, stream);  // warm, and own the policy
  for (auto _ : state) {
    void* p = pool.allocate_async(bytes, 256, stream);
    benchmark::DoNotOptimize(p);
    pool.deallocate_async(p, bytes, 256, stream);
  }
  state.SetItemsProcessed(state.iterations());
}

template <class Policy>
void bare(benchmark::State& state)
{
  Policy pool = make_policy(static_cast<Policy*>(nullptr));
  const auto bytes = static_cast<std::size_t>(state.range(0));
  pool.deallocate(pool.allocate(bytes, 256), bytes, 256);
  for (auto _ : state) {
    void* p = pool.allocate(bytes, 256);
    benchmark::DoNotOptimize(p);
    pool.deallocate(p, bytes, 256);
  }
  state.SetItemsProcessed(state.iterations());
}

/// `Identified`: the stream's id known to the caller (strata::identify); `CheckCapture`: the layer asks every
/// call whether its stream captures (off: captures announced, the plug-in's setting); `Legacy`: the legacy
/// default stream's handle, whose id the layer asks at every call, frees included (the trace replays' case).
template <class Policy, bool Identified, bool CheckCapture, bool Legacy = false>
void ordered(benchmark::State& state)
{
  simulated_streams world;
  layered<Policy> pool{make_policy(static_cast<Policy*>(nullptr)), {.check_capture = CheckCapture}, simulated_events{world}};
  const cuda::stream_ref stream = Legacy ? simulated_streams::legacy() : world.create();
  if constexpr (Identified) run_pairs(state, pool, world.identify(stream));
  else run_pairs(state, pool, stream);
}

void sizes(benchmark::internal::Benchmark* b) { b->Arg(256)->Arg(4096)->Arg(64 << 10)->Arg(1 << 20); }
/// mapped_pool's page state is kept by runs: a block over many mappings must cost about what a small one does.
void mapped_sizes(benchmark::internal::Benchmark* b)
{
  sizes(b);
  b->Arg(256 << 20)->Arg(1 << 30);
}

BENCHMARK(bare<size_classes>)->Name("size_class_pool")->Apply(sizes);
BENCHMARK(ordered<size_classes, true, false>)->Name("stream_ordered<size_class_pool>/identified")->Apply(sizes);
BENCHMARK(ordered<size_classes, false, false>)->Name("stream_ordered<size_class_pool>/handle")->Apply(sizes);
BENCHMARK(ordered<size_classes, true, true>)->Name("stream_ordered<size_class_pool>/identified_checked")->Apply(sizes);
BENCHMARK(bare<mapped>)->Name("mapped_pool")->Apply(mapped_sizes);
BENCHMARK(ordered<mapped, true, false>)->Name("stream_ordered<mapped_pool>/identified")->Apply(mapped_sizes);
BENCHMARK(ordered<mapped, false, false>)->Name("stream_ordered<mapped_pool>/handle")->Apply(mapped_sizes);
BENCHMARK(ordered<mapped, false, true>)->Name("stream_ordered<mapped_pool>/handle_checked")->Apply(mapped_sizes);
BENCHMARK(ordered<mapped, false, true, true>)->Name("stream_ordered<mapped_pool>/legacy_checked")->Apply(mapped_sizes);

} // namespace

BENCHMARK_MAIN();
