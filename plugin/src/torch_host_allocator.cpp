// strata's pinned_host_pool as PyTorch's pinned-memory allocator: an at::HostAllocator registered for CUDA in
// PyTorch's host-allocator registry (at::setHostAllocator), so Tensor.pin_memory(), torch.empty(...,
// pin_memory=True) and the copies that record their use (non_blocking copies call record_event) reach it, and
// torch.cuda.host_memory_stats() / torch._C._host_emptyCache() ask it, wherever PyTorch routes them through the
// registry (tests/device/torch/pinned_host_check.py finds out, path by path).
//
// PyTorch's rule for a block's uses is kept: record_event notes the stream, and the free records one event on
// each noted stream, so the block comes back after everything those streams had been given by then. Blocks
// allocated while a CUDA graph captures into a private pool (begin_allocate_to_pool) are kept for that pool
// until release_pool: a graph replays its copies from the same host addresses.
//
// The pool also lends the device stacks' sleep/wake backup (strata_torch_lend_pinned; Note [One pinned
// budget]): a pause takes its backup as a block of this pool and a resume gives it back at once, so pinned
// tensors, offload buffers and paused tags share one set of pinned pages. The lent blocks count as in use
// (host_memory_stats' active bytes and requests, strata_torch_pinned_figures' in_use) while a tag sleeps.
// Lock order (Note [The plug-in's locks]): a pause or resume calls the lender under a device's lock, and the
// lender takes this allocator's mutex inside it; so nothing done under the mutex calls into libstrata_alloc
// (pinning, events and stream synchronizations are CUDA's own calls), and strata_torch_lend_pinned calls the
// plug-in with the mutex released.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <strata/pinned/pin_lender.hpp>
#include <strata/pinned/pinned_host_pool.hpp>
#include <strata_alloc.h>

namespace {

using pool_type = strata::pinned_host_pool<>;

struct block_record {
  std::size_t bytes = 0;
  std::vector<c10::Stream> streams;  // streams whose work used the block (record_event)
  std::optional<c10::MempoolId_t> graph_pool;  // allocated while a capture routed here
};

class strata_host_allocator final : public at::HostAllocator {
public:
  static strata_host_allocator& instance()
  {
    // Never destroyed: at exit the CUDA runtime may be gone before static destructors run, and the host
    // gives the pinned memory back with the process.
    static auto* allocator = new strata_host_allocator;
    return *allocator;
  }

