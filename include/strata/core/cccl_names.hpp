#pragma once
// CCCL 3.1 renamed the cuda::mr methods: allocate_sync/deallocate_sync for the synchronous pair and a
// stream-first allocate(stream, bytes, alignment) for the stream-ordered one. These CRTP bases give every
// strata box those names too, so it satisfies both CCCL generations without an adaptor.
#include <cstddef>

#include <strata/core/alignment.hpp>
#include <strata/core/config.hpp>

namespace strata {

/// CRTP base: the CCCL 3.1 synchronous names. Derived provides allocate(bytes, alignment) and
/// deallocate(p, bytes, alignment) noexcept, which these call.
template <class Derived>
class sync_names {
public:
  void* allocate_sync(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    return static_cast<Derived&>(*this).allocate(bytes, alignment);
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    static_cast<Derived&>(*this).deallocate(p, bytes, alignment);
  }
};

/// CRTP base: the stream-first overloads alone, present when Enabled (a box that is stream-ordered only when
/// its upstreams are). Derived provides allocate_async(bytes, alignment, stream) and
/// deallocate_async(p, bytes, alignment, stream) noexcept, which these call, and must say
/// `using stream_first_names<D, E>::allocate;` (and deallocate) so that its own synchronous allocate does not
/// hide these.
template <class Derived, bool Enabled = true>
class stream_first_names {
public:
  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment = default_alignment)
    requires Enabled
  {
    return static_cast<Derived&>(*this).allocate_async(bytes, alignment, stream);
  }
  void deallocate(cuda::stream_ref stream, void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
    requires Enabled
  {
    static_cast<Derived&>(*this).deallocate_async(p, bytes, alignment, stream);
  }
};

/// CRTP base: stream-ordered boxes have both generations of names (Derived provides what sync_names and
/// stream_first_names call); they must say `using stream_names<D>::allocate;` (and deallocate) so that their
/// own synchronous allocate does not hide the stream-first ones.
template <class Derived>
class stream_names : public sync_names<Derived>, public stream_first_names<Derived> {
public:
  using stream_first_names<Derived>::allocate;
  using stream_first_names<Derived>::deallocate;
};

/// True when R answers to the CCCL 3.1+ synchronous names.
template <class R>
concept answers_to_cccl31_names = requires(R& r, void* p, std::size_t n, std::size_t a) {
  { r.allocate_sync(n, a) } -> std::same_as<void*>;
  { r.deallocate_sync(p, n, a) } noexcept;
};

/// True when R answers to the CCCL 3.1+ stream-first names.
template <class R>
concept answers_to_cccl31_stream_names =
  answers_to_cccl31_names<R> && requires(R& r, void* p, std::size_t n, std::size_t a, cuda::stream_ref s) {
    { r.allocate(s, n, a) } -> std::same_as<void*>;
    { r.deallocate(s, p, n, a) } noexcept;
  };

} // namespace strata
