#pragma once
#include <concepts>
#include <cstddef>
#include <mutex>
#include <type_traits>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/properties.hpp>

namespace strata {

/// A mutex around a box, so several threads may share it. Every call, including the optional capabilities
/// (owns, release, good_size, usage, snapshot, reset), takes the lock.
/// The lock is recursive: code the box calls back on the same thread while it holds the lock (a
/// retry_on_oom callback, a with_lock body) may call this box again without deadlock, and sees the box
/// between two of its operations (retry_on_oom calls back only after the failed attempt left its upstream
/// unchanged). A callback that waits for another thread which needs this box still deadlocks.
/// Models: whatever the upstream models; its properties. Cost: one std::recursive_mutex lock and unlock per
/// call (uncontended: tens of nanoseconds; contended threads queue — see thread_cached for scaling).
/// Thread-safe. Move-only; move-assignable when the upstream is (moving is not thread-safe: do it before
/// sharing).
template <resource Upstream>
class synchronized : public forward_properties<synchronized<Upstream>, Upstream>,
                     public sync_names<synchronized<Upstream>>,
                     public stream_first_names<synchronized<Upstream>, stream_resource<Upstream>> {
public:
  using stream_first_names<synchronized, stream_resource<Upstream>>::allocate;
  using stream_first_names<synchronized, stream_resource<Upstream>>::deallocate;

  synchronized() requires std::default_initializable<Upstream> : synchronized(Upstream{}) {}
  explicit synchronized(Upstream upstream) : upstream_(std::move(upstream)) {}
  synchronized(synchronized&& other) noexcept : upstream_(std::move(other.upstream_)) {}
  synchronized& operator=(synchronized&& other) noexcept(std::is_nothrow_move_assignable_v<Upstream>)
    requires std::is_move_assignable_v<Upstream>
  {
    upstream_ = std::move(other.upstream_);
    return *this;
  }
  synchronized(const synchronized&) = delete;

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    std::lock_guard lock(mutex_);
    return upstream_.allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    std::lock_guard lock(mutex_);
    upstream_.deallocate(p, bytes, alignment);
  }
  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires stream_resource<Upstream>
  {
    std::lock_guard lock(mutex_);
    return upstream_.allocate_async(bytes, alignment, stream);
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
    requires stream_resource<Upstream>
  {
    std::lock_guard lock(mutex_);
    upstream_.deallocate_async(p, bytes, alignment, stream);
  }

  bool owns(const void* p) const noexcept
    requires owning_resource<Upstream>
  {
    std::lock_guard lock(mutex_);
    return upstream_.owns(p);
  }
  decltype(auto) release()
    requires releasable_resource<Upstream>
  {
    std::lock_guard lock(mutex_);
    return upstream_.release();
  }
  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const
    requires sized_resource<Upstream>
  {
    std::lock_guard lock(mutex_);
    return upstream_.good_size(bytes, alignment);
  }
  strata::usage usage() const
    requires usage_reporting_resource<Upstream>
  {
    std::lock_guard lock(mutex_);
    return upstream_.usage();
  }
  strata::snapshot snapshot() const
    requires snapshot_resource<Upstream>
  {
    std::lock_guard lock(mutex_);
    return upstream_.snapshot();
  }
  void reset()
    requires resettable_resource<Upstream>
  {
    std::lock_guard lock(mutex_);
    upstream_.reset();
  }

  /// Runs f(upstream) under the lock, for anything the adaptor does not forward.
  template <class F>
  decltype(auto) with_lock(F&& f)
  {
    std::lock_guard lock(mutex_);
    return std::forward<F>(f)(upstream_);
  }

  friend bool operator==(const synchronized& a, const synchronized& b) noexcept { return &a == &b; }

private:
  Upstream upstream_;
  mutable std::recursive_mutex mutex_;
};

namespace detail::synchronized_claims {
using S = synchronized<archetype_resource>;
static_assert(resource<S> && !stream_resource<S> && !owning_resource<S>);
static_assert(cccl::synchronous_resource_with<S, device_accessible>);
static_assert(!std::is_copy_constructible_v<S> && std::is_nothrow_move_constructible_v<S> && std::is_nothrow_move_assignable_v<S>);
} // namespace detail::synchronized_claims

} // namespace strata
