// strata-plan: would this workload fit, with which stack, and in how much memory? Replays allocation traces
// (strata's CSV, plain or gzip, or a PyTorch memory snapshot pickle) through strata's stacks and two
// baselines on simulated memory, and prints per stack the peaks, the smallest capacity it fits in, and
// whether it fits the capacity asked for. docs/planner.md is the manual.
//   strata-plan TRACE... [--stacks a,b,...] [--capacity 80GiB|H100-80GB|...] [--scale F] [--json FILE]
//               [--html FILE] [--device] [--no-progress] [--threads N]
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <strata/default_pool.hpp>
#include <strata/source/device_source.hpp>

#include "planner.hpp"

// The memory map viewer (tools/viewer, target strata_viewer) when the build has it: --html needs it.
#ifdef STRATA_PLAN_VIEWER
#include "viewer/html_report.hpp"
#define STRATA_PLAN_HAVE_VIEWER 1
#else
#define STRATA_PLAN_HAVE_VIEWER 0
#endif

#ifndef STRATA_PLAN_CONVERTER
#define STRATA_PLAN_CONVERTER ""
#endif

namespace {

using namespace strata;
using namespace strata::plan;

/// Bad command line or bad input: the message is printed and the exit code is 2.
struct usage_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr const char* usage_text =
    "usage: strata-plan TRACE... [--stacks a,b,...] [--capacity SIZE|DEVICE] [--scale F] [--json FILE] [--html FILE]\n"
    "                   [--device] [--no-progress] [--threads N]\n"
    "  TRACE: strata's trace (CSV op,id,bytes,stream; plain or .gz) or a PyTorch snapshot (.pickle, from\n"
    "         torch.cuda.memory._dump_snapshot(); converted with tools/plan/torch_snapshot.py)\n"
    "  --capacity: 80GiB, 80GB, 81920MiB, 4096B (a unit is required), or a device (H100-80GB, H200, A100-40GB, L4, ...)\n";

struct options {
  std::vector<std::string> traces;
  std::vector<std::string> stacks;
  std::optional<std::size_t> capacity;
  std::string capacity_text;
  double scale = 1.0;
  std::string json_path, html_path;
  bool device = false, progress = true;
  unsigned threads = 0;
};

std::vector<std::string> split(const std::string& list)
{
  std::vector<std::string> parts;
  std::stringstream in(list);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

options parse_args(int argc, char** argv)
{
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw usage_failure(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--stacks") o.stacks = split(value());
    else if (arg == "--capacity") {
      o.capacity_text = value();
      try {
        o.capacity = parse_capacity(o.capacity_text);
      } catch (const std::invalid_argument& e) {
        throw usage_failure(e.what());
      }
    } else if (arg == "--scale") {
      const std::string v = value();
      char* end = nullptr;
      o.scale = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(o.scale > 0) || o.scale > 1e6) throw usage_failure("--scale `" + v + "`: not a positive number");
    } else if (arg == "--json") o.json_path = value();
    else if (arg == "--html") o.html_path = value();
    else if (arg == "--device") o.device = true;
    else if (arg == "--no-progress") o.progress = false;
    else if (arg == "--threads") {
      const std::string v = value();
      o.threads = static_cast<unsigned>(std::strtoul(v.c_str(), nullptr, 10));
      if (o.threads == 0) throw usage_failure("--threads `" + v + "`: not a positive number");
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    } else if (arg.rfind("--", 0) == 0) throw usage_failure("unknown option " + arg);
    else o.traces.push_back(arg);
  }
  if (o.traces.empty()) throw usage_failure("no trace given");
  return o;
}

std::vector<replay::stack_spec> chosen_stacks(const std::vector<std::string>& names)
{
  auto all = replay::standard_stacks();
  if (names.empty()) return all;
  std::vector<replay::stack_spec> chosen;
  for (const auto& name : names) {
    auto it = std::find_if(all.begin(), all.end(), [&](const auto& s) { return s.key == name; });
    if (it == all.end()) {
      std::string known;
      for (const auto& s : all) known += (known.empty() ? "" : ", ") + s.key;
      throw usage_failure("--stacks: unknown stack `" + name + "` (known: " + known + ")");
    }
    chosen.push_back(*it);
  }
  return chosen;
}

bool ends_with(const std::string& s, const std::string& tail) { return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0; }

std::string shell_quote(const std::string& s)
{
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// The converter beside the program (installed) or in the source tree it was built from.
std::string converter_path(const char* argv0)
{
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path self = fs::canonical("/proc/self/exe", ec);
  for (const fs::path& p : {ec ? fs::path() : self.parent_path() / "torch_snapshot.py", fs::path(STRATA_PLAN_CONVERTER)})
    if (!p.empty() && fs::exists(p)) return p.string();
  (void)argv0;
  throw usage_failure("cannot find tools/plan/torch_snapshot.py to convert a PyTorch snapshot; run it yourself: "
                      "python3 tools/plan/torch_snapshot.py SNAPSHOT.pickle -o TRACE.csv");
}

/// A .pickle goes through tools/plan/torch_snapshot.py (python3, standard library only) into a temporary trace.
std::vector<replay::trace_event> load(const std::string& path, const char* argv0)
{
  if (!ends_with(path, ".pickle") && !ends_with(path, ".pkl")) return replay::read_trace(path);
  char name[] = "/tmp/strata-plan-XXXXXX";
  const int fd = ::mkstemp(name);
  if (fd < 0) throw std::runtime_error(std::string("cannot create a temporary file: ") + std::strerror(errno));
  ::close(fd);
  const std::string command = "python3 " + shell_quote(converter_path(argv0)) + " " + shell_quote(path) + " -o " + shell_quote(name) + " --quiet";
  const int status = std::system(command.c_str());
  if (status != 0) {
    std::remove(name);
    throw usage_failure(path + ": the PyTorch snapshot converter failed (its message is above)");
  }
  try {
    auto events = replay::read_trace(name);
    std::remove(name);
    return events;
  } catch (...) {
    std::remove(name);
    throw;
  }
}

/// One line on stderr, redrawn: only on a terminal (a log gets no bar at all).
struct progress_bar {
  bool enabled;
  std::string label;
  int drawn = -1;
  /// `fraction`: of the stacks' first replays; the search that follows each is counted by stacks done.
  void operator()(std::size_t done, std::size_t total, double replayed)
  {
    const double fraction = total == 0 ? 1.0 : 0.5 * replayed + 0.5 * static_cast<double>(done) / static_cast<double>(total);
    const int percent = static_cast<int>(100 * fraction) * 1000 + static_cast<int>(done);
    if (!enabled || percent == drawn) return;  // redraw only when what it shows changes
    drawn = percent;
    const int width = 30, filled = static_cast<int>(fraction * width + 0.5);
    std::fprintf(stderr, "\r%-40.40s [%.*s%*s] %3.0f%%  %zu/%zu stacks", label.c_str(), filled, "##############################",
                 width - filled, "", 100.0 * fraction, done, total);
    std::fflush(stderr);
  }
  void finish()
  {
    if (enabled) std::fprintf(stderr, "\r%*s\r", 100, "");
  }
};

// ---- the GPU replay (--device) ---------------------------------------------------------------------------

std::size_t device_used()
{
  std::size_t free = 0, total = 0;
  detail::cuda_check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total - free;
}

/// The trace's streams as real CUDA streams (0: the legacy default stream); destroyed after the pool is.
struct device_streams {
  std::unordered_map<int, cudaStream_t> streams;
  cuda::stream_ref of(int n)
  {
    if (n == 0) return cuda::stream_ref{cudaStreamLegacy};
    auto it = streams.find(n);
    if (it == streams.end()) {
      cudaStream_t s = nullptr;
      detail::cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      it = streams.emplace(n, s).first;
    }
    return cuda::stream_ref{it->second};
  }
  ~device_streams()
  {
    cudaDeviceSynchronize();
    for (auto& [n, s] : streams) cudaStreamDestroy(s);
  }
};

/// Replays on device memory through the real default_pool and the cudaMalloc baseline, with the same replay
/// loop as the simulated stacks. Peak reserved: default_pool's physical memory by its own count; for
/// cudaMalloc, the rise in cudaMemGetInfo's used memory (what the device really gave).
std::vector<replay::replay_result> replay_on_device(const std::vector<replay::trace_event>& events)
{
  std::vector<replay::replay_result> results;
  replay::run_options o;
  o.timed = true;
  {
    device_streams streams;
    default_pool_options device_options;
    device_options.max_fraction = 0.95;  // leave the rest to the CUDA context and the cudaMalloc replay's teardown
    default_pool pool = make_default_pool(device_options);
    replay::driver d{[&](const replay::trace_event& e) { return pool.allocate_async(e.bytes, 256, streams.of(e.stream)); },
                     [&](void* p, std::size_t bytes, const replay::trace_event& e) { pool.deallocate_async(p, bytes, 256, streams.of(e.stream)); },
                     [](const replay::trace_event&) {}, [&] { return pool.policy().physical_bytes(); }, [&] { return pool.usage().largest_free; },
                     [&] { return pool.policy().snapshot(); }};
    auto r = replay::run("default_pool (on the GPU)", d, events, o);
    replay::detail::add_page_calls(r, pool.policy().page_calls());
    results.push_back(std::move(r));
    detail::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  {
    device_source source;
    const std::size_t base = device_used();
    std::size_t calls = 0;
    replay::driver d{[&](const replay::trace_event& e) {
                       void* p = source.allocate(e.bytes, 256);  // throws when refused: only served ones count
                       ++calls;
                       return p;
                     },
                     [&](void* p, std::size_t bytes, const replay::trace_event&) {
                       ++calls;
                       source.deallocate(p, bytes, 256);
                     },
                     [](const replay::trace_event&) {}, [&] {
                       const std::size_t used = device_used();  // another process may free memory meanwhile
                       return used > base ? used - base : std::size_t{0};
                     }, [] { return std::size_t{0}; },
                     [] { return strata::snapshot{}; }};
    auto r = replay::run("cudaMalloc per tensor (on the GPU)", d, events, o);
    r.upstream_calls = calls;
    r.upstream_allocations = r.allocations;  // one cudaMalloc per tensor served
    results.push_back(std::move(r));
  }
  return results;
}

std::string gpu_name()
{
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return {};
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return {};
  return prop.name;
}

std::string device_json(const std::string& name, const std::vector<replay::replay_result>& results)
{
  std::string out = "\"gpu\":{\"device\":" + json_string(name) + ",\"stacks\":[";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    out += (i ? "," : "") + std::string("{\"name\":") + json_string(r.stack) + ",\"peak_live\":" + std::to_string(r.peak_live) +
           ",\"peak_reserved\":" + std::to_string(r.peak_reserved) + ",\"ratio\":" + json_number(r.ratio()) +
           ",\"ns_per_op\":" + json_number(r.ns_per_op) + ",\"upstream_calls\":" + std::to_string(r.upstream_calls) +
           ",\"failure\":" + (r.failed ? json_string(r.failure) : std::string("null")) + "}";
  }
  return out + "]}";
}

void write_file(const std::string& path, const std::string& text)
{
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.good()) throw std::runtime_error("cannot write " + path);
}

int run(int argc, char** argv)
{
  const options o = parse_args(argc, argv);
  const auto stacks = chosen_stacks(o.stacks);
  if (!o.html_path.empty() && !STRATA_PLAN_HAVE_VIEWER)
    throw usage_failure("--html: this strata-plan was built without the memory map viewer (tools/viewer)");
  std::string gpu;
  if (o.device) {
    gpu = gpu_name();
    std::printf(gpu.empty() ? "--device: no GPU here: simulated memory only\n" : "--device: on the GPU (%s) as well as on simulated memory\n",
                gpu.c_str());
  }
  std::vector<trace_plan> plans;
  std::vector<std::string> extra;
  for (const auto& path : o.traces) {
    auto events = load(path, argv[0]);
    if (o.scale != 1.0) replay::scale_sizes(events, o.scale);
    progress_bar bar{o.progress && ::isatty(2) != 0, std::filesystem::path(path).filename().string()};
    plan_options po{.capacity = o.capacity, .scale = o.scale, .threads = o.threads,
                    .progress = [&](std::size_t done, std::size_t total, double f) { bar(done, total, f); }};
    plans.push_back(plan_trace(path, events, stacks, po));
    bar.finish();
    print_plan(stdout, plans.back());
    extra.emplace_back();
    if (!gpu.empty()) {
      const auto on_gpu = replay_on_device(events);
      std::printf("on the GPU (%s):\n", gpu.c_str());
      for (const auto& r : on_gpu) {
        if (r.failed) std::printf("  %-40s FAILED after %zu operations: %s\n", r.stack.c_str(), r.operations, r.failure.c_str());
        else
          std::printf("  %-40s peak live %s, peak reserved %s (%.3fx), %.0f ns/op\n", r.stack.c_str(), format_bytes(r.peak_live).c_str(),
                      format_bytes(r.peak_reserved).c_str(), r.ratio(), r.ns_per_op);
      }
      extra.back() = device_json(gpu, on_gpu);
    }
    std::fflush(stdout);
  }
  const std::string json = to_json(plans, extra);
  if (!o.json_path.empty()) write_file(o.json_path, json);
#if STRATA_PLAN_HAVE_VIEWER
  if (!o.html_path.empty()) write_file(o.html_path, strata::viewer::render_html(json));
#endif
  if (!o.html_path.empty()) std::printf("memory map: %s\n", o.html_path.c_str());
  return 0;
}

} // namespace

int main(int argc, char** argv)
{
  try {
    return run(argc, argv);
  } catch (const usage_failure& e) {
    std::fprintf(stderr, "strata-plan: %s\n", e.what());
    if (std::strstr(e.what(), "no trace given") || std::strstr(e.what(), "unknown option")) std::fputs(usage_text, stderr);
    return 2;
  } catch (const replay::trace_error& e) {
    std::fprintf(stderr, "strata-plan: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata-plan: %s\n", e.what());
    return 1;
  }
}
