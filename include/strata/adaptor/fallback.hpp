#pragma once
#include <atomic>
#include <cstddef>
#include <new>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>

namespace strata {

/// Tries the primary; when it is out of memory (any std::bad_alloc), the secondary. Frees go to whichever
/// owns the pointer, so the primary must be able to say (owns(p)); the recipe for "GPU memory first, spill
/// to pinned host or managed memory". Counts which tier served each request.
/// Models: resource; stream_resource when both are; owning when the secondary is too; the properties both
/// tiers share (memory may come from either). Cost: the primary's, plus its owns() on every free, plus the
/// secondary's when it serves; a relaxed atomic increment per allocation. Unsynchronized (as its tiers).
template <resource Primary, resource Secondary>
class fallback : public forward_common_properties<fallback<Primary, Secondary>, Primary, Secondary>,
                 public sync_names<fallback<Primary, Secondary>>,
                 public stream_first_names<fallback<Primary, Secondary>, stream_resource<Primary> && stream_resource<Secondary>> {
  using names = stream_first_names<fallback<Primary, Secondary>, stream_resource<Primary> && stream_resource<Secondary>>;
  static_assert(owning_resource<Primary>,
                "fallback<Primary, Secondary>: the primary must have `bool owns(const void*) const noexcept` so "
                "that frees can be routed to the tier that made them (coalescing_pool, size_class_pool, "
                "buddy_pool, arena and simulated_source have it)");
  static constexpr bool stream_ordered = stream_resource<Primary> && stream_resource<Secondary>;

public:
  using names::allocate;
  using names::deallocate;

  fallback(Primary primary, Secondary secondary) : primary_(std::move(primary)), secondary_(std::move(secondary)) {}
  fallback(fallback&& other) noexcept
      : primary_(std::move(other.primary_)), secondary_(std::move(other.secondary_)),
        by_primary_(other.by_primary_.exchange(0)), by_secondary_(other.by_secondary_.exchange(0))
  {}
  fallback& operator=(fallback&&) = delete;
  fallback(const fallback&) = delete;

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    return serve([&](auto& tier) { return tier.allocate(bytes, alignment); });
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    if (primary_.owns(p)) primary_.deallocate(p, bytes, alignment);
    else secondary_.deallocate(p, bytes, alignment);
  }

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires stream_ordered
  {
    return serve([&](auto& tier) { return tier.allocate_async(bytes, alignment, stream); });
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
    requires stream_ordered
  {
    if (p == nullptr) return;
    if (primary_.owns(p)) primary_.deallocate_async(p, bytes, alignment, stream);
    else secondary_.deallocate_async(p, bytes, alignment, stream);
  }

  bool owns(const void* p) const noexcept
    requires owning_resource<Secondary>
  {
    return primary_.owns(p) || secondary_.owns(p);
  }

  /// Requests each tier has served (successful allocations only).
  std::size_t served_by_primary() const noexcept { return by_primary_.load(std::memory_order_relaxed); }
  std::size_t served_by_secondary() const noexcept { return by_secondary_.load(std::memory_order_relaxed); }

  Primary& primary() noexcept { return primary_; }
  Secondary& secondary() noexcept { return secondary_; }

  friend bool operator==(const fallback& a, const fallback& b) noexcept { return &a == &b; }

private:
  template <class Call>
  void* serve(Call call)
  {
    void* p = nullptr;
    try {
      p = call(primary_);
    } catch (const std::bad_alloc&) {
      p = call(secondary_);  // its own out_of_memory, naming it, if it cannot either
      if (p != nullptr) by_secondary_.fetch_add(1, std::memory_order_relaxed);
      return p;
    }
    if (p != nullptr) by_primary_.fetch_add(1, std::memory_order_relaxed);
    return p;
  }

  [[no_unique_address]] Primary primary_;
  [[no_unique_address]] Secondary secondary_;
  std::atomic<std::size_t> by_primary_{0}, by_secondary_{0};
};

namespace detail::fallback_claims {
struct owning_archetype : archetype_resource {
  bool owns(const void*) const noexcept { return false; }
};
using F = fallback<owning_archetype, archetype_resource>;
static_assert(resource<F> && !stream_resource<F> && !owning_resource<F>);
static_assert(cccl::synchronous_resource_with<F, device_accessible>);
static_assert(owning_resource<fallback<owning_archetype, owning_archetype>>);
} // namespace detail::fallback_claims

} // namespace strata
