// strata against the allocators its users have, in one run on one GPU:
//   1. pair latency: allocate then free the same size, 256 B .. 1 GiB;
//   2. random allocations: 200,000 operations, up to 2,000 live, 50/50, sizes uniform in [1 B, 1 MiB] and
//      log-uniform in [256 B, 64 MiB];
//   5. replay of a trace (DESIGN.md format) on real device memory: ns per operation, peak reserved / peak live.
// Peers: cudaMalloc/cudaFree, cudaMallocAsync (own pool, release threshold at the maximum), CUB's
// CachingDeviceAllocator (defaults), Thrust's disjoint_unsynchronized_pool_resource over its CUDA memory
// resource, and RMM's pool and arena resources when the RMM shim was built (bench/rmm_shim, loaded with dlopen).
//   peers [--json FILE] [--trace FILE] [--rmm-shim PATH] [--quick]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cub/util_allocator.cuh>
#include <thrust/mr/disjoint_pool.h>
#include <thrust/mr/new.h>
#include <thrust/system/cuda/memory_resource.h>

#include <strata/adaptor/segregator.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/core/ref.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/async_source.hpp>
#include <strata/source/device_source.hpp>
#include "bench_common.hpp"
#include "replay_driver.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using counted_device = strata::statistics<strata::device_source>;  // its current bytes: what a stack reserved

using strata::bench::check;
using strata::bench::median;

struct op {
  bool allocate;
  std::size_t slot;  // which live slot it fills or empties
  std::size_t bytes;
};

/// 50/50 allocate/free with at most `max_live` live, the same sequence for every allocator.
std::vector<op> random_ops(std::size_t count, std::size_t max_live, bool log_uniform, unsigned seed)
{
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> uniform(1, std::size_t{1} << 20);
  std::uniform_real_distribution<double> log_size(8, 26);  // 256 B .. 64 MiB
  std::vector<op> ops;
  ops.reserve(count);
  std::vector<std::size_t> live, free_slots;
  std::vector<std::size_t> sizes(max_live);
  for (std::size_t s = max_live; s-- > 0;) free_slots.push_back(s);
  while (ops.size() < count) {
    const bool alloc = live.empty() || (!free_slots.empty() && (rng() & 1));
    if (alloc) {
      const std::size_t slot = free_slots.back();
      free_slots.pop_back();
      sizes[slot] = log_uniform ? static_cast<std::size_t>(std::exp2(log_size(rng))) : uniform(rng);
      live.push_back(slot);
      ops.push_back({true, slot, sizes[slot]});
    } else {
      const std::size_t k = rng() % live.size();
      const std::size_t slot = live[k];
      live[k] = live.back();
      live.pop_back();
      free_slots.push_back(slot);
      ops.push_back({false, slot, sizes[slot]});
    }
  }
  return ops;
}

