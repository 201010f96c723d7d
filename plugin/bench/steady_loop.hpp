#pragma once
// The steady loop strata_plugin_cost times and tests/test_mapped_pool.cpp replays over simulated pages: rounds
// of eight allocations with sizes from a ResNet-like mix (512 B to 12 MiB), freed in reverse, the mix shifting
// each round, so the live set never outgrows its first peak but its blocks land on other pages round to round.
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

} // namespace strata::bench
