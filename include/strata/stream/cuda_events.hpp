#pragma once
// Real CUDA streams and events for stream_ordered: the event_backend (core/event_backend.hpp) of a GPU build.
#include <cstdint>

#include <strata/core/config.hpp>
#include <strata/core/event_backend.hpp>
#include <strata/detail/cuda_check.hpp>
#include <strata/stream/identified_stream.hpp>

namespace strata {

inline namespace STRATA_DEFAULT_STREAM_MODE {

/// Real CUDA streams: ids from strata::identify (the driver's cuStreamGetId, which also resolves the legacy and
/// per-thread default streams; handle 0 as this translation unit's compilation mode means it; the legacy
/// stream's remembered per thread and context: legacy_stream_id), events created
/// with timing disabled (cheaper to record). Its calls take handle 0 as the mode says, so the type lives in the
/// mode's inline namespace (see identified_stream.hpp).
/// Every call is a CUDA runtime call; every failure is a strata::cuda_error. Stateless and thread-safe.
struct cuda_events {
  using event = cudaEvent_t;

  std::uint64_t id_of(cuda::stream_ref stream) const
  {
    if (explicit_stream(stream).get() == cudaStreamLegacy) return legacy_stream_id();
    return identify(stream).id();
  }
  event make_event() const
  {
    cudaEvent_t e = nullptr;
    detail::cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  /// An event of `device` (events belong to a device; cudaEventRecord wants the stream's), the calling
  /// thread's current device restored afterwards.
  event make_event_on(int device) const
  {
    detail::scoped_device on(device);
    return make_event();
  }
  void destroy_event(event e) const noexcept { detail::cuda_check_noexcept(cudaEventDestroy(e)); }
  void record(event e, cuda::stream_ref stream) const
  {
    detail::cuda_check(cudaEventRecord(e, stream.get()), "cudaEventRecord");
  }
  /// The legacy default stream (cudaStreamLegacy, or handle 0 in this translation unit's legacy mode): never
  /// destroyed, the same stream from every thread. The per-thread default stream is not: its handle means
  /// the calling thread's.
  bool permanent(cuda::stream_ref stream) const noexcept { return explicit_stream(stream).get() == cudaStreamLegacy; }
  /// cudaEventRecord on `stream` of `device` (the legacy stream's handle names the current device's), the
  /// calling thread's current device restored afterwards.
  void record_on(event e, cuda::stream_ref stream, int device) const
  {
    detail::scoped_device on(device);
    record(e, stream);
  }
  bool done(event e) const
  {
    const cudaError_t status = cudaEventQuery(e);
    if (status == cudaErrorNotReady) {
      detail::clear_last_error();
      return false;
    }
    detail::cuda_check(status, "cudaEventQuery");
    return true;
  }
  void wait_host(event e) const { detail::cuda_check(cudaEventSynchronize(e), "cudaEventSynchronize"); }
  void order_after(cuda::stream_ref stream, event e) const
  {
    detail::cuda_check(cudaStreamWaitEvent(stream.get(), e, 0), "cudaStreamWaitEvent");
  }
  void wait_stream(cuda::stream_ref stream) const
  {
    detail::cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
  }
  /// cudaDeviceSynchronize of `device`, the calling thread's current device restored afterwards.
  void wait_device(int device) const
  {
    int current = 0;
    detail::cuda_check(cudaGetDevice(&current), "cudaGetDevice");
    if (current != device) detail::cuda_check(cudaSetDevice(device), "cudaSetDevice");
    const cudaError_t status = cudaDeviceSynchronize();
    if (current != device) detail::cuda_check_noexcept(cudaSetDevice(current));
    detail::cuda_check(status, "cudaDeviceSynchronize");
  }
  int device_of(cuda::stream_ref stream) const
  {
    int device = 0;
    detail::cuda_check(cudaStreamGetDevice(stream.get(), &device), "cudaStreamGetDevice");
    return device;
  }
  /// The driver's cuStreamIsCapturing through the runtime's entry-point table (a fraction of the runtime's
  /// cost: it is asked once per allocate and free), the runtime where the driver lacks it, where the thread has
  /// no current context yet (the driver would fail with CUDA_ERROR_INVALID_CONTEXT; the runtime binds the
  /// current device's primary context first), or where the driver's answer is an error. Throws cuda_error when
  /// neither can say: stream_ordered then assumes the worst.
  bool capturing(cuda::stream_ref stream) const
  {
    if (const auto driver = detail::driver_is_capturing(); driver != nullptr) {  // refuses without a current context
      int status = 0;
      if (driver(explicit_stream(stream).get(), &status) == 0) return status != 0;  // CU_STREAM_CAPTURE_STATUS_NONE
    }
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t asked = cudaStreamIsCapturing(stream.get(), &status);
    if (asked == cudaErrorStreamCaptureImplicit) {  // a default stream while another captures in global mode
      detail::clear_last_error();
      return true;
    }
    detail::cuda_check(asked, "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
  }

  /// Two driver calls, in the order the driver requires: the capture query, then (not capturing) the id.
  stream_query capture_then_id(cuda::stream_ref stream) const
  {
    if (capturing(stream)) return {true, 0};
    return {false, id_of(stream)};
  }

  /// cudaStreamGetCaptureInfo: legal on a capturing stream (unlike asking its id).
  capture_info capture_of(cuda::stream_ref stream) const
  {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    cudaGraph_t graph = nullptr;
    const cudaError_t asked = cudaStreamGetCaptureInfo(stream.get(), &status, &id, &graph);
    if (asked == cudaErrorStreamCaptureImplicit) {  // a default stream while another captures: not a capture of its own
      detail::clear_last_error();
      return {};
    }
    detail::cuda_check(asked, "cudaStreamGetCaptureInfo");
    if (status != cudaStreamCaptureStatusActive) return {};
    return {true, id, graph};
  }
  /// A user object whose only reference is moved into the graph: executable graphs instantiated from it take
  /// references of their own, so fn runs once the graph and all of them are destroyed (and, CUDA says, once
  /// their pending launches no longer need it).
  void call_when_graph_destroyed(void* graph, graph_release_fn fn, void* arg) const
  {
    cudaUserObject_t object = nullptr;
    detail::cuda_check(cudaUserObjectCreate(&object, arg, fn, 1, cudaUserObjectNoDestructorSync), "cudaUserObjectCreate");
    const cudaError_t moved = cudaGraphRetainUserObject(static_cast<cudaGraph_t>(graph), object, 1, cudaGraphUserObjectMove);
    if (moved != cudaSuccess) {
      // Not moved: our reference is still ours. Releasing it would run fn; the caller expects no call on failure,
      // so the object is leaked instead (a few bytes, on a path that means the driver is already failing).
      detail::cuda_check(moved, "cudaGraphRetainUserObject");
    }
  }
  int exchange_capture_mode(int mode) const
  {
    auto m = static_cast<cudaStreamCaptureMode>(mode);
    detail::cuda_check(cudaThreadExchangeStreamCaptureMode(&m), "cudaThreadExchangeStreamCaptureMode");
    return static_cast<int>(m);
  }
};

static_assert(event_backend<cuda_events>);
static_assert(graph_backend<cuda_events>);
static_assert(permanent_stream_backend<cuda_events>);
static_assert(capture_then_id_backend<cuda_events>);

} // namespace STRATA_DEFAULT_STREAM_MODE

} // namespace strata
