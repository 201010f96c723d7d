#pragma once
// A pretend GPU for stream_ordered on machines without one: streams are counters of enqueued and completed
// work, events remember "stream s, after its k-th piece of work". Tests drive completion by hand to provoke
// every interleaving; the replay benchmark uses it to plan multi-stream traces on simulated_source.
#include <algorithm>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <strata/core/config.hpp>
#include <strata/stream/cuda_events.hpp>
#include <strata/stream/identified_stream.hpp>

namespace strata {

/// The world the simulated streams live in. Stream handles are small fake addresses, recycled after
/// destroy() exactly as the driver recycles real ones; ids are never recycled. The legacy default stream
/// (handle cudaStreamLegacy or 0) always exists; cudaStreamPerThread names the calling host thread's own
/// per-thread default stream. Streams may belong to several devices (create(device)); capture and failing host
/// waits are modelled. Not thread-safe: threads take turns.
class simulated_streams {
public:
  struct event_state {
    std::uint64_t stream = 0;
    std::uint64_t ticket = 0;  ///< the stream's enqueued count when recorded: done once completed reaches it
    bool recorded = false;
    int device = 0;  ///< made on this device: the current one (make_event) or the one named (make_event_on)
    bool captured = false;  ///< last recorded under capture: a node of the graph, not a point of any stream
  };

  /// What the backend was asked to do, so tests can see that work is batched and that the host never waited.
  struct call_counts {
    std::uint64_t records = 0, queries = 0, host_waits = 0, stream_waits = 0, device_waits = 0, orderings = 0;
  };

  /// A CUDA error the simulated GPU raises where the real one would (an event recorded or a host wait under
  /// capture): the layer must never cause one, so tests fail loudly if it does.
  struct illegal_call : std::logic_error {
    using std::logic_error::logic_error;
  };

  simulated_streams()
  {
    streams_.resize(2);  // legacy_id, per_thread_id
    per_thread_ids_[std::this_thread::get_id()] = per_thread_id;
  }

  /// A new stream on `device` (the default streams live on device 0).
  cuda::stream_ref create(int device = 0)
  {
    std::uintptr_t handle = 0;
    if (!free_handles_.empty()) {
      handle = free_handles_.back();
      free_handles_.pop_back();
    } else {
      handle = next_handle_ += 0x100;
    }
    const std::uint64_t id = new_stream();
    handles_[handle] = id;
    streams_[id].device = device;
    return cuda::stream_ref{reinterpret_cast<cudaStream_t>(handle)};
  }

  /// Like cudaStreamDestroy: work already enqueued still completes (finish_id), the handle is reused.
  void destroy(cuda::stream_ref stream)
  {
    const auto handle = reinterpret_cast<std::uintptr_t>(stream.get());
    if (!handles_.erase(handle)) throw std::invalid_argument("simulated_streams: destroy of an unknown stream");
    free_handles_.push_back(handle);
  }

  static cuda::stream_ref legacy() noexcept { return cuda::stream_ref{cudaStreamLegacy}; }

  std::uint64_t id_of(cuda::stream_ref stream) const
  {
    const auto handle = reinterpret_cast<std::uintptr_t>(stream.get());
    if (handle == 0 || stream.get() == cudaStreamLegacy) return legacy_id;
    if (stream.get() == cudaStreamPerThread) return per_thread_stream_of(std::this_thread::get_id());
    const auto it = handles_.find(handle);
    if (it == handles_.end()) [[unlikely]] refuse_handle(handle);
    return it->second;
  }

  /// Calls that named a destroyed stream not yet reused (each is a crash on a real driver): tests check 0.
  std::size_t dead_stream_queries() const noexcept { return dead_stream_queries_; }

  identified_stream identify(cuda::stream_ref stream) const { return {stream, id_of(stream)}; }

  /// Enqueues one piece of work on the stream (a kernel); returns its ticket.
  std::uint64_t launch(cuda::stream_ref stream) { return ++streams_.at(id_of(stream)).enqueued; }

  /// Completes the stream's work so far, and the work of other streams it was ordered after.
  void finish(cuda::stream_ref stream) { finish_id(id_of(stream)); }
  void finish_id(std::uint64_t id)
  {
    stream_state& s = streams_.at(id);
    s.completed = s.enqueued;
    for (const auto& [other, ticket] : s.waits_for) complete_to(other, ticket);
  }
  void finish_all()
  {
    for (auto& s : streams_) s.completed = s.enqueued;
  }
  /// Completes the work of every stream of one device (what cudaDeviceSynchronize waits for).
  void finish_device(int device)
  {
    for (auto& s : streams_)
      if (s.device == device) s.completed = s.enqueued;
  }

