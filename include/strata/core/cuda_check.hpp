#pragma once
#include <source_location>
#include <string_view>

#include <strata/core/errors.hpp>

namespace strata::detail {

constexpr bool is_out_of_memory(cudaError_t status) noexcept { return status == cudaErrorMemoryAllocation; }

/// Clears the runtime's last-error slot so that one failed call does not poison the next check elsewhere.
inline void clear_last_error() noexcept { (void)cudaGetLastError(); }

/// Throws cuda_error for any failure; the runtime's error state is cleared first.
inline void cuda_check(cudaError_t status, std::string_view call,
                       std::source_location where = std::source_location::current())
{
  if (status == cudaSuccess) return;
  clear_last_error();
  throw cuda_error(status, call, where);
}

/// Like cuda_check, but out-of-memory becomes strata::out_of_memory naming the box.
inline void cuda_check_alloc(cudaError_t status, std::string_view call, std::string_view box, std::size_t bytes,
                             std::string_view details = {},
                             std::source_location where = std::source_location::current())
{
  if (status == cudaSuccess) return;
  clear_last_error();
  if (is_out_of_memory(status)) throw out_of_memory(box, bytes, std::string(call) + " refused; " + std::string(details));
  throw cuda_error(status, call, where);
}

/// Destructors and noexcept frees cannot throw: they report nothing, but never leave the error set.
/// cudaErrorCudartUnloading means the runtime is gone (static destruction order); nothing to do then.
inline void cuda_check_noexcept(cudaError_t status) noexcept
{
  if (status != cudaSuccess) clear_last_error();
}

/// A driver function through the runtime's entry-point table (no link to libcuda, so a program without a GPU
/// or driver still loads): F is the function's pointer type; null where the driver lacks it.
template <class F>
F driver_entry_point(const char* name) noexcept
{
  void* symbol = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &symbol, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    clear_last_error();
    return nullptr;
  }
  return reinterpret_cast<F>(symbol);
}

/// The calling thread's current CUDA context (the driver's cuCtxGetCurrent: a thread-local read, a fraction of
/// cudaGetDevice's cost, plugin/bench/plugin_cost.cpp); null when there is none or the driver cannot be asked.
using ctx_get_current_fn = int (*)(void** context);  // cuCtxGetCurrent(CUcontext*)

/// cuCtxGetCurrent through the runtime's entry-point table, looked up once; null where the driver cannot be asked.
inline ctx_get_current_fn ctx_get_current() noexcept
{
  static const auto get_current = driver_entry_point<ctx_get_current_fn>("cuCtxGetCurrent");
  return get_current;
}

inline void* current_context() noexcept
{
  const ctx_get_current_fn get_current = ctx_get_current();
  void* context = nullptr;
  return get_current != nullptr && get_current(&context) == 0 ? context : nullptr;
}

/// Whether the calling thread has a current CUDA context. A thread that never made a runtime call has none,
/// yet cudaGetDevice already answers 0 there, so comparing devices cannot tell; driver calls made then fail
/// with CUDA_ERROR_INVALID_CONTEXT. Where the driver cannot be asked, true: the runtime binds the context
/// itself on its next call.
inline bool context_current() noexcept
{
  return ctx_get_current() == nullptr || current_context() != nullptr;
}

/// Makes `device` current for a scope and restores the previous device, so sources never change the
/// caller's current device behind their back. On a thread with no current context (one that made no runtime
/// call yet: a framework's worker thread) the device's primary context is made current and left so, as the
/// runtime's next call would do anyway, so that driver calls in the scope find it. Cost: cudaGetDevice and a
/// cuCtxGetCurrent when the device is already current; cudaSetDevice twice otherwise.
class scoped_device {
public:
  explicit scoped_device(int device)
  {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) {
      cuda_check(cudaSetDevice(device), "cudaSetDevice");
    } else {
      previous_ = -1;
      if (!context_current()) cuda_check(cudaSetDevice(device), "cudaSetDevice");
    }
  }
  scoped_device(const scoped_device&) = delete;
  scoped_device& operator=(const scoped_device&) = delete;
  ~scoped_device()
  {
    if (previous_ >= 0) cuda_check_noexcept(cudaSetDevice(previous_));
  }

private:
  int previous_ = -1;
};

inline int current_device()
{
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

} // namespace strata::detail
