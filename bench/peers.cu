// strata against the allocators its users have, in one run on one GPU, each called the way its users call it:
//   1. pair latency: allocate then free the same size, 256 B .. 1 GiB;
//   2. random allocations: 200,000 operations, up to 2,000 live, 50/50, sizes uniform in [1 B, 1 MiB] and
//      log-uniform in [256 B, 64 MiB];
//   3. replay of every trace given (the format of bench/traces/README.md) on real device memory, from a fresh allocator each time
//      (growth counted): ns per operation, peak reserved / peak live, and the device's own view (the rise in
//      cudaMemGetInfo's used memory over the replay). Streams as in the trace (0: the legacy default stream,
//      others created) for every allocator that takes a stream. Each trace is replayed once by every allocator
//      untimed (the device, the driver and the trace's streams warm), then --repeats times (default 3) in
//      rounds, the allocators' order rotated from round to round and reversed every other round: ns per
//      operation is the median of the rounds (their range beside it), the memory figures the first round's.
// Every row of the table in `all_stacks` is measured in every part; stream-ordered strata stacks run on a
// created stream in parts 1 and 2. The targets are stated against `recommended_stack`, fixed here before the
// run. Peers: cudaMalloc/cudaFree, cudaMallocAsync (own pool, release threshold at the maximum), CUB's
// CachingDeviceAllocator (defaults), Thrust's disjoint_unsynchronized_pool_resource over its CUDA memory
// resource; RMM's pool and arena through its stream API (bench/rmm_shim) and PyTorch's caching allocator,
// default and expandable segments (bench/torch_shim), when their shims are given.
//   peers [--json FILE] [--trace FILE]... [--traces DIR] [--rmm-shim PATH] [--torch-shim PATH] [--only TEXT] [--quick]
//         [--parts pair,random,replay] [--repeats N] [--no-warmup]
// --only keeps the rows whose name contains one of its comma-separated pieces.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <cub/util_allocator.cuh>
#include <thrust/mr/disjoint_pool.h>
#include <thrust/mr/new.h>
#include <thrust/system/cuda/memory_resource.h>

#include <strata/adaptor/segregator.hpp>
#include <strata/default_pool.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/core/ref.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/async_source.hpp>
#include <strata/source/device_source.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "bench_common.hpp"
#include "random_ops.hpp"
#include "../tools/replay/replay.hpp"

namespace {

/// The stack the README leads with: the targets in the summary are stated against it, and against no other.
constexpr const char* recommended_stack = "strata default_pool";

using clock_type = std::chrono::steady_clock;
using counted_device = strata::statistics<strata::device_source>;  // its current bytes: what a stack reserved
using strata::bench::median;
using strata::replay::trace_event;
using strata::bench::op;
using strata::bench::random_ops;

/// A CUDA error inside a measurement: thrown, so the row is reported as failed and the run goes on.
void require(cudaError_t status, const char* what)
{
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  }
}

// ---- The measurements, templates over the concrete allocator (no indirection of the harness's own) --------

/// Allocate then free `bytes`, repeated for about `budget` seconds (at least 3 pairs); ns per pair.
template <class S>
double pair_latency(S& a, std::size_t bytes, double budget)
{
  for (int i = 0; i < 3; ++i) a.deallocate(a.allocate(bytes, 256), bytes, 256);  // warm: pools hold the block now
  require(cudaDeviceSynchronize(), "sync");
  std::size_t pairs = 0;
  const auto t0 = clock_type::now();
  double elapsed = 0;
  while (pairs < 3 || elapsed < budget) {
    for (int i = 0; i < 64; ++i) a.deallocate(a.allocate(bytes, 256), bytes, 256);
    pairs += 64;
    elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (pairs >= 8'000'000) break;
  }
  return elapsed * 1e9 / static_cast<double>(pairs);
}

/// ns per operation over the sequence (the cleanup of what is still live is not timed), the device idle before
/// and after.
template <class S>
double run_random(S& a, const std::vector<op>& ops, std::size_t max_live)
{
  require(cudaDeviceSynchronize(), "sync");
  const double ns = strata::bench::run_ops(a, ops, max_live);
  require(cudaDeviceSynchronize(), "sync");
  return ns;
}