/// Allocate then free `bytes`, repeated for about `budget` seconds (at least 3 pairs); ns per pair. A template
/// over the concrete allocator: the timed loop calls it directly, with no indirection of the harness's own.
template <class S>
double pair_latency(S& a, std::size_t bytes, double budget)
{
  for (int i = 0; i < 3; ++i) a.deallocate(a.allocate(bytes, 256), bytes, 256);  // warm: pools hold the block now
  check(cudaDeviceSynchronize(), "sync");
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

/// ns per operation over the sequence (the cleanup of what is still live is not timed).
template <class S>
double run_random(S& a, const std::vector<op>& ops, std::size_t max_live)
{
  std::vector<std::pair<void*, std::size_t>> slots(max_live, {nullptr, 0});
  check(cudaDeviceSynchronize(), "sync");
  const auto t0 = clock_type::now();
  for (const op& o : ops) {
    if (o.allocate) {
      slots[o.slot] = {a.allocate(o.bytes, 256), o.bytes};
    } else {
      a.deallocate(slots[o.slot].first, slots[o.slot].second, 256);
      slots[o.slot].first = nullptr;
    }
  }
  const double ns = std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() / static_cast<double>(ops.size());
  for (auto [p, n] : slots)
    if (p != nullptr) a.deallocate(p, n, 256);
  check(cudaDeviceSynchronize(), "sync");
  return ns;
}

/// One allocator as the benchmark drives it: its measurements, bound to the concrete type, and how many bytes
/// it holds from the device (`reserved`).
struct allocator {
  std::string name;
  std::function<double(std::size_t, double)> pair;
  std::function<double(const std::vector<op>&, std::size_t)> random;
  std::function<strata::bench::replay_result(const std::vector<strata::bench::trace_event>&)> replay;
};

template <class S>
allocator measured(std::string name, S* s, std::function<std::size_t()> reserved)
{
  return {name, [s](std::size_t bytes, double budget) { return pair_latency(*s, bytes, budget); },
          [s](const std::vector<op>& ops, std::size_t max_live) { return run_random(*s, ops, max_live); },
          [name, s, reserved](const std::vector<strata::bench::trace_event>& events) {
            return strata::bench::replay_with(name, *s, reserved, events);
          }};
}

/// Makes a fresh allocator each time it is called (each measurement starts from an empty pool), and keeps it
/// alive until the next call.
using factory = std::function<allocator()>;

// ---- The peers, each behind allocate(bytes, alignment) / deallocate(p, bytes, alignment) ---------------------
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

struct cub_peer {
  cub::CachingDeviceAllocator cub;  // defaults: what users get
  void* allocate(std::size_t n, std::size_t)
  {
    void* p = nullptr;
    check(cub.DeviceAllocate(&p, n), "cub allocate");
    return p;
  }
  void deallocate(void* p, std::size_t, std::size_t) { check(cub.DeviceFree(p), "cub free"); }
  std::size_t reserved() const { return cub.cached_bytes.count(0) ? cub.cached_bytes.at(0).free + cub.cached_bytes.at(0).live : 0; }
};

struct async_peer {
  strata::async_source source;  // its own pool, release threshold at the maximum
  void* allocate(std::size_t n, std::size_t a) { return source.allocate_async(n, a, cuda::stream_ref{cudaStreamLegacy}); }
  void deallocate(void* p, std::size_t n, std::size_t a) { source.deallocate_async(p, n, a, cuda::stream_ref{cudaStreamLegacy}); }
};

struct cuda_malloc_peer {
  void* allocate(std::size_t n, std::size_t)
  {
    void* p = nullptr;
    check(cudaMalloc(&p, n), "cudaMalloc");
    return p;
  }
  void deallocate(void* p, std::size_t, std::size_t) { check(cudaFree(p), "cudaFree"); }
};

// ---- RMM through the shim (its own CCCL version lives in its own shared library) ---------------------------
struct rmm_shim {
  void* (*create)(const char* kind) = nullptr;
  void* (*allocate)(void* mr, std::size_t bytes) = nullptr;
  void (*deallocate)(void* mr, void* p, std::size_t bytes) = nullptr;
  std::size_t (*reserved)(void* mr) = nullptr;
  void (*destroy)(void* mr) = nullptr;
  const char* (*version)() = nullptr;

  static std::unique_ptr<rmm_shim> load(const std::string& path)
  {
    void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      std::printf("RMM rows skipped: %s\n", ::dlerror());
      return nullptr;
    }
    auto shim = std::make_unique<rmm_shim>();
    shim->create = reinterpret_cast<decltype(create)>(::dlsym(lib, "strata_rmm_create"));
    shim->allocate = reinterpret_cast<decltype(allocate)>(::dlsym(lib, "strata_rmm_allocate"));
    shim->deallocate = reinterpret_cast<decltype(deallocate)>(::dlsym(lib, "strata_rmm_deallocate"));
    shim->reserved = reinterpret_cast<decltype(reserved)>(::dlsym(lib, "strata_rmm_reserved"));
    shim->destroy = reinterpret_cast<decltype(destroy)>(::dlsym(lib, "strata_rmm_destroy"));
    shim->version = reinterpret_cast<decltype(version)>(::dlsym(lib, "strata_rmm_version"));
    if (!shim->create || !shim->allocate || !shim->deallocate || !shim->reserved || !shim->destroy || !shim->version) {
      std::printf("RMM rows skipped: %s lacks the shim's functions\n", path.c_str());
      return nullptr;
    }
    return shim;
  }
};

struct rmm_peer {
  rmm_shim* shim;
  void* mr;
  rmm_peer(rmm_shim* s, const char* kind) : shim(s), mr(s->create(kind)) {}
  rmm_peer(const rmm_peer&) = delete;
  ~rmm_peer() { shim->destroy(mr); }
  void* allocate(std::size_t n, std::size_t) { return shim->allocate(mr, n); }
  void deallocate(void* p, std::size_t n, std::size_t) { shim->deallocate(mr, p, n); }
};

