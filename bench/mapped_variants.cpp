// The design points of mapped_pool side by side: every trace in bench/traces replayed through each variant of
// its options, and what each costs in memory (peak held / peak live at sizes x0.9, x1.0, x1.1) and in driver
// calls (maps and unmaps per 1000 operations at x1.0, the figures that set its speed on a GPU: each mapping
// is a cuMemCreate + cuMemMap + cuMemSetAccess round trip, each unmapping a cuMemUnmap + cuMemRelease,
// priced per call whatever the size: bench/vmm_costs times them). The last column is the floor no page-mapped
// pool can go under with this placement: the most 2 MiB pages live blocks ever touched, over peak live.
// The last rows put a size-class front (segregator + size_class_pool, the random-allocation benchmark's
// fast path) before the default pool, to show what it costs in memory.
//   mapped_variants [--repeat N] [--traces a,b] [TRACE_DIR]            simulated pages, no GPU needed (x0.9 / x1.0 / x1.1)
//   mapped_variants --device [--repeat N] [--traces a,b] [TRACE_DIR]   driver_pages on the current GPU, x1.0
//   mapped_variants ... --json FILE   also every variant's driver calls per trace (x1.0) and held / live at each
//                                     size, beside the PyTorch-like model's device allocations on the same trace,
//                                     for bench/variant_prices.py to price with bench/vmm_costs' figures
// --traces: the traces' names in TRACE_DIR (default bert_train_varlen,llama_generate,resnet50_train,vit_train_2streams).
// Prints a Markdown table. TRACE_DIR defaults to bench/traces (run from the repository root). ns/op is the
// time inside the pool's calls, the fastest of N replays (default 1; every replay of a variant makes the same
// calls, so only the time varies); on a GPU after one untimed replay, as a process's first device memory
// costs more.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <strata/adaptor/segregator.hpp>
#include <strata/core/ref.hpp>
#include <strata/pages/driver_pages.hpp>
#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include "replay.hpp"
#include "trace.hpp"

