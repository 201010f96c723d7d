#pragma once
// What stream_ordered does when a stream's own cache has no block of the shape asked: reap the blocks whose
// events completed, make the policy safe for the stream, hand a block over from another stream, wait for the
// pending frees, and grow the policy, in that order of cost.
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

#include <strata/core/concepts.hpp>
#include <strata/core/config.hpp>
#include <strata/core/errors.hpp>
#include <strata/detail/event_ledger.hpp>
#include <strata/detail/stream_cache.hpp>

namespace strata::detail {

/// stream_ordered's miss path (a base of the layer, which holds the state): reaping, hand-over between
/// streams, waiting for pending frees and growing the policy. Models nothing; holds nothing. Cost: an event
/// query per pending event, at most one event record and one cudaStreamWaitEvent per batch of frees, and the
/// policy's allocate; the host waits only for a synchronous allocate or when the policy is out of memory
/// with frees pending.
template <class Layer, class Policy, class Backend>
class miss_path {
protected:
  using event = typename Backend::event;
  using shape = block_shape;
  using node = cached_block;
  using stream_state = stream_free_lists<event>;
  using pending_event = detail::pending_event<event>;
  using event_queue = typename event_ledger<event>::queue;

  /// The stream's own safe blocks go back to the policy here, so they merge before the policy is asked;
  /// other streams' safe blocks, and set-aside synchronous frees, before the policy grows.
  void* allocate_on_miss(const shape& sh, cuda::stream_ref stream, stream_state& s, bool for_host, bool capture_checked)
  {
    auto& m_ = m();
    // The owner alone with the policy (one stream, nothing pending, nothing cached or set aside): nothing to
    // reap, wait for or hand back first, so the policy is asked at once, as it would be without this layer.
    // Inline, so that a loop on one stream pays no call; the rest is out of line.
    if (capture_checked && !for_host && &s == m_.own.owner && m_.ledger.pending() == 0 && m_.cache.blocks() == 0 &&
        m_.deferred.blocks.empty()) [[likely]] {
      ++m_.stats.misses;
      return grow_policy(sh);
    }
    return allocate_on_full_miss(sh, stream, s, for_host, capture_checked);
  }

  [[gnu::noinline]] void* allocate_on_full_miss(const shape& sh, cuda::stream_ref stream, stream_state& s, bool for_host, bool capture_checked)
  {
    auto& m_ = m();
    if (!capture_checked && l().checks_capture() && l().captures(stream)) l().refuse_capture("an allocation missed its stream's cache");
    ++m_.stats.misses;
    l().give_back_recent();  // the alignment was checked first (refuse_alignment_first): nothing is refused now  // before the policy is made safe for this stream: they are the owner's frees
    if (m_.ledger.pending() > 0) {  // other streams keep their blocks until the policy would grow (docs/architecture.md)
      l().reap_owner();
      reap(s);
      forget_empty_streams(s);
    }
    l().make_policy_safe_for(s, stream, for_host);
    if ((m_.cache.blocks() > 0 || !m_.deferred.blocks.empty()) && !policy_has_room(sh)) {
      cover(s, stream);
      reap_all(s);
      if (!m_.deferred.blocks.empty() && !policy_has_room(sh)) {
        try {
          l().wait_for_pending_frees(/*policy_too=*/false);
        } catch (const usage_error&) {  // a capture forbids host waits now: let the policy grow instead
        }
      }
    }
    try {
      return grow_policy(sh);
    } catch (const std::bad_alloc&) {
      if (m_.cache.blocks() == 0 && m_.deferred.blocks.empty()) throw;
    }
    if (void* p = hand_over(bin_key{sh.key, sh.tag}, stream, s, for_host)) return p;
    l().wait_for_pending_frees(/*policy_too=*/false);
    return grow_policy(sh);
  }

  /// The policy's allocate. While a stream this layer has seen capturing may still capture, with the calling
  /// thread's capture mode relaxed around the call: a source's cudaMalloc or cuMemCreate is "potentially
  /// unsafe" under capture, and in the default (global) mode any thread's call invalidates every capture going
  /// on, even for an allocation on an uncaptured stream. The call is not captured either way, which is what a
  /// pool wants (its memory belongs to the pool, not to a graph); PyTorch relaxes the mode the same way.
  void* grow_policy(const shape& sh)
  {
    l().give_back_recent_for(sh);
    return l().relaxed_while_capturing([&] { return m().policy.allocate(sh.request, sh.align); });
  }

