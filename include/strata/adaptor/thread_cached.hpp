#pragma once
#include <concepts>
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
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/detail/size_classes.hpp>

namespace strata {

/// Per-thread caches of recently freed blocks in front of one shared box, so that threads allocating and
/// freeing the same sizes rarely touch the shared box or its lock. Requests up to `max_block` bytes
/// (alignment up to 256) are rounded to strata's size classes and served from the calling thread's cache;
/// a miss takes the shared lock once to fetch several blocks, an overfull cache hands half back under one
/// lock. Larger requests go straight to the shared box under its lock. The shared box needs no lock of its
/// own. A thread's cache goes back to the shared box when the thread exits; release() returns every
/// live thread's cache too.
///
/// Re-entrancy: the shared lock is recursive and is the only lock held across a call into the shared box,
/// so code the shared box calls back on the same thread (a retry_on_oom callback that calls release(), or
/// allocates or frees through this box) runs without deadlock. Such a call sees the shared box between
/// two of its operations (retry_on_oom calls back only after the failed attempt left its upstream
/// unchanged). A callback that waits for another thread which needs this box still deadlocks.
/// Models: resource; owning/releasable when the upstream is; sized (the class size) when the upstream is;
/// the upstream's properties. Cost of a cached allocate or free: a thread-local lookup and an uncontended
/// spin flag, O(1); a miss adds the shared mutex and a few upstream calls; the first call on a thread
/// allocates its cache, the thread's exit returns it (the shared mutex once per class it holds).
/// Thread-safe. Movable and move-assignable (not while in use: a move is not synchronized with other
/// threads' calls); a moved-from box is empty: frees of nullptr, release() and cached() work, allocate
/// throws usage_error.
template <resource Upstream>
class thread_cached : public forward_properties<thread_cached<Upstream>, Upstream>, public sync_names<thread_cached<Upstream>> {
  static constexpr std::size_t largest_class = std::size_t{1} << 20;
  static constexpr auto class_sizes = detail::make_class_table<largest_class>();
  static constexpr std::size_t batch = 64;  ///< blocks moved per lock: a stack buffer, no allocation

public:
  struct options {
    std::size_t max_block = largest_class;              ///< larger requests bypass the caches
    std::size_t max_blocks_per_class = 32;              ///< per thread
    std::size_t max_bytes_per_class = std::size_t{1} << 20;  ///< per thread: a class caches at most this much
  };

  thread_cached() requires std::default_initializable<Upstream> : thread_cached(Upstream{}) {}
  explicit thread_cached(Upstream upstream, options opts = options{})
      : core_(std::make_unique<core>(std::move(upstream), opts))
  {
    core_->opts.max_block = std::min(core_->opts.max_block, largest_class);
  }
  thread_cached(thread_cached&& other) noexcept = default;
  thread_cached& operator=(thread_cached&& other) noexcept
  {
    if (this != &other) {
      close();
      core_ = std::move(other.core_);
    }
    return *this;
  }
  ~thread_cached() { close(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    core& k = live_core();
    if (!k.cacheable(bytes, alignment)) {
      std::lock_guard lock(k.mutex);
      return k.upstream.allocate(bytes, alignment);
    }
    const std::size_t c = detail::class_index(bytes);
    cache& mine = my_cache(k);
    {
      spin_guard guard(mine.busy);
      auto& bin = mine.bins[c];
      if (!bin.empty()) {
        void* p = bin.back();
        bin.pop_back();
        return p;
      }
    }
    return refill(k, mine, c);
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr || core_ == nullptr) return;  // nothing can have come from a moved-from box
    core& k = *core_;
    if (!k.cacheable(bytes, alignment)) {
      std::lock_guard lock(k.mutex);
      k.upstream.deallocate(p, bytes, alignment);
      return;
    }
    const std::size_t c = detail::class_index(bytes);
    cache* mine = nullptr;
    try {
      mine = &my_cache(k);
    } catch (...) {
      std::lock_guard lock(k.mutex);
      k.upstream.deallocate(p, class_sizes[c], default_alignment);
      return;
    }
    void* spilled[batch];
    std::size_t n = 0;
    {
      spin_guard guard(mine->busy);
      auto& bin = mine->bins[c];
      if (bin.size() >= k.capacity(c)) n = take_oldest(bin, std::min(bin.size() / 2 + 1, batch), spilled);
      bin.push_back(p);  // capacity reserved when the cache was made: cannot throw
    }
    k.give_back(spilled, n, c);  // after the flag is dropped: the upstream may call back in
  }

  /// Returns every thread's cached blocks to the shared box, then releases the box's free chunks if it can.
  void release()
  {
    if (core_ == nullptr) return;
    drain_all(*core_);
    if constexpr (releasable_resource<Upstream>) {
      std::lock_guard lock(core_->mutex);
      core_->upstream.release();
    }
  }

  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const
    requires sized_resource<Upstream>
  {
    const core& k = live_core();
    std::lock_guard lock(k.mutex);
    if (k.cacheable(bytes, alignment)) return k.upstream.good_size(class_sizes[detail::class_index(bytes)], default_alignment);
    return k.upstream.good_size(bytes, alignment);
  }

