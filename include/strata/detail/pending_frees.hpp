#pragma once
// The frees stream_ordered cannot yet hand back: synchronous frees set aside until a device-wide wait, and
// the host waits that return every pending free to the policy (out of memory, release(), destruction).
#include <cstddef>
#include <cstdint>
#include <vector>

#include <strata/core/config.hpp>
#include <strata/detail/block_tags.hpp>
#include <strata/detail/event_ledger.hpp>
#include <strata/detail/stream_cache.hpp>

namespace strata::detail {

/// A synchronous free (or a released private pool's free block), set aside until a device-wide wait.
struct set_aside {
  void* p;
  block_shape sh;
};

/// Synchronous frees waiting for a device-wide wait.
struct set_aside_frees {
  std::vector<set_aside> blocks;
  std::size_t bytes = 0;
};

/// stream_ordered's pending frees (a base of the layer, whose members' `deferred` holds the set-aside
/// frees): setting synchronous frees aside and waiting, on the host, for everything pending. Models
/// nothing; holds nothing. Cost: a set-aside free is a vector push; a wait is one event synchronize per
/// pending event, or one device synchronize per device when some frees carry no event.
template <class Layer, class Backend>
class pending_frees {
protected:
  using event = typename Backend::event;
  using shape = block_shape;
  using node = cached_block;
  using stream_state = stream_free_lists<event>;
  using pending_event = detail::pending_event<event>;

  /// A synchronous free: set aside until a device-wide wait, which one free in a full batch makes. A sleeping
  /// tag's block goes straight back: no work can use memory that is not there, and the policy no longer
  /// counts it in use, so the layer must not subtract it again.
  void set_aside_free(void* p, const shape& sh) noexcept
  {
    auto& m_ = m();
    if (tag_sleeps(m_.policy, block_tag(m_.policy, p))) return m_.policy.deallocate(p, sh.request, sh.align);
    try {
      const cuda::stream_ref legacy{cudaStreamLegacy};
      l().state_of(m_.backend.id_of(legacy), legacy);  // so that the device-wide wait covers this device
      m_.deferred.blocks.push_back({p, sh});
    } catch (...) {
      return_unordered(p, sh);
      return;
    }
    m_.deferred.bytes += sh.footprint;
    if (m_.deferred.blocks.size() >= m_.opts.sync_frees_per_wait || m_.deferred.bytes >= m_.opts.bytes_per_event) {
      try {
        wait_for_pending_frees(/*policy_too=*/false);
      } catch (...) {
        // Still set aside: a later wait returns them.
      }
    }
  }

  /// No bookkeeping possible: make the block safe for everyone the slow way, then hand it back; if even that
  /// fails, the block is abandoned rather than handed to work that may race it.
  void return_unordered(void* p, const shape& sh) noexcept
  {
    try {
      l().refuse_host_wait_under_capture();
      wait_all_devices();
    } catch (...) {
      l().abandon(sh);
      return;
    }
    m().policy.deallocate(p, sh.request, sh.align);
  }

  /// cudaDeviceSynchronize of the device the policy's memory lives on and of every device whose streams used
  /// this layer; the current device only when none of those is known.
  void wait_all_devices()
  {
    auto& m_ = m();
    if (m_.policy_device) {
      l().count_wait(m_.stats.device_syncs);
      m_.backend.wait_device(*m_.policy_device);
    } else if (m_.cache.devices().empty()) {
      l().count_wait(m_.stats.device_syncs);
      m_.backend.wait_device(m_.backend.device_of(cuda::stream_ref{cudaStreamLegacy}));
    }
    for (const int device : m_.cache.devices()) {
      if (m_.policy_device && device == *m_.policy_device) continue;
      l().count_wait(m_.stats.device_syncs);
      m_.backend.wait_device(device);
    }
  }