  at::DataPtr allocate(std::size_t bytes) override
  {
    if (bytes == 0) return {nullptr, nullptr, &free_block, at::DeviceType::CPU};
    std::lock_guard<std::mutex> lock(mutex_);
    pool_type& pool = pool_on_first_use();
    blocks_.reserve(blocks_.size() + 1);
    void* p = nullptr;
    try {
      p = pool.allocate(bytes);
    } catch (const std::bad_alloc& e) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "pinned host memory (strata): ", e.what());
    }
    try {
      blocks_.emplace(p, block_record{bytes, {}, capturing_pool()});
    } catch (...) {
      pool.deallocate(p, bytes);
      throw;
    }
    ++requests_.allocated;
    peak_requests_ = std::max(peak_requests_, blocks_.size());
    return {p, p, &free_block, at::DeviceType::CPU};
  }

  bool record_event(void* ptr, void* ctx, c10::Stream stream) override
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(ctx != nullptr ? ctx : ptr);
    if (it == blocks_.end()) return false;  // not a block of this allocator
    auto& streams = it->second.streams;
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
    return true;
  }

  void empty_cache() override
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pool_) return;
    if (!unsure_.empty() && captures_.empty() && cudaDeviceSynchronize() == cudaSuccess) {
      for (const auto& [p, bytes] : unsure_) pool_->deallocate(p, bytes);
      unsure_.clear();
    }
    (void)pool_->release();
  }

  at::HostStats get_stats() override
  {
    std::lock_guard<std::mutex> lock(mutex_);
    at::HostStats stats;
    if (!pool_) return stats;
    const auto s = pool_->stats();
    stats.active_requests.current = static_cast<int64_t>(blocks_.size() + lent_blocks_);
    stats.active_requests.peak = static_cast<int64_t>(peak_requests_);
    stats.active_requests.allocated = static_cast<int64_t>(requests_.allocated);
    stats.active_requests.freed = static_cast<int64_t>(requests_.freed);
    stats.active_bytes.current = static_cast<int64_t>(s.in_use);
    stats.active_bytes.peak = static_cast<int64_t>(std::max(peak_in_use_, s.in_use));
    stats.allocations.current = static_cast<int64_t>(pool_->usage().chunks);
    stats.allocations.allocated = static_cast<int64_t>(s.pins);
    stats.allocations.freed = static_cast<int64_t>(s.unpins);
    stats.allocated_bytes.current = static_cast<int64_t>(s.pinned);
    stats.allocated_bytes.peak = static_cast<int64_t>(s.peak_pinned);
    stats.host_alloc_time.total = static_cast<int64_t>(s.pin_ns / 1000);
    stats.host_alloc_time.count = static_cast<int64_t>(s.pins);
    stats.host_free_time.total = static_cast<int64_t>(s.unpin_ns / 1000);
    stats.host_free_time.count = static_cast<int64_t>(s.unpins);
    stats.num_host_alloc = static_cast<int64_t>(s.pins);
    stats.num_host_free = static_cast<int64_t>(s.unpins);
    return stats;
  }

  void reset_accumulated_stats() override
  {
    std::lock_guard<std::mutex> lock(mutex_);
    requests_ = {};
  }
  void reset_peak_stats() override
  {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_requests_ = blocks_.size() + lent_blocks_;
    peak_in_use_ = pool_ ? pool_->stats().in_use : 0;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  void begin_allocate_to_pool(c10::MempoolId_t pool_id, std::function<bool(c10::Stream)> filter) override
  {
    std::lock_guard<std::mutex> lock(mutex_);
    captures_.emplace_back(pool_id, std::move(filter));
  }
  void end_allocate_to_pool(c10::MempoolId_t pool_id) override
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = captures_.begin(); it != captures_.end(); ++it)
      if (it->first == pool_id) {
        captures_.erase(it);
        break;
      }
  }
  void release_pool(c10::MempoolId_t pool_id) override
  {
    std::lock_guard<std::mutex> lock(mutex_);
    released_.push_back(pool_id);
    const auto it = graph_freed_.find(pool_id);
    if (it == graph_freed_.end()) return;
    for (const auto& [p, bytes] : it->second) pool_->deallocate(p, bytes);
    graph_freed_.erase(it);
  }

  /// pinned, peak pinned, in use, requested, waiting, blocks, pins, unpins, pin ns, unpin ns, host waits,
  /// events recorded, NUMA node + 1 (0: none).
  int figures(unsigned long long* out, int n)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pool_) return 0;
    const auto s = pool_->stats();
    const unsigned long long all[] = {s.pinned, s.peak_pinned, s.in_use, s.requested, s.waiting, s.blocks, s.pins, s.unpins,
                                      s.pin_ns, s.unpin_ns, s.host_waits, s.events_recorded,
                                      static_cast<unsigned long long>(pool_->numa_node() + 1)};
    const int count = std::min(n, static_cast<int>(sizeof all / sizeof all[0]));
    for (int i = 0; i < count; ++i) out[i] = all[i];
    return count;
  }

  std::size_t live_blocks()
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return blocks_.size();
  }

  /// strata_set_backup_lender's take: a block of the pool, page-aligned, counted as a request in use until
  /// given back; null when the pool cannot pin it (the pause then fails, nothing lost). Never throws.
  static void* lend(void* self, std::size_t bytes) noexcept
  {
    auto& a = *static_cast<strata_host_allocator*>(self);
    try {
      std::lock_guard<std::mutex> lock(a.mutex_);
      void* p = a.pool_on_first_use().allocate(bytes, strata::pin_lender::page_alignment);
      ++a.lent_blocks_;
      ++a.requests_.allocated;
      a.peak_requests_ = std::max(a.peak_requests_, a.blocks_.size() + a.lent_blocks_);
      return p;
    } catch (...) {
      return nullptr;
    }
  }
  /// strata_set_backup_lender's give: the block is free for the next pinned tensor at once (the backend
  /// finished its copies before giving it back: no event to wait for).
  static void take_back(void* self, void* p, std::size_t bytes) noexcept
  {
    auto& a = *static_cast<strata_host_allocator*>(self);
    std::lock_guard<std::mutex> lock(a.mutex_);
    a.peak_in_use_ = std::max(a.peak_in_use_, a.pool_->stats().in_use);
    a.pool_->deallocate(p, bytes, strata::pin_lender::page_alignment);
    --a.lent_blocks_;
    ++a.requests_.freed;
  }
  /// Whether the device stacks borrow from this pool (strata_torch_lend_pinned).
  std::atomic<bool> lending{false};

  at::HostAllocator* previous = nullptr;
  uint8_t priority = 0;

