// The policies' own cost, without a GPU: allocate+free pairs and random mixes over simulated_source
// (addresses only, so only the bookkeeping is timed). Google Benchmark; one core.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include <strata/policy/arena.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/simulated_source.hpp>

namespace {

using strata::simulated_source;

template <class Pool>
void pair(benchmark::State& state)
{
  Pool pool{simulated_source{}};
  const auto bytes = static_cast<std::size_t>(state.range(0));
  pool.deallocate(pool.allocate(bytes), bytes);  // warm: the first chunk is taken outside the timing
  for (auto _ : state) {
    void* p = pool.allocate(bytes);
    benchmark::DoNotOptimize(p);
    pool.deallocate(p, bytes);
  }
  state.SetItemsProcessed(state.iterations());
}

void arena_pair(benchmark::State& state)
{
  strata::arena<simulated_source> pool{simulated_source{}};
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = pool.allocate(bytes);
    benchmark::DoNotOptimize(p);
    pool.deallocate(p, bytes);  // the top block: rolled back
  }
  state.SetItemsProcessed(state.iterations());
}

/// 50/50 allocate/free with up to 2000 live blocks; sizes log-uniform in [256 B, max]. ns per operation.
template <class Pool>
void random_mix(benchmark::State& state)
{
  Pool pool{simulated_source{}};
  std::mt19937_64 rng(1);
  const double max_log = std::log2(static_cast<double>(state.range(0)));
  std::uniform_real_distribution<double> size(8.0, max_log);
  constexpr std::size_t ops = 1 << 16;
  std::vector<std::size_t> sizes(ops);
  std::vector<int> coin(ops);
  for (std::size_t i = 0; i < ops; ++i) {
    sizes[i] = static_cast<std::size_t>(std::exp2(size(rng)));
    coin[i] = static_cast<int>(rng() % 2);
  }
  std::vector<std::pair<void*, std::size_t>> live;
  live.reserve(2000);
  std::size_t i = 0;
  for (auto _ : state) {
    const std::size_t k = i++ & (ops - 1);
    if (live.empty() || (live.size() < 2000 && coin[k])) {
      live.emplace_back(pool.allocate(sizes[k]), sizes[k]);
    } else {
      const std::size_t victim = sizes[k] % live.size();
      pool.deallocate(live[victim].first, live[victim].second);
      live[victim] = live.back();
      live.pop_back();
    }
  }
  for (auto [p, n] : live) pool.deallocate(p, n);
  state.SetItemsProcessed(state.iterations());
}

using size_classes = strata::size_class_pool<simulated_source>;
using coalescing = strata::coalescing_pool<simulated_source>;
using buddy = strata::buddy_pool<simulated_source>;

BENCHMARK(pair<size_classes>)->Arg(256)->Arg(4096)->Arg(1 << 20);
BENCHMARK(pair<coalescing>)->Arg(256)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(pair<buddy>)->Arg(256)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(arena_pair)->Arg(256)->Arg(4096)->Arg(1 << 20);
BENCHMARK(random_mix<size_classes>)->Arg(1 << 20);
BENCHMARK(random_mix<coalescing>)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(random_mix<buddy>)->Arg(1 << 20)->Arg(64 << 20);

} // namespace

BENCHMARK_MAIN();
