#pragma once
#include <atomic>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/detail/adaptor_base.hpp>
#include <strata/detail/cuda_check.hpp>

namespace strata {

/// Caps the bytes in use through it: a request that would cross the cap is refused with out_of_memory
/// naming the limit, before the upstream is asked. Bytes are counted as the upstream's good size where it
/// has one (what the request really consumes), else as requested. `limit::fraction_of_device(0.8, ...)` is
/// the recipe for "use at most 80% of the GPU".
/// A request larger than the cap, or than any box can serve (largest_request), is out_of_memory without
/// asking the upstream's good_size (which need not be defined that far), and a good_size that wraps is
/// refused too. Before refusing, the alignment is put to the upstream as allocate(0, alignment) (every box
/// checks the alignment before it returns nullptr for 0 bytes): an alignment the upstream cannot honour is
/// its std::invalid_argument, as without the limit, not an out_of_memory.
/// Models: whatever the upstream models (resource, stream_resource, owning, sized, usage...); its properties.
/// Cost: one atomic compare-exchange per allocate, one atomic subtraction per free; no lock. Thread-safe
/// itself (the counter); the upstream keeps its own guarantees. Move-only; move-assignable when the
/// upstream is.
template <resource Upstream>
class limit : public detail::adaptor_base<limit<Upstream>, Upstream> {
  using base = detail::adaptor_base<limit<Upstream>, Upstream>;

public:
  using base::allocate;
  using base::deallocate;

  /// More than any box can serve: larger than the address space of any GPU or host.
  static constexpr std::size_t largest_request = std::size_t{1} << 56;

  limit(Upstream upstream, std::size_t max_bytes) : upstream_(std::move(upstream)), max_bytes_(max_bytes) {}

  /// A cap of `fraction` (0, 1] of the device's total memory (cudaMemGetInfo on `device`, -1: current).
  static limit fraction_of_device(Upstream upstream, double fraction, int device = -1)
  {
    if (!(fraction > 0.0 && fraction <= 1.0))
      throw std::invalid_argument("limit: fraction " + std::to_string(fraction) + " is not in (0, 1]");
    std::size_t free_bytes = 0, total_bytes = 0;
    {
      detail::scoped_device scope(device < 0 ? detail::current_device() : device);
      detail::cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    }
    return limit(std::move(upstream), static_cast<std::size_t>(static_cast<double>(total_bytes) * fraction));
  }

  limit(limit&& other) noexcept
      : upstream_(std::move(other.upstream_)), max_bytes_(other.max_bytes_), in_use_(other.in_use_.exchange(0))
  {}
  limit& operator=(limit&& other) noexcept(std::is_nothrow_move_assignable_v<Upstream>)
    requires std::is_move_assignable_v<Upstream>
  {
    if (this != &other) {
      upstream_ = std::move(other.upstream_);
      max_bytes_ = other.max_bytes_;
      in_use_.store(other.in_use_.exchange(0, std::memory_order_relaxed), std::memory_order_relaxed);
    }
    return *this;
  }
  limit(const limit&) = delete;

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    const std::size_t n = charge(bytes, alignment);
    try {
      return upstream_.allocate(bytes, alignment);
    } catch (...) {
      in_use_.fetch_sub(n, std::memory_order_relaxed);
      throw;
    }
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    upstream_.deallocate(p, bytes, alignment);
    in_use_.fetch_sub(cost(bytes, alignment), std::memory_order_relaxed);
  }

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires stream_resource<Upstream>
  {
    const std::size_t n = charge(bytes, alignment);
    try {
      return upstream_.allocate_async(bytes, alignment, stream);
    } catch (...) {
      in_use_.fetch_sub(n, std::memory_order_relaxed);
      throw;
    }
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
    requires stream_resource<Upstream>
  {
    if (p == nullptr) return;
    upstream_.deallocate_async(p, bytes, alignment, stream);
    in_use_.fetch_sub(cost(bytes, alignment), std::memory_order_relaxed);
  }

  std::size_t max_bytes() const noexcept { return max_bytes_; }
  std::size_t bytes_in_use() const noexcept { return in_use_.load(std::memory_order_relaxed); }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }

  friend bool operator==(const limit& a, const limit& b) noexcept { return &a == &b; }

private:
  std::size_t cost(std::size_t bytes, std::size_t alignment) const
  {
    if (bytes == 0) return 0;
    if constexpr (sized_resource<Upstream>) return upstream_.good_size(bytes, alignment);
    else return bytes;
  }

  /// Reserves the request's bytes under the cap, or throws without touching anything.
  std::size_t charge(std::size_t bytes, std::size_t alignment)
  {
    if (bytes > std::min(max_bytes_, largest_request) || alignment > largest_request) [[unlikely]]
      refuse(bytes, alignment, "larger than the limit or than any box can serve");
    const std::size_t n = cost(bytes, alignment);
    if (n < bytes) [[unlikely]]
      refuse(bytes, alignment, "the upstream's good size overflows");
    std::size_t current = in_use_.load(std::memory_order_relaxed);
    do {
      if (n > max_bytes_ - std::min(current, max_bytes_)) refuse(bytes, alignment, std::to_string(current) + " bytes in use");
    } while (!in_use_.compare_exchange_weak(current, current + n, std::memory_order_relaxed));
    return n;
  }

  /// out_of_memory, unless the upstream refuses the alignment itself (its std::invalid_argument).
  [[noreturn, gnu::cold]] void refuse(std::size_t bytes, std::size_t alignment, const std::string& why)
  {
    (void)upstream_.allocate(0, alignment);
    throw out_of_memory("limit", bytes, "limit " + std::to_string(max_bytes_) + " bytes: " + why);
  }

  [[no_unique_address]] Upstream upstream_;
  std::size_t max_bytes_;
  std::atomic<std::size_t> in_use_{0};
};

namespace detail::limit_claims {
using L = limit<archetype_resource>;
static_assert(resource<L> && !stream_resource<L> && !owning_resource<L>);
static_assert(cuda::mr::resource_with<L, device_accessible> && answers_to_cccl31_names<L>);
static_assert(!std::is_copy_constructible_v<L> && std::is_nothrow_move_constructible_v<L> && std::is_nothrow_move_assignable_v<L>);
} // namespace detail::limit_claims

} // namespace strata
