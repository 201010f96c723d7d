#pragma once
// strata-plan's work, apart from its command line: replay a trace through each named stack, find the smallest
// capacity each fits in, and report it as a terminal table and as the JSON the memory map viewer renders
// (docs/planner.md gives the schema).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include <strata/core/snapshot.hpp>

#include "../replay/replay.hpp"
#include "capacity.hpp"

namespace strata::plan {

using replay::replay_result;
using replay::stack_spec;
using replay::trace_event;

/// The capacity search steps in pages of 2 MiB: the granularity of cudaMalloc for large requests and of
/// page-mapped memory.
inline constexpr std::size_t granularity = std::size_t{2} << 20;
inline constexpr std::size_t timeline_points = 2000;

struct stack_plan {
  std::string key{}, description{};
  bool pages = false;
  replay_result result{};                ///< the replay on unlimited memory, with its timeline
  std::optional<strata::snapshot> map{};  ///< at result.peak_op
  std::size_t largest_free_at_peak = 0;
  std::optional<std::size_t> min_capacity{};  ///< none when the stack failed for another reason than memory
  bool min_capacity_exact = false;          ///< derived from peak reserved (else found by search)
  std::size_t probes = 0;                   ///< capped replays the search ran
  std::optional<bool> fits{};               ///< in the capacity asked for, if one was
  std::optional<std::size_t> request_segment{}, request_offset{};  ///< where the largest request would go at the peak
};

struct trace_plan {
  std::string name;
  std::size_t operations = 0;
  double scale = 1.0;
  std::optional<std::size_t> capacity;
  std::size_t largest_request = 0;
  std::vector<stack_plan> stacks{};
};

struct plan_options {
  std::optional<std::size_t> capacity{};
  double scale = 1.0;
  unsigned threads = 0;  ///< 0: one per core
  /// Called (under a lock, from any thread) as work finishes: stacks done, stacks in all, fraction of the
  /// current trace's first replays done.
  std::function<void(std::size_t, std::size_t, double)> progress{};
};

inline bool fits_in(const stack_spec& spec, const std::vector<trace_event>& events, std::size_t capacity)
{
  replay::run_options o;
  o.capacity = capacity;
  return !spec.run(events, o).failed;
}

/// The smallest multiple of `granularity` the stack replays the trace in, by bisection between a capacity
/// below peak live (which cannot fit) and peak reserved rounded up (which fits: nothing is ever refused
/// there). A stack that may hold less when refused (gives memory back, tries a smaller chunk) can fit below
/// its unlimited peak reserved: that is what the search finds. The result fits and one step less does not;
/// fitting is not strictly monotonic in the capacity, so a smaller capacity further down might fit again.
inline std::size_t search_min_capacity(const stack_spec& spec, const std::vector<trace_event>& events, const replay_result& unlimited,
                                       std::size_t& probes)
{
  if (unlimited.peak_live == 0) return 0;
  std::size_t lo = (unlimited.peak_live - 1) / granularity * granularity;  // below peak live: refused
  std::size_t hi = (unlimited.peak_reserved + granularity - 1) / granularity * granularity;
  hi = std::max(hi, lo + granularity);
  // At peak reserved nothing is refused, so the replay fits; checked, so that the bisection's premise holds
  // even for a stack that would behave differently under a cap it never reaches.
  for (int tries = 0; (++probes, !fits_in(spec, events, hi)); ++tries) {
    if (tries == 16) throw std::logic_error(spec.key + ": does not fit even in " + std::to_string(hi) + " bytes, above its peak reserved");
    lo = hi;
    hi += std::max(granularity, hi / 8 / granularity * granularity);
  }
  while (hi - lo > granularity) {
    const std::size_t mid = lo + (hi - lo) / granularity / 2 * granularity;
    ++probes;
    (fits_in(spec, events, mid) ? hi : lo) = mid;
  }
  return hi;
}

inline void locate_request(stack_plan& p, std::size_t request)
{
  if (!p.map || request == 0 || request > p.largest_free_at_peak) return;
  for (std::size_t s = 0; s < p.map->segments.size(); ++s)
    for (const auto& b : p.map->segments[s].blocks)
      if (b.free && b.size >= request) {
        p.request_segment = s;
        p.request_offset = b.offset;
        return;
      }
}

inline stack_plan plan_stack(const stack_spec& spec, const std::vector<trace_event>& events, const plan_options& opts,
                             std::size_t largest_request, const std::function<void(std::size_t)>& ops_done)
{
  stack_plan p{.key = spec.key, .description = spec.description, .pages = spec.pages};
  replay::run_options o;
  o.timeline_points = timeline_points;
  o.progress = ops_done;
  p.result = spec.run(events, o);
  if (p.result.failed) {  // even on unlimited memory: nothing to search (reported with its message)
    if (opts.capacity) p.fits = false;
    return p;
  }
  replay::run_options at_peak;
  at_peak.capture_at = p.result.peak_op;
  replay_result captured = spec.run(events, at_peak);
  p.map = std::move(captured.map);
  p.largest_free_at_peak = captured.largest_free_at_capture;
  locate_request(p, largest_request);
  p.min_capacity_exact = spec.exact_min_capacity;
  p.min_capacity = spec.exact_min_capacity ? p.result.peak_reserved : search_min_capacity(spec, events, p.result, p.probes);
  if (opts.capacity) {
    if (*opts.capacity >= p.result.peak_reserved) p.fits = true;  // never refused: the unlimited replay stands
    else if (spec.exact_min_capacity) p.fits = false;
    else p.fits = fits_in(spec, events, *opts.capacity);
  }
  return p;
}

/// Plans one trace through `stacks`, several stacks at once (each replay is independent).
inline trace_plan plan_trace(const std::string& name, const std::vector<trace_event>& events, const std::vector<stack_spec>& stacks,
                             const plan_options& opts)
{
  trace_plan plan{.name = name, .operations = events.size(), .scale = opts.scale, .capacity = opts.capacity};
  for (const auto& e : events)
    if (e.allocate) plan.largest_request = std::max(plan.largest_request, e.bytes);
  plan.stacks.resize(stacks.size());
  std::atomic<std::size_t> next{0}, finished{0}, ops{0};
  std::mutex report;
  auto tell = [&] {
    if (!opts.progress) return;
    std::scoped_lock lock(report);
    const double total = static_cast<double>(events.size() * stacks.size());
    opts.progress(finished.load(), stacks.size(), total == 0 ? 1.0 : static_cast<double>(ops.load()) / total);
  };
  auto worker = [&] {
    for (std::size_t i; (i = next++) < stacks.size();) {
      std::size_t seen = 0;
      plan.stacks[i] = plan_stack(stacks[i], events, opts, plan.largest_request, [&](std::size_t done) {
        ops += done - seen;
        seen = done;
        tell();
      });
      ++finished;
      tell();
    }
  };
  const unsigned cores = opts.threads != 0 ? opts.threads : std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < std::min<std::size_t>(cores, stacks.size()); ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  return plan;
}

// ---- output ------------------------------------------------------------------------------------------

inline std::string json_string(std::string_view s)
{
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else out += c;
  }
  return out + "\"";
}

