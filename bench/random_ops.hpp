#pragma once
// bench/peers' random-allocation sequence and the loop that runs it, shared with bench/random_calls (which
// counts what the recommended stack asks of the driver on it): 50/50 allocations and frees with at most
// `max_live` live, sizes uniform in [1 B, 1 MiB] or log-uniform in [256 B, 64 MiB], the same sequence for every
// allocator.
#include <chrono>
#include <cmath>
#include <cstddef>
#include <random>
#include <utility>
#include <vector>

namespace strata::bench {

struct op {
  bool allocate;
  std::size_t slot;  // which live slot it fills or empties
  std::size_t bytes;
};

/// 50/50 allocate/free with at most `max_live` live, the same sequence for every allocator.
inline std::vector<op> random_ops(std::size_t count, std::size_t max_live, bool log_uniform, unsigned seed)
{
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> uniform(1, std::size_t{1} << 20);
  std::uniform_real_distribution<double> log_size(8, 26);  // 256 B .. 64 MiB
  std::vector<op> ops;
  ops.reserve(count);
  std::vector<std::size_t> live, free_slots;
  std::vector<std::size_t> sizes(max_live);
  for (std::size_t s = max_live; s-- > 0;) free_slots.push_back(s);
  while (ops.size() < count) {
    const bool alloc = live.empty() || (!free_slots.empty() && (rng() & 1));
    if (alloc) {
      const std::size_t slot = free_slots.back();
      free_slots.pop_back();
      sizes[slot] = log_uniform ? static_cast<std::size_t>(std::exp2(log_size(rng))) : uniform(rng);
      live.push_back(slot);
      ops.push_back({true, slot, sizes[slot]});
    } else {
      const std::size_t k = rng() % live.size();
      const std::size_t slot = live[k];
      live[k] = live.back();
      live.pop_back();
      free_slots.push_back(slot);
      ops.push_back({false, slot, sizes[slot]});
    }
  }
  return ops;
}

/// Runs `ops` through `a` (anything with allocate(bytes, alignment) and deallocate(p, bytes, alignment)) and
/// returns the ns per operation; what is still live afterwards is freed, untimed, and also when a call throws.
template <class Allocator>
double run_ops(Allocator& a, const std::vector<op>& ops, std::size_t max_live)
{
  std::vector<std::pair<void*, std::size_t>> slots(max_live, {nullptr, 0});
  auto free_the_rest = [&] {
    for (auto [p, n] : slots)
      if (p != nullptr) a.deallocate(p, n, 256);
  };
  const auto start = std::chrono::steady_clock::now();
  try {
    for (const op& o : ops) {
      if (o.allocate) {
        slots[o.slot] = {a.allocate(o.bytes, 256), o.bytes};
      } else {
        a.deallocate(slots[o.slot].first, slots[o.slot].second, 256);
        slots[o.slot].first = nullptr;
      }
    }
  } catch (...) {
    free_the_rest();
    throw;
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / static_cast<double>(ops.size());
  free_the_rest();
  return ns;
}

} // namespace strata::bench
