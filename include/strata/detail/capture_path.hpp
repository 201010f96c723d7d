#pragma once
// stream_ordered under CUDA graph capture: when a stream is asked whether it captures, what a capture
// forbids (host waits, stream id lookups), and how captures are served: an allocation on a capturing (or
// routed) stream comes from the capture's or route's private pool, a block freed under capture joins that
// pool, and a released pool's free blocks become synchronous frees.
#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include <strata/core/config.hpp>
#include <strata/core/errors.hpp>
#include <strata/detail/block_tags.hpp>
#include <strata/detail/graph_router.hpp>
#include <strata/detail/pending_frees.hpp>
#include <strata/stream/cuda_events.hpp>

namespace strata::detail {

/// stream_ordered's handling of capture (a base of the layer, whose members' `captures` and `graphs` hold
/// what captures were seen, the routes and the private pools): capture queries, refusals, and serving and
/// filing blocks of CUDA graphs. Models nothing; holds nothing. Cost: one capture query per call that asks
/// (detail::stream_lookup); a pool hit is a hash lookup; a miss is the policy's allocate, with the thread's
/// capture mode relaxed. The host waits only when a route opens outside capture with frees pending.
template <class Layer, class Backend>
class capture_path {
protected:
  using event = typename Backend::event;
  using shape = block_shape;
  using router = graph_router<set_aside>;
  using pool_target = typename router::target;
  using pool = typename graph_pools<set_aside>::pool;

  /// Runs f with the calling thread's capture mode relaxed while a stream this layer has seen capturing may
  /// still capture: in the default (global) mode a "potentially unsafe" call from any thread (a source's
  /// cudaMalloc, an event query for an uncaptured stream) invalidates every capture going on.
  template <class F>
  [[gnu::always_inline]] decltype(auto) relaxed_while_capturing(F&& f)
  {
    return m().captures.relaxed(m().backend, std::forward<F>(f));
  }

  /// Whether an event has completed; relaxed while a capture goes on (see relaxed_while_capturing).
  bool event_done(const event& e)
  {
    return relaxed_while_capturing([&] { return m().backend.done(e); });
  }

  void collect_released_pools_noexcept() noexcept
  {
    try {
      l().collect_released_pools();
    } catch (...) {  // host memory exhausted: the ids stay posted for a later call
    }
  }

  /// Whether a capture may be under way: a stream seen capturing, or a route (PyTorch announces its captures
  /// with begin_allocate_to_pool). A free whose capture query fails then assumes the worst: its stream may be
  /// captured, where asking its id would invalidate the capture and a block filed for reuse could be handed
  /// out while a graph still uses it, so the block is abandoned (counted in stats().abandoned_blocks).
  bool capture_possible() const noexcept { return m().captures.any() || m().graphs.routing(); }

  /// Whether captures nobody announced are looked for (options::check_capture), or a capture may be under way
  /// (announced by a route, as all of PyTorch's are, or seen). detail::stream_lookup says which calls ask.
  bool checks_capture() const noexcept { return m().opts.check_capture || capture_possible(); }

  bool captures(cuda::stream_ref stream) { return m().captures.captures(m().backend, stream); }
  [[noreturn]] static void refuse_capture(const char* what) { detail::refuse_capture(what); }

  /// Host waits are refused while a capture may go on (detail::capture_guard says when). The layer never asks
  /// the driver about a stream handle outside a call on that stream: it may have been destroyed since.
  void refuse_host_wait_under_capture()
  {
    if (checks_capture()) m().captures.refuse_host_wait(m().backend);
  }

