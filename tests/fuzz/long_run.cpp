// The differential fuzzer's long run: every registered stack over fresh seeds, one stack after another, on as
// many threads as asked (each run is independent: its own upstream, streams and stack).
//   strata_fuzz [--seconds N] [--threads N] [--operations N] [--first-seed N] [--only SUBSTRING]
//               [--min-steps N] [--per-stack]
// Runs until the time is up or, with --min-steps, until every chosen stack has run at least N steps (the time
// limit still holds). Prints each failing run's seed and what broke, then the stacks' step counts (each one
// with --per-stack, the fewest otherwise) and "N passed, N failed"; exits 1 on any failure, 3 when a
// --min-steps floor was not reached in time.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fuzz/stack_fuzzer.hpp"

using namespace strata::testing;

namespace {

struct options {
  double seconds = 60;
  unsigned threads = 2;
  std::size_t operations = 100'000;
  std::uint64_t first_seed = 1000;
  std::string only;
  std::size_t min_steps = 0;
  bool per_stack = false;
};

bool parse(int argc, char** argv, options& o)
{
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--per-stack") {
      o.per_stack = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "strata_fuzz: %s needs a value\n", flag.c_str());
      return false;
    }
    const char* value = argv[++i];
    if (flag == "--seconds") o.seconds = std::atof(value);
    else if (flag == "--threads") o.threads = static_cast<unsigned>(std::max(1, std::atoi(value)));
    else if (flag == "--operations") o.operations = std::strtoull(value, nullptr, 10);
    else if (flag == "--first-seed") o.first_seed = std::strtoull(value, nullptr, 10);
    else if (flag == "--only") o.only = value;
    else if (flag == "--min-steps") o.min_steps = std::strtoull(value, nullptr, 10);
    else {
      std::fprintf(stderr, "strata_fuzz: unknown option %s\n", flag.c_str());
      return false;
    }
  }
  return true;
}

/// Each stack's steps so far; the stacks still short of the floor are the ones handed out next.
class tallies {
public:
  explicit tallies(std::size_t stacks) : steps_(std::make_unique<std::atomic<std::size_t>[]>(stacks)), n_(stacks) {}
  void add(std::size_t stack, std::size_t steps) noexcept { steps_[stack] += steps; }
  std::size_t of(std::size_t stack) const noexcept { return steps_[stack].load(); }
  std::size_t fewest() const noexcept
  {
    std::size_t m = n_ == 0 ? 0 : of(0);
    for (std::size_t k = 1; k < n_; ++k) m = std::min(m, of(k));
    return m;
  }

private:
  std::unique_ptr<std::atomic<std::size_t>[]> steps_;
  std::size_t n_;
};

} // namespace

int main(int argc, char** argv)
{
  options o;
  if (!parse(argc, argv, o)) return 2;
  std::vector<const fuzz_target*> targets;
  for (const auto& t : fuzz_targets())
    if (o.only.empty() || t.name.find(o.only) != std::string::npos) targets.push_back(&t);
  if (targets.empty()) {
    std::fprintf(stderr, "strata_fuzz: no stack matches '%s'\n", o.only.c_str());
    return 2;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.seconds);
  // With a floor, a run is started only while some run started so far may leave a stack short: the runs are
  // handed out round-robin, so the floor needs ceil(min_steps / operations) runs of every stack.
  const std::uint64_t runs_needed =
      o.min_steps == 0 ? UINT64_MAX : (o.min_steps + o.operations - 1) / o.operations * targets.size();
  std::atomic<std::uint64_t> next_run{0};
  std::atomic<std::size_t> passed{0}, failed{0}, steps{0};
  tallies per(targets.size());
  std::mutex print;
  auto worker = [&] {
    while (std::chrono::steady_clock::now() < deadline) {
      const std::uint64_t run = next_run++;
      if (run >= runs_needed) return;
      const std::size_t stack = run % targets.size();
      const fuzz_target& t = *targets[stack];
      const std::uint64_t seed = o.first_seed + run / targets.size();
      const fuzz_report r = t.run({.seed = seed, .operations = o.operations});
      steps += r.operations;
      per.add(stack, r.operations);
      if (r.ok()) {
        ++passed;
      } else {
        ++failed;
        std::scoped_lock lock(print);
        std::printf("FAILED %s\n", r.summary().c_str());
        std::fflush(stdout);
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned k = 0; k < o.threads; ++k) pool.emplace_back(worker);
  for (auto& th : pool) th.join();
  if (o.per_stack)
    for (std::size_t k = 0; k < targets.size(); ++k) std::printf("%12zu steps  %s\n", per.of(k), targets[k]->name.c_str());
  std::printf("%zu stacks, %zu steps, at least %zu per stack\n", targets.size(), steps.load(), per.fewest());
  std::printf("%zu passed, %zu failed\n", passed.load(), failed.load());
  if (failed != 0) return 1;
  return o.min_steps != 0 && per.fewest() < o.min_steps ? 3 : 0;
}