private:
  static void free_block(void* ctx) { instance().free(ctx); }

  void free(void* ctx) noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = blocks_.find(ctx);
    if (it == blocks_.end()) return;
    block_record record = std::move(it->second);
    blocks_.erase(it);
    ++requests_.freed;
    peak_in_use_ = std::max(peak_in_use_, pool_->stats().in_use);
    try {
      if (record.graph_pool && !released(*record.graph_pool)) {
        graph_freed_[*record.graph_pool].emplace_back(ctx, record.bytes);
        return;
      }
      for (const c10::Stream& s : record.streams) {
        const c10::cuda::CUDAStream stream(c10::cuda::CUDAStream::UNCHECKED, s);
        const c10::cuda::CUDAGuard on(stream.device_index());
        try {
          pool_->record_use(ctx, stream.stream());
        } catch (...) {  // a capturing stream, or one of another device: no event the pool could wait for
          if (cudaStreamSynchronize(stream.stream()) != cudaSuccess) {
            (void)cudaGetLastError();
            unsure_.emplace_back(ctx, record.bytes);
            return;
          }
        }
      }
    } catch (...) {  // bookkeeping failed: keep the block out rather than hand it out early
      return;
    }
    pool_->deallocate(ctx, record.bytes);
  }

  pool_type& pool_on_first_use()
  {
    if (!pool_) pool_.emplace(strata::host_pinning(c10::cuda::current_device()), strata::cuda_events{});
    return *pool_;
  }

  std::optional<c10::MempoolId_t> capturing_pool() const
  {
    if (captures_.empty()) return std::nullopt;
    const c10::Stream current = c10::cuda::getCurrentCUDAStream().unwrap();
    for (const auto& [id, filter] : captures_)
      if (filter(current)) return id;
    return std::nullopt;
  }

  bool released(const c10::MempoolId_t& id) const { return std::find(released_.begin(), released_.end(), id) != released_.end(); }

  struct request_counts {
    std::size_t allocated = 0, freed = 0;
  };

  std::mutex mutex_;
  std::optional<pool_type> pool_;
  std::unordered_map<void*, block_record> blocks_;
  std::vector<std::pair<c10::MempoolId_t, std::function<bool(c10::Stream)>>> captures_;
  std::map<c10::MempoolId_t, std::vector<std::pair<void*, std::size_t>>> graph_freed_;
  std::vector<c10::MempoolId_t> released_;
  std::vector<std::pair<void*, std::size_t>> unsure_;  // freed with a use no event covers: back after a device sync
  request_counts requests_;
  std::size_t lent_blocks_ = 0;  // blocks the device stacks' backup borrows now
  std::size_t peak_requests_ = 0;
  std::size_t peak_in_use_ = 0;
};

