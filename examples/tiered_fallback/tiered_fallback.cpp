// GPU memory first, pinned host memory when the device pool is full: fallback routes each request to the
// first tier that can serve it and each free back to the tier that owns the pointer. Kernels can read both
// tiers (pinned memory is device-accessible), so the program carries on, slower, instead of failing.
#include <cstdio>
#include <vector>

#include <strata/adaptor/fallback.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/pinned_source.hpp>
#include "../gpu_or_host.hpp"

template <class Fast, class Slow>
int run(Fast fast, Slow slow, bool on_gpu)
{
  // The fast tier may hold at most 256 MiB: think of a device shared with a model's weights.
  using fast_pool = strata::coalescing_pool<Fast>;
  using slow_pool = strata::coalescing_pool<Slow>;
  strata::fallback<fast_pool, slow_pool> tiers{
    fast_pool{std::move(fast), {.initial_chunk = 64 << 20, .max_chunk = 64 << 20, .max_reserved = 256 << 20}},
    slow_pool{std::move(slow), {.initial_chunk = 64 << 20}}};
  std::vector<void*> buffers;
  for (int i = 0; i < 24; ++i) {
    buffers.push_back(tiers.allocate(16 << 20));
    examples::touch(buffers.back(), 16 << 20, on_gpu);
  }
  std::printf("24 buffers of 16 MiB: %zu from the fast tier, %zu from the slow tier\n", tiers.served_by_primary(),
              tiers.served_by_secondary());
  std::size_t fast_owned = 0;
  for (void* p : buffers) fast_owned += tiers.primary().owns(p) ? 1 : 0;
  for (void* p : buffers) tiers.deallocate(p, 16 << 20);
  std::printf("each free went back to its tier: fast pool in use %zu bytes, slow pool in use %zu bytes (%zu were fast)\n",
              tiers.primary().usage().in_use, tiers.secondary().usage().in_use, fast_owned);
  examples::expect(tiers.served_by_primary() == 16 && tiers.served_by_secondary() == 8 && fast_owned == 16,
                   "the fast tier serves its 256 MiB, the slow tier the rest");
  examples::expect(tiers.primary().usage().in_use == 0 && tiers.secondary().usage().in_use == 0, "each free reached its tier");
  return examples::status();
}

int main()
{
  if (examples::has_gpu()) {
    std::puts("tiered_fallback: on the GPU (device_source first, then pinned_source)");
    return run(strata::device_source{}, strata::pinned_source{}, true);
  }
  std::puts("tiered_fallback: no GPU found, two host tiers (host_source, then host_source)");
  return run(strata::host_source{}, strata::host_source{}, false);
}