  /// Host-waits for every pending free and returns every cached and set-aside block to the policy (with
  /// `policy_too`, the owner's frees already there are waited for as well). Blocks freed after a stream's
  /// last event, and synchronous frees, have nothing to wait on but the devices. Throws, changing nothing,
  /// when a wait fails.
  void wait_for_pending_frees(bool policy_too)
  {
    auto& m_ = m();
    if (!l().recent_frees_empty()) {
      l().refuse_host_wait_under_capture();
      l().give_back_recent();  // the owner's frees: covered by the waits below like any other
    }
    const bool owner_dirty = policy_too && !l().policy_clean();
    if (m_.cache.blocks() == 0 && m_.deferred.blocks.empty() && !owner_dirty) return;
    l().refuse_host_wait_under_capture();
    bool uncovered = !m_.deferred.blocks.empty() ||
                     (owner_dirty && (m_.ledger.owner_events().empty() || m_.ledger.owner_events().back().covers_below < m_.own.policy_seq));
    m_.cache.for_each([&](const stream_state& s) { uncovered |= s.uncovered_blocks > 0; });
    if (uncovered) {
      wait_all_devices();
    } else {
      m_.cache.for_each([&](const stream_state& s) {
        for (const pending_event& pe : s.events) {
          l().count_wait(m_.stats.event_syncs);
          m_.backend.wait_host(pe.e);
        }
      });
      if (owner_dirty) {
        l().count_wait(m_.stats.event_syncs);
        m_.backend.wait_host(m_.ledger.owner_events().back().e);
      }
    }
    m_.cache.for_each([this](stream_state& s) { drain(s); });
    if (owner_dirty || uncovered) l().mark_safe(m_.own.policy_seq);
    for (const set_aside& b : m_.deferred.blocks) m_.policy.deallocate(b.p, b.sh.request, b.sh.align);
    m_.deferred.blocks.clear();
    m_.deferred.bytes = 0;
  }

  /// At destruction and move-assignment: cached blocks go back only after a successful wait; if the wait
  /// fails (a sticky CUDA error, the runtime gone at exit) they are abandoned, never handed back as if safe.
  void return_everything() noexcept
  {
    auto& m_ = m();
    l().give_back_recent();
    // The layer is going away: its graphs must be gone too (a box outlives its blocks). Free pool blocks join
    // the set-aside frees; live ones stay with their holders.
    while (!m_.graphs.pools().empty()) {
      auto* pl = l().first_unreleased_pool();
      if (pl == nullptr) break;
      try {
        l().release_pool_blocks(*pl);
      } catch (...) {
        m_.stats.abandoned_blocks += pl->free_blocks;
        pl->released = true;
      }
    }
    m_.graphs.clear_routes();
    if (m_.cache.no_streams() && m_.ledger.empty() && m_.deferred.blocks.empty()) return;
    try {
      wait_for_pending_frees(/*policy_too=*/false);
    } catch (...) {
      m_.stats.abandoned_blocks += m_.cache.blocks() + m_.deferred.blocks.size();
      m_.stats.abandoned_bytes += m_.cache.bytes() + m_.deferred.bytes;
    }
    m_.cache.for_each([&m_](const stream_state& s) { event_ledger<event>::destroy(m_.backend, s.events); });
    m_.ledger.destroy_own(m_.backend);
    m_.cache.clear();
    m_.deferred = {};
    m_.own = {};
  }

private:
  Layer& l() noexcept { return static_cast<Layer&>(*this); }
  auto& m() noexcept { return l().m_; }

  /// Everything s holds goes back: only after its work is known to be complete.
  void drain(stream_state& s) noexcept
  {
    while (!s.events.empty()) l().retire_front(s.events);
    while (s.oldest != nullptr) {
      node* n = s.oldest;
      s.remove(n);
      l().give_back(n);
    }
    s.covered_seq = s.next_seq;
    s.uncovered_blocks = s.uncovered_bytes = 0;
  }
};

} // namespace strata::detail