  /// Stream capture (cudaStreamBeginCapture / cudaStreamEndCapture): while a stream captures, recording an
  /// event on it, and any host wait on a stream or a device, is illegal_call. Each capture has an id (never
  /// reused) and a graph; end_capture returns the graph, which lives until destroy_graph and every executable
  /// graph instantiated from it is destroyed: then the callbacks attached to it run (CUDA user objects).
  /// `mode` is cudaStreamCaptureMode's value (0 global, 1 thread-local, 2 relaxed): see unsafe_call.
  std::uint64_t begin_capture(cuda::stream_ref stream, int mode = 0)
  {
    stream_state& s = streams_.at(id_of(stream));
    if (s.capturing) throw illegal_call("simulated_streams: begin_capture on a stream already capturing");
    const std::uint64_t graph = next_graph_++;
    graphs_[graph] = {};
    s.capturing = true;
    s.capture = {true, next_capture_++, reinterpret_cast<void*>(static_cast<std::uintptr_t>(graph))};
    s.capture_mode = mode;
    return s.capture.id;
  }
  /// Joins `stream` to the capture of `capturing` (what an event recorded there and waited for here does).
  void join_capture(cuda::stream_ref stream, cuda::stream_ref capturing)
  {
    const std::uint64_t from_id = id_of(capturing), id = id_of(stream);  // ids first: a new stream moves the states
    const stream_state& from = streams_.at(from_id);
    stream_state& s = streams_.at(id);
    s.capturing = true;
    s.capture = from.capture;
    s.capture_mode = from.capture_mode;
  }
  /// Ends the capture on `stream` (and on the streams joined to it); returns its graph.
  void* end_capture(cuda::stream_ref stream)
  {
    stream_state& origin = streams_.at(id_of(stream));
    if (!origin.capturing) throw illegal_call("simulated_streams: end_capture on a stream not capturing");
    const capture_info ended = origin.capture;
    for (auto& s : streams_)
      if (s.capturing && s.capture.id == ended.id) {
        s.capturing = false;
        s.capture = {};
      }
    return ended.graph;
  }
  bool capturing(cuda::stream_ref stream) const { return streams_.at(id_of(stream)).capturing; }
  /// The layer asking whether a stream is being captured (counted: a driver call each on a real GPU).
  bool query_capture(cuda::stream_ref stream) const
  {
    ++capture_queries_;
    return streams_.at(legacy_handle(stream) ? legacy_id : id_of(stream)).capturing;
  }
  std::uint64_t capture_queries() const noexcept { return capture_queries_; }
  /// The layer asking a stream's id (counted: a driver call each on a real GPU). Illegal on a capturing stream:
  /// cuStreamGetId refuses it and invalidates the capture.
  std::uint64_t query_id(cuda::stream_ref stream) const
  {
    ++id_queries_;
    const std::uint64_t id = id_of(stream);
    if (streams_.at(id).capturing) throw illegal_call("simulated_streams: the id of a capturing stream was asked");
    return id;
  }
  /// The capture query, then, for a stream not capturing, its id (id 0, not asked, for a capturing one):
  /// counted as the two driver calls they are on a real GPU.
  stream_query query_capture_then_id(cuda::stream_ref stream) const
  {
    ++capture_queries_;
    const std::uint64_t id = legacy_handle(stream) ? legacy_id : id_of(stream);  // the legacy stream inline
    if (streams_.at(id).capturing) return {true, 0};
    ++id_queries_;
    return {false, id};
  }
  std::uint64_t id_queries() const noexcept { return id_queries_; }
  capture_info capture_of(cuda::stream_ref stream) const { return streams_.at(id_of(stream)).capture; }

  /// cudaGraphInstantiate: the executable graph holds the graph's user objects too.
  std::uint64_t instantiate(void* graph)
  {
    graph_state& g = graph_at(graph);
    ++g.holders;
    const std::uint64_t exec = next_graph_++;
    execs_[exec] = graph_id(graph);
    return exec;
  }
  /// cudaGraphLaunch: one piece of work on the stream (nothing is allocated at replay).
  std::uint64_t launch_graph(std::uint64_t exec, cuda::stream_ref stream)
  {
    if (!execs_.contains(exec)) throw std::invalid_argument("simulated_streams: launch of an unknown executable graph");
    ++replays_;
    return launch(stream);
  }
  void destroy_exec(std::uint64_t exec)
  {
    const auto it = execs_.find(exec);
    if (it == execs_.end()) throw std::invalid_argument("simulated_streams: destroy of an unknown executable graph");
    const std::uint64_t graph = it->second;
    execs_.erase(it);
    drop_holder(graph);
  }
  void destroy_graph(void* graph)
  {
    graph_state& g = graph_at(graph);
    if (g.destroyed) throw std::invalid_argument("simulated_streams: graph destroyed twice");
    g.destroyed = true;
    drop_holder(graph_id(graph));
  }
  std::uint64_t replays() const noexcept { return replays_; }

