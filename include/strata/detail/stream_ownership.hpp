#pragma once
// Which stream owns stream_ordered's policy: the owner's frees go straight back to the policy, numbered, and
// are covered by events (or, for a permanent owner, by one event made when another stream needs them), so
// that another stream takes from the policy only after the owner's frees there are complete.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <strata/core/config.hpp>
#include <strata/detail/event_ledger.hpp>
#include <strata/detail/stream_cache.hpp>
#include <strata/stream/cuda_events.hpp>

namespace strata::detail {

/// The owner's side: its frees go straight to the policy, numbered, and are known complete up to a number.
template <class Event>
struct owner_books {
  stream_free_lists<Event>* owner = nullptr;
  bool shared = false;  ///< a second stream has used the layer
  std::size_t frees_unneeded = 0;  ///< owner frees since another stream last needed them (owner_cover_window)
  std::uint64_t policy_seq = 0;    ///< the owner's frees into the policy, numbered (across owners)
  std::uint64_t safe_seq = 0;      ///< policy frees numbered up to this are known complete
};

/// stream_ordered's ownership of its policy (a base of the layer, which keeps the books in its members'
/// `own`): who owns it, handing it over, and making the owner's policy frees safe for another stream.
/// Models nothing; holds nothing. Cost: an event record per owner free while another stream shares the
/// layer (none for a permanent owner); making the policy safe for another stream is one event query and one
/// cudaStreamWaitEvent, or a host wait for a synchronous allocate.
template <class Layer, class Backend>
class stream_ownership {
protected:
  using event = typename Backend::event;
  using stream_state = stream_free_lists<event>;
  using node = cached_block;
  using pending_event = detail::pending_event<event>;

  bool policy_clean() const noexcept { return m().own.safe_seq >= m().own.policy_seq; }

  /// Whether the owner's frees get their event from the stream that needs them, when it needs them, instead
  /// of one per free: the owner's handle must outlive every call (a permanent stream: the legacy default
  /// stream), and no capture may be under way (an event recorded on the legacy stream joins a blocking
  /// stream's capture; while one may go on, frees carry their events as for any owner).
  bool covers_owner_on_demand() const noexcept
  {
    return m().own.owner != nullptr && permanent(m().own.owner->handle) && !l().capture_possible();
  }

  /// s's frees go straight to the policy from now on, and what s has cached goes there now: every
  /// block is safe for s itself. Only while the policy holds no other stream's unfinished frees.
  void become_owner(stream_state& s, cuda::stream_ref stream) noexcept
  {
    m().own.owner = &s;
    while (!s.events.empty()) l().retire_front(s.events);
    flush_owner_cache();
    if (m().own.shared && !policy_clean() && !covers_owner_on_demand()) cover_owner(stream);  // the flushed blocks, for the other streams
  }

  /// Ownership moves to t when the owner's frees are all known complete and t has been freeing more.
  void weigh_ownership(stream_state& t, cuda::stream_ref stream) noexcept
  {
    auto& own = m().own;
    if (own.owner == &t) return;
    if (own.owner == nullptr || t.recent_frees > own.owner->recent_frees) {
      if (own.owner != nullptr) own.owner->recent_frees = 0;
      t.recent_frees = 0;
      become_owner(t, stream);
    } else {
      own.owner->recent_frees = 0;
      t.recent_frees = 0;
    }
  }

  /// Once another stream shares the layer, every owner free records an event after itself, on the owner's
  /// stream while it is known alive (this call): so another stream never has to touch the owner's handle,
  /// which may belong to a stream destroyed since. A failed record leaves the free uncovered; a taker then
  /// waits device-wide (owner_event). Not for a permanent owner (covers_owner_on_demand).
  void cover_owner(cuda::stream_ref stream) noexcept
  {
    try {
      l().record_into(m().ledger.owner_events(), stream, m().own.policy_seq, m().own.owner->device);
    } catch (...) {
    }
  }

