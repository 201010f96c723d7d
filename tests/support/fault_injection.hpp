#pragma once
// The fault injector: replays one small random workload against a box once for every place it can fail, and
// checks rule 4 of docs/architecture.md there: after any exception the box's usage() and its upstream's outstanding count
// are exactly what they were, nothing leaked, and the box goes on working.
// Two kinds of fault:
//  - the upstream refuses its N-th allocate call (a spy's refuse_call), for every N the clean run makes;
//  - the N-th host allocation made inside the box's allocate throws std::bad_alloc, for every N the clean run
//    makes. That needs the replaceable global operator new of support/counting_new.cpp, linked only into the
//    fault-injection program (strata_fault_tests) so the main suite keeps the ordinary one.
// Faults are injected only inside allocate: deallocate is noexcept, and a host allocation failing there would
// end the program; the detail tests prove the noexcept paths allocate nothing instead.
// A box instantiates it in a few lines:
//   testing::sweep_faults<spy<host_source>>([](auto& up) { return std::make_unique<arena<ref<spy<host_source>>>>(ref(up)); });
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/usage.hpp>
#include "invariants.hpp"

namespace strata::testing {

namespace host_faults {

struct thread_state {
  bool counting = false;    ///< inside a counted_section
  std::size_t counted = 0;  ///< host allocations counted since arm()
  std::size_t fail_at = 0;  ///< the counted allocation that throws (0: none)
  bool fired = false;
};
inline thread_local thread_state state;
inline std::atomic<std::size_t> live_blocks{0};  ///< operator new minus operator delete, all threads

/// Starts counting from zero; the fail_at-th allocation counted from now throws (0: none does).
inline void arm(std::size_t fail_at) noexcept { state = {state.counting, 0, fail_at, false}; }
inline void disarm() noexcept { state.fail_at = 0; }
inline std::size_t counted() noexcept { return state.counted; }
inline bool fired() noexcept { return state.fired; }

/// Called by the replaced operator new: whether this allocation is the one to fail.
inline bool next_allocation_fails() noexcept
{
  if (!state.counting) return false;
  if (++state.counted != state.fail_at) return false;
  state.fired = true;
  return true;
}

/// Host allocations on this thread are counted (and may be made to fail) while one of these is alive.
class counted_section {
public:
  counted_section() noexcept : was_counting_(state.counting) { state.counting = true; }
  ~counted_section() { state.counting = was_counting_; }
  counted_section(const counted_section&) = delete;
  counted_section& operator=(const counted_section&) = delete;

private:
  bool was_counting_;
};

} // namespace host_faults

/// The upstream of a box that has none (a source under test): no calls to refuse, nothing outstanding.
struct no_upstream {
  void refuse_call(std::size_t) noexcept {}
  std::size_t calls() const noexcept { return 0; }
  std::size_t outstanding_bytes() const noexcept { return 0; }
  std::size_t outstanding_blocks() const noexcept { return 0; }
  std::size_t mismatches() const noexcept { return 0; }
};

/// How the sweep calls a box; a box with streams (or anything else to observe) passes its own.
struct plain_calls {
  void start_run() {}
  template <class Box>
  void* allocate(Box& box, std::size_t bytes, std::size_t alignment, std::size_t /*step*/)
  {
    return box.allocate(bytes, alignment);
  }
  template <class Box>
  void deallocate(Box& box, void* p, std::size_t bytes, std::size_t alignment, std::size_t /*allocated_at*/)
  {
    box.deallocate(p, bytes, alignment);
  }
  /// Figures besides usage() that an exception must leave unchanged (counters of the box, say).
  template <class Box>
  std::array<std::size_t, 2> extra(const Box&) const
  {
    return {};
  }
};

struct fault_workload {
  std::size_t operations = 60;
  std::size_t max_live = 12;
  std::size_t min_bytes = 1;
  std::size_t max_bytes = std::size_t{1} << 20;
  std::size_t max_alignment = 4096;
  unsigned seed = 7;
};

struct sweep_result {
  std::size_t upstream_calls = 0;    ///< in the clean run: the refusal sweep's N goes up to this
  std::size_t host_allocations = 0;  ///< in the clean run, inside allocate: the host sweep's N goes up to this
  std::size_t refusal_exceptions = 0;
  std::size_t host_exceptions = 0;
};

namespace detail {

struct scripted_op {
  bool allocate;
  std::size_t bytes;
  std::size_t alignment;
  std::size_t pick;  ///< which live block a free takes (modulo the live count)
};

inline std::vector<scripted_op> make_script(const fault_workload& w)
{
  std::mt19937_64 rng(w.seed);
  std::uniform_real_distribution<double> log_size(std::log2(static_cast<double>(w.min_bytes)), std::log2(static_cast<double>(w.max_bytes)));
  std::uniform_int_distribution<int> percent(0, 99);
  std::uniform_int_distribution<int> shift(0, std::countr_zero(w.max_alignment));
  std::vector<scripted_op> script;
  std::size_t live = 0;
  for (std::size_t i = 0; i < w.operations; ++i) {
    const bool allocate = live == 0 || (live < w.max_live && percent(rng) < 60);
    const auto bytes = static_cast<std::size_t>(std::exp2(log_size(rng)));
    const std::size_t alignment = percent(rng) < 15 ? std::size_t{1} << shift(rng) : default_alignment;
    script.push_back({allocate, bytes, alignment, static_cast<std::size_t>(rng())});
    if (allocate) ++live;
    else --live;
  }
  return script;
}

struct observation {
  strata::usage box_usage;
  std::size_t upstream_bytes;
  std::size_t upstream_blocks;
  std::array<std::size_t, 2> extra;
};

template <class Box, class Upstream, class Calls>
observation observe(const Box& box, const Upstream& up, const Calls& calls)
{
  observation o{{}, up.outstanding_bytes(), up.outstanding_blocks(), calls.extra(box)};
  if constexpr (usage_reporting_resource<Box>) o.box_usage = box.usage();
  return o;
}

/// `free_may_merge`: the box may, on its way to out_of_memory, move free blocks it keeps aside into its policy
/// (stream_ordered's safe cached blocks, its documented last resort before failing), where they merge with
/// their neighbours: its largest free block may then only grow. Nothing else may change.
inline void check_unchanged(const observation& before, const observation& after, bool free_may_merge = false)
{
  CHECK(after.box_usage.reserved == before.box_usage.reserved);
  CHECK(after.box_usage.in_use == before.box_usage.in_use);
  CHECK(after.box_usage.chunks == before.box_usage.chunks);
  CHECK(after.box_usage.used_blocks == before.box_usage.used_blocks);
  if (free_may_merge) {
    CHECK(after.box_usage.free_blocks <= before.box_usage.free_blocks);
    CHECK(after.box_usage.largest_free >= before.box_usage.largest_free);
  } else {
    CHECK(after.box_usage.free_blocks == before.box_usage.free_blocks);
    CHECK(after.box_usage.largest_free == before.box_usage.largest_free);
  }
  CHECK(after.upstream_bytes == before.upstream_bytes);
  CHECK(after.upstream_blocks == before.upstream_blocks);
  CHECK(after.extra[0] == before.extra[0]);
  CHECK(after.extra[1] == before.extra[1]);
}

enum class fault { none, upstream_refusal, host_allocation };

/// One replay of the script with at most one fault; returns how many exceptions reached the caller.
template <class Upstream, class Make, class Calls>
std::size_t replay(Make& make, Calls& calls, const std::vector<scripted_op>& script, fault kind, std::size_t n,
                   sweep_result* clean)
{
  Upstream up;
  calls.start_run();
  std::size_t exceptions = 0;
  {
    auto box = make(up);
    const std::size_t calls_before = up.calls();
    if (kind == fault::upstream_refusal) up.refuse_call(n);
    host_faults::arm(kind == fault::host_allocation ? n : 0);
    std::vector<std::pair<live_block, std::size_t>> live;  // block, step it was allocated at
    live_set overlap;
    for (std::size_t step = 0; step < script.size(); ++step) {
      const scripted_op& op = script[step];
      if (!op.allocate) {
        if (live.empty()) continue;
        const std::size_t i = op.pick % live.size();
        const auto [b, at] = live[i];
        live[i] = live.back();
        live.pop_back();
        REQUIRE(overlap.remove(b.p));
        calls.deallocate(*box, b.p, b.bytes, b.alignment, at);
        continue;
      }
      const observation before = observe(*box, up, calls);
      void* p = nullptr;
      bool threw = false, threw_out_of_memory = false;
      try {
        host_faults::counted_section counted;
        p = calls.allocate(*box, op.bytes, op.alignment, step);
      } catch (const out_of_memory&) {
        threw = threw_out_of_memory = true;
      } catch (const std::bad_alloc&) {
        threw = true;
      }
      if (threw) {  // out of the catch: the exception (and the host memory of its message) is gone
        CAPTURE(step);
        CAPTURE(op.bytes);
        ++exceptions;
        // A refusal by the upstream must reach the caller as out_of_memory; a host fault may be plain bad_alloc.
        CHECK((kind != fault::none && (threw_out_of_memory || kind == fault::host_allocation)));
        check_unchanged(before, observe(*box, up, calls), requires { Calls::free_may_merge; });
        host_faults::disarm();
        up.refuse_call(0);
        continue;
      }
      REQUIRE(p != nullptr);
      CHECK(is_aligned(p, effective_alignment(op.alignment)));
      CHECK(overlap.add({p, op.bytes, op.alignment}));
      live.push_back({{p, op.bytes, op.alignment}, step});
    }
    if (clean != nullptr) {
      clean->upstream_calls = up.calls() - calls_before;
      clean->host_allocations = host_faults::counted();
    }
    host_faults::disarm();
    // Still usable after the fault: a fresh block, then everything back.
    void* p = calls.allocate(*box, 1000, default_alignment, script.size());
    REQUIRE(p != nullptr);
    calls.deallocate(*box, p, 1000, default_alignment, script.size());
    for (const auto& [b, at] : live) calls.deallocate(*box, b.p, b.bytes, b.alignment, at);
  }
  CHECK(up.outstanding_blocks() == 0);  // the box is gone: everything it took came back
  CHECK(up.mismatches() == 0);
  return exceptions;
}

} // namespace detail

/// Replays `w` against the box make(upstream) returns (a unique_ptr) once clean, then once for every upstream
/// call the clean run made with that call refused, and once for every host allocation it made inside
/// allocate with that one failing. Each replay starts from a fresh Upstream and box.
template <class Upstream, class Make, class Calls = plain_calls>
sweep_result sweep_faults(Make make, const fault_workload& w = {}, Calls calls = {})
{
  const auto script = detail::make_script(w);
  sweep_result r;
  REQUIRE(detail::replay<Upstream>(make, calls, script, detail::fault::none, 0, &r) == 0);
  for (std::size_t n = 1; n <= r.upstream_calls; ++n) {
    CAPTURE(n);
    INFO("the upstream refuses its call number " << n);
    r.refusal_exceptions += detail::replay<Upstream>(make, calls, script, detail::fault::upstream_refusal, n, nullptr);
  }
  for (std::size_t n = 1; n <= r.host_allocations; ++n) {
    CAPTURE(n);
    INFO("host allocation number " << n << " inside allocate throws std::bad_alloc");
    r.host_exceptions += detail::replay<Upstream>(make, calls, script, detail::fault::host_allocation, n, nullptr);
  }
  MESSAGE("upstream calls " << r.upstream_calls << " (" << r.refusal_exceptions << " reached the caller), host allocations "
                            << r.host_allocations << " (" << r.host_exceptions << " reached the caller)");
  return r;
}

} // namespace strata::testing
