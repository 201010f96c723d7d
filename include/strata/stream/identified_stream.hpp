#pragma once
// Telling streams apart costs a driver call (cuStreamGetId; the runtime's cudaStreamGetId costs more), a large
// share of a whole cached allocate+free in stream_ordered (bench/streams measures both). A stream created
// once and used for many allocations can carry its id.
//
// Handle 0 means the legacy default stream in code compiled normally and the calling thread's per-thread
// default stream under `nvcc --default-stream per-thread` (CUDA_API_PER_THREAD_DEFAULT_STREAM), and the CUDA
// runtime's stream calls are macros that change name with it. Everything here that reads handle 0 or calls
// those functions therefore lives in an inline namespace named after the mode: a program mixing both modes
// gets two distinct functions (and two distinct cuda_events types), never one inline function compiled two
// ways (an ODR violation whose outcome is whichever copy the linker keeps).
#include <cstdint>
#include <thread>

#include <strata/core/config.hpp>
#include <strata/detail/cuda_check.hpp>

#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#define STRATA_DEFAULT_STREAM_MODE per_thread_default_stream
#else
#define STRATA_DEFAULT_STREAM_MODE legacy_default_stream
#endif

namespace strata {

/// A stream with the id that tells it apart from every other stream, looked up once. Valid while the stream
/// lives (the same contract as its handle). stream_ordered's overloads taking it skip the id lookup, and with
/// check_capture off (captures announced with begin_allocate_to_pool) make no CUDA call while no capture is
/// announced or seen (docs/architecture.md).
/// A per-thread default stream is a different stream on every thread: its identified_stream remembers the
/// thread it was identified on (`bound_thread()`), and stream_ordered looks the id up again when it is used
/// on another thread, so a free is always filed under the stream that really orders it.
class identified_stream {
public:
  identified_stream(cuda::stream_ref stream, std::uint64_t id) noexcept
      : stream_(stream), id_(id), thread_(stream.get() == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id{})
  {}

  cuda::stream_ref stream() const noexcept { return stream_; }
  std::uint64_t id() const noexcept { return id_; }
  operator cuda::stream_ref() const noexcept { return stream_; }
  /// The thread whose per-thread default stream this is; a default-constructed id for every other stream.
  std::thread::id bound_thread() const noexcept { return thread_; }
  /// True when the id holds on the calling thread.
  bool valid_here() const noexcept { return thread_ == std::thread::id{} || thread_ == std::this_thread::get_id(); }

private:
  cuda::stream_ref stream_;
  std::uint64_t id_;
  std::thread::id thread_;
};

namespace detail {

/// The driver's cuStreamGetId (through the runtime's entry-point table): it skips the runtime's own layer,
/// about half the cost of cudaStreamGetId. Null where the driver lacks it.
using stream_id_fn = int (*)(cudaStream_t, unsigned long long*);
inline stream_id_fn driver_stream_id() noexcept
{
  static const auto fn = driver_entry_point<stream_id_fn>("cuStreamGetId");
  return fn;
}

/// The driver's cuStreamIsCapturing, found the same way (its status: 0 none, 1 active, 2 invalidated).
using is_capturing_fn = int (*)(cudaStream_t, int*);
inline is_capturing_fn driver_is_capturing() noexcept
{
  static const auto fn = driver_entry_point<is_capturing_fn>("cuStreamIsCapturing");
  return fn;
}

/// The driver's cuCtxGetCurrent, found the same way: a thread-local read in the driver.
using current_context_fn = int (*)(void**);
inline current_context_fn driver_current_context() noexcept
{
  static const auto fn = driver_entry_point<current_context_fn>("cuCtxGetCurrent");
  return fn;
}

} // namespace detail

inline namespace STRATA_DEFAULT_STREAM_MODE {

/// Handle 0 as this translation unit's compilation mode means it: cudaStreamPerThread under
/// `--default-stream per-thread`, cudaStreamLegacy otherwise. Other handles are returned as they are.
inline cuda::stream_ref explicit_stream(cuda::stream_ref stream) noexcept
{
  if (stream.get() != nullptr) return stream;
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
  return cuda::stream_ref{cudaStreamPerThread};
#else
  return cuda::stream_ref{cudaStreamLegacy};
#endif
}

/// The id of a real CUDA stream, asked of the driver directly (falling back to the runtime if the driver
/// refuses or the thread has no current context). Handle 0 is first made explicit (explicit_stream), and the
/// identified_stream carries the explicit handle, so it means the same stream wherever it is passed.
inline identified_stream identify(cuda::stream_ref stream)
{
  const cuda::stream_ref named = explicit_stream(stream);
  unsigned long long id = 0;
  // Without a current context (a thread that made no runtime call yet) the driver refuses: the runtime, asked
  // next, binds the context first. Asking the driver first keeps the common case at one call.
  if (const auto driver = detail::driver_stream_id(); driver != nullptr && driver(named.get(), &id) == 0)
    return {named, id};
  detail::cuda_check(cudaStreamGetId(named.get(), &id), "cudaStreamGetId");
  return {named, id};
}

/// The legacy default stream's id, remembered per thread for the context last current: that stream lives as
/// long as its context, so its id never changes under one context, and the context is a cheaper question
/// than the id. Asked again whenever another context is current, or none is (identify then binds one). A
/// context destroyed and another made at the same address (a device reset) leaves this thread the old
/// stream's id: ids are never reused, so that stream is at worst taken for two, whose blocks then wait for
/// each other as any two streams' do, never for another stream.
inline std::uint64_t legacy_stream_id()
{
  thread_local void* context = nullptr;
  thread_local std::uint64_t id = 0;
  void* current = nullptr;
  const auto ask = detail::driver_current_context();
  if (ask != nullptr && ask(&current) == 0 && current != nullptr && current == context) return id;
  id = identify(cuda::stream_ref{cudaStreamLegacy}).id();
  context = current;  // null when the driver could not say: asked again next time
  return id;
}

} // namespace STRATA_DEFAULT_STREAM_MODE

} // namespace strata