  /// Makes whatever the policy hands out next safe for stream t: the owner's frees not yet known complete are
  /// waited for, on the GPU (t waits for an event on the owner) or, for the host, on the host.
  void make_policy_safe_for(stream_state& t, cuda::stream_ref stream, bool for_host)
  {
    auto& m_ = m();
    if (!policy_clean() && (for_host || (&t != m_.own.owner && t.ordered_after < m_.own.policy_seq))) {
      m_.own.frees_unneeded = 0;  // the owner's frees were needed: they carry events again (owner_cover_window)
      reap_owner();
      if (!policy_clean()) {
        if (const pending_event* e = owner_event()) {
          if (!l().event_done(e->e)) {
            if (!for_host) {
              m_.backend.order_after(stream, e->e);
              ++m_.stats.orderings;
              t.ordered_after = e->covers_below;
              return;
            }
            l().refuse_host_wait_under_capture();
            l().count_wait(m_.stats.event_syncs);
            m_.backend.wait_host(e->e);
          }
          // Ownership passes only when the policy is clean, so an event on the owner after its last policy
          // free covers every policy free before it.
          mark_safe(e->covers_below);
        }
      }
    }
    if (!for_host && policy_clean()) weigh_ownership(t, stream);
  }

  void mark_safe(std::uint64_t seq) noexcept
  {
    auto& m_ = m();
    m_.own.safe_seq = std::max(m_.own.safe_seq, seq);
    while (!m_.ledger.owner_events().empty() && m_.ledger.owner_events().front().covers_below <= m_.own.safe_seq)
      l().retire_front(m_.ledger.owner_events());
  }

  /// The owner's completed events: its policy frees they cover are safe for everyone.
  void reap_owner()
  {
    auto& events = m().ledger.owner_events();
    while (!events.empty() && l().event_done(events.front().e)) mark_safe(events.front().covers_below);
  }

  /// Records e on `stream` from a call on another stream, on `device` (only for a permanent stream, which a
  /// backend without the capability never has).
  void record_on(event e, cuda::stream_ref stream, int device)
  {
    if constexpr (permanent_stream_backend<Backend>) m().backend.record_on(e, stream, device);
    else m().backend.record(e, stream);
  }

private:
  Layer& l() noexcept { return static_cast<Layer&>(*this); }
  const Layer& l() const noexcept { return static_cast<const Layer&>(*this); }
  auto& m() noexcept { return l().m_; }
  const auto& m() const noexcept { return l().m_; }

  bool permanent(cuda::stream_ref stream) const noexcept
  {
    if constexpr (permanent_stream_backend<Backend>) return m().backend.permanent(stream);
    else return false;
  }

  /// The owner's cached blocks go to the policy (where they merge), as the owner's unfinished frees.
  void flush_owner_cache() noexcept
  {
    stream_state& s = *m().own.owner;
    while (s.oldest != nullptr) {
      node* n = s.oldest;
      s.remove(n);
      l().give_back(n);
      ++m().own.policy_seq;
    }
    s.covered_seq = s.next_seq;
    s.uncovered_blocks = s.uncovered_bytes = s.blocks_at_cover = s.bytes_at_cover = 0;
  }

  /// An event after all the owner's policy frees, or null when some have none (made before another stream
  /// shared the layer, or a record failed): then every device was waited for and the policy is clean.
  const pending_event* owner_event()
  {
    auto& m_ = m();
    if (!m_.ledger.owner_events().empty() && m_.ledger.owner_events().back().covers_below >= m_.own.policy_seq)
      return &m_.ledger.owner_events().back();
    if (covers_owner_on_demand()) {
      try {
        l().record_into(m_.ledger.owner_events(), m_.own.owner->handle, m_.own.policy_seq, m_.own.owner->device,
                        /*on_its_device=*/true);
        return &m_.ledger.owner_events().back();
      } catch (...) {
        // Not recorded: wait for the devices instead, as for frees made before the layer was shared.
      }
    }
    l().refuse_host_wait_under_capture();
    l().wait_all_devices();
    mark_safe(m_.own.policy_seq);
    return nullptr;
  }
};

} // namespace strata::detail
