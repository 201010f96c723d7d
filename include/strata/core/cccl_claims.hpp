#pragma once
// CCCL's cuda::mr words changed meaning in 3.1, and strata must compile against both generations:
//
//   what strata claims              CCCL 3.0 (CUDA 12.x, 13.0)        CCCL >= 3.1 (CUDA 13.1+, RAPIDS 26.x)
//   a synchronous resource          cuda::mr::resource                cuda::mr::synchronous_resource
//   ... with properties             cuda::mr::resource_with           cuda::mr::synchronous_resource_with
//   a stream-ordered resource       cuda::mr::async_resource          cuda::mr::resource
//   ... with properties             cuda::mr::async_resource_with     cuda::mr::resource_with
//   non-owning reference, sync      cuda::mr::resource_ref            cuda::mr::synchronous_resource_ref
//   non-owning reference, stream    cuda::mr::async_resource_ref      cuda::mr::resource_ref
//
// The same spelling means a different thing in each column, so no header names cuda::mr concepts directly:
// each claims in strata::cccl's words, and this file alone maps them onto the generation being compiled.
//
// Under 3.0 the concepts also demand the 3.1 names (allocate_sync, stream-first allocate): a box that
// passes its claims there already has what 3.1 asks for, so a user who upgrades CCCL breaks nothing.
//
// From 3.2 on, CCCL's wrappers (resource_ref, synchronous_resource_ref, any_resource) take copyable
// resources only, and strata's pools are move-only by design: hand them a strata::ref to the pool (copyable;
// the pool must outlive it), or use strata::any_resource. STRATA_CCCL_WRAPPERS_NEED_COPYABLE says which.
//
// The opt-in switch: 3.0 hides all of cuda::mr behind LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE,
// 3.1 only the resource_ref types, and 3.2 onwards have no switch (config.hpp defines it for the first two;
// the later generations ignore it).
#include <cstddef>

#include <cuda/version>

#include <strata/core/cccl_names.hpp>
#include <strata/core/config.hpp>

#if !defined(CCCL_MAJOR_VERSION) || !defined(CCCL_MINOR_VERSION)
#error "strata: <cuda/version> did not say which CCCL this is; strata needs CCCL 3.0 or later"
#endif
#if CCCL_MAJOR_VERSION < 3
#error "strata needs CCCL 3.0 or later (the cuda::mr vocabulary it models)"
#endif

/// 1 when the CCCL being compiled against uses the 3.1+ cuda::mr vocabulary (synchronous_resource,
/// stream-first resource); 0 for CCCL 3.0. For code that must spell a call differently per generation.
#if CCCL_MAJOR_VERSION > 3 || CCCL_MINOR_VERSION >= 1
#define STRATA_CCCL_STREAM_FIRST_MR 1
#else
#define STRATA_CCCL_STREAM_FIRST_MR 0
#endif

/// 1 when cuda::mr's resource_ref and any_resource accept only copyable resources (CCCL 3.2+): a move-only
/// strata box goes to them as a strata::ref.
#if CCCL_MAJOR_VERSION > 3 || CCCL_MINOR_VERSION >= 2
#define STRATA_CCCL_WRAPPERS_NEED_COPYABLE 1
#else
#define STRATA_CCCL_WRAPPERS_NEED_COPYABLE 0
#endif

namespace strata::cccl {

/// The CCCL release being compiled against, as major * 1000 + minor (3000, 3005...).
inline constexpr int version = CCCL_MAJOR_VERSION * 1000 + CCCL_MINOR_VERSION;

#if STRATA_CCCL_STREAM_FIRST_MR

template <class R>
concept synchronous_resource = cuda::mr::synchronous_resource<R>;
template <class R, class... Properties>
concept synchronous_resource_with = cuda::mr::synchronous_resource_with<R, Properties...>;
template <class R>
concept stream_resource = cuda::mr::resource<R>;
template <class R, class... Properties>
concept stream_resource_with = cuda::mr::resource_with<R, Properties...>;

template <class... Properties>
using synchronous_resource_ref = cuda::mr::synchronous_resource_ref<Properties...>;
template <class... Properties>
using stream_resource_ref = cuda::mr::resource_ref<Properties...>;

#else

template <class R>
concept synchronous_resource = cuda::mr::resource<R> && answers_to_cccl31_names<R>;
template <class R, class... Properties>
concept synchronous_resource_with = cuda::mr::resource_with<R, Properties...> && answers_to_cccl31_names<R>;
template <class R>
concept stream_resource = cuda::mr::async_resource<R> && answers_to_cccl31_stream_names<R>;
template <class R, class... Properties>
concept stream_resource_with =
  cuda::mr::async_resource_with<R, Properties...> && answers_to_cccl31_stream_names<R>;

template <class... Properties>
using synchronous_resource_ref = cuda::mr::resource_ref<Properties...>;
template <class... Properties>
using stream_resource_ref = cuda::mr::async_resource_ref<Properties...>;

#endif

/// Calls on CCCL's own wrappers (the references above, cuda::mr's any_resource), which answer only to their
/// generation's names; strata's boxes answer to both and need none of these.
template <class R>
void* allocate_sync(R& r, std::size_t bytes, std::size_t alignment)
{
#if STRATA_CCCL_STREAM_FIRST_MR
  return r.allocate_sync(bytes, alignment);
#else
  return r.allocate(bytes, alignment);
#endif
}
template <class R>
void deallocate_sync(R& r, void* p, std::size_t bytes, std::size_t alignment) noexcept
{
#if STRATA_CCCL_STREAM_FIRST_MR
  r.deallocate_sync(p, bytes, alignment);
#else
  r.deallocate(p, bytes, alignment);
#endif
}
template <class R>
void* allocate(R& r, cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
{
#if STRATA_CCCL_STREAM_FIRST_MR
  return r.allocate(stream, bytes, alignment);
#else
  return r.allocate_async(bytes, alignment, stream);
#endif
}
template <class R>
void deallocate(R& r, cuda::stream_ref stream, void* p, std::size_t bytes, std::size_t alignment) noexcept
{
#if STRATA_CCCL_STREAM_FIRST_MR
  r.deallocate(stream, p, bytes, alignment);
#else
  r.deallocate_async(p, bytes, alignment, stream);
#endif
}

} // namespace strata::cccl
