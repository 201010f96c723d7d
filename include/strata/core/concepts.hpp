#pragma once
// The vocabulary every strata box speaks (docs/architecture.md), and the optional capabilities detected with
// `requires` so that adaptors use them only where a box really has them.
#include <concepts>
#include <cstddef>

#include <strata/core/config.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/usage.hpp>

namespace strata {

/// allocate/deallocate with an alignment, equality (memory from one may be freed by the other).
template <class R>
concept resource = requires(R& r, void* p, std::size_t bytes, std::size_t alignment) {
  { r.allocate(bytes, alignment) } -> std::same_as<void*>;
  { r.deallocate(p, bytes, alignment) } noexcept -> std::same_as<void>;
} && std::equality_comparable<R>;

/// A resource whose memory may be used, and freed, in stream order.
template <class R>
concept stream_resource =
  resource<R> && requires(R& r, void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) {
    { r.allocate_async(bytes, alignment, stream) } -> std::same_as<void*>;
    { r.deallocate_async(p, bytes, alignment, stream) } noexcept -> std::same_as<void>;
  };

/// Can tell whether it handed out a pointer (what fallback routes frees by). One meaning across strata:
/// `owns(p)` is true exactly when p lies inside a block this box handed out and has not taken back — for a
/// pool, a live block; for a source, a live allocation; for an adaptor, what its box(es) below say. It is
/// never "p is in my address range": a pool over a source draws its chunks from that source, so a source
/// answering by range would claim the pool's blocks (fallback<source, pool over the same source> would free
/// them to the wrong tier). Not owning p says nothing about who does.
template <class R>
concept owning_resource = resource<R> && requires(const R& r, const void* p) {
  { r.owns(p) } noexcept -> std::same_as<bool>;
};

/// Can hand every fully free chunk back to its upstream.
template <class R>
concept releasable_resource = resource<R> && requires(R& r) { r.release(); };

/// Can say how many bytes a request really consumes.
template <class R>
concept sized_resource = resource<R> && requires(const R& r, std::size_t bytes, std::size_t alignment) {
  { r.good_size(bytes, alignment) } -> std::same_as<std::size_t>;
};

template <class R>
concept usage_reporting_resource = resource<R> && requires(const R& r) {
  { r.usage() } -> std::same_as<strata::usage>;
};

template <class R>
concept snapshot_resource = resource<R> && requires(const R& r) {
  { r.snapshot() } -> std::same_as<strata::snapshot>;
};

/// Can say, without side effects, whether a request would be served from memory it already holds (no
/// upstream call). stream_ordered uses it to hand cached blocks back only when the policy would grow.
template <class R>
concept room_reporting_resource = resource<R> && requires(const R& r, std::size_t bytes, std::size_t alignment) {
  { r.has_room_for(bytes, alignment) } noexcept -> std::same_as<bool>;
};

/// Can free everything at once (arena).
///
/// A vocabulary rule boxes rely on (limit does): allocate(0, alignment) checks the alignment (a
/// std::invalid_argument for one the box cannot honour) before returning nullptr, and has no other effect.
template <class R>
concept resettable_resource = resource<R> && requires(R& r) { r.reset(); };

/// The largest alignment R promises (its static `max_alignment`), or default_alignment when it says nothing.
/// Policies ask their upstream for chunks aligned this much, so blocks inside can be aligned without padding.
template <class R>
inline constexpr std::size_t max_alignment_of = [] {
  if constexpr (requires { R::max_alignment; }) return std::size_t{R::max_alignment};
  else return std::size_t{256};
}();

} // namespace strata
