// What the plug-in's default stack asks of CUDA per allocation in a PyTorch-style training loop, counted on
// the pretend GPU (no GPU needed): the loop of tests/device/torch/train.py, where a side stream copies each
// step's batch and record_stream keeps it for the main stream, against the same loop with no side stream.
// It counts the event records and event queries stream_ordered (the default stack's stream layer) and the
// plug-in's record_stream holding (recorded_uses) make, per allocation and per free. These are the calls
// (cudaEventRecord, cudaEventQuery: about a microsecond of host time each on a real GPU) that PyTorch's own
// caching allocator does not make in this loop; docs/pytorch.md ("Why strata is slower on GPT-2") uses them.
// "window" is stream_ordered's options::owner_cover_window: SIZE_MAX is the library's default; the plug-in sets 4096,
// about four GPT-2 steps of frees, which is 400 in this loop of 100 frees per step.
//   g++ -std=c++20 -O2 -DLIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE -Iinclude -Iplugin/src \
//     -I/usr/local/cuda/include/cccl -isystem /usr/local/cuda/include bench/torch_loop_sim.cpp -o /tmp/torch_loop_sim \
//     -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,/usr/local/cuda/lib64 && /tmp/torch_loop_sim
// The allocation pattern is GPT-2-like (12 layers, activations kept for the backward pass and freed there,
// temporaries freed at once), not a recorded trace: the ratios per operation are what it shows.
#include <cstdio>
#include <vector>

#include <strata/default_pool.hpp>

#include "recorded_uses.hpp"

using namespace strata;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

struct totals {
  std::uint64_t allocations = 0, frees = 0, records = 0, queries = 0, layer_events = 0, host_waits = 0;
};

/// `steps` training steps; the GPU catches up with all work issued at the start of every `lag`-th step (the
/// host runs up to `lag` steps ahead).
totals run(bool side_stream, std::size_t owner_cover_window, int lag, int steps, int measured_from)
{
  simulated_streams world;
  planning_pool::options opts;
  opts.owner_cover_window = owner_cover_window;
  planning_pool pool{mapped_pool<simulated_pages>{simulated_pages{2 * MiB, std::size_t{80} << 30}}, opts, simulated_events{world}};
  plugin::recorded_uses<simulated_events> uses;
  const cuda::stream_ref main = world.create(), side = world.create();
  totals t;
  totals at_start;
  auto allocate = [&](std::size_t bytes, cuda::stream_ref s) {
    void* p = pool.allocate_async(bytes, 256, s);
    ++t.allocations;
    uses.reap(pool.backend(), [&](void* q, std::size_t n, cudaStream_t home) { pool.deallocate_async(q, n, 256, cuda::stream_ref{home}); });
    world.launch(s);  // a kernel writes it
    return p;
  };
  auto free = [&](void* p, std::size_t bytes, cuda::stream_ref s) {
    ++t.frees;
    if (!uses.hold(pool.backend(), p, bytes, s.get())) pool.deallocate_async(p, bytes, 256, s);
  };
  for (int step = 0; step < steps; ++step) {
    if (step == measured_from) {
      at_start = t;
      at_start.records = world.calls().records;
      at_start.queries = world.calls().queries;
      at_start.layer_events = pool.stats().events;
      at_start.host_waits = pool.stats().host_waits;
    }
    if (step % lag == 0) {  // the GPU has caught up
      world.finish(main);
      world.finish(side);
    }
    // The batch, copied on the side stream (train.py's fetch), used by the main stream.
    const cuda::stream_ref batch_stream = side_stream ? side : main;
    void* x = allocate(64 * 1024, batch_stream);
    void* y = allocate(64 * 1024, batch_stream);
    if (side_stream) {
      uses.record(x, main.get());
      uses.record(y, main.get());
    }
    // Forward: per layer, five activations kept for the backward pass and one temporary.
    std::vector<std::pair<void*, std::size_t>> saved;
    for (int layer = 0; layer < 12; ++layer) {
      for (std::size_t bytes : {12 * MiB, 12 * MiB, 48 * MiB, 48 * MiB, 3 * MiB}) saved.push_back({allocate(bytes, main), bytes});
      void* tmp = allocate(6 * MiB, main);
      free(tmp, 6 * MiB, main);
    }
    void* logits = allocate(1608 * MiB, main);
    // Backward: the logits' gradient, then per layer two gradient temporaries and the layer's activations.
    void* dlogits = allocate(1608 * MiB, main);
    free(logits, 1608 * MiB, main);
    free(dlogits, 1608 * MiB, main);
    for (int layer = 11; layer >= 0; --layer) {
      void* g1 = allocate(12 * MiB, main);
      void* g2 = allocate(48 * MiB, main);
      free(g2, 48 * MiB, main);
      free(g1, 12 * MiB, main);
      for (int i = 0; i < 5; ++i) {
        free(saved.back().first, saved.back().second, main);
        saved.pop_back();
      }
    }
    // The batch goes at the step's end (del x, y): held until the main stream is done with it.
    free(x, 64 * 1024, batch_stream);
    free(y, 64 * 1024, batch_stream);
  }
  t.records = world.calls().records - at_start.records;
  t.queries = world.calls().queries - at_start.queries;
  t.layer_events = pool.stats().events - at_start.layer_events;
  t.host_waits = pool.stats().host_waits - at_start.host_waits;
  t.allocations -= at_start.allocations;
  t.frees -= at_start.frees;
  uses.destroy(pool.backend());
  return t;
}

void print(const char* name, const totals& t, int steps)
{
  std::printf("%-30s %7.1f %7.1f %11.2f %14.2f %11.2f %10.1f\n", name, double(t.allocations) / steps, double(t.frees) / steps,
              double(t.records) / double(t.frees), double(t.layer_events) / double(t.frees), double(t.queries) / double(t.allocations),
              double(t.host_waits) / steps);
}

} // namespace

int main()
{
  constexpr int steps = 40, measured_from = 10, measured = steps - measured_from;
  std::printf("GPT-2-like loop on the pretend GPU, steps %d-%d (steady state), per step and per operation\n", measured_from, steps - 1);
  std::printf("%-30s %7s %7s %11s %14s %11s %10s\n", "loop", "allocs", "frees", "records/free", "(stream layer)", "queries/alloc",
              "host waits");
  for (int lag : {1, 2, 3}) {
    std::printf("the GPU catches up every %d step(s)\n", lag);
    print("  main stream only", run(false, SIZE_MAX, lag, steps, measured_from), measured);
    print("  side stream, window SIZE_MAX", run(true, SIZE_MAX, lag, steps, measured_from), measured);
    print("  side stream, window 400", run(true, 400, lag, steps, measured_from), measured);
  }
}
