// The differential fuzzer's long run: every registered stack over fresh seeds until the time is up, one stack
// after another, on as many threads as asked (each run is independent: its own upstream, streams and stack).
//   strata_fuzz [--seconds N] [--threads N] [--operations N] [--first-seed N] [--only SUBSTRING]
// Prints each failing run's seed and what broke, then "N passed, N failed"; exits 1 on any failure.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fuzz/stack_fuzzer.hpp"

using namespace strata::testing;

int main(int argc, char** argv)
{
  double seconds = 60;
  unsigned threads = 2;
  std::size_t operations = 100'000;
  std::uint64_t first_seed = 1000;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (flag == "--threads") threads = static_cast<unsigned>(std::atoi(argv[i + 1]));
    else if (flag == "--operations") operations = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--first-seed") first_seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--only") only = argv[i + 1];
    else {
      std::fprintf(stderr, "strata_fuzz: unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  std::vector<const fuzz_target*> targets;
  for (const auto& t : fuzz_targets())
    if (only.empty() || t.name.find(only) != std::string::npos) targets.push_back(&t);
  if (targets.empty()) {
    std::fprintf(stderr, "strata_fuzz: no stack matches '%s'\n", only.c_str());
    return 2;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::atomic<std::uint64_t> next_run{0};
  std::atomic<std::size_t> passed{0}, failed{0}, steps{0};
  std::mutex print;
  auto worker = [&] {
    while (std::chrono::steady_clock::now() < deadline) {
      const std::uint64_t run = next_run++;
      const fuzz_target& t = *targets[run % targets.size()];
      const std::uint64_t seed = first_seed + run / targets.size();
      const fuzz_report r = t.run({.seed = seed, .operations = operations});
      steps += r.operations;
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
  for (unsigned k = 0; k < threads; ++k) pool.emplace_back(worker);
  for (auto& th : pool) th.join();
  std::printf("%zu stacks, %zu steps\n", targets.size(), steps.load());
  std::printf("%zu passed, %zu failed\n", passed.load(), failed.load());
  return failed == 0 ? 0 : 1;
}