  /// Serves an allocation from a private pool when it belongs to one (true, the block in `out`); refuses an
  /// allocation under capture that cannot be served so (usage_error, nothing changed).
  bool routed(const shape& sh, cuda::stream_ref stream, void*& out)
  {
    if (!checks_capture()) return false;
    return routed_as(sh, stream, captures(stream), out);
  }
  /// routed(), the stream's capture query already asked and filed (`capturing`).
  bool routed_as(const shape& sh, cuda::stream_ref stream, bool capturing, void*& out)
  {
    if (!capturing && !m().graphs.routing()) [[likely]] return false;
    return serve_from_pool(sh, stream, capturing, out);
  }

  /// Out of line: a capturing or routed stream's allocation, served from its pool or refused.
  [[gnu::noinline]] bool serve_from_pool(const shape& sh, cuda::stream_ref stream, bool capturing, void*& out)
  {
    if constexpr (graph_backend<Backend>) {
      if (const std::optional<pool_target> t = target_for(stream, capturing)) {
        out = allocate_in_pool(*t, sh);
        return true;
      }
    }
    if (capturing) refuse_capture("an allocation was asked of it");
    return false;
  }

  /// A free that concerns the private pools: a pool block (filed in its pool under its tag, or, its pool
  /// released, freed the common way: false), or any block freed under capture (it joins the capture's pool:
  /// the graph may use it at every replay). False: not for the pools. Never throws: a block that cannot be
  /// filed is abandoned.
  bool free_in_pools(void* p, const shape& sh, cuda::stream_ref stream, bool capturing, bool synchronous = false) noexcept
  {
    if constexpr (!graph_backend<Backend>) {
      return false;
    } else {
      auto& m_ = m();
      auto* pl = m_.graphs.pools().owner_of(p);
      if (pl != nullptr && pl->released) {
        m_.graphs.pools().disown(*pl, p, sh.footprint);
        pl = nullptr;
      }
      if (pl == nullptr && !capturing) return false;
      try {
        reuse_tag tag = reuse_tag::nowhere();
        if (pl == nullptr) {  // from outside the pools, freed under capture
          const std::optional<pool_target> t = target_for(stream, capturing);
          if (!t) return false;  // the caller abandons it
          pl = m_.graphs.open(m_.backend, *t).first;
          try {
            m_.graphs.pools().prepare_adopt();
          } catch (...) {
            m_.graphs.pools().erase_if_empty(*pl);
            throw;
          }
          m_.graphs.pools().adopt(*pl, p, sh.footprint);
          ++m_.stats.pool_adoptions;
          tag = t->tag;
        } else if (synchronous) {
          tag = reuse_tag::nowhere();
        } else if (capturing) {
          const capture_info info = m_.backend.capture_of(stream);
          if (info.active) tag = router::captured_tag(pl->name, info.id, stream);
        } else {
          try {
            tag = {0, m_.backend.id_of(stream)};
          } catch (...) {  // an unknown stream: kept, never reused in the pool
          }
        }
        shape own = sh;
        own.tag = block_tag(m_.policy, p);  // reused only under its own tag: it sleeps and wakes with that tag
        m_.graphs.pools().put(*pl, tag, own.tag, own.key, set_aside{p, own});
      } catch (...) {
        if (pl != nullptr && m_.graphs.pools().owner_of(p) == pl) m_.graphs.pools().disown(*pl, p, sh.footprint);
        l().abandon(sh);
      }
      return true;
    }
  }

  void add_route(std::uint64_t pool_id, std::function<bool(cudaStream_t)> filter)
  {
    auto& m_ = m();
    m_.graphs.reserve_route();
    auto [pl, fresh] = m_.graphs.pools().open({pool_id, false});
    try {
      // Outside capture, once: nothing freed before this is still running when the graph first does.
      bool capture_on = false;
      try {
        refuse_host_wait_under_capture();
      } catch (const usage_error&) {
        capture_on = true;
      }
      if (!capture_on) l().give_back_recent();  // the owner's frees: the wait below covers them as any other
      if (!capture_on && (!l().policy_clean() || m_.cache.blocks() > 0 || !m_.deferred.blocks.empty()))
        l().wait_for_pending_frees(/*policy_too=*/true);
    } catch (...) {
      if (fresh) m_.graphs.pools().erase_if_empty(*pl);
      throw;
    }
    pl->released = false;  // a pool id used again after release_pool: its remaining blocks are its own again
    m_.graphs.add_route(pool_id, std::move(filter));
  }

