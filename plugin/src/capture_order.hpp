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

/// The capture frontiers of blocks freed during a capture, and the test of whether a stream's capture now
/// follows them. Graph models the capture: `using node = ...` (hashable), `std::optional<std::vector<node>>
/// frontier(void* stream)` (the nodes the stream's next captured work will depend on; nullopt when the stream
/// is not capturing) and `std::vector<node> predecessors(node)`. Cost: note() is one frontier query per use
/// stream; ordered_before() walks the captured graph back from the stream's frontier, O(nodes + edges), only
/// while some noted free of that stream waits. No lock (the backend holds the device's).
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
    entry e{address, ticket, stream, {}};
    for (void* use : uses) {
      const auto reached = graph.frontier(use);
      if (!reached) return false;
      e.nodes.insert(e.nodes.end(), reached->begin(), reached->end());
    }
    entries_.push_back(std::move(e));
    return true;
  }

  /// The noted frees of `stream`'s segments whose use streams' captured work `stream`'s capture now depends
  /// on; they are forgotten here, for the caller to settle.
  std::vector<freed> ordered_before(void* stream, Graph& graph)
  {
    std::vector<freed> out;
    bool waiting = false;
    for (const entry& e : entries_) waiting = waiting || e.stream == stream;
    if (!waiting) return out;
    const auto start = graph.frontier(stream);
    if (!start) return out;
    const std::unordered_set<node> before = ancestors(*start, graph);
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
    std::vector<node> nodes;
  };

  /// The frontier's nodes and every node they depend on, directly or not.
  static std::unordered_set<node> ancestors(const std::vector<node>& frontier, Graph& graph)
  {
    std::unordered_set<node> seen(frontier.begin(), frontier.end());
    std::vector<node> todo(frontier.begin(), frontier.end());
    while (!todo.empty()) {
      const node n = todo.back();
      todo.pop_back();
      for (const node& p : graph.predecessors(n))
        if (seen.insert(p).second) todo.push_back(p);
    }
    return seen;
  }

  std::vector<entry> entries_;
};

} // namespace strata::plugin
