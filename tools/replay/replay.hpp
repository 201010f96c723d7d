#pragma once
// Replays an allocation trace through a strata stack on simulated memory: the one replay implementation
// behind bench/replay, bench/peers and strata-plan, so their figures agree by construction. A replay tracks
// peak live (what the program asked for), peak reserved (what the stack held from its simulated device),
// upstream calls, and on request a downsampled timeline and the stack's map at one operation.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <strata/adaptor/segregator.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/ref.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/default_pool.hpp>
#include <strata/pages/page_backend.hpp>
#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/simulated_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>

#include "torch_model.hpp"
#include "trace.hpp"

namespace strata::replay {

/// At most `points` samples over the whole trace; each keeps the highest live and reserved of its bucket of
/// operations, so a downsampled peak is never lower than the real one.
struct timeline {
  std::vector<std::size_t> op, live, reserved;
};

struct replay_result {
  std::string stack{};
  std::size_t operations = 0;  ///< operations replayed (all of them unless failed)
  double ns_per_op = 0;        ///< time in the stack's calls (only when run_options::timed)
  std::size_t peak_live = 0;
  std::size_t peak_reserved = 0;
  std::size_t peak_op = 0;     ///< the operation after which peak reserved was first reached
  bool failed = false;
  bool out_of_memory = false;  ///< failed because the simulated device ran out
  std::string failure{};
  std::uint64_t upstream_calls = 0;  ///< allocations and frees made to the device (cudaMalloc/cudaFree or cuMemCreate/cuMemRelease)
  std::uint64_t upstream_allocations = 0;  ///< of those, the allocations (chunks or physical allocations taken)
  std::size_t allocations = 0;             ///< the trace's allocations the stack served
  bool has_page_calls = false;       ///< page-mapped stacks: the driver calls they made
  page_counters page_calls{};
  timeline line{};                        ///< when run_options::timeline_points
  std::optional<strata::snapshot> map{};  ///< at run_options::capture_at
  std::size_t largest_free_at_capture = 0;