  /// A pool's free blocks become synchronous frees (set aside until a device-wide wait, which covers every
  /// launch and stream that used them); its live blocks follow as they are freed. A sleeping tag's blocks go
  /// straight back (pending_frees::set_aside_free says why).
  void release_pool_blocks(pool& pl)
  {
    auto& m_ = m();
    m_.deferred.blocks.reserve(m_.deferred.blocks.size() + pl.free_blocks);
    m_.graphs.pools().drain(pl, [](const set_aside& b) noexcept { return b.sh.footprint; }, [&m_](const set_aside& b) noexcept {
      if (tag_sleeps(m_.policy, b.sh.tag)) return m_.policy.deallocate(b.p, b.sh.request, b.sh.align);
      m_.deferred.blocks.push_back(b);  // capacity reserved
      m_.deferred.bytes += b.sh.footprint;
    });
    ++m_.stats.pools_released;
    if (m_.deferred.blocks.size() >= m_.opts.sync_frees_per_wait || m_.deferred.bytes >= m_.opts.bytes_per_event) {
      try {
        refuse_host_wait_under_capture();
        l().wait_for_pending_frees(/*policy_too=*/false);
      } catch (...) {
        // Still set aside: a later wait returns them.
      }
    }
  }

  pool* first_unreleased_pool() noexcept
  {
    return m().graphs.pools().first_where([](const auto& pl) { return !pl.released; });
  }

private:
  Layer& l() noexcept { return static_cast<Layer&>(*this); }
  const Layer& l() const noexcept { return static_cast<const Layer&>(*this); }
  auto& m() noexcept { return l().m_; }
  const auto& m() const noexcept { return l().m_; }

  std::optional<pool_target> target_for(cuda::stream_ref stream, bool capturing)
    requires graph_backend<Backend>
  {
    return m().graphs.target_for(m().backend, m().captures, stream, capturing, m().opts.graph_pools);
  }

  /// The pool's own free block of this shape in the same stream order, else a new one from the policy.
  void* allocate_in_pool(const pool_target& t, const shape& sh)
    requires graph_backend<Backend>
  {
    auto [pl, fresh] = m().graphs.open(m().backend, t);
    set_aside b{};
    if (m().graphs.pools().take(*pl, t.tag, sh.tag, sh.key, b)) {
      ++m().stats.pool_hits;
      return b.p;
    }
    void* p = nullptr;
    try {
      m().graphs.pools().prepare_adopt();  // before the policy: giving a block back does not undo the policy's growth
      p = grow_pool(sh, t.capturing);
    } catch (...) {
      if (fresh) m().graphs.pools().erase_if_empty(*pl);
      throw;
    }
    m().graphs.pools().adopt(*pl, p, sh.footprint);
    ++m().stats.pool_misses;
    return p;
  }

  /// The policy's allocate, for a pool: under capture with the thread's capture mode relaxed (grow_policy).
  /// A policy that must wait for the device cannot grow under capture: its failure becomes a usage_error
  /// saying so (out of memory stays itself).
  void* grow_pool(const shape& sh, bool capturing)
    requires graph_backend<Backend>
  {
    if (!capturing) return l().grow_policy(sh);
    try {
      return l().grow_policy(sh);
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      std::throw_with_nested(usage_error(
          std::string("stream_ordered: the policy could not grow while a stream is being captured into a CUDA graph (") +
          e.what() + "); a policy that waits for the device to grow (mapped_pool reclaiming idle memory) cannot do so "
          "under capture: warm the pool before capturing; the pool is unchanged"));
    }
  }
};

} // namespace strata::detail
