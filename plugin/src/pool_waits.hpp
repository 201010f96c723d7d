#pragma once
// The events an unsettled parked block of a private pool waits on (block_table.hpp's Note on stream-ordered
// reuse): recorded on the streams the block was used on, at its free; the block is settled once all completed.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <strata/stream/cuda_events.hpp>

#include "free_events.hpp"

namespace strata::plugin {

/// One device's waits of parked pool blocks on their recorded streams. Models: the end-of-life events of
/// PyTorch's caching allocator for blocks with stream uses. Backend: cuda_events or simulated_events (host
/// tests). Unsynchronized: the torch backend calls it under the device's lock. Cost: hold records an event
/// per recorded stream (events are made once and reused); reap queries the events of every waiting block
/// (never waits); drain waits on the host. The events are the device's (made with make_event_on).
template <event_backend Backend>
class pool_waits {
public:
  using event = typename Backend::event;

  explicit pool_waits(int device = 0) noexcept : events_(device) {}

  /// Starts the wait of the parked block (address, ticket) on `streams`: true while it waits (settle comes
  /// from reap or drain); false when it may be settled now (no stream given, or an event could not be
  /// recorded and the streams were waited for on the host instead). If even the host wait fails, the block
  /// is abandoned: true, and it is never settled (its recorded work may still be running).
  bool hold(Backend& b, std::uintptr_t address, std::uint64_t ticket, const std::vector<void*>& streams) noexcept
  {
    if (streams.empty()) return false;
    waiting w{address, ticket, {}};
    switch (events_.record_on(b, streams, w.events, [this] { waiting_.reserve(waiting_.size() + 1); })) {
    case outcome::recorded:
      waiting_.push_back(std::move(w));  // reserved
      return true;
    case outcome::abandoned:
      ++abandoned_;
      return true;
    case outcome::waited:
      break;
    }
    return false;
  }

  /// settle(address, ticket) for every waiting block whose events have all completed. Never waits.
  template <class Settle>
  void reap(Backend& b, Settle&& settle) noexcept
  {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      const bool done = std::all_of(it->events.begin(), it->events.end(), [&b](event e) noexcept {
        try {
          return b.done(e);
        } catch (...) {
          return false;  // a failed query: it keeps waiting; drain's host wait reports the error
        }
      });
      if (!done) {
        ++it;
        continue;
      }
      finish(b, *it, settle);
      it = waiting_.erase(it);
    }
  }

  /// Host-waits for every waiting block's events and settles them all. A failed wait throws the backend's
  /// error; the blocks not yet settled keep waiting.
  template <class Settle>
  void drain(Backend& b, Settle&& settle)
  {
    while (!waiting_.empty()) {
      for (event e : waiting_.front().events) b.wait_host(e);
      finish(b, waiting_.front(), settle);
      waiting_.erase(waiting_.begin());
    }
  }

  std::size_t waiting_blocks() const noexcept { return waiting_.size(); }
  std::size_t abandoned_blocks() const noexcept { return abandoned_; }
  std::size_t spare_events() const noexcept { return events_.spare(); }

  /// Events are the backend's: give them back before the backend goes.
  void destroy(Backend& b) noexcept
  {
    for (waiting& w : waiting_)
      for (event e : w.events) b.destroy_event(e);
    waiting_.clear();
    events_.destroy(b);
  }

private:
  struct waiting {
    std::uintptr_t address;
    std::uint64_t ticket;
    std::vector<event> events;
  };

  template <class Settle>
  void finish(Backend& b, waiting& w, Settle& settle) noexcept
  {
    events_.recycle(b, w.events);
    settle(w.address, w.ticket);
  }

  using outcome = typename free_events<Backend>::outcome;

  free_events<Backend> events_;
  std::vector<waiting> waiting_;
  std::size_t abandoned_ = 0;
};

} // namespace strata::plugin