  double per_1000_ops(std::uint64_t calls) const
  {
    return operations == 0 ? 0 : 1000.0 * static_cast<double>(calls) / static_cast<double>(operations);
  }
  double ratio() const { return peak_live == 0 ? 0 : static_cast<double>(peak_reserved) / static_cast<double>(peak_live); }
  /// Device allocations per 100 allocations served: how often the stack's hot path fell through to the driver.
  double upstream_allocation_percent() const
  {
    return allocations == 0 ? 0 : 100.0 * static_cast<double>(upstream_allocations) / static_cast<double>(allocations);
  }
};

struct run_options {
  std::size_t capacity = SIZE_MAX;      ///< the simulated device's memory; SIZE_MAX: unlimited
  std::size_t capture_at = SIZE_MAX;    ///< take the map (snapshot, largest free block) after this operation
  std::size_t timeline_points = 0;      ///< 0: no timeline
  bool timed = false;                   ///< time each call (two clock reads per operation)
  std::function<void(std::size_t)> progress{};  ///< called with the operations done, every 4096 and at the end
  simulated_source::rounding rounding = simulated_source::rounding::like_cudamalloc;  ///< chunked pools' source
  std::size_t lag = 0;                  ///< stream stacks: work completes this many operations after it was enqueued
};

/// What a replay needs from a stack, as callables: allocate(event) -> void*, deallocate(p, bytes, event of the
/// free), step(event) after each operation, reserved() -> bytes held, largest_free() -> bytes, snapshot().
template <class Allocate, class Deallocate, class Step, class Reserved, class LargestFree, class Snapshot>
struct driver {
  Allocate allocate;
  Deallocate deallocate;
  Step step;
  Reserved reserved;
  LargestFree largest_free;
  Snapshot snapshot;
};
template <class... F>
driver(F...) -> driver<F...>;

template <class Driver>
replay_result run(std::string name, Driver& d, const std::vector<trace_event>& events, const run_options& o)
{
  struct live_block {
    void* p;
    std::size_t bytes;
    int stream;
  };
  replay_result r{.stack = std::move(name)};
  std::unordered_map<std::uint64_t, live_block> live;
  live.reserve(events.size() / 2 + 1);
  const std::size_t bucket = o.timeline_points == 0 ? 0 : std::max<std::size_t>(1, (events.size() + o.timeline_points - 1) / o.timeline_points);
  std::size_t live_bytes = 0;
  double seconds = 0;
  auto clock = [&] { return o.timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}; };
  try {
    for (const auto& e : events) {
      const auto start = clock();
      if (e.allocate) {
        void* p = d.allocate(e);
        if (o.timed) seconds += std::chrono::duration<double>(clock() - start).count();
        live[e.id] = {p, e.bytes, e.stream};
        ++r.allocations;
        live_bytes += e.bytes;
        r.peak_live = std::max(r.peak_live, live_bytes);
        if (const std::size_t held = d.reserved(); held > r.peak_reserved) {
          r.peak_reserved = held;
          r.peak_op = r.operations;
        }
      } else {
        const auto it = live.find(e.id);
        if (it != live.end()) {  // read_trace refuses unknown frees; a hand-built trace may still have them
          d.deallocate(it->second.p, it->second.bytes, e);
          if (o.timed) seconds += std::chrono::duration<double>(clock() - start).count();
          live_bytes -= it->second.bytes;
          live.erase(it);
        }
      }
      d.step(e);
      if (bucket != 0) {
        const std::size_t b = r.operations / bucket;
        if (b == r.line.op.size()) {
          r.line.op.push_back(r.operations);
          r.line.live.push_back(0);
          r.line.reserved.push_back(0);
        }
        r.line.live[b] = std::max(r.line.live[b], live_bytes);
        r.line.reserved[b] = std::max(r.line.reserved[b], static_cast<std::size_t>(d.reserved()));
      }
      if (r.operations == o.capture_at) {
        r.map = d.snapshot();
        r.largest_free_at_capture = d.largest_free();
      }
      ++r.operations;
      if (o.progress && r.operations % 4096 == 0) o.progress(r.operations);
    }
  } catch (const out_of_memory& ex) {
    r.failed = r.out_of_memory = true;
    r.failure = ex.what();
  } catch (const std::exception& ex) {
    r.failed = true;
    r.failure = ex.what();
  }
  if (o.progress) o.progress(events.size());
  for (auto& [id, block] : live) d.deallocate(block.p, block.bytes, trace_event{false, id, block.bytes, block.stream});
  r.ns_per_op = r.operations == 0 ? 0 : seconds * 1e9 / static_cast<double>(r.operations);
  return r;
}

// ---- the stacks ---------------------------------------------------------------------------------------

/// A named stack: `run` builds it fresh over a simulated device and replays the trace through it.
struct stack_spec {
  std::string key;          ///< what --stacks names
  std::string description;  ///< what it is, in a phrase
  bool pages = false;       ///< over page-mapped memory: its page map and unmap calls are counted
  /// True when a capacity changes nothing until it is exceeded and then fails: the smallest capacity is the
  /// peak reserved itself (no search). False for stacks that give memory back or shrink requests when refused.
  bool exact_min_capacity = false;
  std::function<replay_result(const std::vector<trace_event>&, const run_options&)> run;
};

