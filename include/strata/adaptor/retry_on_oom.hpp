#pragma once
#include <atomic>
#include <cstddef>
#include <functional>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/concepts.hpp>
#include <strata/detail/adaptor_base.hpp>

namespace strata {

/// On out-of-memory (any std::bad_alloc from the upstream), calls the user's callback with the request's
/// size and the attempt number (1, 2, ...); if it returns true (it freed something: emptied a cache,
/// released another pool, shrank a batch), the request is tried again, at most `max_retries` times. The last
/// failure is rethrown unchanged.
/// The callback may call back into the boxes above (release a cache, free a spare): see synchronized and
/// thread_cached, whose locks allow it on the same thread.
/// Models: whatever the upstream models; its properties. Cost: none until the upstream fails. Thread-safe
/// when its upstream and callback are (the callback runs on the allocating thread; the count is atomic).
/// Move-only; move-assignable when the upstream is. A moved-from box has no callback and retries nothing.
template <resource Upstream>
class retry_on_oom : public detail::adaptor_base<retry_on_oom<Upstream>, Upstream> {
  using base = detail::adaptor_base<retry_on_oom<Upstream>, Upstream>;

public:
  using base::allocate;
  using base::deallocate;
  using callback = std::function<bool(std::size_t bytes, int attempt)>;

  retry_on_oom(Upstream upstream, callback on_oom, int max_retries = 1)
      : upstream_(std::move(upstream)), on_oom_(std::move(on_oom)), max_retries_(max_retries)
  {
    if (!on_oom_) throw std::invalid_argument("retry_on_oom: the callback is empty");
    if (max_retries < 1) throw std::invalid_argument("retry_on_oom: max_retries must be at least 1");
  }
  retry_on_oom(retry_on_oom&& other) noexcept
      : upstream_(std::move(other.upstream_)), on_oom_(std::move(other.on_oom_)), max_retries_(other.max_retries_),
        rescued_(other.rescued_.exchange(0, std::memory_order_relaxed))
  {}
  retry_on_oom& operator=(retry_on_oom&& other) noexcept(std::is_nothrow_move_assignable_v<Upstream>)
    requires std::is_move_assignable_v<Upstream>
  {
    if (this != &other) {
      upstream_ = std::move(other.upstream_);
      on_oom_ = std::move(other.on_oom_);
      max_retries_ = other.max_retries_;
      rescued_.store(other.rescued_.exchange(0, std::memory_order_relaxed), std::memory_order_relaxed);
    }
    return *this;
  }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    return with_retries(bytes, [&] { return upstream_.allocate(bytes, alignment); });
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    upstream_.deallocate(p, bytes, alignment);
  }
  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires stream_resource<Upstream>
  {
    return with_retries(bytes, [&] { return upstream_.allocate_async(bytes, alignment, stream); });
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
    requires stream_resource<Upstream>
  {
    upstream_.deallocate_async(p, bytes, alignment, stream);
  }

  /// Retries that succeeded since construction.
  std::size_t rescued() const noexcept { return rescued_.load(std::memory_order_relaxed); }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }

  friend bool operator==(const retry_on_oom& a, const retry_on_oom& b) noexcept { return &a == &b; }

private:
  template <class Attempt>
  void* with_retries(std::size_t bytes, Attempt attempt)
  {
    for (int tries = 0;; ++tries) {
      try {
        void* p = attempt();
        if (tries > 0) rescued_.fetch_add(1, std::memory_order_relaxed);
        return p;
      } catch (const std::bad_alloc&) {
        // A moved-from box has no callback: it refuses as its upstream does.
        if (tries == max_retries_ || !on_oom_ || !on_oom_(bytes, tries + 1)) throw;
      }
    }
  }

  [[no_unique_address]] Upstream upstream_;
  callback on_oom_;
  int max_retries_;
  std::atomic<std::size_t> rescued_{0};
};

namespace detail::retry_on_oom_claims {
using R = retry_on_oom<archetype_resource>;
static_assert(resource<R> && !stream_resource<R> && answers_to_cccl31_names<R>);
static_assert(cuda::mr::resource_with<R, device_accessible>);
} // namespace detail::retry_on_oom_claims

} // namespace strata