  bool owns(const void* p) const noexcept
    requires owning_resource<Upstream>
  {
    if (core_ == nullptr) return false;
    std::lock_guard lock(core_->mutex);
    return core_->upstream.owns(p);
  }

  /// Blocks and bytes sitting in all threads' caches.
  std::pair<std::size_t, std::size_t> cached() const
  {
    if (core_ == nullptr) return {0, 0};
    std::lock_guard registry(core_->registry_mutex);
    std::size_t blocks = 0, bytes = 0;
    for (const auto& cache : core_->caches) {
      spin_guard guard(cache->busy);
      for (std::size_t c = 0; c < cache->bins.size(); ++c) {
        blocks += cache->bins[c].size();
        bytes += cache->bins[c].size() * class_sizes[c];
      }
    }
    return {blocks, bytes};
  }
  /// Threads that hold a cache now (a thread's cache goes when it exits).
  std::size_t threads_seen() const
  {
    if (core_ == nullptr) return 0;
    std::lock_guard registry(core_->registry_mutex);
    return core_->caches.size();
  }

  /// Runs f(upstream) under the shared lock.
  template <class F>
  decltype(auto) with_lock(F&& f)
  {
    core& k = live_core();
    std::lock_guard lock(k.mutex);
    return std::forward<F>(f)(k.upstream);
  }

  friend bool operator==(const thread_cached& a, const thread_cached& b) noexcept { return &a == &b; }

private:
  struct core;

  /// One thread's cache. Shared by the box's registry and the thread's list, so that whichever goes first
  /// (the box, or the thread) leaves the other a valid object. `owner` is read and cleared under `busy`.
  struct cache {
    mutable std::atomic_flag busy;  // taken by its thread, and by other threads draining or counting
    core* owner = nullptr;          // null once the box has gone
    std::vector<std::vector<void*>> bins;
  };

  /// What the box owns, on the heap: its address is stable across moves of the box, so caches can point at it.
  struct core {
    core(Upstream up, options o) : upstream(std::move(up)), opts(o) {}

    Upstream upstream;
    options opts;
    std::uint64_t serial = next_serial();  ///< never reused: a thread's entry for a dead box never matches
    mutable std::recursive_mutex mutex;    ///< guards the shared box; recursive for callbacks (see above)
    mutable std::mutex registry_mutex;     ///< guards `caches`; never held across a call into the shared box
    std::vector<std::shared_ptr<cache>> caches;
    std::atomic<std::size_t> exiting{0};   ///< threads returning their cache now: the box waits for them

    bool cacheable(std::size_t bytes, std::size_t alignment) const noexcept
    {
      return bytes != 0 && bytes <= opts.max_block && alignment <= default_alignment && is_power_of_two(alignment);
    }
    std::size_t capacity(std::size_t c) const noexcept
    {
      return std::clamp<std::size_t>(opts.max_bytes_per_class / class_sizes[c], 1, opts.max_blocks_per_class);
    }
    void give_back(void* const* blocks, std::size_t n, std::size_t c) noexcept
    {
      if (n == 0) return;
      std::lock_guard lock(mutex);
      for (std::size_t i = 0; i < n; ++i) upstream.deallocate(blocks[i], class_sizes[c], default_alignment);
    }
    /// Empties one cache into the shared box, a batch at a time, never holding its flag across the upstream.
    void drain(cache& one) noexcept
    {
      void* blocks[batch];
      for (std::size_t c = 0;; ++c) {
        std::size_t n = 0;
        {
          spin_guard guard(one.busy);
          if (c >= one.bins.size()) return;
          n = take_oldest(one.bins[c], batch, blocks);
        }
        give_back(blocks, n, c);
        if (n == batch) --c;  // more may be left in this class
      }
    }
  };

  class spin_guard {
  public:
    // Contended only while another thread drains or counts the caches: spin, yielding.
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

  /// The calling thread's caches, one per box it used; at thread exit each goes back to its box, if alive.
  struct thread_caches {
    struct entry {
      std::uint64_t serial;
      std::shared_ptr<cache> c;
    };
    std::vector<entry> list;
    std::uint64_t last_serial = 0;
    cache* last = nullptr;

    thread_caches() = default;
    thread_caches(const thread_caches&) = delete;
    thread_caches& operator=(const thread_caches&) = delete;
    ~thread_caches()
    {
      for (entry& e : list) retire(*e.c);
    }
  };

  static std::uint64_t next_serial() noexcept
  {
    static std::atomic<std::uint64_t> serial{1};
    return serial.fetch_add(1, std::memory_order_relaxed);
  }

  core& live_core() const
  {
    if (core_ == nullptr) throw usage_error("thread_cached: used after being moved from");
    return *core_;
  }