  /// cudaUserObjectCreate + cudaGraphRetainUserObject(..., cudaGraphUserObjectMove). fail_user_objects(true)
  /// makes it fail, calling nothing, as a failing driver would.
  void call_when_graph_destroyed(void* graph, graph_release_fn fn, void* arg)
  {
    if (fail_user_objects_) throw std::runtime_error("simulated_streams: cudaUserObjectCreate failed (injected)");
    graph_at(graph).callbacks.emplace_back(fn, arg);
  }
  void fail_user_objects(bool fail) noexcept { fail_user_objects_ = fail; }
  /// User objects attached to a live graph (each releases once: two for one pool would release it twice).
  std::size_t user_objects(void* graph) { return graph_at(graph).callbacks.size(); }
  std::size_t live_graphs() const noexcept { return graphs_.size(); }

  /// The calling thread's capture interaction mode (cudaThreadExchangeStreamCaptureMode).
  int exchange_capture_mode(int mode) noexcept
  {
    ++mode_exchanges_;
    return std::exchange(thread_mode_, mode);
  }
  std::size_t mode_exchanges() const noexcept { return mode_exchanges_; }
  /// A call capture calls "potentially unsafe" (cudaMalloc, cuMemCreate): illegal_call while a stream captures
  /// in global mode, or this thread's own capture in thread-local mode, unless the thread's mode is relaxed.
  /// Sources used under capture in the tests call it where the real ones would call CUDA.
  void unsafe_call(const char* call) const
  {
    if (thread_mode_ == 2) return;
    for (const auto& s : streams_)
      if (s.capturing && s.capture_mode != 2)
        throw illegal_call(std::string("simulated_streams: ") + call + " while a stream captures (capture mode " +
                           std::to_string(s.capture_mode) + ", thread mode " + std::to_string(thread_mode_) + ")");
  }
  int device_of(cuda::stream_ref stream) const { return streams_.at(id_of(stream)).device; }
  /// The calling thread's current device (cudaSetDevice): where make_event() makes events.
  void set_current_device(int device) noexcept { current_device_ = device; }
  /// Device-wide waits per device, in the order asked.
  const std::vector<int>& device_waits() const noexcept { return device_waits_; }

  std::uint64_t enqueued(std::uint64_t id) const { return streams_.at(id).enqueued; }
  std::uint64_t completed(std::uint64_t id) const { return streams_.at(id).completed; }
  /// The highest ticket of `other` that stream `id` has been made to wait for (0: none).
  std::uint64_t ordered_after(std::uint64_t id, std::uint64_t other) const
  {
    const auto& waits = streams_.at(id).waits_for;
    const auto it = waits.find(other);
    return it == waits.end() ? 0 : it->second;
  }

  const call_counts& calls() const noexcept { return calls_; }
  std::size_t live_events() const noexcept { return events_.size() - free_events_.size(); }

  // The backend's half.
  std::size_t make_event()
  {
    if (!free_events_.empty()) {
      const std::size_t e = free_events_.back();
      free_events_.pop_back();
      events_[e] = {};
      events_[e].device = current_device_;
      return e;
    }
    events_.push_back({});
    events_.back().device = current_device_;
    return events_.size() - 1;
  }
  std::size_t make_event_on(int device)
  {
    const std::size_t e = make_event();
    events_[e].device = device;
    return e;
  }
  void destroy_event(std::size_t e) noexcept { free_events_.push_back(e); }
  /// As cudaEventRecord: an event of one device never on another's stream. On a capturing stream it is
  /// legal, as in CUDA: captured as a graph node (counted in captured_records()); the event then marks no
  /// point of any stream, and querying, waiting for or ordering an uncaptured stream after it is illegal_call
  /// (cudaErrorStreamCaptureUnsupported / Isolation in CUDA) until it is recorded again outside capture.
  void record(std::size_t e, cuda::stream_ref stream)
  {
    ++calls_.records;
    const std::uint64_t id = id_of(stream);
    event_state& ev = events_.at(e);
    if (ev.device != streams_.at(id).device)
      throw illegal_call("simulated_streams: an event of device " + std::to_string(ev.device) +
                         " recorded on a stream of device " + std::to_string(streams_.at(id).device));
    if (streams_.at(id).capturing) {
      ++captured_records_;
      ev = {id, 0, false, ev.device, true};
      return;
    }
    ev = {id, streams_.at(id).enqueued, true, ev.device};
  }
  /// Events recorded on a capturing stream (legal; stream_ordered never does it: its tests check 0).
  std::size_t captured_records() const noexcept { return captured_records_; }
  bool done(std::size_t e)
  {
    ++calls_.queries;
    const event_state& ev = events_.at(e);
    refuse_captured(ev, "cudaEventQuery");
    return !ev.recorded || streams_.at(ev.stream).completed >= ev.ticket;
  }
  /// From now on every host wait fails, as after a sticky CUDA error (a kernel fault): the GPU's state is
  /// unknown, so nothing it may still be using may be handed out.
  void fail_host_waits(bool fail) noexcept { fail_waits_ = fail; }

