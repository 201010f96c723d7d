#pragma once
// What stream_ordered needs to know about streams and events, as concepts, so that its bookkeeping can run
// over real CUDA streams (cuda_events) or over a pretend GPU on a machine without one (simulated_streams).
#include <concepts>
#include <cstdint>

#include <strata/core/config.hpp>

namespace strata {


/// A backend tells streams apart by a stable id and records, queries and waits on events. It may also offer
/// `make_event_on(device)` (an event of that device, not of the current one), detected with `requires`.
/// `id_of` must give a stream an id no other stream ever had (handles are reused after cudaStreamDestroy; ids
/// are not). `done` never blocks; `wait_host` blocks the calling thread; `order_after(s, e)` makes later work
/// on s wait for e without blocking the host.
/// `device_of(s)` names the device whose work s runs (wait_device(d) waits for all of that device's work);
/// `capturing(s)` says whether s is being captured into a CUDA graph, where no event may be recorded on it
/// and no host wait may be made.
template <class B>
concept event_backend = std::movable<B> && requires(B& b, const typename B::event e, cuda::stream_ref s, int device) {
  typename B::event;
  { b.id_of(s) } -> std::same_as<std::uint64_t>;
  { b.make_event() } -> std::same_as<typename B::event>;
  { b.destroy_event(e) } noexcept;
  b.record(e, s);
  { b.done(e) } -> std::same_as<bool>;
  b.wait_host(e);
  b.order_after(s, e);
  b.wait_stream(s);
  b.wait_device(device);
  { b.device_of(s) } -> std::same_as<int>;
  { b.capturing(s) } -> std::same_as<bool>;
};

/// A backend whose streams include some that never die and mean the same stream from every thread (the legacy
/// default stream of each device), detected with `requires`: `permanent(s)` says whether s is one, and
/// `record_on(e, s, device)` records e (an event of `device`) on such a stream of `device`, whichever device is
/// current. stream_ordered then records an event after a permanent owner's frees only when another stream
/// needs them, from that stream's call, instead of after every free (see its class comment).
template <class B>
concept permanent_stream_backend = event_backend<B> && requires(B& b, const typename B::event e, cuda::stream_ref s, int device) {
  { b.permanent(s) } -> std::same_as<bool>;
  b.record_on(e, s, device);
};

/// What a call asks about its stream: whether it captures and, only when it does not, its id (asking a
/// capturing stream's id is refused by the driver and invalidates the capture). `id` is 0 when capturing.
struct stream_query {
  bool capturing = false;
  std::uint64_t id = 0;
};

namespace detail {
template <class M>
struct member_class_of;
template <class R, class C>
struct member_class_of<R C::*> {
  using type = C;
};
/// Whether B's capture_then_id, capturing and id_of are declared by one class: a backend derived from one
/// that redefines either question (to count or fail it) must not be answered by the base's pair.
template <auto Member>
using declaring_class = typename member_class_of<decltype(Member)>::type;
template <class B>
concept declares_query_pair = requires {
  &B::capture_then_id;
  &B::capturing;
  &B::id_of;
} && std::same_as<declaring_class<&B::capture_then_id>, declaring_class<&B::capturing>> &&
                              std::same_as<declaring_class<&B::capture_then_id>, declaring_class<&B::id_of>>;
} // namespace detail

/// A backend that answers both of a call's questions in one call, detected with `requires`:
/// `capture_then_id(s)` is `capturing(s)` and then, for a stream not capturing, `id_of(s)`, with their
/// errors, declared by the class that declares those two. stream_ordered asks it where a call needs both; a
/// backend with one lookup of the stream for both saves the second.
template <class B>
concept capture_then_id_backend = event_backend<B> && detail::declares_query_pair<B> && requires(B& b, cuda::stream_ref s) {
  { b.capture_then_id(s) } -> std::same_as<stream_query>;
};

/// What a stream's capture query says: whether it captures, the capture's id (unique over the process's
/// lifetime, shared by every stream joined to the capture) and the graph being built (valid while it captures).
struct capture_info {
  bool active = false;
  std::uint64_t id = 0;
  void* graph = nullptr;
};

/// What CUDA calls when the last graph or executable graph holding a token is gone, on an internal thread
/// where no CUDA call may be made.
using graph_release_fn = void (*)(void*);

/// A backend that can serve allocations made under stream capture from private pools (stream_ordered's
/// automatic graph mode), detected with `requires`:
/// - `capture_of(s)`: the capture query, which capture forbids nothing of (cudaStreamGetCaptureInfo);
/// - `call_when_graph_destroyed(graph, fn, arg)`: fn(arg) once the graph and every executable graph
///   instantiated from it are destroyed (a CUDA user object moved into the graph); throws, calling nothing,
///   when it cannot;
/// - `exchange_capture_mode(mode)`: the calling thread's capture interaction mode (0 global, 1 thread-local,
///   2 relaxed), as cudaThreadExchangeStreamCaptureMode: relaxed lets a policy grow (cudaMalloc, cuMemCreate)
///   while a stream captures, which the default mode forbids.
template <class B>
concept graph_backend = event_backend<B> && requires(B& b, cuda::stream_ref s, void* graph, graph_release_fn fn, void* arg, int mode) {
  { b.capture_of(s) } -> std::same_as<capture_info>;
  b.call_when_graph_destroyed(graph, fn, arg);
  { b.exchange_capture_mode(mode) } -> std::same_as<int>;
};

} // namespace strata