  /// Records an event on `stream` (of `device`) into `events`, covering what is numbered below `covers_below`.
  /// `on_its_device`: a permanent stream's handle, recorded on as a stream of `device` whichever is current.
  void record_into(event_queue& events, cuda::stream_ref stream, std::uint64_t covers_below, int device,
                   bool on_its_device = false)
  {
    m().ledger.record_into(events, m().backend, device, covers_below, [&](event e) {
      if (on_its_device) l().record_on(e, stream, device);
      else m().backend.record(e, stream);
    });
    ++m().stats.events;
  }

  void retire_front(event_queue& events) noexcept { m().ledger.retire_front(events); }

  /// Records an event after the stream's uncovered blocks, so they can be reclaimed once it completes.
  void cover(stream_state& s, cuda::stream_ref stream)
  {
    if (s.uncovered_blocks == 0) return;
    reap(s);
    if (l().checks_capture() && l().captures(stream)) l().refuse_capture("an event was needed");
    l().record_into(s.events, stream, s.next_seq, s.device);
    s.covered_seq = s.next_seq;
    s.uncovered_blocks = 0;
    s.uncovered_bytes = 0;
    s.blocks_at_cover = s.blocks;
    s.bytes_at_cover = s.bytes;
  }

private:
  Layer& l() noexcept { return static_cast<Layer&>(*this); }
  const Layer& l() const noexcept { return static_cast<const Layer&>(*this); }
  auto& m() noexcept { return l().m_; }
  const auto& m() const noexcept { return l().m_; }

  bool policy_has_room(const shape& sh) const noexcept
  {
    if constexpr (room_reporting_resource<Policy>) return m().policy.has_room_for(sh.request, sh.align);
    else return false;
  }

  /// Returns to the policy every block of s whose covering event has completed.
  void reap(stream_state& s)
  {
    while (!s.events.empty() && l().event_done(s.events.front().e)) {
      const std::uint64_t below = s.events.front().covers_below;
      l().retire_front(s.events);
      while (s.oldest != nullptr && s.oldest->seq < below) {
        node* n = s.oldest;
        s.remove(n);
        l().give_back(n);
      }
    }
  }

  /// Reaps every stream and forgets streams with nothing left (destroyed streams never come back).
  void reap_all(const stream_state& keep)
  {
    l().reap_owner();
    m().cache.for_each([this](stream_state& s) { reap(s); });
    forget_empty_streams(keep);
  }

  /// Streams with nothing cached and no event pending are forgotten (destroyed streams never come back).
  void forget_empty_streams(const stream_state& keep) noexcept { m().cache.forget_empty(keep, m().own.owner); }

  /// A block of this shape and tag freed on another stream and covered by an event: the requesting stream is
  /// made to wait on that event (the host, for a synchronous allocate), and gets the block.
  void* hand_over(bin_key key, cuda::stream_ref stream, stream_state& self, bool for_host)
  {
    auto& m_ = m();
    stream_state* from = nullptr;
    node* n = nullptr;
    const pending_event* cover = nullptr;
    m_.cache.for_each([&](stream_state& other) {
      if (n == nullptr && &other != &self && (n = covered_block(other, key, cover)) != nullptr) from = &other;
    });
    if (n == nullptr) return nullptr;
    if (for_host) {
      l().refuse_host_wait_under_capture();
      l().count_wait(m_.stats.event_syncs);
      m_.backend.wait_host(cover->e);
    } else {
      m_.backend.order_after(stream, cover->e);
    }
    ++m_.stats.handovers;
    from->remove(n);
    return l().hand_out(n);
  }

  /// A block of `key` cached by `other` and covered by one of its events (that event in `cover`), or null.
  static node* covered_block(stream_state& other, bin_key key, const pending_event*& cover) noexcept
  {
    const auto bin = other.bins.find(key);
    if (bin == other.bins.end()) return nullptr;
    for (node* n = bin->second; n != nullptr; n = n->bin_next) {
      if (n->seq >= other.covered_seq) continue;
      for (const pending_event& pe : other.events)
        if (pe.covers_below > n->seq) {
          cover = &pe;
          return n;
        }
      // No event covers it: cannot happen, a completed event's blocks were reaped with it.
    }
    return nullptr;
  }

};

} // namespace strata::detail