  void wait_host(std::size_t e)
  {
    refuse_under_capture("cudaEventSynchronize");
    ++calls_.host_waits;
    const event_state& ev = events_.at(e);
    refuse_captured(ev, "cudaEventSynchronize");
    if (ev.recorded) complete_to(ev.stream, ev.ticket);
  }
  void order_after(cuda::stream_ref stream, std::size_t e)
  {
    ++calls_.orderings;
    const event_state& ev = events_.at(e);
    if (ev.captured && !streams_.at(id_of(stream)).capturing) refuse_captured(ev, "cudaStreamWaitEvent");
    if (!ev.recorded) return;
    std::uint64_t& ticket = streams_.at(id_of(stream)).waits_for[ev.stream];
    ticket = std::max(ticket, ev.ticket);
  }
  void wait_stream(cuda::stream_ref stream)
  {
    refuse_under_capture("cudaStreamSynchronize");
    ++calls_.stream_waits;
    finish(stream);
  }
  void wait_device(int device)
  {
    refuse_under_capture("cudaDeviceSynchronize");
    ++calls_.device_waits;
    device_waits_.push_back(device);
    finish_device(device);
  }

private:
  struct stream_state {
    std::uint64_t enqueued = 0, completed = 0;
    std::map<std::uint64_t, std::uint64_t> waits_for;
    int device = 0;
    bool capturing = false;
    capture_info capture;
    int capture_mode = 0;
  };

  struct graph_state {
    std::size_t holders = 1;  ///< the graph itself, then each executable graph
    bool destroyed = false;
    std::vector<std::pair<graph_release_fn, void*>> callbacks;
  };

  static std::uint64_t graph_id(void* graph) noexcept { return reinterpret_cast<std::uintptr_t>(graph); }
  graph_state& graph_at(void* graph)
  {
    const auto it = graphs_.find(graph_id(graph));
    if (it == graphs_.end()) throw std::invalid_argument("simulated_streams: unknown graph");
    return it->second;
  }
  void drop_holder(std::uint64_t graph)
  {
    graph_state& g = graphs_.at(graph);
    if (--g.holders > 0) return;
    const auto callbacks = std::move(g.callbacks);
    graphs_.erase(graph);
    for (const auto& [fn, arg] : callbacks) fn(arg);  // CUDA runs them on its own thread, later; here, now
  }

  static bool legacy_handle(cuda::stream_ref stream) noexcept
  {
    return stream.get() == nullptr || stream.get() == cudaStreamLegacy;
  }

  [[noreturn, gnu::noinline]] void refuse_handle(std::uintptr_t handle) const
  {
    if (std::find(free_handles_.begin(), free_handles_.end(), handle) != free_handles_.end()) {
      ++dead_stream_queries_;  // counted: the layer may swallow the exception, a test must not
      throw illegal_call("simulated_streams: a destroyed stream was asked about (undefined in CUDA: it crashes)");
    }
    throw std::invalid_argument("simulated_streams: stream handle " + std::to_string(handle) + " is not a live stream");
  }

  static void refuse_captured(const event_state& ev, const char* call)
  {
    if (ev.captured)
      throw illegal_call(std::string("simulated_streams: ") + call + " of an event last recorded under capture");
  }

  void refuse_under_capture(const char* call) const
  {
    if (fail_waits_) throw std::runtime_error(std::string("simulated_streams: ") + call + " failed (sticky error)");
    for (const auto& s : streams_)
      if (s.capturing) throw illegal_call(std::string("simulated_streams: ") + call + " while a stream captures");
  }
  static constexpr std::uint64_t legacy_id = 0, per_thread_id = 1;

