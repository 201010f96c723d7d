// Replays an allocation trace against strata stacks on simulated memory and reports, for each stack, time
// per operation and peak held over peak live: how much memory the stack holds from the device, at its worst,
// for what the program needed.
//   replay TRACE [--scale F] [--exact] [--json FILE]
// --scale multiplies every size by F (rounded up to 512 bytes, as PyTorch rounds), so a figure that holds
// only at one lucky size shows it. Chunked pools run over simulated_source rounding as cudaMalloc does
// (requests of 2 MiB or more take a multiple of 2 MiB) unless --exact; page-mapped pools over simulated_pages
// (2 MiB granularity), whose driver calls are counted and reported per 1000 operations.
// The stream column is honoured by the stream-ordered stacks over simulated streams, where each operation is
// one piece of work on its stream, completed at once or 64 operations later. No GPU needed: the replay on
// device memory, beside the peers, is bench/peers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <strata/core/ref.hpp>
#include <strata/default_pool.hpp>
#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/simulated_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "replay_driver.hpp"
#include "trace.hpp"

namespace {

using namespace strata;
using bench::replay_result;
using bench::trace_event;

simulated_source::rounding source_rounding = simulated_source::rounding::like_cudamalloc;

simulated_source make_source() { return simulated_source(simulated_source::unlimited, std::size_t{1} << 40, source_rounding); }

void scale_sizes(std::vector<trace_event>& events, double factor)
{
  for (auto& e : events) {
    const auto scaled = static_cast<std::size_t>(static_cast<double>(e.bytes) * factor + 0.5);
    e.bytes = std::max<std::size_t>(512, (scaled + 511) / 512 * 512);
  }
}

template <class Pool>
void add_page_calls(replay_result& r, const Pool& pool)
{
  r.has_page_calls = true;
  r.page_calls = pool.page_calls();
}

/// Replays with the trace's streams through a stream-ordered stack built over `world`: stream 0 is the legacy
/// default stream, others are created on first use; work completes `lag` operations after it was enqueued.
template <class Layer, class Held>
replay_result replay_on_streams(std::string name, Layer& layer, simulated_streams& world, Held held,
                                const std::vector<trace_event>& events, std::size_t lag)
{
  std::unordered_map<int, cuda::stream_ref> streams{{0, simulated_streams::legacy()}};
  auto stream_of = [&](int n) {
    auto it = streams.find(n);
    if (it == streams.end()) it = streams.emplace(n, world.create()).first;
    return it->second;
  };
  replay_result r{.stack = std::move(name)};
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
        r.peak_reserved = std::max(r.peak_reserved, static_cast<std::size_t>(held()));
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
  r.ns_per_op = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
                static_cast<double>(std::max<std::size_t>(r.operations, 1));
  for (auto& [id, block] : live) layer.deallocate_async(std::get<0>(block), std::get<1>(block), 256, stream_of(std::get<2>(block)));
  return r;
}

replay_result stream_ordered_coalescing(std::string name, const std::vector<trace_event>& events, std::size_t lag)
{
  simulated_streams world;
  simulated_source sim = make_source();
  using pool = coalescing_pool<ref<simulated_source>>;
  stream_ordered<pool, simulated_events> layer{pool{ref(sim)}, {}, simulated_events(world)};
  return replay_on_streams(std::move(name), layer, world, [&] { return sim.allocated_bytes(); }, events, lag);
}

/// The recommended stack as it is planned without a GPU (default_pool's policy over simulated pages).
replay_result recommended(std::string name, const std::vector<trace_event>& events, std::size_t lag)
{
  simulated_streams world;
  planning_pool layer{mapped_pool<simulated_pages>{}, {}, simulated_events(world)};
  auto r = replay_on_streams(std::move(name), layer, world, [&] { return layer.policy().physical_bytes(); }, events, lag);
  add_page_calls(r, layer.policy());
  return r;
}

replay_result mapped(std::string name, const std::vector<trace_event>& events, mapped_pool<simulated_pages>::options opts)
{
  mapped_pool<simulated_pages> pool{simulated_pages{}, opts};
  auto r = bench::replay_with(std::move(name), pool, [&] { return pool.physical_bytes(); }, events);
  add_page_calls(r, pool);
  return r;
}

template <class Pool, class... Options>
replay_result chunked(std::string name, const std::vector<trace_event>& events, Options... opts)
{
  simulated_source sim = make_source();
  Pool pool{ref(sim), opts...};
  return bench::replay(std::move(name), pool, sim, events);
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
    else if (arg == "--scale" && i + 1 < argc) scale = std::strtod(argv[++i], nullptr);
    else if (arg == "--exact") source_rounding = simulated_source::rounding::none;
    else {
      std::fprintf(stderr, "replay: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (!(scale > 0)) {
    std::fprintf(stderr, "replay: --scale must be a positive number\n");
    return 2;
  }
  std::vector<trace_event> events;
  try {
    events = bench::read_trace(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "replay: %s\n", e.what());
    return 1;
  }
  if (scale != 1.0) scale_sizes(events, scale);

  using chunks = coalescing_pool<ref<simulated_source>>;
  std::vector<replay_result> results;
  results.push_back(recommended("default_pool (recommended; trace streams, work done at once)", events, 0));
  results.push_back(recommended("default_pool (recommended; work done 64 operations later)", events, 64));
  results.push_back(mapped("mapped_pool (defaults)", events, {}));
  results.push_back(mapped("mapped_pool (no idle slack, mappings of any size)", events,
                           {.reclaim_slack_fraction = 0.0, .max_mapping = SIZE_MAX}));
  results.push_back(mapped("mapped_pool (never reclaims: like expandable segments)", events,
                           {.reclaim_slack = SIZE_MAX, .reclaim_slack_fraction = 0.0}));
  results.push_back(chunked<chunks>("coalescing_pool (defaults)", events));
  results.push_back(stream_ordered_coalescing("stream_ordered<coalescing_pool> (trace streams, work done at once)", events, 0));
  results.push_back(stream_ordered_coalescing("stream_ordered<coalescing_pool> (work done 64 operations later)", events, 64));
  results.push_back(chunked<size_class_pool<ref<simulated_source>>>("size_class_pool (large requests direct)", events));
  results.push_back(chunked<buddy_pool<ref<simulated_source>>>("buddy_pool (1 GiB regions)", events));
  bench::print_table(argv[1], results);
  if (!json_path.empty()) bench::write_json(json_path, argv[1], results, scale);
  return 0;
}