std::string& last_error()
{
  static std::string message;
  return message;
}

} // namespace

/// Installs strata's pinned pool as PyTorch's CUDA host allocator (highest priority). Refused (1, with
/// strata_torch_pinned_last_error) when PyTorch's own allocator already holds live pinned blocks: their uses
/// would be recorded with the wrong allocator. 0 on success, and when already installed.
extern "C" STRATA_ALLOC_API int strata_torch_install_pinned(void)
{
  try {
    auto& strata_allocator = strata_host_allocator::instance();
    at::HostAllocator* current = at::getHostAllocator(at::kCUDA);
    if (current == &strata_allocator) return 0;
    const auto live = current->get_stats().active_requests.current;
    if (live > 0) {
      last_error() = "PyTorch's pinned-memory allocator holds " + std::to_string(live) +
                     " live blocks: install strata's before the first pinned allocation";
      return 1;
    }
    strata_allocator.previous = current;
    at::setHostAllocator(at::kCUDA, &strata_allocator, 255);
    if (at::getHostAllocator(at::kCUDA) != &strata_allocator) {
      last_error() = "PyTorch's host-allocator registry kept another allocator";
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    last_error() = e.what();
    return 1;
  }
}

/// Gives PyTorch its own allocator back; refused (1) while strata's holds live blocks or lends the device
/// stacks' backup (strata_torch_lend_pinned(0) first).
extern "C" STRATA_ALLOC_API int strata_torch_uninstall_pinned(void)
{
  try {
    auto& strata_allocator = strata_host_allocator::instance();
    if (at::getHostAllocator(at::kCUDA) != &strata_allocator) return 0;
    if (strata_allocator.lending.load()) {
      last_error() = "strata's pinned pool lends the device stacks' sleep/wake backup: stop lending first";
      return 1;
    }
    if (const std::size_t live = strata_allocator.live_blocks(); live > 0) {
      last_error() = "strata's pinned pool holds " + std::to_string(live) + " live blocks";
      return 1;
    }
    strata_allocator.empty_cache();
    at::setHostAllocator(at::kCUDA, strata_allocator.previous, 255);
    return 0;
  } catch (const std::exception& e) {
    last_error() = e.what();
    return 1;
  }
}

/// on != 0: every device's page-mapped stack borrows its sleep/wake backup from strata's pinned pool, which must
/// be installed (strata_torch_install_pinned); on == 0: they pin their own again. strata_set_backup_lender's
/// answer: 1 lent, 0 nothing lent (the stacks cannot sleep), -1 refused (a device holds backup memory: resume
/// the paused tags or strata_release_backup() first), the message in strata_torch_pinned_last_error. Called
/// with the allocator's mutex released: the plug-in takes its backup and device locks, and under a device's
/// lock the lender takes this mutex.
extern "C" STRATA_ALLOC_API int strata_torch_lend_pinned(int on)
{
  auto& strata_allocator = strata_host_allocator::instance();
  if (on != 0 && at::getHostAllocator(at::kCUDA) != &strata_allocator) {
    last_error() = "strata's pinned-memory allocator is not installed (strata_torch_install_pinned first)";
    return -1;
  }
  const int answer = on != 0
                         ? strata_set_backup_lender(&strata_allocator, &strata_host_allocator::lend, &strata_host_allocator::take_back)
                         : strata_clear_backup_lender();
  if (answer < 0) {
    last_error() = strata_last_error();
    return -1;
  }
  strata_allocator.lending.store(on != 0 && answer == 1);
  return answer;
}

/// Up to n figures of strata's pinned pool (the order of strata_host_allocator::figures); returns how many.
extern "C" STRATA_ALLOC_API int strata_torch_pinned_figures(unsigned long long* out, int n)
{
  return strata_host_allocator::instance().figures(out, n);
}

extern "C" STRATA_ALLOC_API const char* strata_torch_pinned_last_error(void) { return last_error().c_str(); }
