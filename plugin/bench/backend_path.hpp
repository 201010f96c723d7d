#pragma once
// What strata's PyTorch backend (plugin/src/torch_backend.cpp) does per allocation and free, without PyTorch:
// the device's lock, the observed entry point, the block table and the statistics, in the backend's order.
// The benchmarks time it over a real stack (plugin_cost.cpp) and the simulated one (host_cost.cpp).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include <strata_alloc.h>

#include "block_table.hpp"
#include "pool_layout.hpp"
#include "figures_of.hpp"
#include "device_statistics.hpp"

namespace strata::bench {

using plugin::figures_of;

/// The backend's books of device 0. SeparateLock: its own mutex around the plug-in's calls (which then lock
/// the device again), instead of the plug-in's device lock held across both.
template <bool SeparateLock>
class backend_path {
public:
  void* allocate(std::size_t n, cudaStream_t stream)
  {
    section s(*this);
    void* p = strata_malloc_or_throw_observed(n, 0, stream, &last_);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    blocks_.insert(a, {n, n, stream, {}, {}});
    stats_.on_allocate(plugin::pool_layout::block_bytes(n), n);
    apply();
    return p;
  }
  void free(void* p)
  {
    section s(*this);
    const auto gone = blocks_.erase(reinterpret_cast<std::uintptr_t>(p));
    const auto& b = gone->b;
    if (gone->to_strata) strata_free_observed(p, b.size, 0, static_cast<cudaStream_t>(b.stream), &last_);
    stats_.on_free(plugin::pool_layout::block_bytes(b.size), b.requested);
    apply();
  }
  const plugin::device_statistics& stats() const noexcept { return stats_; }

private:
  struct section {
    backend_path& b;
    explicit section(backend_path& owner) : b(owner)
    {
      if constexpr (SeparateLock) b.mutex_.lock();
      else (void)strata_device_lock(0);
    }
    ~section()
    {
      if constexpr (SeparateLock) b.mutex_.unlock();
      else strata_device_unlock(0);
    }
  };

  void apply() { stats_.observe(figures_of(last_), blocks_.figures(), blocks_.small_pages()); }

  std::mutex mutex_;
  plugin::device_statistics stats_;
  plugin::block_table<std::shared_ptr<void>> blocks_;
  strata_device_figures last_{};
};

} // namespace strata::bench
