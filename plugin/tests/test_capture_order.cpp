// Blocks freed during a capture and recorded on other streams: reused within the capture only once the
// capture of their own stream depends on every node those streams had captured at the free (a pretend graph).
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "capture_order.hpp"

using namespace strata::plugin;

namespace {
/// A capture as CUDA keeps it: nodes with their dependencies, and each capturing stream's frontier.
struct pretend_graph {
  using node = int;
  std::map<int, std::vector<int>> deps;
  std::map<void*, std::vector<int>> frontiers;  ///< absent: the stream is not capturing
  std::map<void*, unsigned long long> ids;      ///< a capturing stream's capture (1 unless set)
  int next = 1;
  int queries = 0;
  int walked = 0;

  std::optional<capture_point<int>> frontier(void* stream)
  {
    ++queries;
    const auto it = frontiers.find(stream);
    if (it == frontiers.end()) return std::nullopt;
    return capture_point<int>{ids.count(stream) ? ids[stream] : 1, it->second};
  }
  std::vector<int> predecessors(int n)
  {
    ++walked;
    return deps[n];
  }
  /// Work captured on `stream`: a node after its frontier, which it becomes.
  int launch(void* stream)
  {
    const int n = next++;
    deps[n] = frontiers.at(stream);
    frontiers[stream] = {n};
    return n;
  }
  /// `waiter` waits for `other` (an event recorded and waited in the capture): their frontiers join.
  void join(void* waiter, void* other)
  {
    auto& f = frontiers[waiter];
    for (int n : frontiers.at(other)) f.push_back(n);
  }
};
void* stream(int i) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(0x100 * i)); }
} // namespace

TEST_CASE("capture_frontiers: a block read on a forked stream is reused only after that stream joins back")
{
  pretend_graph g;
  capture_frontiers<pretend_graph> f;
  void* const s1 = stream(1);
  void* const s2 = stream(2);
  g.frontiers[s1] = {};
  g.join(s2, s1);  // s2 forks from s1 (s1 has captured nothing yet)
  g.launch(s2);    // s2 reads the block
  REQUIRE(f.note(0x1000, 7, s1, {s2}, g));
  CHECK(f.ordered_before(s1, g).empty());  // before the join: s1 does not follow s2's read
  CHECK(f.ordered_before(s2, g).empty());  // another stream's segments never take it
  g.join(s1, s2);
  g.launch(s1);
  const auto ready = f.ordered_before(s1, g);
  REQUIRE(ready.size() == 1);
  CHECK(ready[0].address == 0x1000);
  CHECK(ready[0].ticket == 7);
  CHECK(f.empty());
}

TEST_CASE("capture_frontiers: with four streams, a partial join is not enough")
{
  pretend_graph g;
  capture_frontiers<pretend_graph> f;
  void* const s[5] = {nullptr, stream(1), stream(2), stream(3), stream(4)};
  g.frontiers[s[1]] = {};
  g.launch(s[1]);  // data1 written on s1
  for (int i = 2; i <= 4; ++i) {
    g.join(s[i], s[1]);
    g.launch(s[i]);  // each reads data1
  }
  REQUIRE(f.note(0x2000, 1, s[1], {s[2], s[3], s[4]}, g));
  g.join(s[1], s[2]);
  g.launch(s[1]);
  g.join(s[3], s[4]);
  g.launch(s[3]);
  CHECK(f.ordered_before(s[1], g).empty());  // s3 and s4 are joined to each other, not to s1
  g.join(s[1], s[3]);
  g.launch(s[1]);
  CHECK(f.ordered_before(s[1], g).size() == 1);
}

