// libstrata_torch_hooks.so, part two: strata as PyTorch's CUDA allocator backend, complete.
//
// PyTorch reaches its CUDA allocator through one process-wide c10::cuda::CUDACachingAllocator::CUDAAllocator.
// Its own second backend (cudaMallocAsync) is installed by storing another subclass there; this file does the
// same with a subclass over libstrata_alloc.so's per-device stacks, so every torch.cuda memory function
// (memory_stats, memory_snapshot, _record_memory_history, CUDA graphs' private pools, MemPool, IPC, ...) reaches
// strata. strata_torch_install_backend() installs it; strata_torch.enable() calls that before CUDA starts.
//
// The PyTorch-free parts live in headers the host tests check: device_statistics.hpp (memory_stats' figures),
// block_table.hpp (live blocks, private pools, checkpoints), pool_waits.hpp (parked blocks waiting on their
// recorded streams) and memory_history.hpp (trace and snapshot).
//
// Locks: libstrata_alloc.so's lock of the device (strata_device_lock) covers the backend's books of that device
// and its calls into the stack, which take no lock of their own inside it: one lock per allocation or free.
// Frames are gathered before it (the context recorder may take the GIL). A free finds its device by looking the
// pointer up in each device's table.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/core/impl/GPUTrace.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <strata_alloc.h>

#include <strata/ipc/imported_block.hpp>

#include "block_table.hpp"
#include "capture_order.hpp"
#include "descriptor_service.hpp"
#include "device_statistics.hpp"
#include "figures_of.hpp"
#include "ipc_handles.hpp"
#include "memory_history.hpp"
#include "pool_waits.hpp"

namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;
namespace caching = c10::CachingDeviceAllocator;
using context_ptr = std::shared_ptr<c10::GatheredContext>;
using strata::plugin::pool_id;

// The history's actions are c10's TraceEntry actions, in the same order.
static_assert(static_cast<int>(strata::plugin::trace_action::oom) == static_cast<int>(caching::TraceEntry::OOM));
static_assert(static_cast<int>(strata::plugin::context_mode::all) == static_cast<int>(caching::RecordContext::ALL));
static_assert(static_cast<std::size_t>(c10::CachingAllocator::StatType::NUM_TYPES) == strata::plugin::pool_kinds);

static_assert(sizeof(cudaIpcMemHandle_t) == strata::plugin::decoded_handle::cuda_handle_bytes);

