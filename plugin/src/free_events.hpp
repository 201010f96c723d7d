#pragma once
// The events a freed block waits on: recorded at its free on the streams that used it, and made once and reused.
// recorded_uses (record_stream) and pool_waits (a private pool's parked blocks) both hold blocks behind them.
#include <cstddef>
#include <vector>

#include <strata/stream/cuda_events.hpp>

namespace strata::plugin {

/// Records the events a freed block waits on, from a stock of spare events. Models: the end-of-life events
/// of PyTorch's caching allocator, which it pools too. Backend: cuda_events or simulated_events (host tests).
/// Unsynchronized: its owner is called under the device's lock. Cost: an event record per stream (an event
/// made only when no spare is left); the fallback a host wait per stream.
template <event_backend Backend>
class free_events {
public:
  using event = typename Backend::event;

  /// How record_on ended.
  enum class outcome {
    recorded,  ///< an event on every stream: the block waits for them
    waited,    ///< an event could not be recorded: the streams were waited for on the host, the block is free
    abandoned  ///< not even the host wait succeeded: the block must never be reused (its work may still run)
  };

  /// Events are made on `device` (make_event_on), or on the current device when it is negative (make_event).
  explicit free_events(int device = -1) noexcept : device_(device) {}

  /// An event recorded on each of `streams` (handles, or pointers to them), in order, into `events`.
  /// `prepare` runs first, before any event exists: it makes room for whatever must not fail once they do.
  /// On any failure the events made go back to the stock and the streams are waited for on the host instead.
  template <class Streams, class Prepare>
  outcome record_on(Backend& b, const Streams& streams, std::vector<event>& events, Prepare&& prepare) noexcept
  {
    try {
      events.reserve(streams.size());
      prepare();
      for (const auto& s : streams) {
        const event e = take(b);
        try {
          b.record(e, cuda::stream_ref{static_cast<cudaStream_t>(s)});
        } catch (...) {
          recycle(b, e);
          throw;
        }
        events.push_back(e);  // reserved
      }
      return outcome::recorded;
    } catch (...) {
      recycle(b, events);
    }
    try {
      for (const auto& s : streams) b.wait_stream(cuda::stream_ref{static_cast<cudaStream_t>(s)});
    } catch (...) {
      return outcome::abandoned;
    }
    return outcome::waited;
  }

  /// Puts `e` back in the stock (destroyed where there is no room to keep it: made again next time).
  void recycle(Backend& b, event e) noexcept
  {
    try {
      spare_.push_back(e);
    } catch (...) {
      b.destroy_event(e);
    }
  }
  /// Puts every event of `events` back, leaving it empty.
  void recycle(Backend& b, std::vector<event>& events) noexcept
  {
    for (event e : events) recycle(b, e);
    events.clear();
  }

  /// Events kept for the next records.
  std::size_t spare() const noexcept { return spare_.size(); }

  /// Events are the backend's: give the stock back before the backend goes.
  void destroy(Backend& b) noexcept
  {
    for (event e : spare_) b.destroy_event(e);
    spare_.clear();
  }

private:
  event take(Backend& b)
  {
    if (spare_.empty()) return device_ < 0 ? b.make_event() : b.make_event_on(device_);
    const event e = spare_.back();
    spare_.pop_back();
    return e;
  }

  int device_;
  std::vector<event> spare_;
};

} // namespace strata::plugin
