#pragma once
// What stream_ordered needs to know about streams and events, as a concept, so that its bookkeeping can run
// over real CUDA streams (cuda_events) or over a pretend GPU on a machine without one (simulated_streams).
#include <concepts>
#include <cstdint>

#include <strata/core/config.hpp>
#include <strata/detail/cuda_check.hpp>
#include <strata/stream/identified_stream.hpp>

namespace strata {

/// A backend tells streams apart by a stable id and records, queries and waits on events.
/// `id_of` must give a stream an id no other stream ever had (handles are reused after cudaStreamDestroy; ids
/// are not). `done` never blocks; `wait_host` blocks the calling thread; `order_after(s, e)` makes later work
/// on s wait for e without blocking the host.
template <class B>
concept event_backend = std::movable<B> && requires(B& b, const typename B::event e, cuda::stream_ref s) {
  typename B::event;
  { b.id_of(s) } -> std::same_as<std::uint64_t>;
  { b.make_event() } -> std::same_as<typename B::event>;
  { b.destroy_event(e) } noexcept;
  b.record(e, s);
  { b.done(e) } -> std::same_as<bool>;
  b.wait_host(e);
  b.order_after(s, e);
  b.wait_stream(s);
  b.wait_device();
};

/// Real CUDA streams: ids from strata::identify (the driver's cuStreamGetId, which also resolves the legacy and
/// per-thread default streams; handle 0 through cudaStreamGetId, which resolves it under either compilation
/// mode), events created with timing disabled (cheaper to record).
/// Every call is a CUDA runtime call; every failure is a strata::cuda_error. Stateless and thread-safe.
struct cuda_events {
  using event = cudaEvent_t;

  std::uint64_t id_of(cuda::stream_ref stream) const { return identify(stream).id(); }
  event make_event() const
  {
    cudaEvent_t e = nullptr;
    detail::cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void destroy_event(event e) const noexcept { detail::cuda_check_noexcept(cudaEventDestroy(e)); }
  void record(event e, cuda::stream_ref stream) const
  {
    detail::cuda_check(cudaEventRecord(e, stream.get()), "cudaEventRecord");
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
  void wait_device() const { detail::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
};

static_assert(event_backend<cuda_events>);

} // namespace strata
