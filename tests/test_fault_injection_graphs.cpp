// stream_ordered's private pools (CUDA graphs) under the fault injector (support/fault_injection.hpp): the
// workload alternates between a stream being captured (its allocations go to the capture's private pool, tied
// to the graph by a user object) and an ordinary stream, and is replayed once for every upstream call with
// that call refused and once for every host allocation with that one throwing. After each exception the
// layer's usage, its private pools and the upstream are exactly as before; the graph's end returns everything.
// Built into strata_fault_tests only: it replaces the global operator new.
#include <doctest/doctest.h>

#include <memory>

#include <strata/core/ref.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/host_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "support/fault_injection.hpp"
#include "support/spy.hpp"

using namespace strata;

namespace {
using host_spy = testing::spy<host_source>;
using host_pool = size_class_pool<ref<host_spy>>;

/// Even steps on the captured stream, odd ones on the other. The capture begins with each run and ends (its
/// graph destroyed) at the sweep's final "still usable" allocation, so the run's last frees and the layer's
/// destruction happen outside capture, after the pool was released.
struct half_captured {
  std::shared_ptr<simulated_streams> world = std::make_shared<simulated_streams>();
  cuda::stream_ref captured = world->create(), plain = world->create();
  std::size_t steps = 0;  ///< the script's length: the final allocation's step

  void start_run()
  {
    if (world->capturing(captured)) world->destroy_graph(world->end_capture(captured));
    world->begin_capture(captured);
  }
  template <class Box>
  void* allocate(Box& box, std::size_t bytes, std::size_t alignment, std::size_t step)
  {
    if (step >= steps && world->capturing(captured)) world->destroy_graph(world->end_capture(captured));
    return box.allocate_async(bytes, alignment, step % 2 == 0 ? captured : plain);
  }
  template <class Box>
  void deallocate(Box& box, void* p, std::size_t bytes, std::size_t alignment, std::size_t allocated_at)
  {
    const cuda::stream_ref s = allocated_at % 2 == 0 ? captured : plain;
    if (!world->capturing(s)) world->launch(s);
    box.deallocate_async(p, bytes, alignment, s);
  }
  template <class Box>
  std::array<std::size_t, 2> extra(const Box& box) const
  {
    return {box.private_pool_blocks(), box.private_pools()};
  }
};
} // namespace

TEST_CASE("fault injection: stream_ordered's private pools under capture")
{
  using layer = stream_ordered<host_pool, simulated_events>;
  const testing::fault_workload w{};
  half_captured calls;
  calls.steps = w.operations;
  const auto r = testing::sweep_faults<host_spy>(
    [&calls](host_spy& up) {
      return std::make_unique<layer>(host_pool{ref(up), {.chunk_size = 1 << 20}}, layer::options{}, simulated_events(*calls.world));
    },
    w, calls);
  CHECK(r.upstream_calls > 3);
  CHECK(r.refusal_exceptions > 0);
  CHECK(r.host_allocations > 0);
  CHECK(r.host_exceptions > 0);
}