/// Bytes as PyTorch's messages write them (c10's format_size: "20.00 MiB", never a unit above GiB, each unit
/// up to and including its own size), so a message matched against PyTorch's matches strata's. snprintf, not an
/// ostream: where the toolchain links the C++ library statically into each shared object, a floating-point
/// ostream insertion here may resolve to another object's copy, whose locale this one never set up.
std::string bytes_text(std::size_t bytes)
{
  if (bytes <= 1024) return std::to_string(bytes) + " bytes";
  const char* unit = "GiB";
  double value = static_cast<double>(bytes) / 1073741824.0;
  if (bytes <= 1048576) {
    unit = "KiB";
    value = static_cast<double>(bytes) / 1024.0;
  } else if (bytes <= 1073741824ULL) {
    unit = "MiB";
    value = static_cast<double>(bytes) / 1048576.0;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", value, unit);
  return buf;
}

pool_id to_pool(c10::MempoolId_t id) { return {id.first, id.second}; }
c10::MempoolId_t to_mempool(pool_id id) { return {id.first, id.second}; }

std::uint64_t now_us()
{
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

using strata::plugin::figures_of;

/// A private pool's checkpoint as PyTorch carries it (getCheckpointState / setCheckpointPoolState).
struct strata_pool_state final : alloc::AllocatorState {
  strata::plugin::pool_checkpoint<context_ptr> checkpoint;
};

struct route {
  pool_id pool;
  std::function<bool(cudaStream_t)> filter;
};

/// The device's lock in libstrata_alloc.so, held across the backend's books and its calls into the stack.
class device_lock {
public:
  explicit device_lock(int device) : device_(device)
  {
    TORCH_CHECK(strata_device_lock(device) == 0, "strata: ", strata_last_error());
  }
  ~device_lock() { unlock(); }
  device_lock(const device_lock&) = delete;
  device_lock& operator=(const device_lock&) = delete;
  void unlock() noexcept
  {
    if (held_) strata_device_unlock(device_);
    held_ = false;
  }
  void lock()
  {
    if (held_) return;
    TORCH_CHECK(strata_device_lock(device_) == 0, "strata: ", strata_last_error());
    held_ = true;
  }

private:
  int device_;
  bool held_ = true;
};

/// A capture as CUDA keeps it, for capture_frontiers (capture_order.hpp): a stream's capture frontier and a
/// node's dependencies. A query CUDA refuses reads as "not capturing" / "no dependencies known", which keeps
/// a free deferred rather than reuse a block too early.
struct cuda_capture_graph {
  using node = cudaGraphNode_t;
  std::optional<strata::plugin::capture_point<node>> frontier(void* stream)
  {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    const cudaGraphNode_t* deps = nullptr;
    size_t n = 0;
    if (cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, &id, nullptr, &deps, nullptr, &n) != cudaSuccess) {
      (void)cudaGetLastError();
      return std::nullopt;
    }
    if (status != cudaStreamCaptureStatusActive) return std::nullopt;
    return strata::plugin::capture_point<node>{id, std::vector<node>(deps, deps + n)};
  }
  std::vector<node> predecessors(node n)
  {
    size_t count = 0;
    std::vector<node> out;
    if (cudaGraphNodeGetDependencies(n, nullptr, nullptr, &count) == cudaSuccess && count > 0) {
      out.resize(count);
      if (cudaGraphNodeGetDependencies(n, out.data(), nullptr, &count) == cudaSuccess) out.resize(count);
      else out.clear();
    }
    (void)cudaGetLastError();
    return out;
  }
};

// Note [A MemPool's own allocator counts against the cap]
// PyTorch's per-process memory fraction caps everything its allocator holds, a MemPool's own allocator's
// segments (MemPool(allocator=...)) included, and such a pool caches its segments like any private pool, a
// released pool's until empty_cache. So here: those segments are cut and reused in the block table, at
// PyTorch's sizes, and kept idle once their released pool gives them up, until empty_cache hands them back; a
// new one is taken only when strata's held memory, the pools' own segments and it fit the cap; and strata's
// stack is told what those segments hold (strata_set_held_elsewhere), so that it holds at most the cap they
// leave and refuses past it as out of memory, after returning its idle memory where a wait is allowed, as
// PyTorch's allocator refuses (and use_on_oom pools may then serve the request).
/// One device's view: PyTorch's statistics, its blocks and pools, its history, the pools being allocated to.
/// Guarded by the device's lock (device_lock).
struct device_view {
  explicit device_view(int device) noexcept : waits(device) {}
  strata::plugin::device_statistics stats;
  strata::plugin::block_table<context_ptr> blocks;
  strata::plugin::pool_waits<strata::cuda_events> waits;  ///< parked blocks waiting on their recorded streams
  /// Blocks freed during a capture that the capture may order for reuse (capture_order.hpp).
  strata::plugin::capture_frontiers<cuda_capture_graph> frontiers;
  strata::plugin::memory_history<context_ptr> history;
  std::vector<route> routes;
  std::array<std::size_t, 3> oom_figures{};  ///< the request, the most allowed, the device's free bytes at the last out of memory
  /// The stack's figures as the backend's last call into it left them: a call that changes only the backend's
  /// own table (a parked block freed or revived) observes these, the stack being as it was.
  strata_device_figures last{};
  /// The segments and mapped ranges the trace last reported (Note [Segments and mapped ranges]), and the
  /// stack's figures then: segment events are looked for only when these figures move.
  strata::plugin::segment_ledger segments;
  strata::plugin::segment_figures segment_figures{};
  /// MemPools with an allocator of their own (MemPool(allocator=...), NCCL's ncclMemAlloc pool the common one):
  /// their segments come from that allocator, at PyTorch's sizes, and are cut and reused in the block table as
  /// any private pool's; a segment its released pool gave up stays idle until empty_cache hands it back (Note
  /// [A MemPool's own allocator counts against the cap]).
  std::map<pool_id, std::shared_ptr<alloc::CUDAAllocator>> foreign_pools;
  struct foreign_segment {
    std::shared_ptr<alloc::CUDAAllocator> from;
    size_t size;
  };
  std::unordered_map<std::uintptr_t, foreign_segment> foreign_segments;
  /// A segment its released pool gave up whole: kept, and counted as reserved, until empty_cache hands it back
  /// to its allocator (after the work on its streams), as PyTorch keeps a released pool's segments. Room for
  /// every segment is kept in the vector, so that a free moves one here without allocating.
  struct idle_segment {
    std::shared_ptr<alloc::CUDAAllocator> from;
    void* segment = nullptr;
    size_t size = 0;
    pool_id pool{};
    void* stream = nullptr;     ///< the stream it served
    std::vector<void*> uses;    ///< other streams its pieces were recorded on
  };
  std::vector<idle_segment> foreign_idle;
  size_t foreign_bytes = 0;       ///< held from MemPools' own allocators (idle ones too): counted as reserved
  size_t foreign_idle_bytes = 0;  ///< of those, given up by their pools
  std::uint64_t cap_ooms = 0;     ///< requests refused for the cap that MemPools' own allocators share
};

void local_raw_delete(void* ptr);

/// strata as PyTorch's process-wide CUDA allocator. Models: c10::cuda::CUDACachingAllocator::CUDAAllocator
/// (every member of PyTorch 2.11's interface; what strata cannot honour throws a c10::Error naming it).
/// Cost: an allocation or free is one libstrata_alloc.so call (which returns the figures it left) inside the
/// device's lock, plus an address-table update and O(1) statistics (no CUDA call of its own); recording history
/// adds PyTorch's frame gathering; out of memory adds a cudaMemGetInfo. Thread-safe: one lock per device.
class strata_backend final : public alloc::CUDAAllocator {
public:
  // ---- c10::Allocator ------------------------------------------------------------------------------------
  c10::DataPtr allocate(size_t size) override
  {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    void* p = size == 0 ? nullptr : malloc(device, size, c10::cuda::getCurrentCUDAStream(device).stream());
    return {p, p, &local_raw_delete, c10::Device(c10::DeviceType::CUDA, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &local_raw_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const final
  {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // ---- c10::DeviceAllocator ------------------------------------------------------------------------------
  bool initialized() override { return initialized_.load(std::memory_order_acquire); }

  void emptyCache(c10::MempoolId_t mempool_id) override
  {
    // PyTorch's default pool ({0, 0}): every device's idle memory, except on a device with an allocation to a
    // private pool under way (a capture may be running, where the release's host waits are illegal): there
    // nothing is released and nothing raised, as PyTorch's allocator does. A private pool's parked blocks stay
    // (its graphs replay at their addresses) until the pool is released. A private pool's id (MemPool's
    // destructor, after releasePool): strata took that pool's blocks back at its release, so what is left to
    // empty is the idle segments of the pool's own allocator, if it has one; nothing of another pool or device
    // is touched; this path never throws. Idle segments of MemPools' own allocators go back to them here, after
    // the work on them (not while an allocation to a pool is under way: a capture may be running).
    if (!to_pool(mempool_id).none()) {
      try {
        const int count = device_count_.load(std::memory_order_acquire);
        for (int d = 0; d < count; ++d) {
          device_view& v = *views_[static_cast<std::size_t>(d)];
          std::vector<device_view::idle_segment> idle;
          {
            device_lock lock(d);
            if (v.routes.empty()) {
              settle_waits(v);
              idle = take_idle(v, to_pool(mempool_id));
            }
            observe(v, static_cast<c10::DeviceIndex>(d));
          }
          hand_back_idle(v, d, idle);
        }
      } catch (...) {  // a destructor's path: figures read late are harmless, an exception is not
      }
      return;
    }
    std::string failure;
    const int count = device_count_.load(std::memory_order_acquire);
    for (int d = 0; d < count; ++d) {
      device_view& v = *views_[static_cast<std::size_t>(d)];
      std::vector<device_view::idle_segment> idle;
      {
        device_lock lock(d);
        if (v.routes.empty()) {
          settle_waits(v);
          try {
            v.waits.drain(events_, [&v](std::uintptr_t a, std::uint64_t t) noexcept { (void)v.blocks.settle(a, t); });
            idle = take_idle(v, {});
          } catch (const std::exception& e) {
            failure = e.what();
          }
        }
        strata_report_error("");  // the thread's last message may be an older call's
        if (strata_reset_device(d) != 0 && failure.empty()) failure = strata_last_error();
        observe(v, static_cast<c10::DeviceIndex>(d));
        track_segments(v, static_cast<c10::DeviceIndex>(d));
      }
      hand_back_idle(v, d, idle);
    }
    if (!failure.empty()) TORCH_CHECK(false, "strata: emptyCache: ", failure);
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override { alloc::CUDAAllocator::recordStream(ptr, stream); }

  caching::DeviceStats getDeviceStats(c10::DeviceIndex device) override
  {
    device_view& v = view(device);
    device_lock lock(device);
    observe(v, device);
    return to_c10(v.stats);
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override
  {
    device_view& v = view(device);
    device_lock lock(device);
    observe(v, device);
    v.stats.reset_accumulated();
  }
  void resetPeakStats(c10::DeviceIndex device) override
  {
    device_view& v = view(device);
    device_lock lock(device);
    observe(v, device);
    v.stats.reset_peaks();
    strata_reset_peak_stats(device);  // strata_torch.memory_stats()' peaks move with PyTorch's
  }

  // ---- CUDAAllocator -------------------------------------------------------------------------------------
  void* raw_alloc(size_t nbytes) override
  {
    if (nbytes == 0) return nullptr;
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return malloc(device, nbytes, c10::cuda::getCurrentCUDAStream(device).stream());
  }
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override
  {
    if (nbytes == 0) return nullptr;
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return malloc(device, nbytes, stream);
  }
  void raw_delete(void* ptr) override { free(ptr); }

  void init(int device_count) override
  {
    std::lock_guard lock(init_mutex_);
    if (static_cast<int>(views_.size()) < device_count) {
      std::vector<std::unique_ptr<device_view>> grown;
      for (auto& v : views_) grown.push_back(std::move(v));
      while (static_cast<int>(grown.size()) < device_count) {
        grown.push_back(std::make_unique<device_view>(static_cast<int>(grown.size())));
        grown.back()->segments.adopt(strata::plugin::held_memory{});  // before its first allocation a device holds nothing
      }
      views_ = std::move(grown);
    }
    device_count_.store(device_count, std::memory_order_release);
    initialized_.store(true, std::memory_order_release);
    apply_torch_conf();
  }

  double getMemoryFraction(c10::DeviceIndex device) override
  {
    // The cap is known once the device's stack is built (PYTORCH_CUDA_ALLOC_CONF's fraction applies then):
    // asked first, as a process may before its first tensor, it builds the stack as that tensor would.
    TORCH_CHECK(strata_device_prepare(device) == 0, "strata: ", strata_last_error());
    const strata_device_figures f = figures(device);
    if (f.device_memory == 0 || f.limit == SIZE_MAX) return 1.0;
    return static_cast<double>(f.limit) / static_cast<double>(f.device_memory);
  }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override
  {
    TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "strata: memory fraction ", std::to_string(fraction), " is not in [0, 1]");
    (void)view(device);
    strata_report_error("");  // so that only this call's message is read below
    strata_set_memory_fraction(fraction, device);
    const std::string message = strata_last_error();
    {
      device_lock lock(device);
      observe(view(device), device);  // the new cap in the figures at once
    }
    if (!message.empty()) TORCH_WARN(message);
  }

  std::vector<alloc::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex /*device*/) override
  {
    return {};  // strata has no expandable segments: its page-mapped pool is one reservation per device
  }

  void enable(bool value) override
  {
    TORCH_CHECK(value, "strata: the allocator cannot be turned off once installed (PyTorch's uncached mode is not "
                       "offered by the strata backend); use PyTorch's own allocator instead of strata_torch.enable()");
  }
  bool isEnabled() const override { return true; }

  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override
  {
    // cuDNN sizes its workspace by this: the largest block strata could hand out without growing, or the
    // device's free memory, never past the cap's headroom (a workspace the cap refuses would fail the conv).
    if (*largestBlock == 0) {
      size_t free_bytes = 0, total = 0;
      c10::cuda::CUDAGuard guard(device);
      C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
      *largestBlock = free_bytes;
    }
    const strata_device_figures f = figures(device);
    *largestBlock = std::max(*largestBlock, f.largest_free);
    // Under the cap on what strata holds, a block larger than its free space needs new memory, which the cap
    // grants only in place of idle memory given back: what is not in use.
    if (f.limit != SIZE_MAX)
      *largestBlock = std::min(*largestBlock, std::max(f.largest_free, f.limit - std::min(f.limit, f.in_use)));
  }

  void* getBaseAllocation(void* ptr, size_t* size) override { return strata_base_alloc(ptr, size); }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override
  {
    if (ptr.get_deleter() != &local_raw_delete || ptr.get() == nullptr) return;  // not ours (a shared tensor)
    const c10::DeviceIndex device = ptr.device().index();
    device_view& v = view(device);
    device_lock lock(device);
    // A private pool's block: its pool keeps the use (block_table.hpp's Note on stream-ordered reuse).
    if (v.blocks.record_use(reinterpret_cast<std::uintptr_t>(ptr.get()), stream.stream())) return;
    strata_report_error("");
    strata_record_stream_on(device, ptr.get(), stream.stream());
    check_no_error("recordStream");
  }

  alloc::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override
  {
    alloc::SnapshotInfo result;
    const int count = device_count_.load(std::memory_order_acquire);
    for (int d = 0; d < count; ++d) {
      device_view& v = *views_[static_cast<std::size_t>(d)];
      device_lock lock(d);
      append_segments(result.segments, v, static_cast<c10::DeviceIndex>(d), to_pool(mempool_id));
      result.device_traces.emplace_back();
      if (include_traces) append_trace(result.device_traces.back(), v, static_cast<c10::DeviceIndex>(d));
    }
    auto& md = result.config_metadata;
    md.garbage_collection_threshold = 0.0;
    md.max_split_size = SIZE_MAX;
    md.pinned_num_register_threads = 1;
    md.expandable_segments = false;
    md.release_lock_on_malloc = false;
    md.pinned_use_host_register = false;
    md.graph_capture_record_stream_reuse = reuse_within_capture();
    const char* conf = std::getenv("STRATA_ALLOC_CONF");
    md.last_allocator_settings = std::string("strata backend") + (conf != nullptr ? std::string(": ") + conf : std::string());
    return result;
  }

  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id, std::function<bool(cudaStream_t)> filter) override
  {
    device_view& v = view(device);
    device_lock lock(device);
    const pool_id id = to_pool(mempool_id);
    v.blocks.create_or_incref(id);
    try {
      v.routes.push_back({id, filter});
      strata_begin_allocate_to_pool(device, mempool_id, std::move(filter));
    } catch (const std::exception& e) {
      v.routes.pop_back();
      (void)v.blocks.release(id);
      TORCH_CHECK(false, "strata: beginAllocateToPool(", id.text(), "): ", e.what());
    }
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override
  {
    device_view& v = view(device);
    device_lock lock(device);
    const pool_id id = to_pool(mempool_id);
    const auto it = std::find_if(v.routes.rbegin(), v.routes.rend(), [&](const route& r) { return r.pool == id; });
    TORCH_CHECK(it != v.routes.rend(), "strata: endAllocateToPool: no allocation to pool ", id.text(), " is under way");
    v.routes.erase(std::next(it).base());
    try {
      strata_end_allocate_to_pool(device, mempool_id);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "strata: endAllocateToPool(", id.text(), "): ", e.what());
    }
  }
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override
  {
    device_view& v = view(device);
    device_lock lock(device);
    const pool_id id = to_pool(mempool_id);
    std::vector<std::pair<std::uintptr_t, strata::plugin::live_block<context_ptr>>> returned;
    try {
      returned = v.blocks.release(id);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "strata: ", e.what());
    }
    for (auto& segment : returned) give_back(v, device, std::move(segment), id);  // whole segments
    if (v.blocks.use_count(id) == 0) {
      try {
        strata_release_pool(device, mempool_id);
      } catch (const std::exception& e) {
        TORCH_CHECK(false, "strata: releasePool(", id.text(), "): ", e.what());
      }
    }
    if (v.blocks.use_count(id) == 0) v.foreign_pools.erase(id);  // its segments still live keep their allocator
    observe(v, device);
    track_segments(v, device);
  }
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override
  {
    device_view& v = view(device);
    device_lock lock(device);
    return v.blocks.use_count(to_pool(mempool_id));
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id, std::shared_ptr<alloc::CUDAAllocator> allocator) override
  {
    device_view& v = view(device);
    device_lock lock(device);
    const pool_id id = to_pool(mempool_id);
    const bool foreign = allocator != nullptr && allocator.get() != this;
    if (foreign) {
      const auto it = v.foreign_pools.find(id);
      TORCH_CHECK(it == v.foreign_pools.end() || it->second == allocator, "strata: createOrIncrefPool: pool ", id.text(),
                  " is served by another allocator (", it == v.foreign_pools.end() ? std::string() : it->second->name(), ")");
    }
    try {
      v.blocks.create_or_incref(id);
      if (foreign) v.foreign_pools.emplace(id, std::move(allocator));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "strata: createOrIncrefPool: ", e.what());
    }
  }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) override
  {
    device_view& v = view(device);
    device_lock lock(device);
    try {
      v.blocks.set_use_on_oom(to_pool(mempool_id), use_on_oom);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "strata: ", e.what());
    }
  }
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override
  {
    device_view& v = view(device);
    device_lock lock(device);
    try {
      v.blocks.set_no_split(to_pool(mempool_id));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "strata: ", e.what());
    }
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id, const std::unordered_set<void*>& expected) override
  {
    device_view& v = view(device);
    device_lock lock(device);
    return v.blocks.pool_live_matches(to_pool(mempool_id), expected);
  }

  std::shared_ptr<alloc::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override
  {
    device_view& v = view(device);
    device_lock lock(device);
    auto state = std::make_shared<strata_pool_state>();
    state->checkpoint = v.blocks.checkpoint(device, to_pool(id));
    return state;
  }
  alloc::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device, std::shared_ptr<alloc::AllocatorState> as) override
  {
    const auto state = std::dynamic_pointer_cast<strata_pool_state>(as);
    TORCH_CHECK(state != nullptr, "strata: setCheckpointPoolState was given a state another allocator made");
    TORCH_CHECK(state->checkpoint.device == device, "strata: setCheckpointPoolState: the state is device ",
                state->checkpoint.device, "'s, not device ", static_cast<int>(device), "'s");
    device_view& v = view(device);
    device_lock lock(device);
    strata::plugin::checkpoint_delta<context_ptr> d;
    try {
      d = v.blocks.restore(state->checkpoint);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "strata: ", e.what());
    }
    // The table already holds the new state; the statistics follow it: every freed block was live, every
    // revived one is live now.
    alloc::CheckpointDelta out;
    for (std::uintptr_t a : d.freed) out.ptrs_freed.push_back(reinterpret_cast<void*>(a));
    for (const auto& [a, b] : d.revived) {
      void* p = reinterpret_cast<void*>(a);
      out.dataptrs_allocd.emplace_back(p, p, &local_raw_delete, c10::Device(c10::DeviceType::CUDA, device));
    }
    recount(v);
    observe(v, device);
    return out;
  }

  // torch.multiprocessing (Note [PyTorch's shareable handles], ipc_handles.hpp). PyTorch keeps a shared block
  // alive in the exporter until every importer has released it (its reference-counting files and "limbo",
  // torch/csrc/CudaIPCTypes.cpp); the backend keeps the block's descriptors open until the block is freed.
  alloc::ShareableHandle shareIpcHandle(void* ptr) override
  {
    const auto block = reinterpret_cast<std::uintptr_t>(ptr);
    {
      std::lock_guard lock(ipc_mutex_);
      if (const auto* e = exports_.find(block)) return {e->offset, e->handle};
    }
    // The stack is asked without ipc_mutex_, which the free path takes inside the device's lock.
    std::size_t offset = 0;
    std::vector<std::size_t> sizes(16);
    std::vector<int> fds(16, -1);
    strata_report_error("");
    long n = strata_share_block(ptr, &offset, sizes.data(), fds.data(), sizes.size());
    if (n > static_cast<long>(sizes.size())) {  // a block over more allocations than guessed: ask with room
      sizes.resize(static_cast<std::size_t>(n));
      fds.resize(static_cast<std::size_t>(n), -1);
      n = strata_share_block(ptr, &offset, sizes.data(), fds.data(), sizes.size());
    }
    TORCH_CHECK(n >= 0, "strata: this block cannot be shared with another process: ", strata_last_error());
    if (n == 0) return share_cuda_malloc(ptr);
    strata::plugin::export_ledger::entry e;
    for (long i = 0; i < n; ++i) e.fds.emplace_back(fds[static_cast<std::size_t>(i)]);  // owned from here on
    sizes.resize(static_cast<std::size_t>(n));
    fds.resize(static_cast<std::size_t>(n));
    try {
      e.offset = static_cast<std::ptrdiff_t>(offset);
      e.handle = strata::plugin::encode_pages({.pid = static_cast<std::int32_t>(::getpid()),
                                               .mapping_bytes = {sizes.begin(), sizes.end()}, .fds = fds});
      std::lock_guard lock(ipc_mutex_);
      if (const auto* first = exports_.find(block)) return {first->offset, first->handle};  // another thread's, first
      start_service();
      const auto& kept = exports_.insert(block, std::move(e));
      exported_.fetch_add(1, std::memory_order_release);
      return {kept.offset, kept.handle};
    } catch (const std::exception& ex) {
      TORCH_CHECK(false, "strata: shareIpcHandle: ", ex.what());
    }
  }

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override
  {
    {
      std::lock_guard lock(ipc_mutex_);
      if (auto live = opened_.find(handle)) return live;
    }
    strata::plugin::decoded_handle h;
    try {
      h = strata::plugin::decode_handle(handle);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "strata: getIpcDevPtr: ", e.what());
    }
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    if (h.type == strata::plugin::shareable_type::cuda_malloc) {
      std::lock_guard lock(ipc_mutex_);  // opened once per process: CUDA refuses a second open of a handle
      if (auto live = opened_.find(handle)) return live;
      std::shared_ptr<void> sp = open_cuda_malloc(h, device);
      opened_.insert(handle, sp);
      return sp;
    }
    // Pages are opened without ipc_mutex_: taking the descriptors may wait on the exporter's service, whose
    // answer may need the exporter to finish an open of this process's memory (two processes importing from
    // each other at once).
    std::shared_ptr<void> mine = open_pages(h, device);
    std::shared_ptr<void> first;
    {
      std::lock_guard lock(ipc_mutex_);
      first = opened_.find(handle);  // another thread's, opened meanwhile
      if (!first) opened_.insert(handle, mine);
    }
    return first ? first : mine;  // an unused mapping of ours goes here, outside the lock its deleter takes
  }

  // PyTorch's _set_memory_metadata: a name for what the program does now, carried by each history event.
  void setUserMetadata(const std::string& metadata) override
  {
    auto named = metadata.empty() ? nullptr : std::make_shared<const std::string>(metadata);
    std::lock_guard lock(metadata_mutex_);
    user_metadata_ = std::move(named);
  }
  std::string getUserMetadata() override
  {
    const auto named = user_metadata();
    return named ? *named : std::string();
  }
  std::shared_ptr<const std::string> user_metadata() const
  {
    std::lock_guard lock(metadata_mutex_);
    return user_metadata_;
  }
  // torch.compile's regions, as PyTorch tracks them for the history (record_memory_history(compile_context=
  // True)): a stack per thread, the innermost region naming what the thread allocates.
  void pushCompileContext(std::string& md) override { compile_contexts_.push_back(std::make_shared<const std::string>(md)); }
  void popCompileContext() override
  {
    if (!compile_contexts_.empty()) compile_contexts_.pop_back();
  }
  static std::shared_ptr<const std::string> compile_context()
  {
    return compile_contexts_.empty() ? nullptr : compile_contexts_.back();
  }
  static constexpr const char* no_compile_context = "N/A";  // PyTorch's word for an event outside every region

  bool isHistoryEnabled() override { return history_enabled_.load(std::memory_order_acquire); }

  void recordHistory(bool enabled, alloc::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     alloc::RecordContext when, bool clearHistory, const std::vector<std::string>& skip_actions) override
  {
    const int count = device_count_.load(std::memory_order_acquire);
    // Checked on every device first, so a bad name changes nothing anywhere.
    for (const std::string& name : skip_actions) {
      try {
        (void)strata::plugin::parse_action(name);
      } catch (const std::exception& e) {
        TORCH_CHECK(false, "strata: ", e.what());
      }
    }
    context_recorder_.store(context_recorder, std::memory_order_release);
    for (int d = 0; d < count; ++d) {
      device_view& v = *views_[static_cast<std::size_t>(d)];
      device_lock lock(d);
      v.history.configure(enabled, static_cast<strata::plugin::context_mode>(when), alloc_trace_max_entries, clearHistory, skip_actions);
    }
    history_enabled_.store(enabled, std::memory_order_release);
    when_.store(enabled ? static_cast<int>(when) : 0, std::memory_order_release);
    if (enabled) adopt_segments();
  }

  void attachOutOfMemoryObserver(alloc::OutOfMemoryObserver observer) override
  {
    std::lock_guard lock(observers_mutex_);
    oom_observers_.push_back(std::move(observer));
  }
  void attachAllocatorTraceTracker(alloc::AllocatorTraceTracker tracker) override
  {
    trackers_.attach(std::move(tracker));
    adopt_segments();  // from now on the tracker hears of every segment strata takes or gives back
  }

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override
  {
    c10::cuda::CUDAGuard guard(dev);
    const cudaError_t status = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (status == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
    else C10_CUDA_CHECK(status);
    // Page-mapped memory is reachable only from the devices each mapping's access names: PyTorch asks this
    // before a kernel on `dev` reads `dev_to_access`'s memory (a copy that is not a plain memcpy), so that
    // device's stack grants `dev` on what it holds and on all it maps later.
    TORCH_CHECK(strata_grant_peer(dev_to_access, dev) >= 0, "strata: enablePeerAccess(", static_cast<int>(dev), ", ",
                static_cast<int>(dev_to_access), "): ", strata_last_error());
  }

  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count, cudaStream_t stream,
                          bool /*p2p_enabled*/) override
  {
    // Page-mapped memory is reachable from a peer only where its stack granted access: the peer copy works
    // whatever was granted (the driver takes the direct path where it can).
    if (srcDevice == dstDevice) return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  std::string name() override { return "strata"; }

  // ---- the free behind every DataPtr ---------------------------------------------------------------------
  void free(void* ptr)
  {
    if (ptr == nullptr) return;
    if (const c10::impl::PyInterpreter* trace = c10::impl::GPUTrace::get_trace(); C10_UNLIKELY(trace != nullptr))
      (*trace)->trace_gpu_memory_deallocation(c10::kCUDA, reinterpret_cast<uintptr_t>(ptr));
    const int count = device_count_.load(std::memory_order_acquire);
    context_ptr context;
    if (when_.load(std::memory_order_acquire) == static_cast<int>(alloc::RecordContext::ALL)) context = gather();
    for (int d = 0; d < count; ++d) {
      device_view& v = *views_[static_cast<std::size_t>(d)];
      device_lock lock(d);
      const bool defer = !v.routes.empty();  // see block_table.hpp's Note on stream-ordered reuse
      auto gone = v.blocks.erase(reinterpret_cast<std::uintptr_t>(ptr), defer);
      if (!gone) continue;
      const auto& b = gone->b;
      forget_export(ptr);  // before the address can be handed out (and shared) again
      if (gone->to_strata) give_back(v, d, std::move(*gone->to_strata), b.pool);
      else if (gone->parked && gone->ticket != 0 && !defer) start_wait(v, reinterpret_cast<std::uintptr_t>(ptr), gone->ticket, b.uses);
      else if (gone->parked && gone->ticket != 0 && reuse_within_capture()) note_capture_free(v, reinterpret_cast<std::uintptr_t>(ptr), gone->ticket, b);
      v.stats.on_free(counted(b.size), b.requested);
      apply(v);
      if (recording(v)) {
        record(v, d, strata::plugin::trace_action::free_requested, ptr, b.size, b.stream, b.pool, context);
        record(v, d, strata::plugin::trace_action::free_completed, ptr, b.size, b.stream, b.pool, context);
      }
      changed(v, static_cast<c10::DeviceIndex>(d), ptr, -static_cast<std::int64_t>(b.size));
      return;
    }
    TORCH_CHECK(false, "strata: invalid device pointer: ", ptr, " was not allocated by strata (or was freed already)");
  }

private:
  /// A block of a cudaMalloc'd stack: the IPC handle of the allocation it lies in, and its offset there.
  static alloc::ShareableHandle share_cuda_malloc(void* ptr)
  {
    size_t base_size = 0;
    void* base = strata_base_alloc(ptr, &base_size);
    cudaIpcMemHandle_t handle;
    const cudaError_t status = cudaIpcGetMemHandle(&handle, base);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      TORCH_CHECK(false, "strata: this block cannot be shared with another process: cudaIpcGetMemHandle failed (",
                  cudaGetErrorString(status), ")");
    }
    std::array<std::byte, sizeof handle> raw;
    std::memcpy(raw.data(), &handle, sizeof handle);
    return {static_cast<char*>(ptr) - static_cast<char*>(base), strata::plugin::encode_cuda_malloc(raw)};
  }

  /// Another process's cudaMalloc'd allocation, closed when the last tensor over it goes. ipc_mutex_ held.
  std::shared_ptr<void> open_cuda_malloc(const strata::plugin::decoded_handle& h, c10::DeviceIndex device)
  {
    cudaIpcMemHandle_t raw;
    std::memcpy(&raw, h.cuda_handle.data(), sizeof raw);
    void* p = nullptr;
    C10_CUDA_CHECK(cudaIpcOpenMemHandle(&p, raw, cudaIpcMemLazyEnablePeerAccess));
    // Closed under ipc_mutex_: the same handle opened again meanwhile would be refused by CUDA while this
    // mapping still stands.
    return std::shared_ptr<void>(p, [this, device](void* q) {
      std::lock_guard lock(ipc_mutex_);
      int previous = -1;
      if (cudaGetDevice(&previous) == cudaSuccess && previous != device) (void)cudaSetDevice(device);
      (void)cudaIpcCloseMemHandle(q);
      if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
      (void)cudaGetLastError();
    });
  }

  /// Another process's page-mapped memory ('e' from PyTorch's expandable segments or strata, 's' from strata):
  /// its descriptors taken from the exporter, its allocations mapped here in a range of their own, access
  /// granted to `device`. Unmapped when the last tensor over it goes, after the device's work on it has
  /// finished (cuMemUnmap does not wait for it). Without ipc_mutex_.
  std::shared_ptr<void> open_pages(const strata::plugin::decoded_handle& h, c10::DeviceIndex device)
  {
    strata::ipc::exported_block block;
    block.handle.kind = strata::ipc::memory_kind::mapped_pages;
    block.handle.device = device;
    block.handle.bytes = h.pages.span();
    block.handle.offset = 0;
    block.handle.mapping_bytes = h.pages.mapping_bytes;
    std::shared_ptr<strata::ipc::imported_block> mapping;
    try {
      block.fds = strata::plugin::take_descriptors(h.pages.pid, h.pages.fds);
      mapping = std::make_shared<strata::ipc::imported_block>(strata::ipc::imported_block::open(std::move(block)));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "strata: opening a CUDA tensor another process shared: ", e.what());
    }
    return std::shared_ptr<void>(mapping->get(), [device, mapping](void*) {
      int previous = -1;
      if (cudaGetDevice(&previous) == cudaSuccess && previous != device) (void)cudaSetDevice(device);
      (void)cudaDeviceSynchronize();
      (void)cudaGetLastError();
      mapping->close();
      if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
    });
  }

  /// The exporter's descriptor service (descriptor_service.hpp), started with the first page-mapped export, for
  /// importers that pidfd_getfd refuses. Where it cannot start, importers still have pidfd_getfd. ipc_mutex_ held.
  void start_service()
  {
    if (service_ || service_failed_) return;
    try {
      service_ = std::make_unique<strata::plugin::descriptor_service>([this](std::span<const int> numbers) {
        std::lock_guard lock(ipc_mutex_);
        std::vector<strata::ipc::unique_fd> lent;
        for (const int fd : numbers) {
          if (!exports_.holds(fd)) throw std::invalid_argument("descriptor " + std::to_string(fd) + " names no block shared and live");
          lent.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
          if (!lent.back()) throw std::system_error(errno, std::generic_category(), "dup");
        }
        return lent;
      });
    } catch (const std::exception&) {
      service_failed_ = true;  // an importer refused by pidfd_getfd is told no service runs here
    }
  }

  /// The block is being freed: the descriptors its export named are closed. Device lock held (locks are taken
  /// in that order: device, then ipc_mutex_).
  void forget_export(void* ptr) noexcept
  {
    if (exported_.load(std::memory_order_acquire) == 0) return;
    std::lock_guard lock(ipc_mutex_);
    if (exports_.erase(reinterpret_cast<std::uintptr_t>(ptr))) exported_.fetch_sub(1, std::memory_order_release);
  }

  /// PyTorch's free-memory callbacks (c10::FreeCudaMemoryCallbacksRegistry), as its allocator runs them before
  /// giving up on an allocation: torch.multiprocessing's frees the blocks whose importers are all done
  /// (CudaIPCCollect). Whether any freed memory. Without the device's lock: they free through this backend.
  static bool run_free_memory_callbacks()
  {
    bool freed = false;
    for (const std::string& name : c10::FreeCudaMemoryCallbacksRegistry()->Keys())
      freed = c10::FreeCudaMemoryCallbacksRegistry()->Create(name)->Execute() || freed;
    return freed;
  }

  /// PyTorch's allocator settings, read where PyTorch reads them: honoured, said to have no effect (a warning
  /// each), or refused (CUDA's initialization fails with the reason).
  static void apply_torch_conf()
  {
    const char* text = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
    if (text == nullptr) text = std::getenv("PYTORCH_ALLOC_CONF");
    if (text == nullptr) return;
    const int status = strata_apply_torch_conf(text);
    TORCH_CHECK(status >= 0, "strata: ", strata_last_error());
    if (status == 1) TORCH_WARN("strata: ", strata_last_error());
  }

  device_view& view(c10::DeviceIndex device)
  {
    const int count = device_count_.load(std::memory_order_acquire);
    TORCH_CHECK(device >= 0 && device < count, "strata: invalid device ", static_cast<int>(device), " (", count,
                " devices): did CUDA initialize?");
    return *views_[static_cast<std::size_t>(device)];
  }

  static strata_device_figures figures(c10::DeviceIndex device)
  {
    strata_device_figures f{};
    TORCH_CHECK(strata_device_figures_get(device, &f) >= 0, "strata: ", strata_last_error());
    if (f.limit == 0 && f.device_memory == 0) f.limit = SIZE_MAX;  // not built yet: no cap known
    return f;
  }

  /// A block's bytes in the figures: PyTorch's block size (pool_layout.hpp), whatever strata cut for it.
  static size_t counted(size_t bytes) { return strata::plugin::pool_layout::block_bytes(bytes); }

  /// Reads the stack's figures (outside the allocation and free paths, which are handed them) and applies them.
  static void observe(device_view& v, c10::DeviceIndex device)
  {
    strata_device_figures f{};
    if (strata_device_figures_get(device, &f) < 0) return;
    v.last = f;
    apply(v);
  }

  /// The statistics brought to the stack's last figures and the table's parked blocks.
  static void apply(device_view& v)
  {
    strata::plugin::stack_figures f = figures_of(v.last);
    // MemPools' own allocators' segments: those in their pools are counted by the pools' figures; idle ones
    // are segments of their own, wholly free, which empty_cache hands back.
    f.reserved += v.foreign_bytes;
    f.in_use += v.foreign_bytes - v.foreign_idle_bytes;
    f.chunks += v.foreign_idle.size();
    f.releasable += v.foreign_idle_bytes;
    f.ooms += v.cap_ooms;
    v.stats.observe(f, v.blocks.figures(), v.blocks.small_pages());
  }

  /// After a checkpoint moved blocks wholesale: the live figures recounted from the table.
  static void recount(device_view& v)
  {
    std::vector<std::pair<std::size_t, std::size_t>> live;
    v.blocks.for_each_live([&](std::uintptr_t, const auto& b) { live.emplace_back(counted(b.size), b.requested); });
    v.stats.recount_live(live);
  }

  /// Hands a block to strata's stack, with the streams its pool had recorded it on (the stack holds it for
  /// them). Device lock held.
  static void free_to_strata(int device, std::uintptr_t address, const strata::plugin::live_block<context_ptr>& b,
                             strata_device_figures* figures) noexcept
  {
    void* p = reinterpret_cast<void*>(address);
    for (void* s : b.uses) strata_record_stream_on(device, p, static_cast<cudaStream_t>(s));
    strata_free_observed(p, b.size, device, static_cast<cudaStream_t>(b.stream), figures);
  }

  /// A segment a private pool gave up, whole: to strata's stack, or, a MemPool's own allocator's, kept idle
  /// for empty_cache to hand back (device_view::idle_segment). Device lock held; allocates nothing.
  static void give_back(device_view& v, int device, std::pair<std::uintptr_t, strata::plugin::live_block<context_ptr>>&& segment,
                        pool_id pool) noexcept
  {
    const auto f = v.foreign_segments.find(segment.first);
    if (f == v.foreign_segments.end()) {
      free_to_strata(device, segment.first, segment.second, &v.last);
      return;
    }
    device_view::idle_segment idle{f->second.from, reinterpret_cast<void*>(segment.first), f->second.size, pool,
                                   segment.second.stream, std::move(segment.second.uses)};
    v.foreign_segments.erase(f);
    v.foreign_idle_bytes += idle.size;
    v.foreign_idle.push_back(std::move(idle));  // room kept by allocate_foreign
  }

  /// Counts `delta` more bytes held from MemPools' own allocators, and tells strata's stack, whose share of the
  /// cap they shrink (Note [A MemPool's own allocator counts against the cap]). Device lock held.
  static void hold_foreign(device_view& v, int device, std::ptrdiff_t delta) noexcept
  {
    v.foreign_bytes = static_cast<size_t>(static_cast<std::ptrdiff_t>(v.foreign_bytes) + delta);
    (void)strata_set_held_elsewhere(device, v.foreign_bytes);
  }

  /// The idle segments of MemPools' own allocators (of `pool` only, unless it is (0, 0)), taken off the idle
  /// list to be handed back by hand_back_idle; they still count against the cap until they are. Device lock
  /// held.
  static std::vector<device_view::idle_segment> take_idle(device_view& v, pool_id pool)
  {
    std::vector<device_view::idle_segment> out;
    out.reserve(v.foreign_idle.size());  // before anything moves: nothing below throws
    for (auto it = v.foreign_idle.begin(); it != v.foreign_idle.end();) {
      if (!pool.none() && it->pool != pool) {
        ++it;
        continue;
      }
      v.foreign_idle_bytes -= it->size;
      out.push_back(std::move(*it));
      it = v.foreign_idle.erase(it);
    }
    return out;
  }

  /// Hands idle segments back to their allocators once the work queued on them is done (an allocator frees at
  /// once, as cudaFree does not wait for streams), then stops counting them against the cap: only once they
  /// are gone may strata grow into their room. Without the device's lock (a Python allocator takes the GIL);
  /// takes it at the end.
  static void hand_back_idle(device_view& v, int device, std::vector<device_view::idle_segment>& list) noexcept
  {
    if (list.empty()) return;
    const auto wait = [](void* st) {
      if (cudaStreamSynchronize(static_cast<cudaStream_t>(st)) != cudaSuccess) (void)cudaGetLastError();
    };
    std::ptrdiff_t handed = 0;
    for (device_view::idle_segment& r : list) {
      wait(r.stream);
      for (void* st : r.uses) wait(st);
      r.from->raw_delete(r.segment);
      handed += static_cast<std::ptrdiff_t>(r.size);
    }
    list.clear();
    if (strata_device_lock(device) != 0) return;  // a device out of range: nothing was counted there
    hold_foreign(v, device, -handed);
    apply(v);
    strata_device_unlock(device);
  }

  /// PyTorch's graph_capture_record_stream_reuse (Note [A block freed during a capture is reused once the
  /// capture orders it]).
  static bool reuse_within_capture() { return c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::graph_capture_record_stream_reuse(); }

  /// A block freed during a capture, recorded on other streams: how far their captures reached, so that a
  /// later allocation of the capture may settle it. Device lock held; never throws (unnoted, it stays
  /// deferred).
  static void note_capture_free(device_view& v, std::uintptr_t address, std::uint64_t ticket, const strata::plugin::live_block<context_ptr>& b) noexcept
  {
    try {
      cuda_capture_graph graph;
      (void)v.frontiers.note(address, ticket, b.stream, b.uses, graph);
    } catch (...) {
    }
  }

  /// Settles the blocks freed during this capture whose other streams' work `stream`'s capture now follows.
  /// Device lock held.
  static void settle_ordered(device_view& v, cudaStream_t stream) noexcept
  {
    try {
      cuda_capture_graph graph;
      for (const auto& f : v.frontiers.ordered_before(stream, graph)) (void)v.blocks.settle(f.address, f.ticket);
    } catch (...) {  // no host memory for the walk: they stay deferred
    }
  }

  /// Starts an unsettled parked block's wait on its recorded streams; settles it at once where no wait is
  /// needed. Device lock held, no allocation to a pool under way.
  void start_wait(device_view& v, std::uintptr_t address, std::uint64_t ticket, const std::vector<void*>& uses) noexcept
  {
    if (!v.waits.hold(events_, address, ticket, uses)) (void)v.blocks.settle(address, ticket);
  }

  /// Settles the parked blocks whose waits are over and starts the waits of deferred frees. Device lock held,
  /// no allocation to a pool under way (an event recorded in a capture can never be queried). Never waits.
  void settle_waits(device_view& v) noexcept
  {
    v.frontiers.clear();  // no capture under way: the deferred frees below wait on events
    v.waits.reap(events_, [&v](std::uintptr_t a, std::uint64_t t) noexcept { (void)v.blocks.settle(a, t); });
    std::vector<strata::plugin::deferred_free> deferred;
    try {
      deferred = v.blocks.take_deferred();
    } catch (...) {
      return;  // no room to list them: they stay deferred, to the next call
    }
    for (const auto& f : deferred) start_wait(v, f.address, f.ticket, f.uses);
  }

  context_ptr gather() const
  {
    const auto recorder = context_recorder_.load(std::memory_order_acquire);
    return recorder != nullptr ? recorder() : nullptr;
  }

  /// An allocation, told to PyTorch's sanitizer (torch.cuda._sanitizer) outside the device's lock: its hook
  /// takes the GIL.
  void* malloc(c10::DeviceIndex device, size_t size, cudaStream_t stream)
  {
    void* p = allocate_block(device, size, stream);
    if (const c10::impl::PyInterpreter* trace = c10::impl::GPUTrace::get_trace(); C10_UNLIKELY(trace != nullptr))
      (*trace)->trace_gpu_memory_allocation(c10::kCUDA, reinterpret_cast<uintptr_t>(p));
    return p;
  }

  /// After an allocation or free: the profiler's memory view (profile_memory=True) and the trace's segment
  /// events. Device lock held.
  void changed(device_view& v, c10::DeviceIndex device, void* p, std::int64_t bytes)
  {
    c10::reportMemoryUsageToProfiler(p, bytes, static_cast<size_t>(v.stats.allocated_bytes[strata::plugin::pool_kind::all].current),
                                     static_cast<size_t>(v.stats.reserved_bytes[strata::plugin::pool_kind::all].current),
                                     c10::Device(c10::DeviceType::CUDA, device));
    track_segments(v, device);
  }

  /// Reports the segments strata took or gave back and the ranges it mapped or unmapped since the last report,
  /// when recording and the stack's segment figures moved. Device lock held.
  void track_segments(device_view& v, c10::DeviceIndex device)
  {
    if (!recording(v)) {
      if (v.segments.adopted()) v.segments.forget();  // recording again starts from adopt_segments
      return;
    }
    const strata::plugin::segment_figures now = strata::plugin::segment_figures_of(v.last);
    if (v.segments.adopted() && now == v.segment_figures) return;
    const std::optional<strata::plugin::held_memory> listing = read_listing(device);
    if (!listing) return;
    v.segment_figures = now;
    if (!v.segments.adopted()) {
      v.segments.adopt(*listing);
      return;
    }
    for (const auto& c : v.segments.update(*listing))
      record(v, device, c.action, reinterpret_cast<void*>(c.address), c.size, nullptr, {}, nullptr);
  }

  /// Every device's segments taken as they are: recording starts, and only later changes are reported.
  void adopt_segments()
  {
    const int count = device_count_.load(std::memory_order_acquire);
    for (int d = 0; d < count; ++d) {
      device_view& v = *views_[static_cast<std::size_t>(d)];
      device_lock lock(d);
      strata_device_figures f{};
      if (strata_device_figures_get(d, &f) != 0) {  // no stack yet: nothing held
        v.segments.adopt(strata::plugin::held_memory{});
        continue;
      }
      if (const auto listing = read_listing(static_cast<c10::DeviceIndex>(d))) {
        v.last = f;
        v.segment_figures = strata::plugin::segment_figures_of(f);
        v.segments.adopt(*listing);
      }
    }
  }

  /// The memory strata's listing says the device holds (Note [Segments and mapped ranges]); nullopt where the
  /// stack cannot list it.
  static std::optional<strata::plugin::held_memory> read_listing(c10::DeviceIndex device)
  {
    const size_t need = strata_snapshot_json(device, nullptr, 0);
    if (need == 0) return std::nullopt;
    std::string text(need + 1, '\0');
    if (strata_snapshot_json(device, text.data(), text.size()) != need) return std::nullopt;
    text.resize(need);
    try {
      return strata::plugin::parse_held_memory(text);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  /// A block of a MemPool served by its own allocator: a parked piece of its segments, else a new segment from
  /// that allocator at PyTorch's size, after the cap has room for it (Note [A MemPool's own allocator counts
  /// against the cap]). The allocator is called without the device's lock: it takes its own locks, and a
  /// Python one the GIL.
  void* allocate_foreign(device_view& v, c10::DeviceIndex device, const std::shared_ptr<alloc::CUDAAllocator>& from, pool_id pool,
                         size_t size, cudaStream_t stream, const context_ptr& context)
  {
    const size_t block = counted(size);
    const size_t segment = strata::plugin::pool_layout::segment_bytes(block);
    {
      device_lock lock(device);
      if (void* p = revive_in(v, device, pool, size, stream, context)) return p;
      // The cap and what strata holds as they are now: the figures of the last call may predate a new memory
      // fraction, or strata's stack may not be built yet.
      (void)strata_device_prepare(device);
      v.last = figures(device);
      apply(v);
      if (!cap_has_room(v, segment)) {
        ++v.cap_ooms;
        apply(v);
        const std::string message = out_of_memory_message(v, device, segment, stream,
                                                          "MemPool " + pool.text() + "'s allocator (" + from->name() +
                                                              ") would take the process past its memory cap");
        lock.unlock();
        throw_out_of_memory(device, v, message);
      }
      // Room for the segment's idle entry later (a free must not allocate), and its bytes counted now, so
      // that another thread's check sees them while the allocator runs without the lock.
      v.foreign_idle.reserve(v.foreign_segments.size() + v.foreign_idle.size() + 1);
      hold_foreign(v, device, static_cast<std::ptrdiff_t>(segment));
    }
    const auto unreserve = [&] {
      device_lock lock(device);
      hold_foreign(v, device, -static_cast<std::ptrdiff_t>(segment));
    };
    void* p = nullptr;
    try {
      p = from->raw_alloc_with_stream(segment, stream);
    } catch (...) {
      unreserve();
      throw;
    }
    if (p == nullptr) {
      unreserve();
      TORCH_CHECK_WITH(OutOfMemoryError, false, "strata: MemPool ", pool.text(), "'s allocator (", from->name(),
                       ") could not allocate ", bytes_text(segment));
    }
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    device_lock lock(device);
    size_t handed = 0;
    try {
      v.foreign_segments.emplace(base, device_view::foreign_segment{from, segment});
      handed = v.blocks.insert_segment(base, segment, {block, size, stream, pool, context});
    } catch (const std::exception& e) {
      v.foreign_segments.erase(base);
      hold_foreign(v, device, -static_cast<std::ptrdiff_t>(segment));
      lock.unlock();
      from->raw_delete(p);
      TORCH_CHECK(false, "strata: MemPool ", pool.text(), ": ", e.what());
    }
    v.stats.on_allocate(handed, size);
    apply(v);
    record(v, device, strata::plugin::trace_action::alloc, p, size, stream, pool, context);
    changed(v, device, p, static_cast<std::int64_t>(size));
    return p;
  }

  /// A parked piece of the pool for the request, handed out and counted (nullptr: none fits). Device lock held.
  void* revive_in(device_view& v, c10::DeviceIndex device, pool_id pool, size_t size, cudaStream_t stream, const context_ptr& context)
  {
    const auto revived = v.blocks.revive(pool, size, size, stream, context);
    if (!revived) return nullptr;
    void* p = reinterpret_cast<void*>(*revived);
    v.stats.on_allocate(v.blocks.find(*revived)->size, size);  // the piece may be larger (pool_layout.hpp)
    apply(v);
    record(v, device, strata::plugin::trace_action::alloc, p, size, stream, pool, context);
    changed(v, device, p, static_cast<std::int64_t>(size));
    return p;
  }

  /// Whether what strata holds, MemPools' own allocators' segments and `more` bytes fit the cap. Nothing is
  /// released to make room: a pool is being allocated to, so a capture may run, and PyTorch's allocator releases
  /// no cached blocks then either. Device lock held. O(1).
  static bool cap_has_room(const device_view& v, size_t more) noexcept
  {
    return v.last.limit == SIZE_MAX || v.last.reserved + v.foreign_bytes + more <= v.last.limit;
  }

  void* allocate_block(c10::DeviceIndex device, size_t size, cudaStream_t stream)
  {
    // PyTorch's own bound and words, before anything is counted: no device holds an exabyte.
    constexpr size_t one_exabyte = size_t{1} << 60;
    TORCH_CHECK_WITH(OutOfMemoryError, size < one_exabyte, "CUDA out of memory. Tried to allocate more than 1EB memory.");
    context_ptr context;
    if (when_.load(std::memory_order_acquire) != static_cast<int>(alloc::RecordContext::NEVER)) context = gather();
    device_view& v = view(device);
    device_lock lock(device);
    pool_id pool{};
    for (auto it = v.routes.rbegin(); it != v.routes.rend(); ++it)
      if (it->filter(stream)) {
        pool = it->pool;
        break;
      }
    if (const auto foreign = v.foreign_pools.find(pool); foreign != v.foreign_pools.end()) {
      const std::shared_ptr<alloc::CUDAAllocator> from = foreign->second;
      lock.unlock();  // the pool's allocator takes its own locks, and a Python one the GIL
      return allocate_foreign(v, device, from, pool, size, stream, context);
    }
    if (v.routes.empty()) settle_waits(v);
    if (!pool.none() && !v.routes.empty() && !v.frontiers.empty()) settle_ordered(v, stream);
    if (!pool.none())
      if (void* revived = revive_in(v, device, pool, size, stream, context)) return revived;
    // A private pool takes a segment at PyTorch's size (Note [Private pools are laid out as PyTorch lays them
    // out]); other blocks are exactly the request.
    const size_t taken = pool.none() ? size : strata::plugin::pool_layout::segment_bytes(counted(size));
    void* p = nullptr;
    std::string failure;
    bool out_of_memory = false;
    const auto attempt = [&] {
      out_of_memory = false;
      failure.clear();
      try {
        p = strata_malloc_or_throw_observed(taken, device, stream, &v.last);
      } catch (const std::bad_alloc&) {
        out_of_memory = true;
        failure = strata_last_error();
      } catch (const std::exception& e) {
        failure = e.what();
      }
    };
    // A refusal is counted by strata's stack at once; one the request then gets past after all is taken back,
    // so that num_ooms counts only what the caller sees.
    const auto attempt_again = [&] {
      if (strata_oom_served(device) == 0) --v.last.ooms;
      attempt();
    };
    attempt();
    if (out_of_memory) {
      lock.unlock();
      const bool freed = run_free_memory_callbacks();
      lock.lock();
      if (freed) attempt_again();
    }
    if (out_of_memory && v.routes.empty() && !v.foreign_idle.empty()) {
      // Released MemPools' segments kept for their allocators leave strata less of the cap: they go back first,
      // as PyTorch's allocator frees released pools' cached segments before it gives up (not while a pool is
      // being allocated to: a capture may be under way).
      std::vector<device_view::idle_segment> idle;
      try {
        idle = take_idle(v, {});
      } catch (const std::bad_alloc&) {  // no host memory to list them: they stay, and the request is refused
      }
      lock.unlock();
      hand_back_idle(v, device, idle);
      lock.lock();
      attempt_again();
    }
    if (out_of_memory) {
      if (const auto revived = v.blocks.revive_on_oom(size, size, stream, context)) {  // setUseOnOOM's pools
        const pool_id owner = v.blocks.find(*revived)->pool;
        // The caller got its memory: not an out of memory it saw.
        if (strata_oom_served(device) == 0) --v.last.ooms;
        v.stats.on_allocate(v.blocks.find(*revived)->size, size);
        apply(v);
        record(v, device, strata::plugin::trace_action::alloc, reinterpret_cast<void*>(*revived), size, stream, owner, context);
        changed(v, device, reinterpret_cast<void*>(*revived), static_cast<std::int64_t>(size));
        return reinterpret_cast<void*>(*revived);
      }
      apply(v);  // the refusal filled v.last
      const std::string message = out_of_memory_message(v, device, taken, stream, failure);
      lock.unlock();
      throw_out_of_memory(device, v, message);
    }
    TORCH_CHECK(p != nullptr, "strata: allocating ", taken, " bytes on device ", static_cast<int>(device), ": ", failure);
    size_t handed = counted(size);
    try {
      if (pool.none()) v.blocks.insert(reinterpret_cast<std::uintptr_t>(p), {size, size, stream, pool, context});
      else handed = v.blocks.insert_segment(reinterpret_cast<std::uintptr_t>(p), taken, {counted(size), size, stream, pool, context});
    } catch (const std::exception& e) {
      strata_free_observed(p, taken, device, stream, &v.last);
      apply(v);
      TORCH_CHECK(false, "strata: ", e.what());
    }
    v.stats.on_allocate(handed, size);
    apply(v);
    record(v, device, strata::plugin::trace_action::alloc, p, size, stream, pool, context);
    changed(v, device, p, static_cast<std::int64_t>(size));
    return p;
  }

  /// PyTorch's kind of out-of-memory message with strata's figures; records the trace's oom entry. Device
  /// lock held.
  std::string out_of_memory_message(device_view& v, c10::DeviceIndex device, size_t size, cudaStream_t stream,
                                    const std::string& strata_message)
  {
    size_t device_free = 0, device_total = 0;
    {
      c10::cuda::CUDAGuard guard(device);
      if (cudaMemGetInfo(&device_free, &device_total) != cudaSuccess) (void)cudaGetLastError();
    }
    const strata_device_figures& f = v.last;
    record(v, device, strata::plugin::trace_action::oom, reinterpret_cast<void*>(device_free), size, stream, {}, nullptr);
    c10::reportOutOfMemoryToProfiler(static_cast<std::int64_t>(size), static_cast<size_t>(v.stats.allocated_bytes[strata::plugin::pool_kind::all].current),
                                     static_cast<size_t>(v.stats.reserved_bytes[strata::plugin::pool_kind::all].current),
                                     c10::Device(c10::DeviceType::CUDA, device));
    // What PyTorch's observers are given: the request, the most the process may hold (the cap, else the
    // device's memory) and the device's free memory.
    v.oom_figures = {size, f.limit != SIZE_MAX ? f.limit : device_total, device_free};
    const auto allocated = static_cast<size_t>(v.stats.allocated_bytes[strata::plugin::pool_kind::all].current);
    std::string m = "CUDA out of memory. Tried to allocate " + bytes_text(size) + ". GPU " + std::to_string(device) +
                    " has a total capacity of " + bytes_text(device_total) + " of which " + bytes_text(device_free) +
                    " is free. Of the allocated memory " + bytes_text(allocated) + " is allocated by PyTorch, and " +
                    bytes_text(f.reserved - std::min(f.reserved, f.in_use)) + " is reserved by strata but unallocated. " +
                    "strata holds " + bytes_text(f.reserved) + " (largest free block " + bytes_text(f.largest_free) + ", " +
                    bytes_text(f.held_bytes) + " held for other streams";
    if (f.limit != SIZE_MAX) m += ", cap " + bytes_text(f.limit);
    if (v.foreign_bytes != 0) m += ", of which MemPools' own allocators hold " + bytes_text(v.foreign_bytes);
    return m + "). strata: " + strata_message;
  }

  /// Calls the out-of-memory observers (without the device lock: they may take the GIL and snapshot), then
  /// raises torch.OutOfMemoryError.
  [[noreturn]] void throw_out_of_memory(c10::DeviceIndex device, device_view& v, const std::string& message)
  {
    std::array<size_t, 3> figures{};
    {
      device_lock lock(device);
      figures = v.oom_figures;
    }
    std::vector<alloc::OutOfMemoryObserver> observers;
    {
      std::lock_guard olock(observers_mutex_);
      observers = oom_observers_;
    }
    for (const auto& o : observers) o(device, figures[0], figures[1], figures[2]);
    TORCH_CHECK_WITH(OutOfMemoryError, false, message);
  }

  /// Whether record() would keep or pass on anything: history on, or a trace tracker attached.
  bool recording(const device_view& v) const
  {
    return v.history.enabled() || trackers_.any();
  }

  void record(device_view& v, int device, strata::plugin::trace_action action, void* address, size_t size, void* stream,
              pool_id pool, const context_ptr& context)
  {
    const bool tracked = trackers_.any();
    if (!v.history.enabled() && !tracked) return;
    const std::uint64_t time = now_us();
    if (v.history.enabled())
      v.history.record({action, reinterpret_cast<std::uintptr_t>(address), size, stream, pool, time, context, user_metadata(),
                        compile_context()});
    if (tracked) {
      caching::TraceEntry te(static_cast<caching::TraceEntry::Action>(action), static_cast<c10::DeviceIndex>(device),
                             reinterpret_cast<size_t>(address), size, stream, to_mempool(pool), c10::getApproximateTime(), context,
                             compile_context() ? *compile_context() : no_compile_context, getUserMetadata());
      trackers_.call(te);
    }
  }

  static void append_segments(std::vector<caching::SegmentInfo>& out, device_view& v, c10::DeviceIndex device, pool_id only)
  {
    const size_t need = strata_snapshot_json(device, nullptr, 0);
    TORCH_CHECK(need > 0, "strata: snapshot: ", strata_last_error());
    std::string text(need + 1, '\0');
    TORCH_CHECK(strata_snapshot_json(device, text.data(), text.size()) == need, "strata: snapshot changed while read");
    text.resize(need);
    strata::snapshot view;
    try {
      view = strata::plugin::parse_snapshot_json(text);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "strata: snapshot: ", e.what());
    }
    auto listed = strata::plugin::snapshot_segments(view, v.blocks, only);
    for (const auto& [base, f] : v.foreign_segments)  // MemPools' own allocators' segments lie outside strata
      if (const auto segment = v.blocks.segment_at(base); segment && (only.none() || segment->pool == only))
        listed.push_back(strata::plugin::pool_segment_snapshot(v.blocks, *segment));
    std::sort(listed.begin(), listed.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
    for (const auto& s : listed) {
      caching::SegmentInfo si;
      si.device = device;
      si.address = s.address;
      si.total_size = s.total;
      si.requested_size = s.requested;
      si.allocated_size = s.allocated;
      si.active_size = s.active;
      si.stream = s.stream;
      si.is_large = s.large;
      si.is_expandable = false;
      si.owner_private_pool_id = to_mempool(s.pool);
      for (const auto& b : s.blocks) {
        caching::BlockInfo bi;
        bi.size = b.size;
        bi.requested_size = b.requested;
        bi.allocated = b.allocated;
        bi.active = b.active;
        bi.context_when_allocated = b.context;
        si.blocks.push_back(std::move(bi));
      }
      out.push_back(std::move(si));
    }
  }

  static void append_trace(std::vector<caching::TraceEntry>& out, const device_view& v, c10::DeviceIndex device)
  {
    for (const auto& r : v.history.trace()) {
      caching::TraceEntry te(static_cast<caching::TraceEntry::Action>(r.action), device, r.address, r.size, r.stream,
                             to_mempool(r.pool), 0, r.context, r.compile_context ? *r.compile_context : no_compile_context,
                             r.user_metadata ? *r.user_metadata : std::string());
      te.time_.t_ = static_cast<time_t>(r.time);  // microseconds since the epoch, as PyTorch's snapshot has them
      out.push_back(std::move(te));
    }
  }

  static caching::DeviceStats to_c10(const strata::plugin::device_statistics& s)
  {
    caching::DeviceStats out;
    auto copy = [](c10::CachingAllocator::StatArray& to, const strata::plugin::stat_array& from) {
      for (std::size_t k = 0; k < strata::plugin::pool_kinds; ++k) {
        to[k].current = from.kinds[k].current;
        to[k].peak = from.kinds[k].peak;
        to[k].allocated = from.kinds[k].allocated;
        to[k].freed = from.kinds[k].freed;
      }
    };
    copy(out.allocation, s.allocation);
    copy(out.segment, s.segment);
    copy(out.active, s.active);
    copy(out.inactive_split, s.inactive_split);
    copy(out.allocated_bytes, s.allocated_bytes);
    copy(out.reserved_bytes, s.reserved_bytes);
    copy(out.active_bytes, s.active_bytes);
    copy(out.inactive_split_bytes, s.inactive_split_bytes);
    copy(out.requested_bytes, s.requested_bytes);
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    out.num_sync_all_streams = s.num_sync_all_streams;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    out.max_split_size = -1;  // strata has no split-size limit
    return out;
  }

  static void check_no_error(const char* where)
  {
    const std::string message = strata_last_error();
    if (!message.empty()) TORCH_CHECK(false, "strata: ", where, ": ", message);
  }

  std::mutex init_mutex_;
  std::vector<std::unique_ptr<device_view>> views_;
  std::atomic<int> device_count_{0};
  std::atomic<bool> initialized_{false};
  mutable std::mutex metadata_mutex_;
  inline static thread_local std::vector<std::shared_ptr<const std::string>> compile_contexts_;
  std::shared_ptr<const std::string> user_metadata_;  ///< setUserMetadata's, null while none
  std::atomic<bool> history_enabled_{false};
  std::atomic<int> when_{0};
  std::atomic<alloc::CreateContextFn> context_recorder_{nullptr};
  std::mutex observers_mutex_;
  std::vector<alloc::OutOfMemoryObserver> oom_observers_;
  strata::plugin::tracker_list<caching::TraceEntry> trackers_;
  std::mutex ipc_mutex_;  ///< guards exports_, opened_ and the opening and closing of cudaMalloc handles
  strata::plugin::export_ledger exports_;
  std::atomic<std::size_t> exported_{0};  ///< exports_' size, read by every free without the lock
  strata::plugin::opened_handles opened_;
  std::unique_ptr<strata::plugin::descriptor_service> service_;  ///< never destroyed (the backend is not)
  bool service_failed_ = false;
  strata::cuda_events events_;  ///< stateless: the waits of parked pool blocks record and query through it
};

/// Never destroyed: PyTorch frees tensors during interpreter teardown, after static destructors run.
std::shared_ptr<strata_backend>& backend()
{
  static auto* b = new std::shared_ptr<strata_backend>(std::make_shared<strata_backend>());
  return *b;
}

void local_raw_delete(void* ptr) { backend()->free(ptr); }

} // namespace

/// Installs the strata backend as PyTorch's CUDA allocator. Must run before CUDA is initialized in the process
/// (PyTorch refuses to swap an allocator that has served memory). 0 on success; 1 with strata_last_error() set.
extern "C" STRATA_ALLOC_API int strata_torch_install_backend(void)
{
  try {
    strata_set_oom_handler(nullptr);  // the backend raises torch.OutOfMemoryError itself, with its figures
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(backend());
    // The device-generic API (torch.accelerator.memory_stats and the like) asks c10's allocator registry,
    // which must name strata as well: at the highest priority, so no later registration displaces it.
    c10::SetAllocator(c10::DeviceType::CUDA, backend().get(), std::numeric_limits<std::uint8_t>::max());
    return 0;
  } catch (const std::exception& e) {
    strata_report_error((std::string("strata_torch_install_backend: ") + e.what()).c_str());
    return 1;
  }
}