namespace detail {

inline constexpr std::size_t page = std::size_t{2} << 20;

/// The chunked pools' device: cudaMalloc-like rounding (unless --exact), capped at the capacity.
inline simulated_source make_source(const run_options& o)
{
  return simulated_source(o.capacity, std::size_t{1} << 40, o.rounding);
}

inline std::size_t physical_cap(std::size_t capacity) { return capacity == SIZE_MAX ? SIZE_MAX : std::max(page, capacity / page * page); }

using counted = statistics<ref<simulated_source>>;

/// The device calls a chunked stack made: allocations, and the frees among them.
inline void count_upstream(replay_result& r, const counted& c)
{
  const auto n = c.snapshot_counts();
  r.upstream_allocations = n.total_blocks;
  r.upstream_calls = n.total_blocks + (n.total_blocks - n.current_blocks);
}

template <class Pool>
std::size_t largest_free_of(const Pool& pool)
{
  if constexpr (usage_reporting_resource<Pool>) return pool.usage().largest_free;
  else return 0;
}

/// Streams of the trace over a simulated GPU: 0 is the legacy default stream, others are created on first
/// use; every operation is one piece of work on its stream, all finished every `lag + 1` operations.
struct trace_streams {
  simulated_streams world;
  std::unordered_map<int, cuda::stream_ref> streams{{0, simulated_streams::legacy()}};
  std::size_t ops = 0;
  cuda::stream_ref of(int n)
  {
    auto it = streams.find(n);
    if (it == streams.end()) it = streams.emplace(n, world.create()).first;
    return it->second;
  }
  void step(int n, std::size_t lag)
  {
    world.launch(of(n));
    if (++ops % (lag + 1) == 0) world.finish_all();
  }
};

/// A synchronous pool over a counted simulated source.
template <class Pool, class... Options>
replay_result chunked(const std::string& name, const std::vector<trace_event>& events, const run_options& o, Options... opts)
{
  simulated_source sim = make_source(o);
  counted source{ref(sim)};
  Pool pool{ref(source), opts...};
  driver d{[&](const trace_event& e) { return pool.allocate(e.bytes, 256); },
           [&](void* p, std::size_t bytes, const trace_event&) { pool.deallocate(p, bytes, 256); },
           [](const trace_event&) {}, [&] { return sim.allocated_bytes(); }, [&] { return largest_free_of(pool); },
           [&] { return pool.snapshot(); }};
  auto r = run(name, d, events, o);
  count_upstream(r, source);
  return r;
}

inline replay_result segregated(const std::string& name, const std::vector<trace_event>& events, const run_options& o)
{
  simulated_source sim = make_source(o);
  counted source{ref(sim)};
  using small = size_class_pool<ref<counted>>;
  using large = coalescing_pool<ref<counted>>;
  segregator<(std::size_t{1} << 20), small, large> pool{small{ref(source)}, large{ref(source)}};
  driver d{[&](const trace_event& e) { return pool.allocate(e.bytes, 256); },
           [&](void* p, std::size_t bytes, const trace_event&) { pool.deallocate(p, bytes, 256); },
           [](const trace_event&) {}, [&] { return sim.allocated_bytes(); },
           [&] { return std::max(pool.small().usage().largest_free, pool.large().usage().largest_free); },
           [&] {
             strata::snapshot s = pool.small().snapshot();
             strata::snapshot l = pool.large().snapshot();
             s.box = "segregator<size_class_pool, coalescing_pool>";
             s.segments.insert(s.segments.end(), l.segments.begin(), l.segments.end());
             return s;
           }};
  auto r = run(name, d, events, o);
  count_upstream(r, source);
  return r;
}

inline replay_result stream_ordered_coalescing(const std::string& name, const std::vector<trace_event>& events, const run_options& o)
{
  trace_streams streams;
  simulated_source sim = make_source(o);
  counted source{ref(sim)};
  using pool = coalescing_pool<ref<counted>>;
  stream_ordered<pool, simulated_events> layer{pool{ref(source)}, {}, simulated_events(streams.world)};
  driver d{[&](const trace_event& e) { return layer.allocate_async(e.bytes, 256, streams.of(e.stream)); },
           [&](void* p, std::size_t bytes, const trace_event& e) { layer.deallocate_async(p, bytes, 256, streams.of(e.stream)); },
           [&](const trace_event& e) { streams.step(e.stream, o.lag); }, [&] { return sim.allocated_bytes(); },
           [&] { return layer.usage().largest_free; }, [&] { return layer.policy().snapshot(); }};
  auto r = run(name, d, events, o);
  count_upstream(r, source);
  return r;
}

inline void add_page_calls(replay_result& r, const page_counters& calls)
{
  r.has_page_calls = true;
  r.page_calls = calls;
  r.upstream_calls = calls.creates + calls.releases;
  r.upstream_allocations = calls.creates;
}

/// The recommended stack as planned without a GPU: default_pool's policy over simulated pages and streams.
inline replay_result recommended(const std::string& name, const std::vector<trace_event>& events, const run_options& o)
{
  trace_streams streams;
  mapped_pool<simulated_pages>::options opts{};
  opts.max_physical = physical_cap(o.capacity);
  planning_pool layer{mapped_pool<simulated_pages>{simulated_pages{}, opts}, {}, simulated_events(streams.world)};
  driver d{[&](const trace_event& e) { return layer.allocate_async(e.bytes, 256, streams.of(e.stream)); },
           [&](void* p, std::size_t bytes, const trace_event& e) { layer.deallocate_async(p, bytes, 256, streams.of(e.stream)); },
           [&](const trace_event& e) { streams.step(e.stream, o.lag); }, [&] { return layer.policy().physical_bytes(); },
           [&] { return layer.usage().largest_free; }, [&] { return layer.policy().snapshot(); }};
  auto r = run(name, d, events, o);
  add_page_calls(r, layer.policy().page_calls());
  return r;
}

inline replay_result mapped(const std::string& name, const std::vector<trace_event>& events, const run_options& o,
                            mapped_pool<simulated_pages>::options opts)
{
  opts.max_physical = std::min(opts.max_physical, physical_cap(o.capacity));
  mapped_pool<simulated_pages> pool{simulated_pages{}, opts};
  driver d{[&](const trace_event& e) { return pool.allocate(e.bytes, 256); },
           [&](void* p, std::size_t bytes, const trace_event&) { pool.deallocate(p, bytes, 256); },
           [](const trace_event&) {}, [&] { return pool.physical_bytes(); }, [&] { return pool.usage().largest_free; },
           [&] { return pool.snapshot(); }};
  auto r = run(name, d, events, o);
  add_page_calls(r, pool.page_calls());
  return r;
}

/// Every tensor its own cudaMalloc (rounded as cudaMalloc rounds), freed with cudaFree at once.
inline replay_result cudamalloc_baseline(const std::string& name, const std::vector<trace_event>& events, const run_options& o)
{
  simulated_source sim(o.capacity, std::size_t{1} << 40, simulated_source::rounding::like_cudamalloc);
  counted source{ref(sim)};
  std::map<std::uintptr_t, std::size_t> blocks;  // for the map: each allocation is a segment of its own
  driver d{[&](const trace_event& e) {
             void* p = source.allocate(e.bytes, 256);
             if (p != nullptr) {
               try {
                 blocks.emplace(reinterpret_cast<std::uintptr_t>(p), e.bytes);
               } catch (...) {
                 source.deallocate(p, e.bytes, 256);
                 throw;
               }
             }
             return p;
           },
           [&](void* p, std::size_t bytes, const trace_event&) {
             blocks.erase(reinterpret_cast<std::uintptr_t>(p));
             source.deallocate(p, bytes, 256);
           },
           [](const trace_event&) {}, [&] { return sim.allocated_bytes(); }, [] { return std::size_t{0}; },
           [&] {
             strata::snapshot s{.box = "cudaMalloc per tensor", .segments = {}};
             for (const auto& [address, bytes] : blocks) {
               segment_info seg{.address = address, .size = sim.rounded_size(bytes), .blocks = {{0, bytes, false, -1}}, .mapped = {}};
               if (seg.size > bytes) seg.blocks.push_back({bytes, seg.size - bytes, true, -1});  // rounding: unusable
               s.segments.push_back(std::move(seg));
             }
             return s;
           }};
  auto r = run(name, d, events, o);
  count_upstream(r, source);
  return r;
}

inline replay_result torch_like(const std::string& name, const std::vector<trace_event>& events, const run_options& o)
{
  simulated_source sim(o.capacity, std::size_t{1} << 40, simulated_source::rounding::like_cudamalloc);
  counted source{ref(sim)};
  torch_caching_model<ref<counted>> pool{ref(source)};
  driver d{[&](const trace_event& e) { return pool.allocate(e.bytes, e.stream); },
           [&](void* p, std::size_t, const trace_event&) { pool.deallocate(p); }, [](const trace_event&) {},
           [&] { return sim.allocated_bytes(); }, [&] { return pool.usage().largest_free; }, [&] { return pool.snapshot(); }};
  auto r = run(name, d, events, o);
  count_upstream(r, source);
  return r;
}

inline run_options with_lag(run_options o, std::size_t lag)
{
  o.lag = lag;
  return o;
}

} // namespace detail