namespace {

using namespace strata;
using replay::trace_event;
constexpr std::size_t mib = std::size_t{1} << 20;

/// Requests up to this size go to a size_class_pool whose slabs come from the mapped pool (0: no front).
enum class front : std::size_t { none = 0, classes_64k = std::size_t{64} << 10, classes_1m = std::size_t{1} << 20 };

template <class Backend>
struct variant {
  const char* name;
  typename mapped_pool<Backend>::options options;
  front classes = front::none;
};

/// The variants compared in docs/memory.md; the first is the default. Each changes one thing or two.
template <class Backend>
std::vector<variant<Backend>> variants()
{
  using opts = typename mapped_pool<Backend>::options;
  return {
      {"defaults: reclaim at the high-water mark, mappings 8-128 MiB", opts{}},
      {"mappings up to 64 MiB", opts{.max_mapping = 64 * mib}},
      {"mappings up to 256 MiB", opts{.max_mapping = 256 * mib}},
      {"mappings up to 1 GiB", opts{.max_mapping = 1024 * mib}},
      {"no map-ahead (mappings sized to the run, up to 128 MiB)", opts{.min_mapping = 0}},
      {"mappings up to 32 MiB, no map-ahead", opts{.max_mapping = 32 * mib, .min_mapping = 0}},
      {"mappings 16-128 MiB (map-ahead not bounded by the memory held)", opts{.max_mapping = 128 * mib, .min_mapping = 16 * mib, .min_mapping_fraction = 1.0}},
      {"mappings up to 16 MiB", opts{.max_mapping = 16 * mib}},
      {"mappings up to 8 MiB", opts{.max_mapping = 8 * mib}},
      {"page by page (2 MiB mappings)", opts{.max_mapping = 2 * mib, .min_mapping = 0}},
      {"1% slack above live before reclaiming", opts{.reclaim_slack_fraction = 0.01}},
      {"64 placement candidates", opts{.placement_candidates = 64}},
      {"placement by size alone (1 candidate)", opts{.placement_candidates = 1}},
      {"growth past the mark maps ahead 1% of what is held", opts{.growth_ahead_fraction = 0.01}},
      {"growth past the mark maps ahead 3% of what is held", opts{.growth_ahead_fraction = 0.03}},
      {"growth past the mark maps ahead 10% of what is held", opts{.growth_ahead_fraction = 0.10}},
      {"never reclaims (like expandable segments)", opts{.reclaim_slack = SIZE_MAX}},
      {"defaults behind size classes up to 64 KiB", opts{}, front::classes_64k},
      {"defaults behind size classes up to 1 MiB", opts{}, front::classes_1m},
  };
}

struct outcome {
  replay::replay_result r;
  page_counters calls;
  std::size_t peak_live_pages = 0;
};

/// Replays `stack` (timed), reporting `pool`'s physical memory as what it holds.
template <class Stack, class Pool>
replay::replay_result replay_through(const char* name, Stack& stack, const Pool& pool, const std::vector<trace_event>& events)
{
  replay::driver d{[&](const trace_event& e) { return stack.allocate(e.bytes, 256); },
                   [&](void* p, std::size_t bytes, const trace_event&) { stack.deallocate(p, bytes, 256); },
                   [](const trace_event&) {}, [&] { return pool.physical_bytes(); }, [&] { return pool.usage().largest_free; },
                   [&] { return pool.snapshot(); }};
  return replay::run(name, d, events, replay::run_options{.timed = true});
}

/// Replays through `pool`, or through a size-class front over it.
template <std::size_t Limit, class Pool>
replay::replay_result replay_front(const char* name, Pool& pool, const std::vector<trace_event>& events)
{
  if constexpr (Limit == 0) {
    return replay_through(name, pool, pool, events);
  } else {
    using classes = size_class_pool<ref<Pool>, Limit>;
    segregator<Limit, classes, ref<Pool>> stack{classes{ref(pool)}, ref(pool)};
    return replay_through(name, stack, pool, events);
  }
}

/// "a,b,c" -> {"a", "b", "c"}, empty names dropped.
std::vector<std::string> split_names(const std::string& list)
{
  std::vector<std::string> names;
  for (std::size_t start = 0; start <= list.size();) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    if (comma > start) names.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return names;
}

template <class Backend, class Make>
outcome replay_variant(const variant<Backend>& v, const std::vector<trace_event>& events, Make make_backend)
{
  mapped_pool<Backend> pool{make_backend(), v.options};
  outcome o{};
  switch (v.classes) {
  case front::none: o.r = replay_front<0>(v.name, pool, events); break;
  case front::classes_64k: o.r = replay_front<static_cast<std::size_t>(front::classes_64k)>(v.name, pool, events); break;
  case front::classes_1m: o.r = replay_front<static_cast<std::size_t>(front::classes_1m)>(v.name, pool, events); break;
  }
  o.calls = pool.page_calls();
  o.peak_live_pages = pool.peak_live_page_bytes();
  return o;
}

/// What --json keeps of one variant on one trace.
struct json_cell {
  std::vector<double> ratios;  // held / live at each size
  std::size_t operations = 0;  // at x1.0
  page_counters calls;         // at x1.0
};

void write_calls(std::FILE* f, const page_counters& c)
{
  std::fprintf(f, "{\"creates\":%llu,\"releases\":%llu,\"maps\":%llu,\"unmaps\":%llu,\"access_calls\":%llu,\"device_waits\":%llu}",
               static_cast<unsigned long long>(c.creates), static_cast<unsigned long long>(c.releases),
               static_cast<unsigned long long>(c.maps), static_cast<unsigned long long>(c.unmaps),
               static_cast<unsigned long long>(c.access_calls), static_cast<unsigned long long>(c.synchronizes));
}

void write_ratios(std::FILE* f, const std::vector<double>& ratios)
{
  std::fprintf(f, "[");
  for (std::size_t i = 0; i < ratios.size(); ++i) std::fprintf(f, "%s%.4f", i == 0 ? "" : ",", ratios[i]);
  std::fprintf(f, "]");
}

/// The variants' cells and, per trace, the PyTorch-like model's device allocations and frees at x1.0.
bool write_json(const std::string& path, const std::vector<std::string>& traces, const std::vector<double>& scales,
                const std::vector<std::vector<trace_event>>& loaded, const std::vector<std::pair<std::string, std::vector<json_cell>>>& cells)
{
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  std::fprintf(f, "{\"scales\":");
  write_ratios(f, scales);
  std::fprintf(f, ",\"pytorch_model\":{");
  for (std::size_t t = 0; t < traces.size(); ++t) {
    const auto r = replay::detail::torch_like("pytorch", loaded[t], replay::run_options{});
    std::fprintf(f, "%s\"%s\":{\"operations\":%zu,\"held_live\":%.4f,\"device_allocs\":%llu,\"device_frees\":%llu}", t == 0 ? "" : ",",
                 traces[t].c_str(), r.operations, r.ratio(), static_cast<unsigned long long>(r.upstream_allocations),
                 static_cast<unsigned long long>(r.upstream_calls - r.upstream_allocations));
  }
  std::fprintf(f, "},\"variants\":[");
  for (std::size_t v = 0; v < cells.size(); ++v) {
    std::fprintf(f, "%s{\"name\":\"%s\",\"traces\":{", v == 0 ? "" : ",", cells[v].first.c_str());
    for (std::size_t t = 0; t < traces.size(); ++t) {
      const json_cell& c = cells[v].second[t];
      std::fprintf(f, "%s\"%s\":{\"operations\":%zu,\"held_live\":", t == 0 ? "" : ",", traces[t].c_str(), c.operations);
      write_ratios(f, c.ratios);
      std::fprintf(f, ",\"device_calls\":");
      write_calls(f, c.calls);
      std::fprintf(f, "}");
    }
    std::fprintf(f, "}}");
  }
  std::fprintf(f, "]}\n");
  return std::fclose(f) == 0;
}

template <class Backend, class Make>
int run(const std::string& dir, const std::vector<std::string>& traces, const std::vector<double>& scales, int repeats, bool warm_up,
        Make make_backend, const std::string& json_path = {})
{
  std::vector<std::pair<std::string, std::vector<json_cell>>> cells;
  std::vector<std::vector<trace_event>> loaded;
  for (const auto& t : traces) loaded.push_back(replay::read_trace(dir + "/" + t + ".csv.gz"));
  std::printf("| variant |");
  for (const auto& t : traces) std::printf(" %s: held/live x%s; maps/unmaps per 1000 ops; ns/op |", t.c_str(), scales.size() > 1 ? "0.9/1.0/1.1" : "1.0");
  std::printf(" worst | page floor (x1.0) |\n|---|");
  for (std::size_t i = 0; i <= std::size(traces) + 1; ++i) std::printf("---|");
  std::printf("\n");
  if (warm_up) (void)replay_variant(variants<Backend>().front(), loaded.front(), make_backend);  // a first use, untimed
  int failures = 0;
  for (const auto& v : variants<Backend>()) {
    std::printf("| %s |", v.name);
    cells.push_back({v.name, std::vector<json_cell>(traces.size())});
    double worst = 0;
    std::string floors;
    for (std::size_t t = 0; t < loaded.size(); ++t) {
      std::string ratios, calls;
      for (double scale : scales) {
        std::vector<trace_event> events = loaded[t];
        if (scale != 1.0) replay::scale_sizes(events, scale);
        outcome o = replay_variant(v, events, make_backend);
        for (int i = 1; i < repeats && !o.r.failed; ++i) {
          const outcome again = replay_variant(v, events, make_backend);
          o.r.ns_per_op = std::min(o.r.ns_per_op, again.r.ns_per_op);
        }
        if (o.r.failed) {
          ++failures;
          std::fprintf(stderr, "%s on %s x%g failed: %s\n", v.name, traces[t].c_str(), scale, o.r.failure.c_str());
          ratios += ratios.empty() ? "failed" : " / failed";
          continue;
        }
        worst = std::max(worst, o.r.ratio());
        cells.back().second[t].ratios.push_back(o.r.ratio());
        char cell[96];
        std::snprintf(cell, sizeof cell, "%s%.3f", ratios.empty() ? "" : " / ", o.r.ratio());
        ratios += cell;
        if (scale == 1.0) {
          cells.back().second[t].operations = o.r.operations;
          cells.back().second[t].calls = o.calls;
          std::snprintf(cell, sizeof cell, "; %.1f / %.1f; %.0f", o.r.per_1000_ops(o.calls.maps), o.r.per_1000_ops(o.calls.unmaps), o.r.ns_per_op);
          calls = cell;
          std::snprintf(cell, sizeof cell, "%s%.3f", floors.empty() ? "" : " / ",
                        static_cast<double>(o.peak_live_pages) / static_cast<double>(std::max<std::size_t>(o.r.peak_live, 1)));
          floors += cell;
        }
      }
      std::printf(" %s%s |", ratios.c_str(), calls.c_str());
    }
    std::printf(" %.3f | %s |\n", worst, floors.c_str());
    std::fflush(stdout);
  }
  if (!json_path.empty() && !write_json(json_path, traces, scales, loaded, cells)) {
    std::fprintf(stderr, "mapped_variants: cannot write %s\n", json_path.c_str());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv)
{
  bool device = false;
  int repeats = 1;
  std::string dir = "bench/traces";
  std::string json_path;
  std::vector<std::string> traces{"bert_train_varlen", "llama_generate", "resnet50_train", "vit_train_2streams"};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device") device = true;
    else if (arg == "--repeat" && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--traces" && i + 1 < argc) traces = split_names(argv[++i]);
    else if (arg == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (!arg.empty() && arg[0] == '-') {
      std::fprintf(stderr, "usage: %s [--device] [--repeat N] [--traces a,b,...] [--json FILE] [TRACE_DIR]\n", argv[0]);
      return 2;
    }
    else dir = arg;
  }
  if (traces.empty()) {
    std::fprintf(stderr, "mapped_variants: --traces names no trace\n");
    return 2;
  }
  try {
    if (!device) return run<simulated_pages>(dir, traces, {0.9, 1.0, 1.1}, repeats, false, [] { return simulated_pages{}; }, json_path);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      std::fprintf(stderr, "mapped_variants: --device needs a GPU, and none is present\n");
      return 1;
    }
    return run<driver_pages>(dir, traces, {1.0}, repeats, true, [] { return driver_pages{}; }, json_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mapped_variants: %s\n", e.what());
    return 1;
  }
}