  void complete_to(std::uint64_t id, std::uint64_t ticket)
  {
    stream_state& s = streams_.at(id);
    s.completed = std::max(s.completed, std::min(ticket, s.enqueued));
  }

  /// Each host thread's per-thread default stream is a stream of its own, made on first use.
  std::uint64_t per_thread_stream_of(std::thread::id thread) const
  {
    const auto [it, fresh] = per_thread_ids_.emplace(thread, 0);
    if (fresh) it->second = new_stream();
    return it->second;
  }

  /// A new stream's state; its id is its index (ids are dense and never reused).
  std::uint64_t new_stream() const
  {
    streams_.emplace_back();
    return next_id_++;
  }

  /// By id. A new stream (create, or a thread's first use of its default stream, inside id_of) may move the
  /// others' states: a reference to one is taken only once every id the call needs is known.
  mutable std::vector<stream_state> streams_;
  mutable std::map<std::thread::id, std::uint64_t> per_thread_ids_;
  bool fail_waits_ = false;
  std::map<std::uintptr_t, std::uint64_t> handles_;
  std::vector<std::uintptr_t> free_handles_;
  std::uintptr_t next_handle_ = 0x10000;
  mutable std::uint64_t next_id_ = 2;
  std::vector<event_state> events_;
  std::vector<std::size_t> free_events_;
  std::vector<int> device_waits_;
  call_counts calls_;
  std::map<std::uint64_t, graph_state> graphs_;
  std::map<std::uint64_t, std::uint64_t> execs_;  ///< executable graph -> its graph
  std::uint64_t next_graph_ = 0x1000;
  std::uint64_t next_capture_ = 1;
  std::uint64_t replays_ = 0;
  int thread_mode_ = 0;
  int current_device_ = 0;
  bool fail_user_objects_ = false;
  mutable std::size_t dead_stream_queries_ = 0;
  mutable std::uint64_t capture_queries_ = 0;
  mutable std::uint64_t id_queries_ = 0;
  std::size_t captured_records_ = 0;
  std::size_t mode_exchanges_ = 0;
};

/// The event_backend over a simulated_streams world (held by pointer: the world outlives the pools using it).
class simulated_events {
public:
  using event = std::size_t;

  explicit simulated_events(simulated_streams& world) noexcept : world_(&world) {}

  /// As the driver: asking a capturing stream for its id is illegal (and would invalidate the capture).
  std::uint64_t id_of(cuda::stream_ref stream) const { return world_->query_id(stream); }
  event make_event() { return world_->make_event(); }
  event make_event_on(int device) { return world_->make_event_on(device); }
  void destroy_event(event e) const noexcept { world_->destroy_event(e); }
  void record(event e, cuda::stream_ref stream) { world_->record(e, stream); }
  /// The legacy default stream, as with cuda_events (the simulated world's legacy stream runs on device 0).
  bool permanent(cuda::stream_ref stream) const noexcept
  {
    return stream.get() == nullptr || stream.get() == simulated_streams::legacy().get();
  }
  void record_on(event e, cuda::stream_ref stream, int device)
  {
    if (device != world_->device_of(stream))
      throw simulated_streams::illegal_call("simulated_streams: record_on named device " + std::to_string(device) +
                                            " for a stream of device " + std::to_string(world_->device_of(stream)));
    world_->record(e, stream);
  }
  bool done(event e) { return world_->done(e); }
  void wait_host(event e) { world_->wait_host(e); }
  void order_after(cuda::stream_ref stream, event e) { world_->order_after(stream, e); }
  void wait_stream(cuda::stream_ref stream) { world_->wait_stream(stream); }
  void wait_device(int device) { world_->wait_device(device); }
  int device_of(cuda::stream_ref stream) const { return world_->device_of(stream); }
  bool capturing(cuda::stream_ref stream) const { return world_->query_capture(stream); }
  /// Both of a call's questions in one: the capture query first, as the driver requires.
  stream_query capture_then_id(cuda::stream_ref stream) const { return world_->query_capture_then_id(stream); }
  capture_info capture_of(cuda::stream_ref stream) const { return world_->capture_of(stream); }
  void call_when_graph_destroyed(void* graph, graph_release_fn fn, void* arg) { world_->call_when_graph_destroyed(graph, fn, arg); }
  int exchange_capture_mode(int mode) noexcept { return world_->exchange_capture_mode(mode); }

private:
  simulated_streams* world_;
};

static_assert(event_backend<simulated_events> && graph_backend<simulated_events> && permanent_stream_backend<simulated_events> &&
              capture_then_id_backend<simulated_events>);

} // namespace strata
