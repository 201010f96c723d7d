// Replays an allocation trace against strata stacks and reports time per operation and peak reserved over
// peak live: how much memory each stack holds from its upstream, at its worst, for what the program needed.
//   replay TRACE [--scale F] [--exact] [--json FILE]
// --scale multiplies every size by F (rounded up to 512 bytes, as PyTorch rounds); simulated memory rounds
// as cudaMalloc does (requests of 2 MiB or more take a multiple of 2 MiB) unless --exact.
// Runs on simulated_source (no GPU needed); the GPU replay (real cudaMalloc'd memory, peers beside it) is part
// of bench/peers. The stream column is honoured by a stream_ordered stack over simulated streams, where each
// operation is one piece of work on its stream that completes `lag` operations later.
#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <strata/core/ref.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/simulated_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "replay_driver.hpp"
#include "trace.hpp"

namespace {

strata::simulated_source::rounding source_rounding = strata::simulated_source::rounding::like_cudamalloc;

strata::simulated_source make_source()
{
  return strata::simulated_source(strata::simulated_source::unlimited, std::size_t{1} << 40, source_rounding);
}

/// Every size times `factor`, rounded up to 512 bytes (PyTorch's rounding): the same workload a little
/// larger or smaller, so a figure that holds only at one lucky size shows it.
void scale_sizes(std::vector<strata::bench::trace_event>& events, double factor)
{
  for (auto& e : events) {
    const auto scaled = static_cast<std::size_t>(static_cast<double>(e.bytes) * factor + 0.5);
    e.bytes = std::max<std::size_t>(512, (scaled + 511) / 512 * 512);
  }
}

/// Replays with the trace's streams: stream 0 is the legacy default stream, others are created on first use.
strata::bench::replay_result replay_on_streams(std::string name, const std::vector<strata::bench::trace_event>& events, std::size_t lag,
                                               std::size_t max_chunk = std::size_t{1} << 30)
{
  using namespace strata;
  simulated_streams world;
  simulated_source sim = make_source();
  using pool = coalescing_pool<ref<simulated_source>>;
  stream_ordered<pool, simulated_events> layer{pool{ref(sim), {.max_chunk = max_chunk}}, {}, simulated_events(world)};
  std::unordered_map<int, cuda::stream_ref> streams{{0, simulated_streams::legacy()}};
  auto stream_of = [&](int n) {
    auto it = streams.find(n);
    if (it == streams.end()) it = streams.emplace(n, world.create()).first;
    return it->second;
  };
  bench::replay_result r{.stack = std::move(name)};
  std::unordered_map<std::uint64_t, std::tuple<void*, std::size_t, int>> live;
  std::size_t live_bytes = 0, ops = 0;
  const auto start = std::chrono::steady_clock::now();
  try {
    for (const auto& e : events) {
      const cuda::stream_ref s = stream_of(e.stream);
      if (e.allocate) {
        live[e.id] = {layer.allocate_async(e.bytes, 256, s), e.bytes, e.stream};
        live_bytes += e.bytes;
        r.peak_live = std::max(r.peak_live, live_bytes);
        r.peak_reserved = std::max(r.peak_reserved, sim.allocated_bytes());
      } else {
        const auto it = live.find(e.id);
        if (it == live.end()) continue;
        layer.deallocate_async(std::get<0>(it->second), std::get<1>(it->second), 256, s);
        live_bytes -= std::get<1>(it->second);
        live.erase(it);
      }
      world.launch(s);
      if (++ops % (lag + 1) == 0) world.finish_all();
      ++r.operations;
    }
  } catch (const std::exception& ex) {
    r.failed = true;
    r.failure = ex.what();
  }
  r.ns_per_op = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / static_cast<double>(std::max<std::size_t>(r.operations, 1));
  for (auto& [id, block] : live) layer.deallocate_async(std::get<0>(block), std::get<1>(block), 256, stream_of(std::get<2>(block)));
  return r;
}

} // namespace

