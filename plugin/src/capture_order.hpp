#pragma once
// Which blocks freed during a CUDA graph capture a later allocation of the same capture may take, without
// PyTorch, so the host tests check it over a pretend graph.
//
// Note [A block freed during a capture is reused once the capture orders it]
// A block of a private pool recorded on other streams (record_stream) and freed during a capture cannot wait
// on events (an event recorded in a capture can never be queried), so by default its free is deferred until
// no capture is under way (block_table.hpp). With PyTorch's graph_capture_record_stream_reuse setting on, the
// graph itself says when reuse is safe: at the free, each stream the block was recorded on has captured work
// up to some nodes (its capture frontier); once the capture of the block's own stream depends on all of those
// nodes (the streams joined), everything the other streams queued on the block comes before anything queued
// on it next, and the block may be handed out again within the same capture. A use stream that is not
// capturing at the free has work outside the graph: that free stays deferred.
#include <cstdint>
#include <optional>
#include <unordered_set>
#include <utility>
#include <vector>

namespace strata::plugin {

/// Where a stream's capture stands: the capture's id and the nodes its next captured work will depend on.
template <class Node>
struct capture_point {
  unsigned long long id = 0;
  std::vector<Node> nodes;
};

/// The capture frontiers of blocks freed during a capture, and the test of whether a stream's capture now
/// follows them. Graph models the capture: `using node = ...` (hashable), `std::optional<capture_point<node>>
/// frontier(void* stream)` (nullopt when the stream is not capturing) and `std::vector<node>
/// predecessors(node)`. Cost: note() is one frontier query per use stream; ordered_before() walks the captured
/// graph back from the stream's frontier until it has met every node it looks for, O(nodes + edges) at most,
/// only while some noted free of that stream waits. No lock (the backend holds the device's).
template <class Graph>
class capture_frontiers {
public:
  using node = typename Graph::node;
  struct freed {
    std::uintptr_t address = 0;
    std::uint64_t ticket = 0;
  };

  /// A block of a segment serving `stream`, recorded on `uses`, freed during a capture under `ticket`: notes
  /// how far each use stream's capture has reached. False (nothing noted: the free stays deferred) when a use
  /// stream is not capturing.
  bool note(std::uintptr_t address, std::uint64_t ticket, void* stream, const std::vector<void*>& uses, Graph& graph)
  {
    const auto own = graph.frontier(stream);
    if (!own) return false;
    entry e{address, ticket, stream, own->id, {}};
    for (void* use : uses) {
      const auto reached = graph.frontier(use);
      if (!reached || reached->id != own->id) return false;  // work outside this capture's graph
      e.nodes.insert(e.nodes.end(), reached->nodes.begin(), reached->nodes.end());
    }
    entries_.push_back(std::move(e));
    return true;
  }

  /// The noted frees of `stream`'s segments whose use streams' captured work `stream`'s capture now depends
  /// on; they are forgotten here, for the caller to settle. A noted free of another capture than the one
  /// `stream` is in now is forgotten too (its nodes belong to another graph): it stays deferred.
  std::vector<freed> ordered_before(void* stream, Graph& graph)
  {
    std::vector<freed> out;
    bool waiting = false;
    for (const entry& e : entries_) waiting = waiting || e.stream == stream;
    if (!waiting) return out;
    const auto start = graph.frontier(stream);
    std::unordered_set<node> wanted;
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->stream == stream && (!start || it->capture != start->id)) {
        it = entries_.erase(it);
        continue;
      }
      if (it->stream == stream) wanted.insert(it->nodes.begin(), it->nodes.end());
      ++it;
    }
    if (!start) return out;
    const std::unordered_set<node> before = ancestors(start->nodes, wanted, graph);
    for (auto it = entries_.begin(); it != entries_.end();) {
      bool ordered = it->stream == stream;
      for (const node& n : it->nodes) ordered = ordered && before.count(n) != 0;
      if (!ordered) {
        ++it;
        continue;
      }
      out.push_back({it->address, it->ticket});
      it = entries_.erase(it);
    }
    return out;
  }

  /// No capture is under way any more: deferred frees wait on events again.
  void clear() noexcept { entries_.clear(); }
  bool empty() const noexcept { return entries_.empty(); }

private:
  struct entry {
    std::uintptr_t address;
    std::uint64_t ticket;
    void* stream;
    unsigned long long capture;  ///< the capture's id at the free
    std::vector<node> nodes;
  };

  /// The frontier's nodes and the nodes they depend on, directly or not, as far as the walk must go to meet
  /// every node of `wanted` (all of them when some is not an ancestor).
  static std::unordered_set<node> ancestors(const std::vector<node>& frontier, const std::unordered_set<node>& wanted, Graph& graph)
  {
    std::unordered_set<node> seen(frontier.begin(), frontier.end());
    std::vector<node> todo(frontier.begin(), frontier.end());
    std::size_t met = 0;
    for (const node& n : wanted) met += seen.count(n);
    while (!todo.empty() && met < wanted.size()) {
      const node n = todo.back();
      todo.pop_back();
      for (const node& p : graph.predecessors(n))
        if (seen.insert(p).second) {
          todo.push_back(p);
          met += wanted.count(p);
        }
    }
    return seen;
  }

  std::vector<entry> entries_;
};

} // namespace strata::plugin
