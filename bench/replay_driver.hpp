#pragma once
// The part of replay shared by the host and GPU programs: drive a stack through a trace, time it, and
// track peak live (what the program asked for) and peak reserved (what the upstream handed to the stack).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <strata/core/errors.hpp>
#include <strata/pages/page_backend.hpp>
#include "trace.hpp"

namespace strata::bench {

struct replay_result {
  std::string stack;
  std::size_t operations = 0;
  double ns_per_op = 0;
  std::size_t peak_live = 0;
  std::size_t peak_reserved = 0;
  bool failed = false;
  std::string failure;
  bool has_page_calls = false;  ///< page-mapped stacks: the driver calls they made
  page_counters page_calls{};
  double per_1000_ops(std::uint64_t calls) const
  {
    return operations == 0 ? 0 : 1000.0 * static_cast<double>(calls) / static_cast<double>(operations);
  }
  double ratio() const { return peak_live == 0 ? 0 : static_cast<double>(peak_reserved) / static_cast<double>(peak_live); }
};

/// `reserved()` reads what the stack's upstream holds now; it is sampled after every allocation.
template <class Stack, class Reserved>
replay_result replay_with(std::string name, Stack& stack, Reserved reserved, const std::vector<trace_event>& events)
{
  replay_result r{.stack = std::move(name)};
  std::unordered_map<std::uint64_t, std::pair<void*, std::size_t>> live;
  live.reserve(events.size());
  std::size_t live_bytes = 0;
  double seconds = 0;
  try {
    for (const auto& e : events) {
      const auto start = std::chrono::steady_clock::now();
      if (e.allocate) {
        void* p = stack.allocate(e.bytes, 256);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        live[e.id] = {p, e.bytes};
        live_bytes += e.bytes;
        r.peak_live = std::max(r.peak_live, live_bytes);
        r.peak_reserved = std::max(r.peak_reserved, static_cast<std::size_t>(reserved()));
      } else {
        auto it = live.find(e.id);
        if (it == live.end()) continue;  // freed before the trace began
        stack.deallocate(it->second.first, it->second.second, 256);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        live_bytes -= it->second.second;
        live.erase(it);
      }
      ++r.operations;
    }
  } catch (const std::exception& e) {
    r.failed = true;
    r.failure = e.what();
  }
  for (auto& [id, block] : live) stack.deallocate(block.first, block.second, 256);
  r.ns_per_op = r.operations == 0 ? 0 : seconds * 1e9 / static_cast<double>(r.operations);
  return r;
}

/// For stacks over simulated_source: the source's own peak is the stack's peak reserved.
template <class Stack, class Source>
replay_result replay(std::string name, Stack& stack, Source& source, const std::vector<trace_event>& events)
{
  return replay_with(std::move(name), stack, [&] { return source.allocated_bytes(); }, events);
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
        << ",\"failed\":" << (r.failed ? "true" : "false");
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

} // namespace strata::bench
