#pragma once
#include <concepts>
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/concepts.hpp>
#include <strata/detail/adaptor_base.hpp>

namespace strata {

/// Counts what passes through: bytes and blocks now, at the peak, and in total, with resettable peaks and
/// scopes that answer "what did this phase allocate, and how high did it go?". Bytes are as requested.
/// Models: whatever the upstream models; its properties.
/// Cost: a few relaxed atomic operations per call (a compare-exchange loop for each peak); no lock.
/// Thread-safe itself. Move-only; move-assignable when the upstream is (a moved-from box counts from zero).
template <resource Upstream>
class statistics : public detail::adaptor_base<statistics<Upstream>, Upstream> {
  using base = detail::adaptor_base<statistics<Upstream>, Upstream>;

public:
  using base::allocate;
  using base::deallocate;

  struct counts {
    std::size_t current_bytes = 0, current_blocks = 0;
    std::size_t peak_bytes = 0, peak_blocks = 0;
    std::size_t total_bytes = 0, total_blocks = 0;  ///< everything ever allocated
    friend bool operator==(const counts&, const counts&) = default;
  };

  /// What happened since a scope opened: bytes and blocks allocated and freed, and the peak of bytes in use
  /// within it (counting what was already in use when it opened).
  struct phase {
    std::size_t allocated_bytes = 0, allocated_blocks = 0;
    std::size_t freed_bytes = 0, freed_blocks = 0;
    std::size_t peak_bytes = 0;
  };

  /// RAII: opens a phase; scopes nest (an inner scope's peak counts toward the outer one's).
  class scope {
  public:
    phase so_far() const noexcept
    {
      const auto& s = *owner_;
      return {s.total_bytes_.load() - at_open_.total_bytes, s.total_blocks_.load() - at_open_.total_blocks,
              s.freed_bytes_.load() - freed_bytes_at_open_, s.freed_blocks_.load() - freed_blocks_at_open_,
              s.scope_peak_.load()};
    }
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    ~scope()
    {
      // The enclosing phase's peak is the higher of its own and this one's.
      const std::size_t inner = owner_->scope_peak_.load();
      raise(owner_->scope_peak_, std::max(outer_peak_, inner), /*assign=*/true);
    }

  private:
    friend class statistics;
    explicit scope(statistics& owner)
        : owner_(&owner), at_open_(owner.snapshot_counts()), freed_bytes_at_open_(owner.freed_bytes_.load()),
          freed_blocks_at_open_(owner.freed_blocks_.load()),
          outer_peak_(owner.scope_peak_.exchange(owner.current_bytes_.load()))
    {}
    statistics* owner_;
    counts at_open_;
    std::size_t freed_bytes_at_open_, freed_blocks_at_open_;
    std::size_t outer_peak_;
  };

  statistics() requires std::default_initializable<Upstream> : statistics(Upstream{}) {}
  explicit statistics(Upstream upstream) : upstream_(std::move(upstream)) {}
  statistics(statistics&& other) noexcept : upstream_(std::move(other.upstream_)) { take(other); }
  statistics& operator=(statistics&& other) noexcept(std::is_nothrow_move_assignable_v<Upstream>)
    requires std::is_move_assignable_v<Upstream>
  {
    if (this != &other) {
      upstream_ = std::move(other.upstream_);
      take(other);
    }
    return *this;
  }
  statistics(const statistics&) = delete;

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    void* p = upstream_.allocate(bytes, alignment);
    if (p != nullptr) on_allocate(bytes);
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    upstream_.deallocate(p, bytes, alignment);
    on_free(bytes);
  }
  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires stream_resource<Upstream>
  {
    void* p = upstream_.allocate_async(bytes, alignment, stream);
    if (p != nullptr) on_allocate(bytes);
    return p;
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
    requires stream_resource<Upstream>
  {
    if (p == nullptr) return;
    upstream_.deallocate_async(p, bytes, alignment, stream);
    on_free(bytes);
  }

  counts snapshot_counts() const noexcept
  {
    return {current_bytes_.load(), current_blocks_.load(), peak_bytes_.load(),
            peak_blocks_.load(),   total_bytes_.load(),    total_blocks_.load()};
  }
  /// Peaks start again from what is in use now.
  void reset_peaks() noexcept
  {
    peak_bytes_.store(current_bytes_.load());
    peak_blocks_.store(current_blocks_.load());
  }
  [[nodiscard]] scope open_scope() { return scope(*this); }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }

  friend bool operator==(const statistics& a, const statistics& b) noexcept { return &a == &b; }

private:
  static void raise(std::atomic<std::size_t>& peak, std::size_t value, bool assign = false) noexcept
  {
    if (assign) {
      peak.store(value);
      return;
    }
    std::size_t seen = peak.load(std::memory_order_relaxed);
    while (seen < value && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {}
  }

  void on_allocate(std::size_t bytes) noexcept
  {
    const std::size_t now = current_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    const std::size_t blocks = current_blocks_.fetch_add(1, std::memory_order_relaxed) + 1;
    total_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    total_blocks_.fetch_add(1, std::memory_order_relaxed);
    raise(peak_bytes_, now);
    raise(peak_blocks_, blocks);
    raise(scope_peak_, now);
  }
  void on_free(std::size_t bytes) noexcept
  {
    current_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    current_blocks_.fetch_sub(1, std::memory_order_relaxed);
    freed_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    freed_blocks_.fetch_add(1, std::memory_order_relaxed);
  }

  void take(statistics& other) noexcept
  {
    for (auto [mine, theirs] : {std::pair{&current_bytes_, &other.current_bytes_}, {&current_blocks_, &other.current_blocks_},
                                {&peak_bytes_, &other.peak_bytes_}, {&peak_blocks_, &other.peak_blocks_},
                                {&total_bytes_, &other.total_bytes_}, {&total_blocks_, &other.total_blocks_},
                                {&freed_bytes_, &other.freed_bytes_}, {&freed_blocks_, &other.freed_blocks_},
                                {&scope_peak_, &other.scope_peak_}})
      mine->store(theirs->exchange(0));
  }

  [[no_unique_address]] Upstream upstream_;
  std::atomic<std::size_t> current_bytes_{0}, current_blocks_{0}, peak_bytes_{0}, peak_blocks_{0};
  std::atomic<std::size_t> total_bytes_{0}, total_blocks_{0}, freed_bytes_{0}, freed_blocks_{0};
  std::atomic<std::size_t> scope_peak_{0};
};

namespace detail::statistics_claims {
using S = statistics<archetype_resource>;
static_assert(resource<S> && !stream_resource<S> && !owning_resource<S>);
static_assert(cccl::synchronous_resource_with<S, device_accessible>);
static_assert(!std::is_copy_constructible_v<S> && std::is_nothrow_move_constructible_v<S> && std::is_nothrow_move_assignable_v<S>);
} // namespace detail::statistics_claims

} // namespace strata