/// The stacks every tool replays, in the order they are reported: the recommended stack, each pool with
/// the options that matter, with and without stream ordering, then the two baselines. (No arena: a trace
/// that frees out of order would make it hold everything ever allocated.)
inline std::vector<stack_spec> standard_stacks()
{
  using namespace detail;
  using chunks = coalescing_pool<ref<counted>>;
  using mopts = mapped_pool<simulated_pages>::options;
  auto spec = [](std::string key, std::string description, bool pages, bool exact, auto fn) {
    auto run = [fn, description](const std::vector<trace_event>& ev, const run_options& o) { return fn(description, ev, o); };
    return stack_spec{std::move(key), std::move(description), pages, exact, std::move(run)};
  };
  std::vector<stack_spec> s;
  s.push_back(spec("default_pool", "default_pool (recommended; trace streams, work done at once)", true, false,
                   [](const std::string& n, const auto& ev, const run_options& o) { return recommended(n, ev, with_lag(o, 0)); }));
  s.push_back(spec("default_pool_lag64", "default_pool (recommended; work done 64 operations later)", true, false,
                   [](const std::string& n, const auto& ev, const run_options& o) { return recommended(n, ev, with_lag(o, 64)); }));
  s.push_back(spec("mapped_pool", "mapped_pool (defaults)", true, false,
                   [](const std::string& n, const auto& ev, const run_options& o) { return mapped(n, ev, o, mopts{}); }));
  s.push_back(spec("mapped_pool_any_mapping", "mapped_pool (no idle slack, mappings of any size)", true, false,
                   [](const std::string& n, const auto& ev, const run_options& o) {
                     return mapped(n, ev, o, mopts{.reclaim_slack_fraction = 0.0, .max_mapping = SIZE_MAX});
                   }));
  s.push_back(spec("mapped_pool_relocate", "mapped_pool (relocates idle memory before reclaiming; the plug-in's default)", true, false,
                   [](const std::string& n, const auto& ev, const run_options& o) { return mapped(n, ev, o, mopts{.relocate_idle = true}); }));
  s.push_back(spec("mapped_pool_no_reclaim", "mapped_pool (never reclaims: like expandable segments)", true, false,
                   [](const std::string& n, const auto& ev, const run_options& o) {
                     return mapped(n, ev, o, mopts{.reclaim_slack = SIZE_MAX, .reclaim_slack_fraction = 0.0});
                   }));
  s.push_back(spec("coalescing_pool", "coalescing_pool (defaults)", false, false,
                   [](const std::string& n, const auto& ev, const run_options& o) { return chunked<chunks>(n, ev, o); }));
  s.push_back(spec("stream_ordered_coalescing", "stream_ordered<coalescing_pool> (trace streams, work done at once)", false, false,
                   [](const std::string& n, const auto& ev, const run_options& o) { return stream_ordered_coalescing(n, ev, with_lag(o, 0)); }));
  s.push_back(spec("stream_ordered_coalescing_lag64", "stream_ordered<coalescing_pool> (work done 64 operations later)", false, false,
                   [](const std::string& n, const auto& ev, const run_options& o) { return stream_ordered_coalescing(n, ev, with_lag(o, 64)); }));
  s.push_back(spec("size_class_pool", "size_class_pool (large requests direct)", false, false,
                   [](const std::string& n, const auto& ev, const run_options& o) { return chunked<size_class_pool<ref<counted>>>(n, ev, o); }));
  s.push_back(spec("segregator", "segregator<1 MiB, size_class_pool, coalescing_pool>", false, false,
                   [](const std::string& n, const auto& ev, const run_options& o) { return segregated(n, ev, o); }));
  s.push_back(spec("buddy_pool", "buddy_pool (1 GiB regions)", false, false,
                   [](const std::string& n, const auto& ev, const run_options& o) { return chunked<buddy_pool<ref<counted>>>(n, ev, o); }));
  s.push_back(spec("cudamalloc", "baseline: cudaMalloc per tensor", false, true,
                   [](const std::string& n, const auto& ev, const run_options& o) { return cudamalloc_baseline(n, ev, o); }));
  s.push_back(spec("pytorch_caching", "baseline: PyTorch-like caching pool (a model)", false, false,
                   [](const std::string& n, const auto& ev, const run_options& o) { return torch_like(n, ev, o); }));
  return s;
}