/// A peer made fresh for each measurement: the previous one goes first (and returns its memory).
template <class Peer, class... Args>
factory peer(std::string name, std::function<std::size_t(Peer&)> reserved, Args... args)
{
  return [=, keep = std::make_shared<std::unique_ptr<Peer>>()] {
    keep->reset();
    *keep = std::make_unique<Peer>(args...);
    Peer* p = keep->get();
    return measured(name, p, [p, reserved] { return reserved(*p); });
  };
}

/// A strata stack over device memory counted by statistics (its current bytes are what the stack reserved).
template <class Stack>
factory strata_stack(std::string name, std::function<std::unique_ptr<Stack>(counted_device&)> make)
{
  return [name, make, upstream = std::make_shared<std::unique_ptr<counted_device>>(), keep = std::make_shared<std::unique_ptr<Stack>>()] {
    keep->reset();
    *upstream = std::make_unique<counted_device>();
    *keep = make(**upstream);
    counted_device* u = upstream->get();
    return measured(name, keep->get(), [u] { return u->snapshot_counts().current_bytes; });
  };
}

std::vector<factory> all_allocators(rmm_shim* rmm)
{
  using ref_t = strata::ref<counted_device>;
  std::vector<factory> f;
  f.push_back(strata_stack<strata::size_class_pool<ref_t>>("strata size_class_pool", [](counted_device& u) {
    return std::make_unique<strata::size_class_pool<ref_t>>(ref_t(u));
  }));
  f.push_back(strata_stack<strata::coalescing_pool<ref_t>>("strata coalescing_pool", [](counted_device& u) {
    return std::make_unique<strata::coalescing_pool<ref_t>>(ref_t(u));
  }));
  f.push_back(strata_stack<strata::buddy_pool<ref_t>>("strata buddy_pool", [](counted_device& u) {
    return std::make_unique<strata::buddy_pool<ref_t>>(ref_t(u));
  }));
  using seg = strata::segregator<std::size_t{1} << 20, strata::size_class_pool<ref_t>, strata::coalescing_pool<ref_t>>;
  f.push_back(strata_stack<seg>("strata segregator<1 MiB, size_class, coalescing>", [](counted_device& u) {
    return std::make_unique<seg>(strata::size_class_pool<ref_t>(ref_t(u)), strata::coalescing_pool<ref_t>(ref_t(u)));
  }));
  f.push_back(peer<async_peer>("cudaMallocAsync (pool, threshold max)", [](async_peer& p) { return std::size_t(p.source.reserved_bytes()); }));
  f.push_back(peer<cub_peer>("cub::CachingDeviceAllocator (defaults)", [](cub_peer& p) { return p.reserved(); }));
  f.push_back(peer<thrust_peer>("thrust disjoint_unsynchronized_pool", [](thrust_peer& p) { return p.upstream.held(); }));
  if (rmm != nullptr) {
    f.push_back(peer<rmm_peer>("rmm pool_memory_resource", [](rmm_peer& p) { return p.shim->reserved(p.mr); }, rmm, "pool"));
    f.push_back(peer<rmm_peer>("rmm arena_memory_resource", [](rmm_peer& p) { return p.shim->reserved(p.mr); }, rmm, "arena"));
  }
  f.push_back(peer<cuda_malloc_peer>("cudaMalloc/cudaFree", [](cuda_malloc_peer&) { return std::size_t{0}; }));
  return f;
}

std::string size_name(std::size_t n)
{
  if (n >= (1u << 30)) return std::to_string(n >> 30) + " GiB";
  if (n >= (1u << 20)) return std::to_string(n >> 20) + " MiB";
  if (n >= (1u << 10)) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

} // namespace

