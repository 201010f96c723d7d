#pragma once
// Where stream_ordered sends an allocation or a free made for a CUDA graph: the explicit routes
// (PyTorch's beginAllocateToPool), the automatic pool of each capture, and the graphs watched so that a
// pool is released when its graph is destroyed.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <strata/core/config.hpp>
#include <strata/detail/stream/capture_guard.hpp>
#include <strata/detail/emptied_on_move.hpp>
#include <strata/detail/stream/graph_pools.hpp>

namespace strata::detail {

/// The private pools of a stream_ordered layer and the rules that pick one. Picking is one filter call per
/// route and, under capture, one capture query; a new automatic pool attaches one CUDA user object to its
/// graph. Released graphs are collected in O(1) when none is posted. Unsynchronized (the inbox alone is
/// posted to from CUDA's threads). The defaulted moves hand everything over.
template <class Block>
class graph_router {
public:
  using pool = typename graph_pools<Block>::pool;

  /// Where an allocation or a free under capture goes: a pool, the stream order inside it, and (automatic
  /// mode) the graph being captured, which a new pool is tied to.
  struct target {
    pool_name name;
    reuse_tag tag;
    void* graph = nullptr;
    bool capturing = false;
  };

  /// The stream order of a block freed under capture: the capturing stream within its capture. An explicit
  /// pool may be shared by several captures (PyTorch's graph_pool_handle): there, as in PyTorch, a block freed
  /// in one capture is reused by a later one on the same stream, which is why graphs sharing a pool must be
  /// replayed in the order they were captured and never concurrently. An automatic pool has one capture.
  static reuse_tag captured_tag(pool_name name, std::uint64_t capture, cuda::stream_ref stream) noexcept
  {
    constexpr std::uint64_t any_capture_of_the_pool = ~std::uint64_t{1};
    return {name.automatic ? capture : any_capture_of_the_pool, static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(stream.get()))};
  }

  /// The pool a call on `stream` belongs to: the newest route whose filter accepts the stream, else (under
  /// capture, with `automatic` pools) the capture's own pool; none otherwise. Notes the capture in `guard`.
  template <class Backend>
  std::optional<target> target_for(Backend& backend, capture_guard& guard, cuda::stream_ref stream, bool capturing, bool automatic)
  {
    if (capturing) guard.note(backend, stream);  // so that the policy grows in relaxed mode, and host waits are refused
    for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
      if (!(it->filter ? it->filter(stream.get()) : capturing)) continue;
      if (!capturing) return target{{it->pool, false}, {0, backend.id_of(stream)}, nullptr, false};
      const auto info = backend.capture_of(stream);
      if (!info.active) return std::nullopt;  // implicitly captured (a default stream): no capture of its own
      guard.note(backend, stream, &info.id, &it->pool);
      return target{{it->pool, false}, captured_tag(pool_name{it->pool, false}, info.id, stream), nullptr, true};
    }
    if (!capturing || !automatic) return std::nullopt;
    const auto info = backend.capture_of(stream);
    if (!info.active) return std::nullopt;
    guard.note(backend, stream, &info.id);
    return target{{info.id, true}, captured_tag(pool_name{info.id, true}, info.id, stream), info.graph, true};
  }

  /// The target's pool, made if new (a new automatic pool is tied to its graph first). Strong guarantee.
  template <class Backend>
  std::pair<pool*, bool> open(Backend& backend, const target& t)
  {
    auto opened = pools_.open(t.name);
    if (opened.second && t.graph != nullptr && !watched(t.name.id)) {
      try {
        watched_.reserve(watched_.size() + 1);
        watch_graph(backend, t.graph, t.name.id);
      } catch (...) {
        pools_.erase_if_empty(*opened.first);
        throw;
      }
      watched_.push_back(t.name.id);  // capacity reserved
    }
    return opened;
  }

  /// Releases, through `release(pool&)`, the pools whose graphs CUDA reported destroyed; `ended(id)` is told
  /// each capture id first (its capture has ended).
  template <class Ended, class Release>
  [[gnu::always_inline]] void collect_released(Ended&& ended, Release&& release)
  {
    if (inbox_ && inbox_->any()) [[unlikely]] collect_posted(ended, release);
  }

private:
  template <class Ended, class Release>
  [[gnu::noinline]] void collect_posted(Ended& ended, Release& release)
  {
    for (std::uint64_t id = 0; inbox_->front(id); inbox_->pop()) {
      // The graph is gone: its id is posted once, and never watched again (capture ids are not reused).
      if (const auto w = std::find(watched_.begin(), watched_.end(), id); w != watched_.end()) {
        *w = watched_.back();
        watched_.pop_back();
      }
      ended(id);
      if (pool* pl = pools_.find({id, true})) release(*pl);
    }
  }

public:
  /// Makes room for one more route, so that add_route cannot throw.
  void reserve_route() { routes_.reserve(routes_.size() + 1); }
  void add_route(std::uint64_t pool_id, std::function<bool(cudaStream_t)> filter) noexcept
  {
    routes_.push_back({pool_id, std::move(filter)});  // capacity reserved
  }
  /// Ends the newest route to `pool_id`.
  void end_route(std::uint64_t pool_id) noexcept
  {
    for (auto it = routes_.rbegin(); it != routes_.rend(); ++it)
      if (it->pool == pool_id) {
        routes_.erase(std::next(it).base());
        return;
      }
  }
  /// Ends every route to `pool_id`.
  void drop_routes(std::uint64_t pool_id) noexcept
  {
    std::erase_if(routes_, [pool_id](const route& r) { return r.pool == pool_id; });
  }
  void clear_routes() noexcept { routes_.clear(); }
  bool routing() const noexcept { return !routes_.empty(); }

  graph_pools<Block>& pools() noexcept { return pools_; }
  const graph_pools<Block>& pools() const noexcept { return pools_; }

private:
  struct route {
    std::uint64_t pool;
    std::function<bool(cudaStream_t)> filter;  ///< empty: every capturing stream
  };

  /// Whether the capture's graph already carries this layer's user object. A pool is forgotten when its first
  /// allocation fails, but its user object stays on the graph: attaching another would post the id twice.
  /// O(graphs watched and not yet destroyed).
  bool watched(std::uint64_t id) const noexcept { return std::find(watched_.begin(), watched_.end(), id) != watched_.end(); }

  /// Ties a pool to the graph being captured: a user object whose destructor (a CUDA thread, no CUDA calls)
  /// posts the pool's id to the inbox. Nothing is posted if this throws.
  template <class Backend>
  void watch_graph(Backend& backend, void* graph, std::uint64_t id)
  {
    if (!inbox_) inbox_ = std::make_shared<graph_release_inbox>();
    inbox_->expect_one();
    graph_release_inbox::token* token = nullptr;
    try {
      token = new graph_release_inbox::token{inbox_, id};
      backend.call_when_graph_destroyed(graph, &graph_release_inbox::on_graph_destroyed, token);
    } catch (...) {
      delete token;
      inbox_->unexpect_one();
      throw;
    }
  }

  graph_pools<Block> pools_;
  emptied_on_move<std::vector<route>> routes_;
  std::shared_ptr<graph_release_inbox> inbox_;  ///< made at the first automatic pool
  emptied_on_move<std::vector<std::uint64_t>> watched_;  ///< capture ids whose graphs carry a user object not yet run
};

} // namespace strata::detail
