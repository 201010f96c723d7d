#pragma once
// Makes a strata stack RMM's current device resource. Includes RMM's headers (and so needs librmm and the
// CCCL librmm was built with); interop/rmm_resource.hpp alone needs neither. Not part of strata.hpp, and not
// in the per-header check of strata's own build (which has no RMM): tests/rmm builds it.
//
// Note [librmm's CCCL]: librmm is compiled once, against one CCCL, and its functions take
// cuda::mr::any_resource by value; a translation unit that sees another CCCL builds an any_resource of another
// layout and hands it over, which crashes at run time. This header refuses to compile then, naming both
// releases (the template arguments of rmm_cccl_mismatch_this_unit_vs_librmm in the compiler's message).
// Which CCCL librmm was built with: STRATA_RMM_BUILT_WITH_CCCL (CCCL_VERSION's encoding, 3005000 for 3.5.0;
// cmake/strata_rmm.cmake defines it from RMM's CMake package), else the release shipped with the RMM versions
// listed below.
#include <cuda/version>

#include <rmm/version_config.hpp>

#if !defined(STRATA_RMM_BUILT_WITH_CCCL)
#if RMM_VERSION_MAJOR == 26 && RMM_VERSION_MINOR == 10
#define STRATA_RMM_BUILT_WITH_CCCL 3005000
#else
#error "strata/interop/rmm_current.hpp: which CCCL was this librmm built with? Define STRATA_RMM_BUILT_WITH_CCCL (as CCCL_VERSION spells it, 3005000 for 3.5.0), or link strata_rmm from cmake/strata_rmm.cmake, which does"
#endif
#endif

namespace strata::detail {
template <long ThisUnit, long Librmm>
struct rmm_cccl_mismatch_this_unit_vs_librmm {
  static_assert(ThisUnit == Librmm,
                "strata: this translation unit compiles against another CCCL than librmm was built with (CCCL_VERSION "
                "here, then librmm's: the two template arguments above); cuda::mr::any_resource differs between them. "
                "Put librmm's CCCL (the include/rapids directory of its package) first on the include path.");
  static constexpr bool same = true;
};
static_assert(rmm_cccl_mismatch_this_unit_vs_librmm<CCCL_VERSION, STRATA_RMM_BUILT_WITH_CCCL>::same);
} // namespace strata::detail

#include <string>

#include <rmm/cuda_device.hpp>
#include <rmm/error.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/process_is_exiting.hpp>
#include <rmm/resource_ref.hpp>

#include <strata/interop/rmm_resource.hpp>

namespace strata {

namespace detail {
/// RMM's own messages for this error begin with its name, and RMM's callers (its tests among them) look for it.
[[noreturn]] inline void rethrow_as_rmm(const out_of_memory& e)
{
  throw rmm::out_of_memory(("out_of_memory: " + std::string(e.what())).c_str());
}
inline bool rmm_exiting() noexcept { return rmm::process_is_exiting(); }
} // namespace detail

/// Prepares r for RMM: its out_of_memory becomes rmm::out_of_memory (what RMM's callers catch; the message is
/// "out_of_memory: " and strata's), and it consults rmm::process_is_exiting for Note [exit]. Returns r. Cost: two atomic stores.
inline rmm_resource as_rmm(rmm_resource r)
{
  r.translate_out_of_memory(&detail::rethrow_as_rmm);
  r.also_exiting_when(&detail::rmm_exiting);
  return r;
}

/// Makes r RMM's resource for `device` (-1: the current one): rmm::mr::get_current_device_resource_ref() and
/// everything that allocates through RMM on that device (device_buffer, device_uvector, rmm::exec_policy) use
/// the stack from then on. RMM keeps a copy until it is replaced or the process exits, so r may be destroyed
/// at once. Returns the resource that was current before (hand it back to restore it). The stack must serve
/// `device`: pass one built for it. Cost: RMM's lock on its per-device map, and a CUDA call when device is -1.
inline cuda::mr::any_resource<cuda::mr::device_accessible> make_current_rmm(rmm_resource r, int device = -1)
{
  const rmm::cuda_device_id id{device < 0 ? rmm::get_current_cuda_device().value() : device};
  return rmm::mr::set_per_device_resource(id, cuda::mr::any_resource<cuda::mr::device_accessible>{as_rmm(std::move(r))});
}

/// The same for a stack given directly (moved in; serialized by rmm_resource's lock).
template <class Stack>
  requires(!std::same_as<std::remove_cvref_t<Stack>, rmm_resource>) && rmm_stack<std::remove_cvref_t<Stack>>
cuda::mr::any_resource<cuda::mr::device_accessible> make_current_rmm(Stack&& stack, int device = -1)
{
  return make_current_rmm(rmm_resource(std::forward<Stack>(stack)), device);
}

} // namespace strata
