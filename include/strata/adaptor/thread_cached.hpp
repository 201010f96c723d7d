#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/properties.hpp>
#include <strata/detail/size_classes.hpp>

namespace strata {

/// Per-thread caches of recently freed blocks in front of one shared box, so that threads allocating and
/// freeing the same sizes rarely touch the shared box or its lock. Requests up to `max_block` bytes
/// (alignment up to 256) are rounded to strata's size classes and served from the calling thread's cache;
/// a miss takes the shared lock once to fetch several blocks, an overfull cache hands half back under one
/// lock. Larger requests go straight to the shared box under its lock. The shared box needs no lock of its
/// own. Blocks cached by a thread that has exited stay until release() or destruction, which return every
/// thread's cache.
/// Models: resource; owning/releasable when the upstream is; sized (the class size) when the upstream is;
/// the upstream's properties. Cost of a cached allocate or free: a thread-local lookup and an uncontended
/// spin flag, O(1); a miss adds the shared mutex and a few upstream calls. Thread-safe. Move-only (not while
/// in use).
template <resource Upstream>
class thread_cached : public forward_properties<thread_cached<Upstream>, Upstream>, public sync_names<thread_cached<Upstream>> {
  static constexpr std::size_t largest_class = std::size_t{1} << 20;
  static constexpr auto class_sizes = detail::make_class_table<largest_class>();

public:
  struct options {
    std::size_t max_block = largest_class;              ///< larger requests bypass the caches
    std::size_t max_blocks_per_class = 32;              ///< per thread
    std::size_t max_bytes_per_class = std::size_t{1} << 20;  ///< per thread: a class caches at most this much
  };

