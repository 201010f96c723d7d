// A training-style loop that adapts to the memory it has: each step allocates activations in proportion to
// its batch; when the pool says out_of_memory, the step halves its batch and tries again instead of
// crashing. statistics reports the peak of each step.
#include <cstdio>
#include <vector>

#include <strata/adaptor/limit.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/core/errors.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/host_source.hpp>
#include "../gpu_or_host.hpp"

template <class Source>
int run(Source source, bool on_gpu)
{
  using pool = strata::coalescing_pool<Source>;
  // At most 1 GiB for activations in this example (a device shared with weights and optimizer state).
  strata::statistics<strata::limit<pool>> memory{strata::limit<pool>{pool{std::move(source)}, std::size_t{1} << 30}};
  constexpr std::size_t bytes_per_sample = 6 << 20;  // activations of one sample, over all layers
  constexpr int layers = 12;
  std::size_t batch = 512;
  for (int step = 0; step < 6; ++step) {
    for (;;) {
      std::vector<void*> activations;
      try {
        auto phase = memory.open_scope();
        for (int l = 0; l < layers; ++l) {
          activations.push_back(memory.allocate(batch * bytes_per_sample / layers));
          examples::touch(activations.back(), 4096, on_gpu);  // the forward pass writes them
        }
        for (void* p : activations) memory.deallocate(p, batch * bytes_per_sample / layers);
        std::printf("step %d: batch %4zu, peak %6.1f MiB\n", step, batch,
                    static_cast<double>(phase.so_far().peak_bytes) / (1 << 20));
        break;
      } catch (const strata::out_of_memory& e) {
        for (void* p : activations) memory.deallocate(p, batch * bytes_per_sample / layers);
        std::printf("step %d: batch %4zu does not fit (%s); halving\n", step, batch, e.what());
        batch /= 2;
        if (batch == 0) return 1;
      }
    }
  }
  const auto totals = memory.snapshot_counts();
  std::printf("final batch %zu; %zu allocations in all, peak %.1f MiB, %zu bytes still in use\n", batch,
              totals.total_blocks, static_cast<double>(totals.peak_bytes) / (1 << 20), totals.current_bytes);
  return totals.current_bytes == 0 && batch == 128 ? 0 : 1;
}

int main()
{
  if (examples::has_gpu()) {
    std::puts("adaptive_batch: on the GPU (device_source)");
    return run(strata::device_source{}, true);
  }
  std::puts("adaptive_batch: no GPU found, on host memory (host_source)");
  return run(strata::host_source{}, false);
}
