#pragma once
// PyTorch's record_stream for the plug-in: a block used on streams other than the one it was allocated on
// is not handed out again before that work is done.
#include <algorithm>
#include <array>
#include <cstddef>
#include <unordered_map>
#include <utility>
#include <vector>

#include <strata/stream/cuda_events.hpp>

#include "free_events.hpp"

namespace strata::plugin {

/// Remembers, per block, the streams it was recorded on (besides its allocation stream); at the block's
/// free, records an event on each of them and holds the block until every event has completed, then hands
/// it to the stack on its allocation stream (where stream order covers that stream's own work). This is
/// what PyTorch's caching allocator does for record_stream, and it adds no dependency between the user's
/// streams (making the allocation stream wait for the others would serialize compute and communication).
/// Held blocks are polled by `reap`, which the plug-in calls on every allocation, oldest first and stream by
/// stream as PyTorch's caching allocator does: events on one stream complete in the order they were recorded,
/// so once a stream's event is found pending, the blocks after it waiting on that stream are not asked about
/// (a reap costs an event query per stream with work pending, plus one per block given back, not one per block
/// held); `drain` host-waits for all of them (empty_cache, out of memory).
/// Under capture nothing is held: a free on a capturing stream is not held at all (false: the caller's
/// stream_ordered files it in the capture's private pool, which the graph keeps); a free on an uncaptured
/// stream of a block recorded on a capturing one abandons it (never reused: its use is in the graph, replayed
/// at every launch; an event there would be a node of the user's graph that can never be queried, and a host
/// wait is illegal during capture). If an event cannot be recorded (a CUDA error), the free waits on the host
/// for each recorded stream instead; if even that fails, the block is abandoned (never reused), as
/// stream_ordered does. Events are made once and reused (spare_events). Backend: cuda_events or simulated_events (host tests). Unsynchronized: the
/// plug-in calls it under the device's lock. Cost: record O(recorded streams of the block), a free of an
/// unrecorded block one hash lookup (none while nothing is recorded), a held free an event record per
/// recorded stream.
template <event_backend Backend>
class recorded_uses {
public:
  using event = typename Backend::event;

  /// Notes that p is used on `stream`: its free must wait for that stream's work (unless `stream` is the one
  /// it is freed on, whose order covers it anyway).
  void record(void* p, cudaStream_t stream)
  {
    auto& streams = recorded_[p];
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  }

  bool recorded(const void* p) const noexcept { return !recorded_.empty() && recorded_.contains(const_cast<void*>(p)); }

  /// At p's free: when p was recorded on other streams, holds it behind events on them and returns true;
  /// else false (the caller frees it at once). When an event cannot be recorded, the recorded streams are
  /// waited for on the host and false is returned; when even that fails, the block is abandoned (true).
  bool hold(Backend& b, void* p, std::size_t bytes, cudaStream_t home) noexcept
  {
    if (recorded_.empty()) return false;
    const auto it = recorded_.find(p);
    if (it == recorded_.end()) return false;
    std::vector<cudaStream_t> streams = std::move(it->second);
    recorded_.erase(it);
    std::erase(streams, home);
    if (streams.empty()) return false;
    switch (capture_state(b, home, streams)) {
    case capture::home:
      return false;
    case capture::recorded:
      ++abandoned_;
      return true;
    case capture::none:
      break;
    }
    held h{p, bytes, home, {}, {}};
    switch (events_.record_on(b, streams, h.events, [this] { held_.reserve(held_.size() + 1); })) {
    case outcome::recorded:
      h.streams = std::move(streams);
      held_bytes_ += bytes;
      held_.push_back(std::move(h));  // reserved
      return true;
    case outcome::abandoned:
      ++abandoned_;
      return true;  // never handed out again: its recorded work may still be running
    case outcome::waited:
      break;  // no event: the slow safe way, a wait for every stream that used it
    }
    return false;
  }

  /// Gives back (free(p, bytes, home)) held blocks whose events have all completed, never asking about an
  /// event recorded on a stream after one of that stream's found pending (see the class comment); the rest
  /// wait for a later reap. Never waits.
  template <class Free>
  void reap(Backend& b, Free&& free) noexcept
  {
    if (held_.empty()) return;
    pending_streams pending;
    for (auto it = held_.begin(); it != held_.end();) {
      if (complete(b, *it, pending)) {
        give_back(b, *it, free);
        it = held_.erase(it);
      } else if (pending.full()) {
        return;  // too many streams to tell apart: the rest wait, which only delays their reuse
      } else {
        ++it;
      }
    }
  }