  /// Moves up to `count` of a bin's oldest blocks into `out` (the caller holds the cache's flag).
  static std::size_t take_oldest(std::vector<void*>& bin, std::size_t count, void** out) noexcept
  {
    count = std::min(count, bin.size());
    std::copy_n(bin.begin(), count, out);
    bin.erase(bin.begin(), bin.begin() + static_cast<std::ptrdiff_t>(count));
    return count;
  }

  /// A thread is exiting: its cache goes back to the box if the box is still there. The box's destruction
  /// waits for `exiting` to drop, so it cannot go away during the drain.
  static void retire(cache& mine) noexcept
  {
    core* owner = nullptr;
    {
      spin_guard guard(mine.busy);
      owner = mine.owner;
      if (owner != nullptr) owner->exiting.fetch_add(1);
    }
    if (owner == nullptr) return;
    owner->drain(mine);
    {
      std::lock_guard registry(owner->registry_mutex);
      std::erase_if(owner->caches, [&](const std::shared_ptr<cache>& c) { return c.get() == &mine; });
      spin_guard guard(mine.busy);
      mine.owner = nullptr;
    }
    owner->exiting.fetch_sub(1);
  }

  /// The calling thread's cache for this box, the last one used checked first.
  static cache& my_cache(core& k)
  {
    thread_local thread_caches mine;
    if (mine.last_serial == k.serial) return *mine.last;
    for (const auto& e : mine.list)
      if (e.serial == k.serial) {
        mine.last_serial = e.serial;
        mine.last = e.c.get();
        return *e.c;
      }
    std::erase_if(mine.list, [](const typename thread_caches::entry& e) {
      spin_guard guard(e.c->busy);
      return e.c->owner == nullptr;  // its box has gone
    });
    auto fresh = std::make_shared<cache>();
    fresh->owner = &k;
    fresh->bins.resize(class_sizes.size());
    for (std::size_t c = 0; c < class_sizes.size(); ++c) fresh->bins[c].reserve(k.capacity(c) + 1);
    mine.list.reserve(mine.list.size() + 1);
    {
      std::lock_guard registry(k.registry_mutex);
      k.caches.push_back(fresh);
    }
    mine.list.push_back({k.serial, fresh});  // cannot throw: reserved
    mine.last_serial = k.serial;
    mine.last = fresh.get();
    return *fresh;
  }

  /// Fetches half a cache's worth of class c under one lock; returns one block, files the rest.
  static void* refill(core& k, cache& mine, std::size_t c)
  {
    const std::size_t want = std::min(std::max<std::size_t>(1, k.capacity(c) / 2), batch);
    void* got[batch];
    std::size_t n = 0;
    {
      std::lock_guard lock(k.mutex);
      got[n++] = k.upstream.allocate(class_sizes[c], default_alignment);  // may throw: nothing taken yet
      try {
        while (n < want) got[n++] = k.upstream.allocate(class_sizes[c], default_alignment);
      } catch (...) {
        // Fewer spares than hoped; the one asked for is there.
      }
    }
    void* surplus[batch];
    std::size_t extra = 0;
    {
      spin_guard guard(mine.busy);
      auto& bin = mine.bins[c];
      for (std::size_t i = 1; i < n; ++i) {
        if (bin.size() < k.capacity(c)) bin.push_back(got[i]);
        else surplus[extra++] = got[i];  // a callback filled the cache meanwhile
      }
    }
    k.give_back(surplus, extra, c);
    return got[0];
  }

  static void drain_all(core& k)
  {
    std::vector<std::shared_ptr<cache>> all;
    {
      std::lock_guard registry(k.registry_mutex);
      all = k.caches;  // may throw: nothing has changed yet
    }
    for (auto& one : all) k.drain(*one);
  }

  /// Detaches every cache (their threads find no box at exit), waits for exiting threads, then returns
  /// every cached block. Other threads must not be using the box (as for any destruction).
  void close() noexcept
  {
    if (core_ == nullptr) return;
    core& k = *core_;
    std::vector<std::shared_ptr<cache>> all;
    {
      std::lock_guard registry(k.registry_mutex);
      all.swap(k.caches);
    }
    for (auto& one : all) {
      spin_guard guard(one->busy);
      one->owner = nullptr;
    }
    while (k.exiting.load() != 0) std::this_thread::yield();
    for (auto& one : all) k.drain(*one);
    core_.reset();
  }

  std::unique_ptr<core> core_;
};

namespace detail::thread_cached_claims {
using T = thread_cached<archetype_resource>;
static_assert(resource<T> && !stream_resource<T> && !owning_resource<T> && !sized_resource<T>);
static_assert(cccl::synchronous_resource_with<T, device_accessible>);
static_assert(std::is_nothrow_move_constructible_v<T> && std::is_nothrow_move_assignable_v<T>);
} // namespace detail::thread_cached_claims

} // namespace strata