  explicit thread_cached(Upstream upstream = Upstream{}, options opts = options{})
      : upstream_(std::move(upstream)), opts_(opts), serial_(next_serial())
  {
    opts_.max_block = std::min(opts_.max_block, largest_class);
  }
  thread_cached(thread_cached&& other) noexcept
      : upstream_(std::move(other.upstream_)), opts_(other.opts_), serial_(std::exchange(other.serial_, next_serial())),
        caches_(std::move(other.caches_))
  {
    other.caches_.clear();
  }
  thread_cached& operator=(thread_cached&&) = delete;
  ~thread_cached() { drain_all(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    if (!cacheable(bytes, alignment)) {
      std::lock_guard lock(mutex_);
      return upstream_.allocate(bytes, alignment);
    }
    const std::size_t c = detail::class_index(bytes);
    cache& mine = my_cache();
    {
      spin_guard guard(mine.busy);
      auto& bin = mine.bins[c];
      if (!bin.empty()) {
        void* p = bin.back();
        bin.pop_back();
        return p;
      }
    }
    return refill(mine, c);
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    if (!cacheable(bytes, alignment)) {
      std::lock_guard lock(mutex_);
      upstream_.deallocate(p, bytes, alignment);
      return;
    }
    const std::size_t c = detail::class_index(bytes);
    cache* mine = nullptr;
    try {
      mine = &my_cache();
    } catch (...) {
      std::lock_guard lock(mutex_);
      upstream_.deallocate(p, class_sizes[c], default_alignment);
      return;
    }
    spin_guard guard(mine->busy);
    auto& bin = mine->bins[c];
    if (bin.size() >= capacity(c)) spill(bin, c, bin.size() / 2 + 1);
    bin.push_back(p);  // capacity reserved when the cache was made: cannot throw
  }

  /// Returns every thread's cached blocks to the shared box, then releases the box's free chunks if it can.
  void release()
  {
    drain_all();
    if constexpr (releasable_resource<Upstream>) {
      std::lock_guard lock(mutex_);
      upstream_.release();
    }
  }

  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const
    requires sized_resource<Upstream>
  {
    if (cacheable(bytes, alignment)) return upstream_.good_size(class_sizes[detail::class_index(bytes)], default_alignment);
    std::lock_guard lock(mutex_);
    return upstream_.good_size(bytes, alignment);
  }

  bool owns(const void* p) const noexcept
    requires owning_resource<Upstream>
  {
    std::lock_guard lock(mutex_);
    return upstream_.owns(p);
  }

  /// Blocks and bytes sitting in all threads' caches.
  std::pair<std::size_t, std::size_t> cached() const
  {
    std::lock_guard registry(registry_mutex_);
    std::size_t blocks = 0, bytes = 0;
    for (const auto& cache : caches_) {
      spin_guard guard(cache->busy);
      for (std::size_t c = 0; c < class_sizes.size(); ++c) {
        blocks += cache->bins[c].size();
        bytes += cache->bins[c].size() * class_sizes[c];
      }
    }
    return {blocks, bytes};
  }
  std::size_t threads_seen() const
  {
    std::lock_guard registry(registry_mutex_);
    return caches_.size();
  }

  /// Runs f(upstream) under the shared lock.
  template <class F>
  decltype(auto) with_lock(F&& f)
  {
    std::lock_guard lock(mutex_);
    return std::forward<F>(f)(upstream_);
  }

  friend bool operator==(const thread_cached& a, const thread_cached& b) noexcept { return &a == &b; }

private:
  struct cache {
    mutable std::atomic_flag busy;  // taken by its thread, and by release()/destruction from others
    std::vector<std::vector<void*>> bins;
  };

  class spin_guard {
  public:
    // Contended only while another thread drains the caches (release, destruction): spin, yielding.
    explicit spin_guard(std::atomic_flag& flag) noexcept : flag_(flag)
    {
      while (flag_.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
    }
    ~spin_guard() { flag_.clear(std::memory_order_release); }
    spin_guard(const spin_guard&) = delete;
    spin_guard& operator=(const spin_guard&) = delete;

  private:
    std::atomic_flag& flag_;
  };

  static std::uint64_t next_serial() noexcept
  {
    static std::atomic<std::uint64_t> serial{1};
    return serial.fetch_add(1, std::memory_order_relaxed);
  }

  bool cacheable(std::size_t bytes, std::size_t alignment) const noexcept
  {
    return bytes != 0 && bytes <= opts_.max_block && alignment <= default_alignment && is_power_of_two(alignment);
  }
  std::size_t capacity(std::size_t c) const noexcept
  {
    return std::clamp<std::size_t>(opts_.max_bytes_per_class / class_sizes[c], 1, opts_.max_blocks_per_class);
  }

  /// The calling thread's cache for this box: a thread-local list keyed by the box's serial (never reused,
  /// so a dead box's entry is never matched), the last one used checked first.
  cache& my_cache()
  {
    struct entry {
      std::uint64_t serial;
      cache* c;
    };
    thread_local std::vector<entry> entries;
    thread_local entry last{0, nullptr};
    if (last.serial == serial_) return *last.c;
    for (const entry& e : entries)
      if (e.serial == serial_) {
        last = e;
        return *e.c;
      }
    auto fresh = std::make_unique<cache>();
    fresh->bins.resize(class_sizes.size());
    for (std::size_t c = 0; c < class_sizes.size(); ++c) fresh->bins[c].reserve(capacity(c) + 1);
    cache* raw = fresh.get();
    entries.reserve(entries.size() + 1);
    {
      std::lock_guard registry(registry_mutex_);
      caches_.push_back(std::move(fresh));
    }
    entries.push_back({serial_, raw});
    last = entries.back();
    return *raw;
  }

  /// Fetches half a cache's worth of class c under one lock; returns one block, files the rest.
  void* refill(cache& mine, std::size_t c)
  {
    const std::size_t want = std::max<std::size_t>(1, capacity(c) / 2);
    void* got[64];
    std::size_t n = 0;
    {
      std::lock_guard lock(mutex_);
      got[n++] = upstream_.allocate(class_sizes[c], default_alignment);  // may throw: nothing taken yet
      try {
        while (n < std::min<std::size_t>(want, 64)) got[n++] = upstream_.allocate(class_sizes[c], default_alignment);
      } catch (...) {
        // Fewer spares than hoped; the one asked for is there.
      }
    }
    spin_guard guard(mine.busy);
    auto& bin = mine.bins[c];
    for (std::size_t i = 1; i < n; ++i) {
      if (bin.size() < capacity(c)) {
        bin.push_back(got[i]);
      } else {
        std::lock_guard lock(mutex_);
        upstream_.deallocate(got[i], class_sizes[c], default_alignment);
      }
    }
    return got[0];
  }

  /// Hands the oldest `count` blocks of a bin back under one lock (the caller holds the cache's flag).
  void spill(std::vector<void*>& bin, std::size_t c, std::size_t count) noexcept
  {
    count = std::min(count, bin.size());
    {
      std::lock_guard lock(mutex_);
      for (std::size_t i = 0; i < count; ++i) upstream_.deallocate(bin[i], class_sizes[c], default_alignment);
    }
    bin.erase(bin.begin(), bin.begin() + static_cast<std::ptrdiff_t>(count));
  }

  void drain_all() noexcept
  {
    std::lock_guard registry(registry_mutex_);
    for (auto& cache : caches_) {
      spin_guard guard(cache->busy);
      for (std::size_t c = 0; c < class_sizes.size(); ++c) spill(cache->bins[c], c, cache->bins[c].size());
    }
  }

  Upstream upstream_;
  options opts_;
  std::uint64_t serial_;
  mutable std::mutex mutex_;           ///< guards the shared box
  mutable std::mutex registry_mutex_;  ///< guards the list of caches
  std::vector<std::unique_ptr<cache>> caches_;
};

namespace detail::thread_cached_claims {
using T = thread_cached<archetype_resource>;
static_assert(resource<T> && !stream_resource<T> && !owning_resource<T> && !sized_resource<T>);
static_assert(cccl::synchronous_resource_with<T, device_accessible>);
} // namespace detail::thread_cached_claims

} // namespace strata