  /// Host-waits for every held block's events and gives them all back; a block whose wait fails stays held.
  template <class Free>
  void drain(Backend& b, Free&& free)
  {
    for (auto it = held_.begin(); it != held_.end();) {
      for (event e : it->events) b.wait_host(e);
      give_back(b, *it, free);
      it = held_.erase(it);
    }
  }

  /// p was freed without a recorded use being honoured (never happens through the plug-in's free).
  void forget(const void* p) noexcept { recorded_.erase(const_cast<void*>(p)); }

  std::size_t held_blocks() const noexcept { return held_.size(); }
  std::size_t held_bytes() const noexcept { return held_bytes_; }
  std::size_t abandoned_blocks() const noexcept { return abandoned_; }
  std::size_t recorded_blocks() const noexcept { return recorded_.size(); }

  /// Events are the backend's: give them back before the backend goes.
  void destroy(Backend& b) noexcept
  {
    for (held& h : held_)
      for (event e : h.events) b.destroy_event(e);
    held_.clear();
    events_.destroy(b);
  }

  /// Events kept for the next holds (each made once, then reused: PyTorch's allocator pools its events too).
  std::size_t spare_events() const noexcept { return events_.spare(); }

private:
  enum class capture { none, home, recorded };

  /// Whether the freeing stream, else one of the recorded streams, is being captured. The recorded streams
  /// are the user's (record_stream's contract keeps them alive until the free); one the driver cannot answer
  /// for counts as not capturing, and then fails the event record below like any CUDA error.
  static capture capture_state(Backend& b, cudaStream_t home, const std::vector<cudaStream_t>& streams) noexcept
  {
    const auto capturing = [&b](cudaStream_t s) noexcept {
      try {
        return b.capturing(cuda::stream_ref{s});
      } catch (...) {
        return false;
      }
    };
    if (capturing(home)) return capture::home;
    for (cudaStream_t s : streams)
      if (capturing(s)) return capture::recorded;
    return capture::none;
  }

  struct held {
    void* p;
    std::size_t bytes;
    cudaStream_t home;
    std::vector<event> events;
    std::vector<cudaStream_t> streams;  ///< events[i] was recorded on streams[i]
  };

  /// The streams one reap found an event pending on (a few: a fixed array, so reap never allocates).
  struct pending_streams {
    std::array<cudaStream_t, 8> streams{};
    std::size_t count = 0;
    bool contains(cudaStream_t s) const noexcept { return std::find(streams.begin(), streams.begin() + count, s) != streams.begin() + count; }
    bool full() const noexcept { return count == streams.size(); }
    void add(cudaStream_t s) noexcept
    {
      if (!full() && !contains(s)) streams[count++] = s;
    }
  };

  /// Whether h's events have all completed; not asked (false) where an earlier event on the same stream is
  /// pending. A pending or failed query marks its stream.
  bool complete(Backend& b, const held& h, pending_streams& pending) noexcept
  {
    for (std::size_t i = 0; i < h.events.size(); ++i)
      if (pending.contains(h.streams[i])) return false;
    bool done = true;
    for (std::size_t i = 0; i < h.events.size(); ++i) {
      bool this_done = false;
      try {
        this_done = b.done(h.events[i]);
      } catch (...) {  // a failed query: keep it held; drain's host wait reports the error
      }
      if (!this_done) {
        pending.add(h.streams[i]);
        done = false;
      }
    }
    return done;
  }

  template <class Free>
  void give_back(Backend& b, held& h, Free& free) noexcept
  {
    events_.recycle(b, h.events);
    held_bytes_ -= h.bytes;
    free(h.p, h.bytes, h.home);
  }

  using outcome = typename free_events<Backend>::outcome;

  std::unordered_map<void*, std::vector<cudaStream_t>> recorded_;
  std::vector<held> held_;
  free_events<Backend> events_;
  std::size_t held_bytes_ = 0;
  std::size_t abandoned_ = 0;
};

} // namespace strata::plugin