inline void print_table(const std::string& trace, const std::vector<replay_result>& results)
{
  std::printf("\nreplay of %s\n", trace.c_str());
  std::printf("%-68s %10s %10s %14s %14s %9s\n", "stack", "ops", "ns/op", "peak live MiB", "peak rsv MiB", "rsv/live");
  for (const auto& r : results) {
    if (r.failed) {
      std::printf("%-68s FAILED after %zu ops: %s\n", r.stack.c_str(), r.operations, r.failure.c_str());
      continue;
    }
    std::printf("%-68s %10zu %10.1f %14.1f %14.1f %8.3fx\n", r.stack.c_str(), r.operations, r.ns_per_op,
                static_cast<double>(r.peak_live) / (1 << 20), static_cast<double>(r.peak_reserved) / (1 << 20), r.ratio());
    if (r.has_page_calls)
      std::printf("%-68s per 1000 operations: %.1f maps, %.1f unmaps, %.2f device waits (%llu creates)\n", "", r.per_1000_ops(r.page_calls.maps),
                  r.per_1000_ops(r.page_calls.unmaps), r.per_1000_ops(r.page_calls.synchronizes),
                  static_cast<unsigned long long>(r.page_calls.creates));
  }
}

inline void write_json(const std::string& path, const std::string& trace, const std::vector<replay_result>& results, double scale = 1.0)
{
  std::ofstream out(path);
  out << "{\"trace\":\"" << trace << "\",\"scale\":" << scale << ",\"results\":[";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    out << (i ? "," : "") << "{\"stack\":\"" << r.stack << "\",\"operations\":" << r.operations << ",\"ns_per_op\":" << r.ns_per_op
        << ",\"peak_live\":" << r.peak_live << ",\"peak_reserved\":" << r.peak_reserved << ",\"ratio\":" << r.ratio()
        << ",\"upstream_calls\":" << r.upstream_calls << ",\"allocations\":" << r.allocations
        << ",\"upstream_allocations\":" << r.upstream_allocations << ",\"failed\":" << (r.failed ? "true" : "false");
    if (r.has_page_calls) {
      const auto& c = r.page_calls;
      out << ",\"page_calls\":{\"creates\":" << c.creates << ",\"maps\":" << c.maps << ",\"unmaps\":" << c.unmaps
          << ",\"releases\":" << c.releases << ",\"access_calls\":" << c.access_calls << ",\"device_waits\":" << c.synchronizes
          << ",\"maps_per_1000_ops\":" << r.per_1000_ops(c.maps) << ",\"unmaps_per_1000_ops\":" << r.per_1000_ops(c.unmaps) << "}";
    }
    out << "}";
  }
  out << "]}\n";
}

} // namespace strata::replay
