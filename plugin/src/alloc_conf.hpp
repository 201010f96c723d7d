#pragma once
// The plug-in's configuration string (STRATA_ALLOC_CONF), parsed into a struct. Header-only and free of CUDA
// so that every accepted and refused string is tested on the host (plugin/tests/test_alloc_conf.cpp).
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace strata::plugin {

/// Which stack serves each device.
enum class stack_kind {
  default_pool,  ///< strata::default_pool: stream_ordered<mapped_pool<driver_pages>> (the recommended stack)
  coalescing,    ///< stream_ordered<coalescing_pool<device_source>>: chunked TLSF over cudaMalloc
  simulated,     ///< strata::planning_pool: the same policy over simulated pages and streams (no GPU needed)
};

inline const char* name_of(stack_kind k) noexcept
{
  switch (k) {
  case stack_kind::default_pool: return "default";
  case stack_kind::coalescing: return "coalescing";
  case stack_kind::simulated: return "simulated";
  }
  return "?";
}

/// A bad configuration: the message names the key and the value that were refused.
struct conf_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct alloc_conf {
  stack_kind stack = stack_kind::default_pool;
  /// At most this share of each device's memory held from CUDA (limit=0.9)...
  std::optional<double> limit_fraction;
  /// ...or at most this many bytes per device (limit=40GiB). At most one of the two is set.
  std::optional<std::size_t> limit_bytes;
  /// Trace file of every allocation and free (record=PATH); device d > 0 writes PATH.d. Empty: no trace.
  std::string record;
  enum class peer_mode { none, all, list } peers = peer_mode::none;
  std::vector<int> peer_list;  ///< with peer_mode::list: the devices that may access each device's memory
  bool release_on_oom = true;  ///< on out-of-memory, release idle memory of the device and retry once
  /// stream_ordered's owner_cover_window (owner_cover_window=N, or =always: SIZE_MAX): after this many frees
  /// of the main stream that no other stream needed, they carry no event (see stream_options in plugin/src/stack_builder.cpp).
  std::size_t owner_cover_window = 4096;
  /// stream_ordered's check_capture. false (default): streams are asked whether they are being captured only
  /// while PyTorch has announced a capture (begin_allocate_to_pool), as its own allocator does; true: at every
  /// call (a driver call each, for captures PyTorch does not know of).
  bool check_capture = false;
  /// stack=default: what the page-mapped pool does when a new mapping would lift it past its high-water mark.
  /// relocate_idle (default; mapped_pool's relocate_idle): idle mappings elsewhere are mapped again where the
  /// memory is needed (no device wait; what they cannot cover is reclaimed as with high_water); high_water:
  /// idle mappings go back after one device-wide wait on the host (the least memory); never: only at the cap,
  /// empty_cache or out of memory.
  enum class reclaim_mode { relocate_idle, high_water, never };
  reclaim_mode reclaim = reclaim_mode::relocate_idle;
  /// stack=default: mapped_pool's reclaim_slack_fraction (a share of the live bytes, 0 to 1): idle mappings go
  /// back only once the pool holds more than its live bytes by this share. Each reclaim is a device-wide wait
  /// on the host; some slack lets a training loop settle without one per step.
  double reclaim_slack_fraction = 0.0;
  /// stack=default: mapped_pool's reclaim_headroom_fraction (0 to 1): after a reclaim that kept the pool at its
  /// high-water mark, the mark rises by this share, so a training loop stops waiting for the device at its
  /// peak every step.
  double reclaim_headroom_fraction = 0.0;
  /// stack=coalescing: coalescing_pool's return_free_chunks. true (the library's default): before growing, the
  /// pool hands wholly free chunks back (cudaFree, which waits for the whole device); false: it keeps them
  /// until empty_cache or out of memory, as PyTorch's allocator keeps its segments.
  bool return_free_chunks = true;
  // stack=simulated only: the pretend devices.
  std::size_t sim_capacity = std::size_t{80} << 30;  ///< memory of each simulated device
  std::size_t sim_page = std::size_t{2} << 20;       ///< its page size
  int sim_devices = 1;                               ///< how many simulated devices exist
};

namespace detail_conf {

inline std::string_view trim(std::string_view s) noexcept
{
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

[[noreturn]] inline void refuse(std::string_view key, std::string_view value, std::string_view why)
{
  throw conf_error("STRATA_ALLOC_CONF: " + std::string(key) + "=" + std::string(value) + ": " + std::string(why));
}

/// A whole-string non-negative integer, or nullopt.
inline std::optional<std::uint64_t> parse_uint(std::string_view s) noexcept
{
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

/// A whole-string finite decimal number, or nullopt.
inline std::optional<double> parse_double(std::string_view s) noexcept
{
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::fixed);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

/// "40GiB", "512MiB", "4096B", "1.5GiB", "10GB": bytes; nullopt when the unit is missing or unknown.
inline std::optional<std::size_t> parse_size(std::string_view s)
{
  struct unit {
    std::string_view name;
    double factor;
  };
  static constexpr unit units[] = {{"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
                                   {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
                                   {"TB", 1e12}, {"B", 1.0}};
  for (const unit& u : units) {
    if (s.size() <= u.name.size() || s.substr(s.size() - u.name.size()) != u.name) continue;
    const std::string_view number = trim(s.substr(0, s.size() - u.name.size()));
    const std::optional<double> v = parse_double(number);
    if (!v || *v <= 0) return std::nullopt;
    const double bytes = *v * u.factor;
    if (bytes >= 18446744073709551615.0 || bytes != std::floor(bytes)) return std::nullopt;
    return static_cast<std::size_t>(bytes);
  }
  return std::nullopt;
}

inline void parse_limit(alloc_conf& c, std::string_view key, std::string_view value)
{
  if (const auto bytes = parse_size(value)) {
    c.limit_bytes = *bytes;
    return;
  }
  const auto f = parse_double(value);
  if (!f) refuse(key, value, "neither a fraction in (0, 1] of the device's memory nor a whole number of bytes with a unit (e.g. 0.9, 40GiB, 512MiB)");
  if (!(*f > 0.0 && *f <= 1.0)) refuse(key, value, "a fraction must be in (0, 1]; for bytes give a unit (e.g. 40GiB)");
  c.limit_fraction = *f;
}

inline void parse_peers(alloc_conf& c, std::string_view key, std::string_view value)
{
  if (value == "all") c.peers = alloc_conf::peer_mode::all;
  else if (value == "none") c.peers = alloc_conf::peer_mode::none;
  else {
    c.peers = alloc_conf::peer_mode::list;
    std::string_view rest = value;
    while (true) {
      const std::size_t colon = rest.find(':');
      const std::string_view item = trim(rest.substr(0, colon));
      const auto id = parse_uint(item);
      if (!id || *id > 1023) refuse(key, value, "expected all, none or device ids separated by ':' (e.g. peers=1:2); '" + std::string(item) + "' is not a device id");
      for (int seen : c.peer_list)
        if (seen == static_cast<int>(*id)) refuse(key, value, "device " + std::string(item) + " is listed twice");
      c.peer_list.push_back(static_cast<int>(*id));
      if (colon == std::string_view::npos) break;
      rest = rest.substr(colon + 1);
    }
  }
}

inline bool parse_bool(std::string_view key, std::string_view value)
{
  if (value == "true" || value == "1") return true;
  if (value == "false" || value == "0") return false;
  refuse(key, value, "expected true or false");
}

/// A share in [0, 1]; `what` completes "expected a share ..." in the refusal.
inline double parse_share(std::string_view key, std::string_view value, std::string_view what)
{
  const auto f = parse_double(value);
  if (!f || !(*f >= 0.0 && *f <= 1.0)) refuse(key, value, "expected a share " + std::string(what));
  return *f;
}

/// Keys spelled before they followed the library's option names: refused, naming the new spelling.
inline void refuse_renamed(std::string_view key, std::string_view value)
{
  struct renamed {
    std::string_view old_key, new_spelling;
  };
  constexpr renamed table[] = {{"owner_event_window", "owner_cover_window (stream_ordered's option)"},
                               {"capture_check", "check_capture=true|false (stream_ordered's option; always is true)"},
                               {"reclaim_slack", "reclaim_slack_fraction (mapped_pool's option)"},
                               {"reclaim_headroom", "reclaim_headroom_fraction (mapped_pool's option)"}};
  for (const renamed& r : table)
    if (key == r.old_key)
      throw conf_error("STRATA_ALLOC_CONF: '" + std::string(key) + "' (in " + std::string(key) + "=" + std::string(value) +
                       ") is now spelled " + std::string(r.new_spelling));
  if (key == "reclaim" && value == "relocate")
    throw conf_error("STRATA_ALLOC_CONF: reclaim=relocate is now spelled reclaim=relocate_idle (mapped_pool's option)");
}

inline void apply(alloc_conf& c, std::string_view key, std::string_view value)
{
  refuse_renamed(key, value);
  if (key == "stack") {
    if (value == "default") c.stack = stack_kind::default_pool;
    else if (value == "coalescing") c.stack = stack_kind::coalescing;
    else if (value == "simulated") c.stack = stack_kind::simulated;
    else refuse(key, value, "unknown stack; the stacks are default, coalescing and simulated");
  } else if (key == "limit") {
    parse_limit(c, key, value);
  } else if (key == "record") {
    if (value.size() >= 3 && value.substr(value.size() - 3) == ".gz")
      refuse(key, value, "strata's recorder writes plain CSV and cannot compress; record to a .csv and compress it afterwards");
    c.record = std::string(value);
  } else if (key == "peers") {
    parse_peers(c, key, value);
  } else if (key == "release_on_oom") {
    c.release_on_oom = parse_bool(key, value);
  } else if (key == "owner_cover_window") {
    if (value == "always") {
      c.owner_cover_window = SIZE_MAX;
    } else {
      const auto n = parse_uint(value);
      if (!n || *n < 1) refuse(key, value, "expected always or a positive number of frees (e.g. 4096)");
      c.owner_cover_window = static_cast<std::size_t>(*n);
    }
  } else if (key == "check_capture") {
    c.check_capture = parse_bool(key, value);
  } else if (key == "reclaim") {
    if (value == "never") c.reclaim = alloc_conf::reclaim_mode::never;
    else if (value == "high_water") c.reclaim = alloc_conf::reclaim_mode::high_water;
    else if (value == "relocate_idle") c.reclaim = alloc_conf::reclaim_mode::relocate_idle;
    else refuse(key, value, "expected relocate_idle, high_water or never");
  } else if (key == "reclaim_slack_fraction") {
    c.reclaim_slack_fraction = parse_share(key, value, "of the live bytes from 0 to 1 (e.g. 0.02)");
  } else if (key == "reclaim_headroom_fraction") {
    c.reclaim_headroom_fraction = parse_share(key, value, "of the high-water mark from 0 to 1 (e.g. 0.0625)");
  } else if (key == "return_free_chunks") {
    c.return_free_chunks = parse_bool(key, value);
  } else if (key == "sim_capacity" || key == "sim_page") {
    const auto bytes = parse_size(value);
    if (!bytes) refuse(key, value, "expected a size with a unit (e.g. 16GiB, 2MiB)");
    (key == "sim_capacity" ? c.sim_capacity : c.sim_page) = *bytes;
    if (key == "sim_page" && (*bytes % 256 != 0 || (*bytes & (*bytes - 1)) != 0))
      refuse(key, value, "a page must be a power of two and a multiple of 256 bytes");
  } else if (key == "sim_devices") {
    const auto n = parse_uint(value);
    if (!n || *n < 1 || *n > 64) refuse(key, value, "expected a number of simulated devices from 1 to 64");
    c.sim_devices = static_cast<int>(*n);
  } else {
    throw conf_error("STRATA_ALLOC_CONF: unknown key '" + std::string(key) + "' (in " + std::string(key) + "=" +
                     std::string(value) +
                     "); the keys are stack, limit, record, peers, release_on_oom, owner_cover_window, check_capture, "
                     "reclaim, reclaim_slack_fraction, reclaim_headroom_fraction, return_free_chunks, sim_capacity, sim_page, "
                     "sim_devices");
  }
}

} // namespace detail_conf

/// Parses "key=value,key=value" (spaces around keys and values are ignored; an empty string means every
/// default). Throws conf_error naming the entry, key or value at fault: an unknown key, a bad value, a key
/// given twice, an entry without '=' or with an empty key or value, an empty entry between commas, a
/// simulation key without stack=simulated, peers without stack=default, return_free_chunks without
/// stack=coalescing.
inline alloc_conf parse_alloc_conf(std::string_view text)
{
  using namespace detail_conf;
  alloc_conf c;
  if (trim(text).empty()) return c;
  std::set<std::string, std::less<>> seen;
  std::string_view rest = text;
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view entry = trim(rest.substr(0, comma));
    if (entry.empty()) throw conf_error("STRATA_ALLOC_CONF: an empty entry (two commas, or a comma at an end) in '" + std::string(text) + "'");
    const std::size_t eq = entry.find('=');
    if (eq == std::string_view::npos) throw conf_error("STRATA_ALLOC_CONF: entry '" + std::string(entry) + "' is not key=value");
    const std::string_view key = trim(entry.substr(0, eq));
    const std::string_view value = trim(entry.substr(eq + 1));
    if (key.empty()) throw conf_error("STRATA_ALLOC_CONF: entry '" + std::string(entry) + "' has no key before '='");
    if (value.empty()) refuse(key, value, "empty value");
    if (!seen.emplace(key).second) refuse(key, value, "key '" + std::string(key) + "' is given twice");
    apply(c, key, value);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (c.stack != stack_kind::simulated)
    for (const char* k : {"sim_capacity", "sim_page", "sim_devices"})
      if (seen.contains(std::string_view(k)))
        throw conf_error(std::string("STRATA_ALLOC_CONF: key '") + k + "' applies only to stack=simulated (the stack is " +
                         name_of(c.stack) + ")");
  if (c.stack != stack_kind::default_pool && seen.contains(std::string_view("peers")))
    throw conf_error(std::string("STRATA_ALLOC_CONF: key 'peers' applies only to stack=default (the stack is ") +
                     name_of(c.stack) + ")");
  if (c.stack != stack_kind::coalescing && seen.contains(std::string_view("return_free_chunks")))
    throw conf_error(std::string("STRATA_ALLOC_CONF: key 'return_free_chunks' applies only to stack=coalescing (the stack is ") +
                     name_of(c.stack) + ")");
  if (c.stack == stack_kind::simulated && c.sim_capacity < c.sim_page)
    throw conf_error("STRATA_ALLOC_CONF: sim_capacity=" + std::to_string(c.sim_capacity) + " is less than one page (sim_page=" +
                     std::to_string(c.sim_page) + ")");
  return c;
}

/// What PyTorch's own allocator settings (PYTORCH_CUDA_ALLOC_CONF, or PYTORCH_ALLOC_CONF) mean for strata.
struct torch_conf_reading {
  /// per_process_memory_fraction: the share of each device's memory strata may hold, as
  /// set_per_process_memory_fraction caps it (with limit= as well, the smaller cap holds).
  std::optional<double> fraction;
  /// Settings with no effect under strata, each with the reason: the backend passes them on as warnings.
  std::vector<std::string> notes;
};

/// Reads PyTorch's allocator settings ("key:value,key:value"; a value may be a bracketed list such as
/// roundup_power2_divisions:[64:8,>:1]) for the stack strata serves. Every key PyTorch 2.11 knows is honoured,
/// passed to PyTorch (its pinned host allocator's keys, which strata does not replace), noted as having no
/// effect with the reason, or refused: conf_error naming the key and what to use instead.
inline torch_conf_reading parse_torch_alloc_conf(std::string_view text, stack_kind stack)
{
  using detail_conf::trim;
  torch_conf_reading out;
  auto refuse = [](std::string_view key, std::string_view value, const std::string& why) -> void {
    throw conf_error("PYTORCH_CUDA_ALLOC_CONF: " + std::string(key) + ":" + std::string(value) + ": " + why);
  };
  auto note = [&](std::string_view key, std::string_view value, const std::string& why) {
    out.notes.push_back("PYTORCH_CUDA_ALLOC_CONF: " + std::string(key) + ":" + std::string(value) + " has no effect under strata: " + why);
  };
  auto truthy = [&](std::string_view key, std::string_view value) {
    if (value == "True" || value == "true" || value == "1") return true;
    if (value == "False" || value == "false" || value == "0") return false;
    refuse(key, value, "expected True or False");
    return false;
  };
  std::size_t i = 0;
  while (i < text.size()) {
    // One entry: up to the next comma outside brackets.
    std::size_t end = i;
    int depth = 0;
    for (; end < text.size() && !(text[end] == ',' && depth == 0); ++end) {
      if (text[end] == '[') ++depth;
      else if (text[end] == ']' && --depth < 0) throw conf_error("PYTORCH_CUDA_ALLOC_CONF: an unopened ']' in '" + std::string(text) + "'");
    }
    if (depth != 0) throw conf_error("PYTORCH_CUDA_ALLOC_CONF: an unclosed '[' in '" + std::string(text) + "'");
    const std::string_view entry = trim(text.substr(i, end - i));
    i = end + 1;
    if (entry.empty()) continue;
    const std::size_t colon = entry.find(':');
    if (colon == std::string_view::npos) throw conf_error("PYTORCH_CUDA_ALLOC_CONF: entry '" + std::string(entry) + "' is not key:value");
    const std::string_view key = trim(entry.substr(0, colon));
    const std::string_view value = trim(entry.substr(colon + 1));
    if (key == "per_process_memory_fraction") {
      const auto f = detail_conf::parse_double(value);
      if (!f || !(*f >= 0.0 && *f <= 1.0)) refuse(key, value, "per_process_memory_fraction is invalid: expected a fraction in [0, 1]");
      out.fraction = *f;
    } else if (key == "backend") {
      if (value != "native")
        refuse(key, value, "strata is PyTorch's allocator backend here; use backend:native or leave the key out (or do not enable strata)");
    } else if (key == "expandable_segments") {
      if (truthy(key, value))
        note(key, value, stack == stack_kind::coalescing
                             ? "stack=coalescing holds cudaMalloc'd chunks; stack=default is strata's page-mapped stack"
                             : "strata's page-mapped stack maps pages as the live bytes need them already");
    } else if (key == "garbage_collection_threshold") {
      refuse(key, value, "strata gives idle memory back by its own rule, not by age; the nearest settings are STRATA_ALLOC_CONF's "
                         "reclaim=high_water (idle mappings go back before the pool grows past its high-water mark) and "
                         "reclaim_slack_fraction");
    } else if (key == "max_split_size_mb") {
      if (stack == stack_kind::coalescing)
        refuse(key, value, "stack=coalescing splits any free block to fit a request; it has no split-size limit (stack=default "
                           "maps pages, where a split block's free pages go back one by one)");
      note(key, value, "strata's page-mapped stack gives a split block's free pages back one by one, so an oversize block "
                       "left split wastes no memory beyond its own pages");
    } else if (key == "max_non_split_rounding_mb" || key == "roundup_power2_divisions" || key == "large_segment_size_mb") {
      note(key, value, "strata sizes its blocks and segments by its own rules (PyTorch's rounding and segment sizes are its "
                       "caching allocator's)");
    } else if (key == "release_lock_on_cudamalloc" || key == "release_lock_on_hipmalloc") {
      (void)truthy(key, value);
      note(key, value, "strata holds the device's lock only around its own bookkeeping and driver calls");
    } else if (key == "graph_capture_record_stream_reuse") {
      (void)truthy(key, value);  // honoured: the backend reads PyTorch's own setting (capture_order.hpp)
    } else if (key == "pinned_use_cuda_host_register" || key == "pinned_use_hip_host_register" ||
               key == "pinned_num_register_threads" || key == "pinned_reserve_segment_size_mb" ||
               key == "pinned_use_background_threads") {
      // PyTorch's pinned host allocator reads these itself: strata replaces only the device allocator.
    } else {
      throw conf_error("PYTORCH_CUDA_ALLOC_CONF: unknown key '" + std::string(key) + "' (PyTorch 2.11 refuses it too)");
    }
  }
  return out;
}

} // namespace strata::plugin
