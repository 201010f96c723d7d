#pragma once
// The events stream_ordered records after freed blocks: a queue of pending events per stream, and the
// completed events kept for reuse, so that a steady loop records into events it made long ago.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace strata::detail {

/// An event recorded after a stream's frees: frees numbered below `covers_below` happened before it.
template <class Event>
struct pending_event {
  Event e;
  std::uint64_t covers_below;
  int device = 0;  ///< the event's device: its stream's (cudaEventRecord requires it)
};

/// Every event stream_ordered made, pending (in the streams' queues, or the owner's queue kept here) or
/// spare (kept here for reuse).
/// Retiring an event never allocates: recording reserves room for every event there is. Models nothing;
/// recording is one backend record (and, with no spare of the device, one event made); retiring is O(1).
/// A move hands every event over and leaves the ledger empty.
template <class Event>
class event_ledger {
public:
  using queue = std::deque<pending_event<Event>>;

  event_ledger() = default;
  event_ledger(event_ledger&& other) noexcept
      : owner_events_(std::move(other.owner_events_)), spares_(std::move(other.spares_)), pending_(std::exchange(other.pending_, 0))
  {
    other.owner_events_.clear();
    other.spares_.clear();
  }
  event_ledger& operator=(event_ledger&& other) noexcept
  {
    if (this != &other) {
      owner_events_ = std::move(other.owner_events_);
      other.owner_events_.clear();
      spares_ = std::move(other.spares_);
      other.spares_.clear();
      pending_ = std::exchange(other.pending_, 0);
    }
    return *this;
  }
  event_ledger(const event_ledger&) = delete;
  event_ledger& operator=(const event_ledger&) = delete;
  ~event_ledger() = default;

  /// Records an event of `device` into `events` with `record(e)` (the backend call), covering what is
  /// numbered below `covers_below`. Strong guarantee: an event made or taken here goes back to the spares.
  template <class Backend, class Record>
  void record_into(queue& events, Backend& backend, int device, std::uint64_t covers_below, Record&& record)
  {
    spares_.reserve(spares_.size() + pending_ + 1);
    const Event e = spare_of(backend, device);
    try {
      record(e);
      events.push_back({e, covers_below, device});
    } catch (...) {
      spares_.push_back({e, covers_below, device});
      throw;
    }
    ++pending_;
  }

  /// The oldest event of `events` is done with: it becomes a spare.
  void retire_front(queue& events) noexcept
  {
    spares_.push_back(events.front());  // capacity reserved in record_into
    events.pop_front();
    --pending_;
  }

  /// Destroys the events of a stream's queue (the queue is the caller's to clear).
  template <class Backend>
  static void destroy(Backend& backend, const queue& events) noexcept
  {
    for (const auto& pe : events) backend.destroy_event(pe.e);
  }
  /// Destroys the owner's events and the spares, and forgets every pending event.
  template <class Backend>
  void destroy_own(Backend& backend) noexcept
  {
    destroy(backend, owner_events_);
    for (const auto& sp : spares_) backend.destroy_event(sp.e);
    owner_events_.clear();
    spares_.clear();
    pending_ = 0;
  }

  /// The owner's events, after its frees into the policy, oldest first.
  queue& owner_events() noexcept { return owner_events_; }
  const queue& owner_events() const noexcept { return owner_events_; }

  /// Events recorded and not yet retired.
  std::size_t pending() const noexcept { return pending_; }
  bool empty() const noexcept { return spares_.empty() && owner_events_.empty(); }

private:
  /// A spare event of `device` (the newest such), or a new one made there: an event must belong to the
  /// device of the stream it is recorded on, whichever device is current. Backends without make_event_on
  /// make it on the current device.
  template <class Backend>
  Event spare_of(Backend& backend, int device)
  {
    for (std::size_t i = spares_.size(); i-- > 0;)
      if (spares_[i].device == device) {
        const Event e = spares_[i].e;
        spares_[i] = spares_.back();
        spares_.pop_back();
        return e;
      }
    if constexpr (requires { backend.make_event_on(device); }) return backend.make_event_on(device);
    else return backend.make_event();
  }

  queue owner_events_;
  std::vector<pending_event<Event>> spares_;  ///< covers_below unused
  std::size_t pending_ = 0;
};

} // namespace strata::detail
