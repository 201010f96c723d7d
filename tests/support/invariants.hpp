#pragma once
// The randomized invariant checker every policy test uses: random allocate/free sequences that check after
// every step that no two live blocks overlap, every pointer is aligned, and usage() is exact. It counts what
// succeeded (a box that refuses everything fails it) and accepts an out_of_memory only when a witness says
// why: by default none may happen; refused_by(spy) accepts the ones its spy upstream refused, refusal_if(f)
// the ones a predicate over (bytes, alignment) explains, e.g. a capacity that really is exceeded.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>

namespace strata::testing {

struct live_block {
  void* p;
  std::size_t bytes;
  std::size_t alignment;
};

/// Live blocks by address, so an overlap is found in O(log n) when a block is added.
class live_set {
public:
  /// False if the new block overlaps a live one.
  bool add(const live_block& b)
  {
    const auto start = reinterpret_cast<std::uintptr_t>(b.p);
    auto next = by_address_.lower_bound(start);
    if (next != by_address_.end() && next->first < start + b.bytes) return false;
    if (next != by_address_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.bytes > start) return false;
    }
    by_address_.emplace(start, b);
    blocks_.push_back(b);
    return true;
  }

  live_block take(std::size_t index)
  {
    live_block b = blocks_[index];
    blocks_[index] = blocks_.back();
    blocks_.pop_back();
    by_address_.erase(reinterpret_cast<std::uintptr_t>(b.p));
    return b;
  }

  /// Forgets the block at p (a free the test made by other means); false if none is live there.
  bool remove(const void* p)
  {
    for (std::size_t k = 0; k < blocks_.size(); ++k)
      if (blocks_[k].p == p) {
        take(k);
        return true;
      }
    return false;
  }

  std::size_t size() const noexcept { return blocks_.size(); }
  const std::vector<live_block>& blocks() const noexcept { return blocks_; }

private:
  std::map<std::uintptr_t, live_block> by_address_;
  std::vector<live_block> blocks_;
};

struct workload {
  static constexpr std::size_t automatic = SIZE_MAX;
  std::size_t operations = 100'000;
  std::size_t max_live = 1'000;
  std::size_t min_bytes = 1;
  std::size_t max_bytes = 1 << 20;
  bool log_uniform = true;           ///< sizes log-uniform (many small, some large) or uniform
  std::size_t max_alignment = 4096;  ///< alignments drawn from powers of two up to this (mostly 256)
  unsigned seed = 42;
  std::size_t min_allocations = automatic;  ///< successful allocations required; automatic: a quarter of the operations
};

struct workload_result {
  std::size_t allocations = 0;  ///< successful, non-null allocations
  std::size_t frees = 0;
  std::size_t refusals = 0;  ///< out_of_memory, each one explained by the witness
};

/// The default witness: no refusal has a reason, so any out_of_memory fails the test.
struct no_refusals_expected {
  void before_allocate() noexcept {}
  bool explains(std::size_t, std::size_t) const noexcept { return false; }
};

/// Accepts a refusal when the spy (any upstream counting refusals()) refused a request during that allocate.
template <class Spy>
class refused_by {
public:
  explicit refused_by(const Spy& spy) noexcept : spy_(&spy) {}
  void before_allocate() noexcept { before_ = spy_->refusals(); }
  bool explains(std::size_t, std::size_t) const noexcept { return spy_->refusals() > before_; }

private:
  const Spy* spy_;
  std::size_t before_ = 0;
};

/// Accepts a refusal when f(bytes, alignment) says the request really could not be served.
template <class F>
class refusal_if {
public:
  explicit refusal_if(F f) : f_(std::move(f)) {}
  void before_allocate() noexcept {}
  bool explains(std::size_t bytes, std::size_t alignment) const { return f_(bytes, alignment); }

private:
  F f_;
};

/// Checks the usage figures a box reports against what the test knows is live.
template <class R>
void check_usage(const R& r, const live_set& live)
{
  if constexpr (usage_reporting_resource<R>) {
    const strata::usage u = r.usage();
    REQUIRE(u.used_blocks == live.size());
    REQUIRE(u.in_use <= u.reserved);
    REQUIRE(u.largest_free <= u.free());
    if constexpr (sized_resource<R>) {
      std::size_t expected = 0;
      for (const auto& b : live.blocks()) expected += r.good_size(b.bytes, b.alignment);
      REQUIRE(u.in_use == expected);
    }
  }
}

/// Runs `w` against `r`; every live block is freed at the end. An out-of-memory refusal must be explained by
/// `witness` (and leave the box consistent); anything else fails the test, and so do fewer successful
/// allocations than w.min_allocations.
template <class R, class Witness = no_refusals_expected>
workload_result run_random_workload(R& r, const workload& w, bool check_every_step = true, Witness witness = {})
{
  std::mt19937_64 rng(w.seed);
  std::uniform_real_distribution<double> log_size(std::log2(static_cast<double>(w.min_bytes)),
                                                  std::log2(static_cast<double>(w.max_bytes)));
  std::uniform_int_distribution<std::size_t> uniform_size(w.min_bytes, w.max_bytes);
  std::uniform_int_distribution<int> percent(0, 99);
  live_set live;
  workload_result result;
  for (std::size_t step = 0; step < w.operations; ++step) {
    const bool allocate = live.size() == 0 || (live.size() < w.max_live && percent(rng) < 50);
    if (allocate) {
      const std::size_t bytes =
        w.log_uniform ? static_cast<std::size_t>(std::exp2(log_size(rng))) : uniform_size(rng);
      std::size_t alignment = default_alignment;
      if (w.max_alignment > default_alignment && percent(rng) < 10) {
        std::uniform_int_distribution<int> shift(0, std::countr_zero(w.max_alignment));
        alignment = std::size_t{1} << shift(rng);
      }
      void* p = nullptr;
      witness.before_allocate();
      try {
        p = r.allocate(bytes, alignment);
      } catch (const out_of_memory& e) {
        INFO("step " << step << ": " << e.what());
        REQUIRE_MESSAGE(witness.explains(bytes, alignment), "an out_of_memory nothing explains");
        ++result.refusals;
        if (check_every_step) check_usage(r, live);
        continue;
      }
      REQUIRE(p != nullptr);
      REQUIRE(is_aligned(p, effective_alignment(alignment)));
      REQUIRE(live.add({p, bytes, alignment}));
      ++result.allocations;
    } else {
      std::uniform_int_distribution<std::size_t> pick(0, live.size() - 1);
      const live_block b = live.take(pick(rng));
      r.deallocate(b.p, b.bytes, b.alignment);
      ++result.frees;
    }
    if (check_every_step) check_usage(r, live);
  }
  while (live.size() > 0) {
    const live_block b = live.take(live.size() - 1);
    r.deallocate(b.p, b.bytes, b.alignment);
    ++result.frees;
  }
  check_usage(r, live);
  const std::size_t required = w.min_allocations == workload::automatic ? w.operations / 4 : w.min_allocations;
  CAPTURE(result.refusals);
  REQUIRE_MESSAGE(result.allocations >= required, "only " << result.allocations << " allocations succeeded, at least "
                                                           << required << " required");
  return result;
}

} // namespace strata::testing
