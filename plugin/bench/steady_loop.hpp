#pragma once
// The steady loop strata_plugin_cost times and tests/test_mapped_pool.cpp replays over simulated pages: rounds
// of eight allocations with sizes from a ResNet-like mix (512 B to 12 MiB), freed in reverse, the mix shifting
// each round, so the live set never outgrows its first peak but its blocks land on other pages round to round.
#include <algorithm>
#include <chrono>
#include <cstddef>

namespace strata::bench {

inline constexpr std::size_t steady_loop_mix[] = {1605632, 802816, 401408, 3211264, 6422528, 12845056, 512, 4096, 147456, 2359296, 1048576, 65536};
inline constexpr int steady_loop_depth = 8;  ///< blocks live at once

/// The size of block `k` (0 .. steady_loop_depth - 1) of round `round`.
constexpr std::size_t steady_loop_size(int round, int k) noexcept
{
  constexpr std::size_t count = sizeof steady_loop_mix / sizeof steady_loop_mix[0];
  return steady_loop_mix[static_cast<std::size_t>(round * 5 + k * 7) % count];
}

/// ns per allocate+free pair over the steady loop, the best of `repetitions` runs of `rounds` rounds.
template <class Allocate, class Free>
double steady_loop_pair_ns(Allocate allocate, Free free, int rounds, int repetitions)
{
  void* p[steady_loop_depth];
  std::size_t n[steady_loop_depth];
  double best = 1e30;
  for (int rep = 0; rep < repetitions; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) {
      for (int k = 0; k < steady_loop_depth; ++k) {
        n[k] = steady_loop_size(i, k);
        p[k] = allocate(n[k]);
      }
      for (int k = steady_loop_depth - 1; k >= 0; --k) free(p[k], n[k]);
    }
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, ns / (double(rounds) * steady_loop_depth));
  }
  return best;
}

} // namespace strata::bench