int main(int argc, char** argv)
{
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TRACE [--scale F] [--exact] [--json FILE]\n", argv[0]);
    return 2;
  }
  std::string json_path;
  double scale = 1.0;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (arg == "--scale" && i + 1 < argc) scale = std::stod(argv[++i]);
    else if (arg == "--exact") source_rounding = strata::simulated_source::rounding::none;
    else {
      std::fprintf(stderr, "replay: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (!(scale > 0)) {
    std::fprintf(stderr, "replay: --scale must be positive\n");
    return 2;
  }
  auto events = strata::bench::read_trace(argv[1]);
  if (scale != 1.0) scale_sizes(events, scale);
  using namespace strata;
  std::vector<bench::replay_result> results;

  {
    simulated_source sim = make_source();
    coalescing_pool<ref<simulated_source>> pool{ref(sim)};
    results.push_back(bench::replay("coalescing_pool (defaults)", pool, sim, events));
  }
  {
    simulated_source sim = make_source();
    coalescing_pool<ref<simulated_source>> pool{ref(sim), {.initial_chunk = 2 << 20, .max_chunk = 1 << 30, .growth_factor = 1.0}};
    results.push_back(bench::replay("coalescing_pool (2 MiB chunks, no growth)", pool, sim, events));
  }
  {
    simulated_source sim = make_source();
    coalescing_pool<ref<simulated_source>> pool{ref(sim), {.initial_chunk = 20 << 20, .max_chunk = 1 << 30, .growth_factor = 1.0}};
    results.push_back(bench::replay("coalescing_pool (20 MiB chunks, no growth)", pool, sim, events));
  }
  {
    simulated_source sim = make_source();
    buddy_pool<ref<simulated_source>> pool{ref(sim)};
    results.push_back(bench::replay("buddy_pool (1 GiB regions)", pool, sim, events));
  }
  {
    simulated_source sim = make_source();
    buddy_pool<ref<simulated_source>> pool{ref(sim), {.region_size = 64 << 20}};
    results.push_back(bench::replay("buddy_pool (64 MiB regions)", pool, sim, events));
  }
  {
    simulated_source sim = make_source();
    size_class_pool<ref<simulated_source>> pool{ref(sim)};
    results.push_back(bench::replay("size_class_pool (large requests direct)", pool, sim, events));
  }
  results.push_back(replay_on_streams("stream_ordered<coalescing_pool> (trace streams, work done at once)", events, 0));
  results.push_back(replay_on_streams("stream_ordered<coalescing_pool> (work done 64 operations later)", events, 64));
  // Growth comes in chunks of up to max_chunk: a stack a few MiB short at its peak takes a whole one more.
  {
    simulated_source sim = make_source();
    coalescing_pool<ref<simulated_source>> pool{ref(sim), {.max_chunk = 128 << 20}};
    results.push_back(bench::replay("coalescing_pool (chunks up to 128 MiB)", pool, sim, events));
  }
  results.push_back(replay_on_streams("stream_ordered<coalescing_pool> (chunks up to 128 MiB)", events, 0, 128 << 20));
  {
    const char* spec = std::getenv("MAPPED");  // slack_mib,fraction,candidates;...
    std::string all = spec ? spec : "0,1,16";
    std::size_t pos = 0;
    while (pos < all.size()) {
      std::size_t end = all.find(';', pos);
      if (end == std::string::npos) end = all.size();
      double slack = 0, max_map = 0, page_mib = 2;
      int cands = 16;
      double small_mib = 4;
      std::sscanf(all.substr(pos, end - pos).c_str(), "%lf,%lf,%d,%lf,%lf", &slack, &max_map, &cands, &page_mib, &small_mib);
      pos = end + 1;
      mapped_pool<simulated_pages> pool{simulated_pages{static_cast<std::size_t>(page_mib * (1 << 20))},
                                        {.small_limit = static_cast<std::size_t>(small_mib * (1 << 20)), .reclaim_slack = slack >= 1 ? static_cast<std::size_t>(slack * (1 << 20)) : 0, .reclaim_slack_fraction = slack < 1 ? slack : 0.0, .max_mapping = max_map > 0 ? static_cast<std::size_t>(max_map * (1 << 20)) : SIZE_MAX, .placement_candidates = cands}};
      char name[128];
      std::snprintf(name, sizeof name, "mapped_pool (small %g MiB, slack %g, max map %.0f MiB, candidates %d)", small_mib, slack, max_map, cands);
      auto r = bench::replay_with(name, pool, [&] { return pool.physical_bytes(); }, events);
      const auto& c = pool.page_calls();
      const double us = 7.5 * c.creates + 31.0 * c.maps + 20.0 * c.unmaps + 10.0 * c.releases + 1.0 * c.synchronizes;
      std::printf("  %s: creates %llu maps %llu unmaps %llu access %llu syncs %llu; model %.0f ns/op\n", name,
                  (unsigned long long)c.creates, (unsigned long long)c.maps, (unsigned long long)c.unmaps, (unsigned long long)c.access_calls,
                  (unsigned long long)c.synchronizes, 1000.0 * us / static_cast<double>(r.operations));
      results.push_back(std::move(r));
    }
  }
  bench::print_table(argv[1], results);
  if (!json_path.empty()) bench::write_json(json_path, argv[1], results);
  return 0;
}