int main(int argc, char** argv)
{
  std::string shim_default;
#ifdef STRATA_RMM_SHIM_PATH
  shim_default = STRATA_RMM_SHIM_PATH;  // found by CMake at configure time; --rmm-shim overrides it
#endif
  const std::string json_path = strata::bench::option(argc, argv, "--json");
  const std::string trace_path = strata::bench::option(argc, argv, "--trace");
  const std::string shim_path = strata::bench::option(argc, argv, "--rmm-shim", shim_default);
  const bool quick = strata::bench::flag(argc, argv, "--quick");
  if (!strata::bench::gpu_present("peers")) return 0;  // bench/replay plans traces on simulated memory
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::unique_ptr<rmm_shim> rmm = shim_path.empty() ? nullptr : rmm_shim::load(shim_path);
  if (shim_path.empty()) std::printf("RMM rows skipped: no RMM shim given (bench/rmm_shim builds one where RMM is installed)\n");
  auto factories = all_allocators(rmm.get());

  std::ofstream json;
  if (!json_path.empty()) json.open(json_path);
  json << "{\"device\":\"" << prop.name << "\",\"rmm\":\"" << (rmm ? rmm->version() : "absent") << "\"";

  // 1. Pair latency.
  const std::vector<std::size_t> pair_sizes = {256, 4096, 65536, 1 << 20, 16 << 20, 256 << 20, std::size_t{1} << 30};
  std::vector<std::vector<double>> pair_ns(factories.size());
  std::vector<std::string> names;
  for (std::size_t k = 0; k < factories.size(); ++k) {
    allocator a = factories[k]();
    names.push_back(a.name);
    for (std::size_t bytes : pair_sizes) pair_ns[k].push_back(a.pair(bytes, quick ? 0.02 : 0.1));
    factories[k]();  // frees this one's memory before the next
  }
  std::printf("\n1. pair latency (allocate then free the same size), ns per pair on %s\n%-52s", prop.name, "allocator");
  for (auto s : pair_sizes) std::printf(" %10s", size_name(s).c_str());
  std::printf("\n");
  for (std::size_t k = 0; k < factories.size(); ++k) {
    std::printf("%-52s", names[k].c_str());
    for (double ns : pair_ns[k]) std::printf(" %10.1f", ns);
    std::printf("\n");
  }
  json << ",\"pair_sizes\":[";
  for (std::size_t i = 0; i < pair_sizes.size(); ++i) json << (i ? "," : "") << pair_sizes[i];
  json << "],\"pair_ns\":{";
  for (std::size_t k = 0; k < factories.size(); ++k) {
    json << (k ? "," : "") << "\"" << names[k] << "\":[";
    for (std::size_t i = 0; i < pair_ns[k].size(); ++i) json << (i ? "," : "") << pair_ns[k][i];
    json << "]";
  }
  json << "}";

  // 2. Random allocations.
  constexpr std::size_t max_live = 2000;
  const std::size_t count = quick ? 20'000 : 200'000;
  std::printf("\n2. random allocations: %zu operations, up to %zu live, 50/50; ns per operation (median of 3)\n%-52s %12s %14s\n",
              count, max_live, "allocator", "uniform", "log-uniform");
  json << ",\"random\":{";
  for (std::size_t k = 0; k < factories.size(); ++k) {
    const bool slow = names[k] == "cudaMalloc/cudaFree";
    double result[2];
    for (int dist = 0; dist < 2; ++dist) {
      const auto ops = random_ops(slow ? count / 10 : count, max_live, dist == 1, 42 + dist);
      std::vector<double> runs;
      for (int r = 0; r < (slow ? 1 : 3); ++r) {
        allocator a = factories[k]();
        runs.push_back(a.random(ops, max_live));
      }
      result[dist] = median(runs);
    }
    factories[k]();
    std::printf("%-52s %12.1f %14.1f%s\n", names[k].c_str(), result[0], result[1], slow ? "   (a tenth of the operations)" : "");
    json << (k ? "," : "") << "\"" << names[k] << "\":{\"uniform\":" << result[0] << ",\"log_uniform\":" << result[1] << "}";
  }
  json << "}";

  // 5. Replay on device memory.
  if (!trace_path.empty()) {
    const auto events = strata::bench::read_trace(trace_path);
    std::vector<strata::bench::replay_result> results;
    for (std::size_t k = 0; k < factories.size(); ++k) {
      if (names[k] == "cudaMalloc/cudaFree" && quick) continue;
      allocator a = factories[k]();
      results.push_back(a.replay(events));
      factories[k]();
    }
    strata::bench::print_table(trace_path + " on device memory (peak reserved: bytes held from the device)", results);
    json << ",\"replay\":{\"trace\":\"" << trace_path << "\",\"results\":[";
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      json << (i ? "," : "") << "{\"stack\":\"" << r.stack << "\",\"ns_per_op\":" << r.ns_per_op << ",\"peak_live\":" << r.peak_live
           << ",\"peak_reserved\":" << r.peak_reserved << ",\"ratio\":" << r.ratio() << ",\"failed\":" << (r.failed ? "true" : "false") << "}";
    }
    json << "]}";
  }
  json << "}\n";
  return 0;
}