template <class T>
std::string json_or_null(const std::optional<T>& v)
{
  if (!v) return "null";
  if constexpr (std::is_same_v<T, bool>) return *v ? "true" : "false";
  else return std::to_string(*v);
}

inline std::string json_array(const std::vector<std::size_t>& v)
{
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

inline std::string json_number(double d)
{
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", d);
  return text;
}

inline std::string to_json(const stack_plan& p, std::size_t largest_request)
{
  const replay_result& r = p.result;
  std::string out = "{\"name\":" + json_string(p.key) + ",\"description\":" + json_string(p.description);
  out += ",\"peak_live\":" + std::to_string(r.peak_live) + ",\"peak_reserved\":" + std::to_string(r.peak_reserved);
  out += ",\"ratio\":" + json_number(r.ratio()) + ",\"largest_free_at_peak\":" + std::to_string(p.largest_free_at_peak);
  out += ",\"upstream_calls\":" + std::to_string(r.upstream_calls);
  out += ",\"map_calls\":" + (p.pages ? std::to_string(r.page_calls.maps) : std::string("null"));
  out += ",\"unmap_calls\":" + (p.pages ? std::to_string(r.page_calls.unmaps) : std::string("null"));
  out += ",\"fits\":" + json_or_null(p.fits) + ",\"min_capacity\":" + json_or_null(p.min_capacity);
  out += ",\"min_capacity_method\":" + json_string(p.min_capacity_exact ? "exact" : "search");
  out += ",\"failure\":" + (r.failed ? json_string(r.failure) : std::string("null"));
  out += ",\"timeline\":{\"op\":" + json_array(r.line.op) + ",\"live\":" + json_array(r.line.live) + ",\"reserved\":" +
         json_array(r.line.reserved) + "}";
  if (!p.map) return out + ",\"peak_map\":null}";  // the stack failed: no peak to show
  out += ",\"peak_map\":{\"at_op\":" + std::to_string(r.peak_op) + ",\"snapshot\":" + strata::to_json(*p.map);
  out += ",\"largest_request\":{\"size\":" + std::to_string(largest_request) + ",\"segment\":" + json_or_null(p.request_segment) +
         ",\"offset\":" + json_or_null(p.request_offset) + "}}}";
  return out;
}

/// The report: {"tool":"strata-plan","version":1,"traces":[...]}; `extra` is appended to each trace object
/// (the GPU replay, when there was one), by index.
inline std::string to_json(const std::vector<trace_plan>& plans, const std::vector<std::string>& extra = {})
{
  std::string out = "{\"tool\":\"strata-plan\",\"version\":1,\"traces\":[";
  for (std::size_t t = 0; t < plans.size(); ++t) {
    const trace_plan& tp = plans[t];
    out += (t ? "," : "") + std::string("{\"trace\":") + json_string(tp.name) + ",\"operations\":" + std::to_string(tp.operations) +
           ",\"scale\":" + json_number(tp.scale) + ",\"capacity\":" + json_or_null(tp.capacity) + ",\"stacks\":[";
    for (std::size_t s = 0; s < tp.stacks.size(); ++s) {
      if (s) out += ',';
      out += to_json(tp.stacks[s], tp.largest_request);
    }
    out += "]";
    if (t < extra.size() && !extra[t].empty()) {
      out += ',';
      out += extra[t];
    }
    out += "}";
  }
  return out + "]}\n";
}

inline const stack_plan* find_stack(const trace_plan& plan, std::string_view key)
{
  for (const auto& s : plan.stacks)
    if (s.key == key) return &s;
  return nullptr;
}

inline void print_plan(std::FILE* out, const trace_plan& plan)
{
  std::fprintf(out, "\n%s: %zu operations%s, largest request %s", plan.name.c_str(), plan.operations,
               plan.scale != 1.0 ? (", sizes x" + json_number(plan.scale)).c_str() : "", format_bytes(plan.largest_request).c_str());
  if (plan.capacity) std::fprintf(out, ", capacity %s", format_bytes(*plan.capacity).c_str());
  std::fprintf(out, "\n%-68s %11s %11s %7s %11s %9s %13s %5s %12s\n", "stack", "peak live", "peak rsv", "rsv/live", "free@peak",
               "upstream", "map/unmap", "fits", "min capacity");
  for (const auto& s : plan.stacks) {
    const replay_result& r = s.result;
    if (r.failed) {
      std::fprintf(out, "%-68s FAILED after %zu operations: %s\n", s.description.c_str(), r.operations, r.failure.c_str());
      continue;
    }
    const std::string pages = s.pages ? std::to_string(r.page_calls.maps) + "/" + std::to_string(r.page_calls.unmaps) : "-";
    const std::string fits = s.fits ? (*s.fits ? "yes" : "NO") : "-";
    const std::string min = s.min_capacity ? format_bytes(*s.min_capacity) + (s.min_capacity_exact ? "" : "*") : "-";
    std::fprintf(out, "%-68s %11s %11s %7.3fx %11s %9llu %13s %5s %12s\n", s.description.c_str(), format_bytes(r.peak_live).c_str(),
                 format_bytes(r.peak_reserved).c_str(), r.ratio(), format_bytes(s.largest_free_at_peak).c_str(),
                 static_cast<unsigned long long>(r.upstream_calls), pages.c_str(), fits.c_str(), min.c_str());
  }
  std::fprintf(out, "min capacity: the smallest multiple of 2 MiB the replay fits in (* found by bisection over a capped simulated "
                    "device; otherwise exactly peak reserved). upstream: cudaMalloc+cudaFree calls, or cuMemCreate+cuMemRelease "
                    "for page-mapped stacks.\n");
  const stack_plan* best = find_stack(plan, "default_pool");
  const stack_plan* torch = find_stack(plan, "pytorch_caching");
  const stack_plan* malloc = find_stack(plan, "cudamalloc");
  if (best && best->min_capacity) {
    std::fprintf(out, "=> default_pool needs %s", format_bytes(*best->min_capacity).c_str());
    auto against = [&](const stack_plan* other, const char* what) {
      if (!other || !other->min_capacity || *other->min_capacity == 0) return;
      const double saved = 1.0 - static_cast<double>(*best->min_capacity) / static_cast<double>(*other->min_capacity);
      std::fprintf(out, "; %s %s (%s%.0f%%)", what, format_bytes(*other->min_capacity).c_str(), saved >= 0 ? "default_pool saves " : "default_pool needs more: ",
                   100.0 * std::abs(saved));
    };
    against(torch, "the PyTorch-like caching pool");
    against(malloc, "cudaMalloc per tensor");
    std::fprintf(out, "\n");
  }
}

} // namespace strata::plan