/// The bytes in use on the device (every process's), as cudaMemGetInfo sees them.
std::size_t device_used()
{
  std::size_t free_bytes = 0, total = 0;
  require(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  return total - free_bytes;
}

/// The trace's streams: 0 is the legacy default stream, the others are created (non-blocking, as PyTorch's
/// side streams are) on first use and live until the program ends, shared by every allocator.
class trace_streams {
public:
  cudaStream_t operator[](int n)
  {
    if (n == 0) return cudaStreamLegacy;
    auto it = created_.find(n);
    if (it == created_.end()) {
      cudaStream_t s = nullptr;
      require(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
      it = created_.emplace(n, s).first;
    }
    return it->second;
  }
  ~trace_streams()
  {
    for (auto [n, s] : created_) (void)cudaStreamDestroy(s);
  }

private:
  std::map<int, cudaStream_t> created_;
};

/// One replay on the device: as strata::replay::run, plus streams and the device's own view.
struct device_replay : strata::replay::replay_result {
  std::size_t device_peak = 0;         ///< peak rise of the device's used memory over the replay
  std::size_t own_peak_reserved = 0;   ///< the allocator's own statistics, where it keeps them (PyTorch)
  std::size_t own_peak_allocated = 0;
  /// The device calls the allocator made over the replay, by kind, where it counts them: strata's page-mapped
  /// stacks their page calls, PyTorch's allocator its num_device_alloc / num_device_free.
  std::vector<std::pair<std::string, std::uint64_t>> device_calls;
  double device_ratio() const { return peak_live == 0 ? 0 : static_cast<double>(device_peak) / static_cast<double>(peak_live); }
};

/// Allocators that take a stream: strata's stream-ordered stacks and the peers' stream APIs.
template <class S>
concept takes_stream = requires(S& s, void* p, std::size_t n, cuda::stream_ref st) {
  { s.allocate_async(n, n, st) } -> std::same_as<void*>;
  s.deallocate_async(p, n, n, st);
};

/// `reserved()` reads what the allocator holds from the device now; sampled after every allocation, and the
/// device's used memory with it whenever that figure moved. `baseline`: the device's used memory before the
/// allocator was made (so memory an allocator takes up front counts).
template <class S, class Reserved>
device_replay replay_on_device(S& a, Reserved reserved, const std::vector<trace_event>& events, trace_streams& streams,
                               std::size_t baseline)
{
  device_replay r;
  std::unordered_map<std::uint64_t, std::tuple<void*, std::size_t, cudaStream_t>> live;
  live.reserve(events.size());
  std::size_t live_bytes = 0, last_reserved = ~std::size_t{0};
  double seconds = 0;
  auto allocate = [&](std::size_t n, cudaStream_t s) {
    if constexpr (takes_stream<S>) return a.allocate_async(n, 256, cuda::stream_ref{s});
    else return a.allocate(n, 256);
  };
  auto deallocate = [&](void* p, std::size_t n, cudaStream_t s) {
    if constexpr (takes_stream<S>) a.deallocate_async(p, n, 256, cuda::stream_ref{s});
    else a.deallocate(p, n, 256);
  };
  try {
    for (const auto& e : events) {
      const cudaStream_t s = streams[e.stream];
      const auto start = clock_type::now();
      if (e.allocate) {
        void* p = allocate(e.bytes, s);
        seconds += std::chrono::duration<double>(clock_type::now() - start).count();
        live[e.id] = {p, e.bytes, s};
        live_bytes += e.bytes;
        r.peak_live = std::max(r.peak_live, live_bytes);
        const std::size_t now = reserved();
        r.peak_reserved = std::max(r.peak_reserved, now);
        if (now != last_reserved) {
          last_reserved = now;
          const std::size_t used = device_used();
          r.device_peak = std::max(r.device_peak, used - std::min(used, baseline));
        }
      } else {
        auto it = live.find(e.id);
        if (it == live.end()) continue;  // freed before the trace began
        deallocate(std::get<0>(it->second), std::get<1>(it->second), s);
        seconds += std::chrono::duration<double>(clock_type::now() - start).count();
        live_bytes -= std::get<1>(it->second);
        live.erase(it);
      }
      ++r.operations;
    }
  } catch (const std::exception& ex) {
    r.failed = true;
    r.failure = ex.what();
  }
  for (auto& [id, block] : live) deallocate(std::get<0>(block), std::get<1>(block), std::get<2>(block));
  (void)cudaDeviceSynchronize();
  r.ns_per_op = r.operations == 0 ? 0 : seconds * 1e9 / static_cast<double>(r.operations);
  return r;
}

/// Calls an allocator that takes a stream on one stream, through allocate/deallocate (parts 1 and 2).
template <class S>
struct on_stream {
  S* s;
  cudaStream_t stream;
  void* allocate(std::size_t n, std::size_t a) { return s->allocate_async(n, a, cuda::stream_ref{stream}); }
  void deallocate(void* p, std::size_t n, std::size_t a) { s->deallocate_async(p, n, a, cuda::stream_ref{stream}); }
};

/// Which stream parts 1 and 2 use: none (the allocator takes none), the legacy default stream, or a created one.
enum class stream_use { none, legacy, created };

cudaStream_t measurement_stream(stream_use use)
{
  static cudaStream_t created = [] {
    cudaStream_t s = nullptr;
    require(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return s;
  }();
  return use == stream_use::created ? created : cudaStreamLegacy;
}

/// One allocator, made fresh, as the benchmark drives it.
struct allocator {
  std::function<double(std::size_t, double)> pair;
  std::function<double(const std::vector<op>&, std::size_t)> random;
  std::function<device_replay(const std::vector<trace_event>&, trace_streams&, std::size_t)> replay;
  std::function<std::pair<std::size_t, std::size_t>()> own_peaks;  ///< peak reserved, peak allocated, where it keeps them
  std::function<std::vector<std::pair<std::string, std::uint64_t>>()> device_calls;  ///< where it counts them
};

template <class S>
allocator measured(S* s, stream_use use, std::function<std::size_t()> reserved)
{
  auto drive = [s, use](auto&& f) {
    if constexpr (takes_stream<S>) {
      if (use != stream_use::none) {
        on_stream<S> bound{s, measurement_stream(use)};
        return f(bound);
      }
    }
    if constexpr (requires(S& x, void* p) { x.allocate(std::size_t{1}, std::size_t{256}); x.deallocate(p, std::size_t{1}, std::size_t{256}); })
      return f(*s);
    else
      throw std::logic_error("allocator takes a stream but was given none");
  };
  return {[drive](std::size_t bytes, double budget) { return drive([&](auto& a) { return pair_latency(a, bytes, budget); }); },
          [drive](const std::vector<op>& ops, std::size_t max_live) { return drive([&](auto& a) { return run_random(a, ops, max_live); }); },
          [s, reserved](const std::vector<trace_event>& events, trace_streams& streams, std::size_t baseline) {
            return replay_on_device(*s, reserved, events, streams, baseline);
          }};
}

/// Makes a fresh allocator for each measurement (growth counted) and destroys it afterwards, so it holds no
/// memory while the others run.
struct factory {
  std::function<allocator()> make;
  std::function<void()> drop;
  bool peer = false;  ///< another library's allocator (the targets compare strata's recommended stack with these)
};

/// A row of the table: the allocator's name, how to make it, and whether it takes part in the replays
/// (a peer measured on two streams replays once, on the trace's streams).
struct stack_row {
  std::string name;
  factory make;
  bool replays = true;
};

// ---- The peers, each behind allocate/deallocate, and allocate_async/deallocate_async where it takes a stream --
class counting_cuda_resource final : public thrust::mr::memory_resource<thrust::cuda::pointer<void>> {
public:
  pointer do_allocate(std::size_t bytes, std::size_t alignment) override
  {
    auto p = inner_.do_allocate(bytes, alignment);
    held_ += bytes;
    return p;
  }
  void do_deallocate(pointer p, std::size_t bytes, std::size_t alignment) override
  {
    inner_.do_deallocate(p, bytes, alignment);
    held_ -= bytes;
  }
  std::size_t held() const { return held_; }

private:
  thrust::system::cuda::memory_resource inner_;
  std::size_t held_ = 0;
};

/// Thrust's disjoint pool over its CUDA memory resource (counted, for peak reserved).
struct thrust_peer {
  counting_cuda_resource upstream;
  thrust::mr::new_delete_resource bookkeeper;
  thrust::mr::disjoint_unsynchronized_pool_resource<counting_cuda_resource, thrust::mr::new_delete_resource> pool{&upstream, &bookkeeper};
  void* allocate(std::size_t n, std::size_t a) { return thrust::raw_pointer_cast(pool.do_allocate(n, a)); }
  void deallocate(void* p, std::size_t n, std::size_t a) { pool.do_deallocate(thrust::cuda::pointer<void>(p), n, a); }
};

/// CUB's caching allocator with its defaults, on the caller's stream (DeviceAllocate's stream argument).
struct cub_peer {
  cub::CachingDeviceAllocator cub;
  void* allocate_async(std::size_t n, std::size_t, cuda::stream_ref s)
  {
    void* p = nullptr;
    require(cub.DeviceAllocate(&p, n, s.get()), "cub DeviceAllocate");
    return p;
  }
  void deallocate_async(void* p, std::size_t, std::size_t, cuda::stream_ref) { require(cub.DeviceFree(p), "cub DeviceFree"); }
  std::size_t reserved() const { return cub.cached_bytes.count(0) ? cub.cached_bytes.at(0).free + cub.cached_bytes.at(0).live : 0; }
};

/// cudaMallocAsync on its own pool (release threshold at the maximum).
struct async_peer {
  strata::async_source source;
  void* allocate_async(std::size_t n, std::size_t a, cuda::stream_ref s) { return source.allocate_async(n, a, s); }
  void deallocate_async(void* p, std::size_t n, std::size_t a, cuda::stream_ref s) { source.deallocate_async(p, n, a, s); }
};

/// cudaMalloc/cudaFree; what it holds is what is live (so the replay samples the device at every allocation).
struct cuda_malloc_peer {
  std::size_t held = 0;
  void* allocate(std::size_t n, std::size_t)
  {
    void* p = nullptr;
    require(cudaMalloc(&p, n), "cudaMalloc");
    held += n;
    return p;
  }
  void deallocate(void* p, std::size_t n, std::size_t)
  {
    require(cudaFree(p), "cudaFree");
    held -= n;
  }
};

/// A library loaded with dlopen and its C functions: RMM and PyTorch each bring their own CUDA libraries
/// (RMM its own CCCL, PyTorch its own runtime), so each lives in a shim of its own.
class shim_library {
public:
  static std::unique_ptr<shim_library> open(const std::string& path, const char* what)
  {
    if (path.empty()) {
      std::printf("%s rows skipped: no shim given\n", what);
      return nullptr;
    }
    void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      std::printf("%s rows skipped: %s\n", what, ::dlerror());
      return nullptr;
    }
    return std::unique_ptr<shim_library>(new shim_library(lib));
  }
  /// The function named `name`, or a null one (the caller then skips the rows).
  template <class F>
  F* function(const char* name) const
  {
    return reinterpret_cast<F*>(::dlsym(lib_, name));
  }

private:
  explicit shim_library(void* lib) : lib_(lib) {}
  void* lib_;  // never closed: CUDA libraries do not unload cleanly
};

// ---- RMM through bench/rmm_shim ----------------------------------------------------------------------------
struct rmm_shim {
  void* (*create)(const char*) = nullptr;
  void* (*allocate_async)(void*, std::size_t, cudaStream_t) = nullptr;
  void (*deallocate_async)(void*, void*, std::size_t, cudaStream_t) = nullptr;
  void* (*allocate_sync)(void*, std::size_t) = nullptr;
  void (*deallocate_sync)(void*, void*, std::size_t) = nullptr;
  std::size_t (*reserved)(void*) = nullptr;
  void (*destroy)(void*) = nullptr;
  const char* (*version)() = nullptr;

  static std::unique_ptr<rmm_shim> load(const std::string& path)
  {
    auto lib = shim_library::open(path, "RMM");
    if (!lib) return nullptr;
    auto s = std::make_unique<rmm_shim>();
    s->create = lib->function<void*(const char*)>("strata_rmm_create");
    s->allocate_async = lib->function<void*(void*, std::size_t, cudaStream_t)>("strata_rmm_allocate_async");
    s->deallocate_async = lib->function<void(void*, void*, std::size_t, cudaStream_t)>("strata_rmm_deallocate_async");
    s->allocate_sync = lib->function<void*(void*, std::size_t)>("strata_rmm_allocate");
    s->deallocate_sync = lib->function<void(void*, void*, std::size_t)>("strata_rmm_deallocate");
    s->reserved = lib->function<std::size_t(void*)>("strata_rmm_reserved");
    s->destroy = lib->function<void(void*)>("strata_rmm_destroy");
    s->version = lib->function<const char*()>("strata_rmm_version");
    if (!s->create || !s->allocate_async || !s->deallocate_async || !s->allocate_sync || !s->deallocate_sync || !s->reserved ||
        !s->destroy || !s->version) {
      std::printf("RMM rows skipped: %s lacks the shim's functions (rebuild it: bench/get_rmm.sh)\n", path.c_str());
      return nullptr;
    }
    lib.release();
    return s;
  }
};

/// RMM's pool or arena through its stream API: allocate(stream, bytes, alignment), as device_buffer calls it.
struct rmm_peer {
  rmm_shim* shim;
  void* mr;
  rmm_peer(rmm_shim* s, const char* kind) : shim(s), mr(s->create(kind)) {}
  rmm_peer(const rmm_peer&) = delete;
  ~rmm_peer() { shim->destroy(mr); }
  void* allocate_async(std::size_t n, std::size_t, cuda::stream_ref s)
  {
    void* p = shim->allocate_async(mr, n, s.get());
    if (p == nullptr) throw std::runtime_error("rmm: allocate of " + std::to_string(n) + " bytes failed");
    return p;
  }
  void deallocate_async(void* p, std::size_t n, std::size_t, cuda::stream_ref s) { shim->deallocate_async(mr, p, n, s.get()); }
};

/// The same through allocate_sync/deallocate_sync (a default-stream synchronize per call): rows "(sync)".
struct rmm_sync_peer : rmm_peer {
  using rmm_peer::rmm_peer;
  void* allocate(std::size_t n, std::size_t)
  {
    void* p = shim->allocate_sync(mr, n);
    if (p == nullptr) throw std::runtime_error("rmm: allocate_sync of " + std::to_string(n) + " bytes failed");
    return p;
  }
  void deallocate(void* p, std::size_t n, std::size_t) { shim->deallocate_sync(mr, p, n); }
};

// ---- PyTorch's caching allocator through bench/torch_shim -------------------------------------------------
struct torch_shim {
  void* (*create)(const char*) = nullptr;
  void* (*allocate)(void*, std::size_t, cudaStream_t) = nullptr;
  void (*deallocate)(void*, void*) = nullptr;
  const char* (*last_error)(void*) = nullptr;
  void (*stats)(void*, std::size_t*, std::size_t*, std::size_t*) = nullptr;
  void (*destroy)(void*) = nullptr;
  const char* (*version)() = nullptr;
  void (*device_calls)(void*, std::size_t*, std::size_t*) = nullptr;  ///< optional: shims built before it lack it

  static std::unique_ptr<torch_shim> load(const std::string& path)
  {
    auto lib = shim_library::open(path, "PyTorch");
    if (!lib) return nullptr;
    auto s = std::make_unique<torch_shim>();
    s->create = lib->function<void*(const char*)>("strata_torch_create");
    s->allocate = lib->function<void*(void*, std::size_t, cudaStream_t)>("strata_torch_allocate");
    s->deallocate = lib->function<void(void*, void*)>("strata_torch_deallocate");
    s->last_error = lib->function<const char*(void*)>("strata_torch_last_error");
    s->stats = lib->function<void(void*, std::size_t*, std::size_t*, std::size_t*)>("strata_torch_stats");
    s->destroy = lib->function<void(void*)>("strata_torch_destroy");
    s->version = lib->function<const char*()>("strata_torch_version");
    s->device_calls = lib->function<void(void*, std::size_t*, std::size_t*)>("strata_torch_device_calls");
    if (!s->create || !s->allocate || !s->deallocate || !s->last_error || !s->stats || !s->destroy || !s->version) {
      std::printf("PyTorch rows skipped: %s lacks the shim's functions (rebuild it: bench/get_torch_shim.sh)\n", path.c_str());
      return nullptr;
    }
    lib.release();
    return s;
  }
};

/// PyTorch's allocator is one per process: a torch_peer sets its settings and empties its cache when made and
/// when destroyed, and only one exists at a time (factories drop the previous allocator first).
struct torch_peer {
  torch_shim* shim;
  void* h;
  torch_peer(torch_shim* s, const char* settings) : shim(s), h(s->create(settings))
  {
    if (h == nullptr) throw std::runtime_error(std::string("PyTorch's allocator could not be set up with ") + settings + " (its reason on stderr)");
  }
  torch_peer(const torch_peer&) = delete;
  ~torch_peer() { shim->destroy(h); }
  /// PyTorch's own default stream is the null handle; the legacy stream's special handle would be a stranger.
  static cudaStream_t torch_stream(cuda::stream_ref s) { return s.get() == cudaStreamLegacy ? nullptr : s.get(); }
  void* allocate_async(std::size_t n, std::size_t, cuda::stream_ref s)
  {
    void* p = shim->allocate(h, n, torch_stream(s));
    if (p == nullptr) throw std::runtime_error(std::string("torch: ") + shim->last_error(h));
    return p;
  }
  void deallocate_async(void* p, std::size_t, std::size_t, cuda::stream_ref) { shim->deallocate(h, p); }
  std::size_t reserved() const { return stats()[0]; }
  /// Since this peer was made: PyTorch's max_memory_reserved and max_memory_allocated.
  std::pair<std::size_t, std::size_t> own_peaks() const
  {
    const auto s = stats();
    return {s[1], s[2]};
  }
  /// cudaMalloc and cudaFree calls (with expandable segments: ranges mapped and unmapped) since this peer was made.
  std::vector<std::pair<std::string, std::uint64_t>> device_calls() const
  {
    if (shim->device_calls == nullptr) return {};
    std::size_t allocs = 0, frees = 0;
    shim->device_calls(h, &allocs, &frees);
    return {{"device_allocs", allocs - calls_before[0]}, {"device_frees", frees - calls_before[1]}};
  }
  /// The counts when this peer was made: zero where the shim's reset of the statistics clears them, as PyTorch
  /// 2.11's does; subtracted so that the figures are this peer's whatever the PyTorch.
  std::array<std::size_t, 2> calls_before = [this] {
    std::array<std::size_t, 2> c{};
    if (h != nullptr && shim->device_calls != nullptr) shim->device_calls(h, &c[0], &c[1]);
    return c;
  }();
  std::array<std::size_t, 3> stats() const
  {
    std::array<std::size_t, 3> s{};
    shim->stats(h, &s[0], &s[1], &s[2]);
    return s;
  }
};

// ---- Factories -----------------------------------------------------------------------------------------------

/// A peer made fresh for each measurement; `args` are its constructor's.
template <class Peer, class... Args>
factory peer(stream_use use, std::function<std::size_t(Peer&)> reserved, Args... args)
{
  auto keep = std::make_shared<std::unique_ptr<Peer>>();
  return {[=] {
            keep->reset();
            *keep = std::make_unique<Peer>(args...);
            Peer* p = keep->get();
            allocator a = measured(p, use, [p, reserved] { return reserved(*p); });
            if constexpr (requires { p->own_peaks(); }) a.own_peaks = [p] { return p->own_peaks(); };
            if constexpr (requires { p->device_calls(); }) a.device_calls = [p] { return p->device_calls(); };
            return a;
          },
          [keep] { keep->reset(); }, true};
}

/// A strata stack over device memory counted by statistics (its current bytes are what the stack reserved).
/// Stream-ordered stacks run on a created stream in parts 1 and 2, on the trace's streams in replays.
template <class Stack>
factory strata_stack(std::function<std::unique_ptr<Stack>(counted_device&)> make)
{
  auto upstream = std::make_shared<std::unique_ptr<counted_device>>();
  auto keep = std::make_shared<std::unique_ptr<Stack>>();
  return {[=] {
            keep->reset();
            *upstream = std::make_unique<counted_device>();
            *keep = make(**upstream);
            counted_device* u = upstream->get();
            return measured(keep->get(), takes_stream<Stack> ? stream_use::created : stream_use::none,
                            [u] { return u->snapshot_counts().current_bytes; });
          },
          [=] {
            keep->reset();
            upstream->reset();
          }};
}

std::vector<std::pair<std::string, std::uint64_t>> page_call_list(const strata::page_counters& c)
{
  return {{"creates", c.creates},         {"releases", c.releases}, {"maps", c.maps},
          {"unmaps", c.unmaps},           {"access_calls", c.access_calls}, {"device_waits", c.synchronizes},
          {"reserves", c.reserves}};
}

/// A strata stack that owns its memory source (e.g. one over page-mapped memory): `reserved` reads the bytes
/// it holds from the device.
template <class Stack>
factory owned_stack(std::function<std::unique_ptr<Stack>()> make, std::function<std::size_t(const Stack&)> reserved)
{
  auto keep = std::make_shared<std::unique_ptr<Stack>>();
  return {[=] {
            keep->reset();
            *keep = make();
            Stack* s = keep->get();
            allocator a = measured(s, takes_stream<Stack> ? stream_use::created : stream_use::none, [s, reserved] { return reserved(*s); });
            if constexpr (requires { s->policy().page_calls(); }) {
              a.device_calls = [s] {
                auto calls = page_call_list(s->policy().page_calls());
                if constexpr (requires { s->policy().backend().microseconds(); })  // timed_pages: the time too
                  for (const auto& timed : s->policy().backend().microseconds()) calls.push_back(timed);
                return calls;
              };
            } else if constexpr (requires { s->page_calls(); }) {
              a.device_calls = [s] { return page_call_list(s->page_calls()); };
            }
            return a;
          },
          [keep] { keep->reset(); }};
}

/// driver_pages with every driver call timed: the driver time the recommended stack spends on a trace,
/// measured where driver_time.py otherwise prices the counts. One stack at a time uses it (the totals are
/// shared and cleared when the stack is made).
struct timed_pages : strata::driver_pages {
  using strata::driver_pages::driver_pages;
  enum kind { creates, releases, maps, unmaps, access_calls, device_waits, kinds };
  static inline std::array<double, kinds> seconds{};

  template <class F>
  static auto timed(kind k, F&& f)
  {
    struct stopwatch {
      kind k;
      clock_type::time_point start = clock_type::now();
      ~stopwatch() { seconds[k] += std::chrono::duration<double>(clock_type::now() - start).count(); }
    } watch{k};
    return f();
  }
  page create(std::size_t bytes) { return timed(creates, [&] { return driver_pages::create(bytes); }); }
  void destroy(page p) noexcept { timed(releases, [&] { driver_pages::destroy(p); }); }
  void map(std::uintptr_t address, page p, std::size_t bytes) { timed(maps, [&] { driver_pages::map(address, p, bytes); }); }
  void set_access(std::uintptr_t address, std::size_t bytes) { timed(access_calls, [&] { driver_pages::set_access(address, bytes); }); }
  void unmap(std::uintptr_t address, std::size_t bytes) { timed(unmaps, [&] { driver_pages::unmap(address, bytes); }); }
  void synchronize() { timed(device_waits, [&] { driver_pages::synchronize(); }); }
  /// The time in each kind of call so far, as device_calls entries ("us_creates", ...).
  static std::vector<std::pair<std::string, std::uint64_t>> microseconds()
  {
    const char* names[kinds] = {"us_creates", "us_releases", "us_maps", "us_unmaps", "us_access_calls", "us_device_waits"};
    std::vector<std::pair<std::string, std::uint64_t>> out;
    for (int k = 0; k < kinds; ++k) out.emplace_back(names[k], static_cast<std::uint64_t>(seconds[k] * 1e6));
    return out;
  }
};

/// The recommended stack over timed_pages, as make_default_pool builds it (capped at the device's memory): its
/// device calls carry the measured microseconds per kind.
factory timed_default_pool()
{
  using stack = strata::stream_ordered<strata::mapped_pool<timed_pages>>;
  return owned_stack<stack>(
      [] {
        timed_pages::seconds.fill(0);
        std::size_t free_bytes = 0, total_bytes = 0;
        require(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
        strata::mapped_pool<timed_pages>::options o{};
        o.max_physical = total_bytes;
        return std::make_unique<stack>(strata::mapped_pool<timed_pages>{timed_pages{}, o});
      },
      [](const stack& p) { return p.policy().physical_bytes(); });
}

/// The recommended stack with some of its options changed.
factory default_pool_with(std::function<void(strata::default_pool_options&)> change)
{
  return owned_stack<strata::default_pool>(
      [change] {
        strata::default_pool_options o;
        change(o);
        return std::make_unique<strata::default_pool>(strata::make_default_pool(o));
      },
      [](const strata::default_pool& p) { return p.policy().physical_bytes(); });
}

/// THE table: every allocator the run measures, strata's stacks first. A new stack is one more row here.
std::vector<stack_row> all_stacks(rmm_shim* rmm, torch_shim* torch)
{
  using ref_t = strata::ref<counted_device>;
  using seg = strata::segregator<std::size_t{1} << 20, strata::size_class_pool<ref_t>, strata::coalescing_pool<ref_t>>;
  using so_coalescing = strata::stream_ordered<strata::coalescing_pool<ref_t>>;
  using so_size_class = strata::stream_ordered<strata::size_class_pool<ref_t>>;
  using strata::size_class_pool, strata::coalescing_pool, strata::buddy_pool;
  std::vector<stack_row> rows = {
    {"strata size_class_pool", strata_stack<size_class_pool<ref_t>>([](counted_device& u) { return std::make_unique<size_class_pool<ref_t>>(ref_t(u)); })},
    {"strata coalescing_pool", strata_stack<coalescing_pool<ref_t>>([](counted_device& u) { return std::make_unique<coalescing_pool<ref_t>>(ref_t(u)); })},
    {"strata buddy_pool", strata_stack<buddy_pool<ref_t>>([](counted_device& u) { return std::make_unique<buddy_pool<ref_t>>(ref_t(u)); })},
    {"strata segregator<1 MiB, size_class, coalescing>", strata_stack<seg>([](counted_device& u) {
       return std::make_unique<seg>(size_class_pool<ref_t>(ref_t(u)), coalescing_pool<ref_t>(ref_t(u)));
     })},
    {"strata stream_ordered<coalescing_pool>",
     strata_stack<so_coalescing>([](counted_device& u) { return std::make_unique<so_coalescing>(coalescing_pool<ref_t>(ref_t(u))); })},
    {"strata stream_ordered<size_class_pool>",
     strata_stack<so_size_class>([](counted_device& u) { return std::make_unique<so_size_class>(size_class_pool<ref_t>(ref_t(u))); })},
    {"strata default_pool", default_pool_with([](strata::default_pool_options&) {})},
    {"strata default_pool (relocate idle: the plug-in's default)", default_pool_with([](strata::default_pool_options& o) { o.pool.relocate_idle = true; })},
    {"strata default_pool (mappings up to 8 MiB)", default_pool_with([](strata::default_pool_options& o) { o.pool.max_mapping = std::size_t{8} << 20; })},
    {"strata default_pool (driver calls timed)", timed_default_pool()},
    {"strata default_pool (growth maps ahead 3%)", default_pool_with([](strata::default_pool_options& o) { o.pool.growth_ahead_fraction = 0.03; })},
    {"strata default_pool (placement by size alone)", default_pool_with([](strata::default_pool_options& o) { o.pool.placement_candidates = 1; })},
    {"strata mapped_pool", owned_stack<strata::mapped_pool<strata::driver_pages>>(
                             [] { return std::make_unique<strata::mapped_pool<strata::driver_pages>>(); },
                             [](const strata::mapped_pool<strata::driver_pages>& p) { return p.physical_bytes(); })},
    {"cudaMallocAsync (legacy stream)", peer<async_peer>(stream_use::legacy, [](async_peer& p) { return std::size_t(p.source.reserved_bytes()); })},
    {"cudaMallocAsync (created stream)", peer<async_peer>(stream_use::created, [](async_peer& p) { return std::size_t(p.source.reserved_bytes()); }), false},
    {"cub::CachingDeviceAllocator (defaults)", peer<cub_peer>(stream_use::legacy, [](cub_peer& p) { return p.reserved(); })},
    {"thrust disjoint_unsynchronized_pool", peer<thrust_peer>(stream_use::none, [](thrust_peer& p) { return p.upstream.held(); })},
  };
  if (rmm != nullptr) {
    auto held = [](rmm_peer& p) { return p.shim->reserved(p.mr); };
    auto held_sync = [](rmm_sync_peer& p) { return p.shim->reserved(p.mr); };
    rows.push_back({"rmm pool (legacy stream)", peer<rmm_peer>(stream_use::legacy, held, rmm, "pool")});
    rows.push_back({"rmm pool (created stream)", peer<rmm_peer>(stream_use::created, held, rmm, "pool"), false});
    rows.push_back({"rmm pool (sync)", peer<rmm_sync_peer>(stream_use::none, held_sync, rmm, "pool"), false});
    rows.push_back({"rmm arena (legacy stream)", peer<rmm_peer>(stream_use::legacy, held, rmm, "arena")});
    rows.push_back({"rmm arena (created stream)", peer<rmm_peer>(stream_use::created, held, rmm, "arena"), false});
  }
  if (torch != nullptr) {
    auto held = [](torch_peer& p) { return p.reserved(); };
    const char* plain = "expandable_segments:False";
    const char* expandable = "expandable_segments:True";
    rows.push_back({"torch caching allocator (legacy stream)", peer<torch_peer>(stream_use::legacy, held, torch, plain)});
    rows.push_back({"torch caching allocator (created stream)", peer<torch_peer>(stream_use::created, held, torch, plain), false});
    rows.push_back({"torch expandable segments (legacy stream)", peer<torch_peer>(stream_use::legacy, held, torch, expandable)});
    rows.push_back({"torch expandable segments (created stream)", peer<torch_peer>(stream_use::created, held, torch, expandable), false});
  }
  rows.push_back({"cudaMalloc/cudaFree", peer<cuda_malloc_peer>(stream_use::none, [](cuda_malloc_peer& p) { return p.held; })});
  return rows;
}

std::string size_name(std::size_t n)
{
  if (n >= (1u << 30)) return std::to_string(n >> 30) + " GiB";
  if (n >= (1u << 20)) return std::to_string(n >> 20) + " MiB";
  if (n >= (1u << 10)) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

/// Every value given for `name` (an option that may repeat).
std::vector<std::string> options(int argc, char** argv, const char* name)
{
  std::vector<std::string> values;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) values.push_back(argv[++i]);
  return values;
}

/// The traces named with --trace, then every *.csv / *.csv.gz in --traces DIR (sorted).
std::vector<std::string> trace_paths(int argc, char** argv)
{
  std::vector<std::string> paths = options(argc, argv, "--trace");
  const std::string dir = strata::bench::option(argc, argv, "--traces");
  if (!dir.empty()) {
    std::vector<std::string> found;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string p = entry.path().string();
      if (p.ends_with(".csv") || p.ends_with(".csv.gz")) found.push_back(p);
    }
    std::sort(found.begin(), found.end());
    paths.insert(paths.end(), found.begin(), found.end());
  }
  return paths;
}

/// Whether `name` contains one of the comma-separated pieces of `pieces` (--only's list).
bool names_any(const std::string& name, const std::string& pieces)
{
  for (std::size_t start = 0; start <= pieces.size();) {
    const std::size_t end = std::min(pieces.find(',', start), pieces.size());
    if (end > start && name.find(pieces.substr(start, end - start)) != std::string::npos) return true;
    start = end + 1;
  }
  return false;
}

std::string json_number(double v) { return std::isfinite(v) ? std::to_string(v) : "null"; }

} // namespace

int main(int argc, char** argv)
{
  std::string rmm_default, torch_default;
#ifdef STRATA_RMM_SHIM_PATH
  rmm_default = STRATA_RMM_SHIM_PATH;  // found by CMake at configure time; --rmm-shim overrides it
#endif
#ifdef STRATA_TORCH_SHIM_PATH
  torch_default = STRATA_TORCH_SHIM_PATH;  // likewise --torch-shim
#endif
  const std::string json_path = strata::bench::option(argc, argv, "--json");
  const std::string only = strata::bench::option(argc, argv, "--only");
  const bool quick = strata::bench::flag(argc, argv, "--quick");
  const std::string parts = strata::bench::option(argc, argv, "--parts", "pair,random,replay");
  const auto part = [&](const char* name) { return parts.find(name) != std::string::npos; };
  const std::vector<std::string> traces = part("replay") ? trace_paths(argc, argv) : std::vector<std::string>{};
  const int repeats = std::max(1, std::atoi(strata::bench::option(argc, argv, "--repeats", quick ? "1" : "3").c_str()));
  const bool warmup = !strata::bench::flag(argc, argv, "--no-warmup");
  if (!strata::bench::gpu_present("peers")) return 0;  // bench/replay plans traces on simulated memory
  cudaDeviceProp prop{};
  strata::bench::check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::unique_ptr<rmm_shim> rmm = rmm_shim::load(strata::bench::option(argc, argv, "--rmm-shim", rmm_default));
  std::unique_ptr<torch_shim> torch = torch_shim::load(strata::bench::option(argc, argv, "--torch-shim", torch_default));
  std::vector<stack_row> rows = all_stacks(rmm.get(), torch.get());
  if (!only.empty()) std::erase_if(rows, [&](const stack_row& r) { return !names_any(r.name, only); });

  std::ofstream json;
  if (!json_path.empty()) json.open(json_path);
  json << "{\"device\":\"" << prop.name << "\",\"recommended\":\"" << recommended_stack << "\",\"rmm\":\""
       << (rmm ? rmm->version() : "absent") << "\",\"torch\":\"" << (torch ? torch->version() : "absent") << "\",\"stacks\":[";
  for (std::size_t k = 0; k < rows.size(); ++k)
    json << (k ? "," : "") << "{\"name\":\"" << rows[k].name << "\",\"peer\":" << (rows[k].make.peer ? "true" : "false") << "}";
  json << "]";
  if (std::none_of(rows.begin(), rows.end(), [](const stack_row& r) { return r.name == recommended_stack; }))
    std::printf("the recommended stack \"%s\" is not in this run: the targets cannot be judged\n", recommended_stack);
  std::vector<std::string> failures;  // "row: part: why", for the summary
  auto attempt = [&](const stack_row& row, const char* part, auto&& f) -> double {
    try {
      return f();
    } catch (const std::exception& e) {
      failures.push_back(row.name + ": " + part + ": " + e.what());
      std::printf("%s: %s failed: %s\n", row.name.c_str(), part, e.what());
      (void)cudaGetLastError();
      row.make.drop();
      return NAN;
    }
  };

  // 1. Pair latency.
  const std::vector<std::size_t> pair_sizes = {256, 4096, 65536, 1 << 20, 16 << 20, 256 << 20, std::size_t{1} << 30};
  std::vector<std::vector<double>> pair_ns(rows.size());
  for (std::size_t k = 0; k < rows.size() && part("pair"); ++k) {
    for (std::size_t bytes : pair_sizes)
      pair_ns[k].push_back(attempt(rows[k], "pair", [&] { return rows[k].make.make().pair(bytes, quick ? 0.02 : 0.1); }));
    rows[k].make.drop();
  }
  std::printf("\n1. pair latency (allocate then free the same size), ns per pair on %s\n%-52s", prop.name, "allocator");
  for (auto s : pair_sizes) std::printf(" %10s", size_name(s).c_str());
  std::printf("\n");
  for (std::size_t k = 0; k < rows.size(); ++k) {
    std::printf("%-52s", rows[k].name.c_str());
    for (double ns : pair_ns[k]) std::printf(" %10.1f", ns);
    std::printf("\n");
  }
  json << ",\"pair_sizes\":[";
  for (std::size_t i = 0; i < pair_sizes.size(); ++i) json << (i ? "," : "") << pair_sizes[i];
  json << "],\"pair_ns\":{";
  for (std::size_t k = 0; k < rows.size(); ++k) {
    json << (k ? "," : "") << "\"" << rows[k].name << "\":[";
    for (std::size_t i = 0; i < pair_ns[k].size(); ++i) json << (i ? "," : "") << json_number(pair_ns[k][i]);
    json << "]";
  }
  json << "}";

  // 2. Random allocations.
  constexpr std::size_t max_live = 2000;
  const std::size_t count = quick ? 20'000 : 200'000;
  std::printf("\n2. random allocations: %zu operations, up to %zu live, 50/50; ns per operation (median of 3)\n%-52s %12s %14s\n",
              count, max_live, "allocator", "uniform", "log-uniform");
  json << ",\"random\":{";
  for (std::size_t k = 0; k < rows.size() && part("random"); ++k) {
    const bool slow = rows[k].name == "cudaMalloc/cudaFree" || rows[k].name.ends_with("(sync)");
    double result[2];
    for (int dist = 0; dist < 2; ++dist) {
      const auto ops = random_ops(slow ? count / 10 : count, max_live, dist == 1, 42 + dist);
      std::vector<double> runs;
      for (int r = 0; r < (slow ? 1 : 3); ++r)
        runs.push_back(attempt(rows[k], "random", [&] { return rows[k].make.make().random(ops, max_live); }));
      result[dist] = std::any_of(runs.begin(), runs.end(), [](double v) { return std::isnan(v); }) ? NAN : median(runs);
    }
    rows[k].make.drop();
    std::printf("%-52s %12.1f %14.1f%s\n", rows[k].name.c_str(), result[0], result[1], slow ? "   (a tenth of the operations)" : "");
    json << (k ? "," : "") << "\"" << rows[k].name << "\":{\"uniform\":" << json_number(result[0])
         << ",\"log_uniform\":" << json_number(result[1]) << ",\"operations\":" << (slow ? count / 10 : count) << "}";
  }
  json << "}";

  // 3. Replay of every trace on device memory, each allocator fresh.
  json << ",\"replay\":[";
  trace_streams streams;
  for (std::size_t t = 0; t < traces.size(); ++t) {
    std::vector<trace_event> events;
    try {
      events = strata::replay::read_trace(traces[t]);
    } catch (const std::exception& e) {
      failures.push_back(traces[t] + ": " + e.what());
      std::printf("%s\n", e.what());
      continue;
    }
    std::vector<stack_row*> replaying;
    for (auto& row : rows)
      if (row.replays && !(quick && row.name == "cudaMalloc/cudaFree")) replaying.push_back(&row);
    const auto replay_once = [&](stack_row& row) {
      device_replay r;
      try {
        (void)cudaDeviceSynchronize();
        const std::size_t baseline = device_used();
        allocator a = row.make.make();
        r = a.replay(events, streams, baseline);
        if (a.own_peaks) std::tie(r.own_peak_reserved, r.own_peak_allocated) = a.own_peaks();
        if (a.device_calls) r.device_calls = a.device_calls();
      } catch (const std::exception& e) {
        r.failed = true;
        r.failure = e.what();
        (void)cudaGetLastError();
      }
      r.stack = row.name;
      row.make.drop();
      return r;
    };
    if (warmup)
      for (stack_row* row : replaying) (void)replay_once(*row);  // untimed; a failure shows again below
    const std::size_t n = replaying.size();
    std::vector<std::vector<device_replay>> rounds(n);
    for (int round = 0; round < repeats; ++round)
      for (std::size_t j = 0; j < n; ++j) {
        const std::size_t position = round % 2 == 0 ? j : n - 1 - j;
        const std::size_t i = (position + static_cast<std::size_t>(round)) % n;
        rounds[i].push_back(replay_once(*replaying[i]));
      }
    std::vector<device_replay> results;
    std::vector<std::vector<double>> times(n);
    for (std::size_t i = 0; i < n; ++i) {
      device_replay r = rounds[i].front();
      for (const device_replay& x : rounds[i]) {
        if (x.failed && !r.failed) r = x;
        times[i].push_back(x.ns_per_op);
      }
      if (!r.failed) r.ns_per_op = median(times[i]);
      if (r.failed) failures.push_back(r.stack + ": replay of " + traces[t] + ": " + r.failure);
      results.push_back(r);
    }
    std::printf("\n3. replay of %s on device memory, on the trace's streams where the allocator takes one (reserved: what the "
                "allocator holds from the device; device: the rise in cudaMemGetInfo's used memory)\n%-52s %10s %10s %12s %12s %9s %12s %9s\n",
                traces[t].c_str(), "stack", "ops", "ns/op", "live MiB", "rsv MiB", "rsv/live", "device MiB", "dev/live");
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      if (r.failed) {
        std::printf("%-52s FAILED after %zu ops: %s\n", r.stack.c_str(), r.operations, r.failure.c_str());
        continue;
      }
      const auto [lo, hi] = std::minmax_element(times[i].begin(), times[i].end());
      std::printf("%-52s %10zu %10.1f %12.1f %12.1f %8.3fx %12.1f %8.3fx   ns/op %.1f-%.1f over %zu rounds\n", r.stack.c_str(),
                  r.operations, r.ns_per_op, static_cast<double>(r.peak_live) / (1 << 20),
                  static_cast<double>(r.peak_reserved) / (1 << 20), r.ratio(), static_cast<double>(r.device_peak) / (1 << 20),
                  r.device_ratio(), *lo, *hi, times[i].size());
    }
    json << (t ? "," : "") << "{\"trace\":\"" << traces[t] << "\",\"results\":[";
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      json << (i ? "," : "") << "{\"stack\":\"" << r.stack << "\",\"operations\":" << r.operations << ",\"ns_per_op\":" << json_number(r.ns_per_op)
           << ",\"peak_live\":" << r.peak_live << ",\"peak_reserved\":" << r.peak_reserved << ",\"ratio\":" << json_number(r.ratio())
           << ",\"device_peak\":" << r.device_peak << ",\"device_ratio\":" << json_number(r.device_ratio())
           << ",\"own_peak_reserved\":" << r.own_peak_reserved << ",\"own_peak_allocated\":" << r.own_peak_allocated
           << ",\"device_calls\":{";
      for (std::size_t k = 0; k < r.device_calls.size(); ++k)
        json << (k ? "," : "") << "\"" << r.device_calls[k].first << "\":" << r.device_calls[k].second;
      json << "},\"ns_per_op_rounds\":[";
      for (std::size_t k = 0; k < times[i].size(); ++k) json << (k ? "," : "") << json_number(times[i][k]);
      json << "]"
           << ",\"failed\":" << (r.failed ? "true" : "false") << "}";
    }
    json << "]}";
  }
  json << "],\"failures\":[";
  for (std::size_t i = 0; i < failures.size(); ++i) {
    std::string f = failures[i];
    std::replace(f.begin(), f.end(), '"', '\'');
    std::replace(f.begin(), f.end(), '\\', '/');
    std::replace(f.begin(), f.end(), '\n', ' ');
    json << (i ? "," : "") << "\"" << f << "\"";
  }
  json << "]}\n";
  if (!failures.empty()) std::printf("\n%zu measurement(s) failed; see above\n", failures.size());
  return failures.empty() ? 0 : 1;
}