TEST_CASE("capture_frontiers: a use stream outside the capture keeps the free deferred; clear forgets the rest")
{
  pretend_graph g;
  capture_frontiers<pretend_graph> f;
  g.frontiers[stream(1)] = {};
  CHECK(!f.note(0x3000, 2, stream(1), {stream(9)}, g));  // stream 9 is not capturing
  CHECK(f.empty());
  g.join(stream(2), stream(1));
  g.launch(stream(2));
  REQUIRE(f.note(0x4000, 3, stream(1), {stream(2)}, g));
  CHECK(!f.empty());
  f.clear();
  g.join(stream(1), stream(2));
  CHECK(f.ordered_before(stream(1), g).empty());
  const int before = g.queries;
  CHECK(f.ordered_before(stream(1), g).empty());
  CHECK(g.queries == before);  // nothing noted for the stream: the graph is not walked
}

TEST_CASE("capture_frontiers: a free noted in one capture never settles in the next; the walk stops once it has met its nodes")
{
  pretend_graph g;
  capture_frontiers<pretend_graph> f;
  void* const s1 = stream(1);
  void* const s2 = stream(2);
  g.frontiers[s1] = {};
  g.join(s2, s1);
  g.launch(s2);
  REQUIRE(f.note(0x6000, 4, s1, {s2}, g));
  g.ids[s1] = 2;  // the capture ended and another began on s1: the old graph's nodes mean nothing there
  g.join(s1, s2);
  CHECK(f.ordered_before(s1, g).empty());
  CHECK(f.empty());  // forgotten: it stays deferred until no capture is under way
  g.ids[s2] = 3;
  CHECK(!f.note(0x7000, 5, s1, {s2}, g));  // a use stream in another capture: not noted

  // A long chain on s1 before the fork: the walk from the join stops at the fork's node.
  pretend_graph h;
  capture_frontiers<pretend_graph> k;
  h.frontiers[s1] = {};
  for (int i = 0; i < 1000; ++i) h.launch(s1);
  h.join(s2, s1);
  h.launch(s2);
  REQUIRE(k.note(0x8000, 6, s1, {s2}, h));
  h.join(s1, s2);
  h.launch(s1);
  REQUIRE(k.ordered_before(s1, h).size() == 1);
  CHECK(h.walked < 10);
}

TEST_CASE("capture_frontiers: random forks and joins agree with a reachability oracle")
{
  std::mt19937 rng(5);
  std::size_t agreed = 0, reused = 0;
  for (int round = 0; round < 300; ++round) {
    pretend_graph g;
    capture_frontiers<pretend_graph> f;
    const int streams = 2 + static_cast<int>(rng() % 4);
    g.frontiers[stream(1)] = {};
    for (int i = 2; i <= streams; ++i) g.join(stream(i), stream(1));
    for (int step = 0; step < 6; ++step) g.launch(stream(1 + static_cast<int>(rng() % streams)));
    std::vector<void*> uses;
    for (int i = 2; i <= streams; ++i)
      if (rng() % 2) uses.push_back(stream(i));
    // What each use stream had reached at the free.
    std::set<int> must;
    for (void* u : uses)
      for (int n : g.frontiers[u]) must.insert(n);
    REQUIRE(f.note(0x5000, 1, stream(1), uses, g));
    for (int step = 0; step < 8; ++step) {
      const int a = 1 + static_cast<int>(rng() % streams), b = 1 + static_cast<int>(rng() % streams);
      if (rng() % 2) g.join(stream(a), stream(b));
      else g.launch(stream(a));
    }
    // Oracle: every noted node reachable backwards from stream 1's frontier.
    std::set<int> seen(g.frontiers[stream(1)].begin(), g.frontiers[stream(1)].end());
    std::vector<int> todo(seen.begin(), seen.end());
    while (!todo.empty()) {
      const int n = todo.back();
      todo.pop_back();
      for (int p : g.deps[n])
        if (seen.insert(p).second) todo.push_back(p);
    }
    bool expected = true;
    for (int n : must) expected = expected && seen.count(n) != 0;
    const bool got = !f.ordered_before(stream(1), g).empty();
    agreed += got == expected ? 1 : 0;
    reused += got ? 1 : 0;
  }
  CHECK(agreed == 300);
  CHECK(reused > 30);
  CHECK(reused < 270);
}
