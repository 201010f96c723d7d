#pragma once
#include <atomic>
#include <cstddef>
#include <mutex>
#include <new>
#include <type_traits>
#include <unordered_set>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>

namespace strata {

/// Tries the primary; when it is out of memory (any std::bad_alloc), the secondary. A free goes to the
/// primary when the primary owns the pointer (handed it out and has not taken it back: the one meaning of
/// owns(), concepts.hpp), otherwise to the secondary. When both tiers draw on one source, a block the
/// secondary carved from a chunk the source handed out lies inside the source's live allocation, so the
/// primary claims it too: such blocks (found when the secondary serves them, by asking the primary) are
/// remembered until freed, and their frees go to the secondary. So a source as primary and a pool over the
/// same source as secondary route every free correctly; tiers over separate memory remember nothing.
/// The recipe for "GPU memory first, spill to pinned host or managed memory". Counts which tier served each
/// request.
/// Models: resource; stream_resource when both are; owning when the secondary is too; the properties both
/// tiers share (memory may come from either). Cost: the primary's, plus its owns() on every free, plus the
/// secondary's and one primary owns() when it serves; a relaxed atomic increment per allocation. Blocks
/// both tiers claim add a mutex and a hash-set operation to their allocation and to every free the primary
/// claims while any is live. Unsynchronized (as its tiers); its own records are thread-safe.
/// Move-only; move-assignable when both tiers are.
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
        by_primary_(other.by_primary_.exchange(0)), by_secondary_(other.by_secondary_.exchange(0)),
        claimed_by_both_(std::move(other.claimed_by_both_)), claimed_count_(other.claimed_count_.exchange(0))
  {}
  fallback& operator=(fallback&& other) noexcept(std::is_nothrow_move_assignable_v<Primary> &&
                                                 std::is_nothrow_move_assignable_v<Secondary>)
    requires std::is_move_assignable_v<Primary> && std::is_move_assignable_v<Secondary>
  {
    if (this != &other) {
      primary_ = std::move(other.primary_);
      secondary_ = std::move(other.secondary_);
      by_primary_.store(other.by_primary_.exchange(0), std::memory_order_relaxed);
      by_secondary_.store(other.by_secondary_.exchange(0), std::memory_order_relaxed);
      claimed_by_both_ = std::move(other.claimed_by_both_);
      other.claimed_by_both_.clear();
      claimed_count_.store(other.claimed_count_.exchange(0), std::memory_order_relaxed);
    }
    return *this;
  }
  fallback(const fallback&) = delete;

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    return serve([&](auto& tier) { return tier.allocate(bytes, alignment); },
                 [&](auto& tier, void* p) { tier.deallocate(p, bytes, alignment); });
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    if (routes_to_primary(p)) primary_.deallocate(p, bytes, alignment);
    else secondary_.deallocate(p, bytes, alignment);
  }

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires stream_ordered
  {
    return serve([&](auto& tier) { return tier.allocate_async(bytes, alignment, stream); },
                 [&](auto& tier, void* p) { tier.deallocate_async(p, bytes, alignment, stream); });
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
    requires stream_ordered
  {
    if (p == nullptr) return;
    if (routes_to_primary(p)) primary_.deallocate_async(p, bytes, alignment, stream);
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
  /// `call(tier)` allocates from a tier; `give_back(tier, p)` frees what it allocated.
  template <class Call, class GiveBack>
  void* serve(Call call, GiveBack give_back)
  {
    void* p = nullptr;
    try {
      p = call(primary_);
    } catch (const std::bad_alloc&) {
      p = call(secondary_);  // its own out_of_memory, naming it, if it cannot either
      if (p == nullptr) return p;
      if (primary_.owns(p)) [[unlikely]] {
        try {
          std::lock_guard lock(claimed_mutex_);
          claimed_by_both_.insert(p);
          claimed_count_.fetch_add(1, std::memory_order_relaxed);
        } catch (...) {
          give_back(secondary_, p);  // unrecorded, its free would go to the primary
          throw;
        }
      }
      by_secondary_.fetch_add(1, std::memory_order_relaxed);
      return p;
    }
    if (p != nullptr) by_primary_.fetch_add(1, std::memory_order_relaxed);
    return p;
  }

  bool routes_to_primary(void* p) noexcept
  {
    if (!primary_.owns(p)) return false;
    if (claimed_count_.load(std::memory_order_relaxed) == 0) return true;
    std::lock_guard lock(claimed_mutex_);
    if (claimed_by_both_.erase(p) == 0) return true;
    claimed_count_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }

  [[no_unique_address]] Primary primary_;
  [[no_unique_address]] Secondary secondary_;
  std::atomic<std::size_t> by_primary_{0}, by_secondary_{0};
  std::mutex claimed_mutex_;
  std::unordered_set<const void*> claimed_by_both_;  ///< live blocks of the secondary that the primary claims
  std::atomic<std::size_t> claimed_count_{0};
};

namespace detail::fallback_claims {
struct owning_archetype : archetype_resource {
  bool owns(const void*) const noexcept { return false; }
};
using F = fallback<owning_archetype, archetype_resource>;
static_assert(resource<F> && !stream_resource<F> && !owning_resource<F>);
static_assert(cuda::mr::resource_with<F, device_accessible> && answers_to_cccl31_names<F>);
static_assert(owning_resource<fallback<owning_archetype, owning_archetype>>);
} // namespace detail::fallback_claims

} // namespace strata
