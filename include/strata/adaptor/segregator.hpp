#pragma once
#include <concepts>
#include <cstddef>
#include <type_traits>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/usage.hpp>

namespace strata {

/// Requests of up to Threshold bytes go to Small, larger ones to Large; frees are routed by the same size
/// test, so no lookup is needed (the size passed to a free must be the size allocated, as for any box).
/// The recipe for "size classes for the many small buffers, a coalescing pool for the few large ones".
/// Models: resource; stream_resource, owning, sized when both are; the properties both share.
/// Cost: one comparison, then the chosen box's. Unsynchronized (as its boxes). Move-only; move-assignable
/// when both boxes are.
template <std::size_t Threshold, resource Small, resource Large>
class segregator
    : public forward_common_properties<segregator<Threshold, Small, Large>, Small, Large>,
      public sync_names<segregator<Threshold, Small, Large>>,
      public stream_first_names<segregator<Threshold, Small, Large>, stream_resource<Small> && stream_resource<Large>> {
  static constexpr bool stream_ordered = stream_resource<Small> && stream_resource<Large>;
  using names = stream_first_names<segregator<Threshold, Small, Large>, stream_ordered>;

public:
  using names::allocate;
  using names::deallocate;
  static constexpr std::size_t threshold = Threshold;

  segregator() requires std::default_initializable<Small> && std::default_initializable<Large> : segregator(Small{}, Large{}) {}
  segregator(Small small) requires std::default_initializable<Large> : segregator(std::move(small), Large{}) {}
  segregator(Small small, Large large) : small_(std::move(small)), large_(std::move(large)) {}
  segregator(segregator&&) noexcept = default;
  segregator& operator=(segregator&&) noexcept(std::is_nothrow_move_assignable_v<Small> &&
                                               std::is_nothrow_move_assignable_v<Large>) = default;

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    return bytes <= Threshold ? small_.allocate(bytes, alignment) : large_.allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (bytes <= Threshold) small_.deallocate(p, bytes, alignment);
    else large_.deallocate(p, bytes, alignment);
  }
  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires stream_ordered
  {
    return bytes <= Threshold ? small_.allocate_async(bytes, alignment, stream) : large_.allocate_async(bytes, alignment, stream);
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
    requires stream_ordered
  {
    if (bytes <= Threshold) small_.deallocate_async(p, bytes, alignment, stream);
    else large_.deallocate_async(p, bytes, alignment, stream);
  }

  bool owns(const void* p) const noexcept
    requires owning_resource<Small> && owning_resource<Large>
  {
    return small_.owns(p) || large_.owns(p);
  }
  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const
    requires sized_resource<Small> && sized_resource<Large>
  {
    return bytes <= Threshold ? small_.good_size(bytes, alignment) : large_.good_size(bytes, alignment);
  }
  /// Both boxes' figures added up.
  strata::usage usage() const
    requires usage_reporting_resource<Small> && usage_reporting_resource<Large>
  {
    return small_.usage() + large_.usage();
  }
  void release()
    requires releasable_resource<Small> && releasable_resource<Large>
  {
    small_.release();
    large_.release();
  }

  Small& small() noexcept { return small_; }
  Large& large() noexcept { return large_; }

  friend bool operator==(const segregator& a, const segregator& b) noexcept { return &a == &b; }

private:
  [[no_unique_address]] Small small_;
  [[no_unique_address]] Large large_;
};

namespace detail::segregator_claims {
using S = segregator<4096, archetype_resource, archetype_resource>;
static_assert(resource<S> && !stream_resource<S> && !owning_resource<S> && !sized_resource<S>);
static_assert(cccl::synchronous_resource_with<S, device_accessible>);
} // namespace detail::segregator_claims

} // namespace strata
