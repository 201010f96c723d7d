// stream_ordered's capture path (detail::stream_ordered_impl, "Capture"): what the layer does when it cannot
// tell whether a stream is being captured.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>
#include <random>
#include <stdexcept>
#include <vector>

#include <strata/adaptor/checked.hpp>
#include <strata/adaptor/segregator.hpp>
#include <strata/default_pool.hpp>
#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>
#include "support/conformance.hpp"
#include "support/spy.hpp"

using namespace strata;
using strata::testing::spy;

// stream_ordered when the capture query itself fails (cuda_events::capturing throws when neither the driver nor
// the runtime can answer, as CUDA_ERROR_INVALID_CONTEXT from cuStreamIsCapturing on a thread without a
// context). The layer must assume the worst: an allocation fails with nothing changed; a free while a capture
// may be under way abandons its block instead of asking the stream's id (which would invalidate the capture) or
// filing it for reuse; with no capture known, a free goes back by its stream's id.
namespace capture_query_failure_tests {

namespace {

/// simulated_events whose capture query throws while `fail` is set, and which counts the ids asked of a
/// capturing stream (the simulated driver also throws for those, but the layer catches that).
class flaky_events : public simulated_events {
public:
  explicit flaky_events(simulated_streams& world) : simulated_events(world), world_(&world) {}
  bool capturing(cuda::stream_ref stream) const
  {
    if (*fail) throw std::runtime_error("cuStreamIsCapturing: invalid device context (injected)");
    return simulated_events::capturing(stream);
  }
  /// Its capture query is the one that fails.
  stream_query capture_then_id(cuda::stream_ref stream) const
  {
    if (capturing(stream)) return {true, 0};
    return {false, id_of(stream)};
  }
  std::uint64_t id_of(cuda::stream_ref stream) const
  {
    if (world_->capturing(stream)) ++*ids_asked_under_capture;
    return simulated_events::id_of(stream);
  }
  std::shared_ptr<bool> fail = std::make_shared<bool>(false);
  std::shared_ptr<int> ids_asked_under_capture = std::make_shared<int>(0);

private:
  simulated_streams* world_;
};

using pool_t = coalescing_pool<ref<simulated_source>>;
using layer_t = stream_ordered<pool_t, flaky_events>;

struct rig {
  rig() : memory(std::size_t{64} << 20), layer(pool_t{ref<simulated_source>(memory), {.initial_chunk = 1 << 20, .max_chunk = 1 << 20}}, {}, flaky_events(world)) {}
  bool& fail() { return *layer.backend().fail; }
  simulated_streams world;
  simulated_source memory;
  layer_t layer;
};

} // namespace

TEST_CASE("capture query failure during a capture: the free abandons its block and asks no id")
{
  rig r;
  const cuda::stream_ref s = r.world.create();
  r.layer.deallocate_async(r.layer.allocate_async(4096, 256, s), 4096, 256, s);  // s owns the layer
  void* before = r.layer.allocate_async(8192, 256, s);                            // made outside the capture
  r.world.begin_capture(s);
  void* captured = r.layer.allocate_async(4096, 256, s);  // the layer now knows of the capture
  REQUIRE(captured != nullptr);
  const auto abandoned = r.layer.stats().abandoned_blocks;
  const std::size_t in_use = r.layer.usage().in_use;

  r.fail() = true;
  r.layer.deallocate_async(before, 8192, 256, s);
  CHECK(r.layer.stats().abandoned_blocks == abandoned + 1);
  CHECK(*r.layer.backend().ids_asked_under_capture == 0);
  CHECK(r.layer.usage().in_use == in_use);  // never handed back: the graph may use it
  // The identified_stream overload too.
  void* second = nullptr;
  r.fail() = false;
  second = r.layer.allocate_async(4096, 256, s);
  r.fail() = true;
  r.layer.deallocate_async(second, 4096, 256, identified_stream(s, 12345));
  CHECK(r.layer.stats().abandoned_blocks == abandoned + 2);
  CHECK(*r.layer.backend().ids_asked_under_capture == 0);

  // An allocation whose query fails throws, with nothing changed.
  const std::size_t in_use_now = r.layer.usage().in_use;
  CHECK_THROWS_AS(r.layer.allocate_async(4096, 256, s), std::runtime_error);
  CHECK(r.layer.usage().in_use == in_use_now);

  // Once the queries answer again, the capture ends normally and the layer serves allocations again.
  r.fail() = false;
  r.layer.deallocate_async(captured, 4096, 256, s);
  r.world.destroy_graph(r.world.end_capture(s));
  r.world.launch(s);
  void* after = r.layer.allocate_async(4096, 256, s);
  CHECK(after != nullptr);
  r.layer.deallocate_async(after, 4096, 256, s);
}

TEST_CASE("capture query failure with no capture known: the free goes back by the stream's id")
{
  rig r;
  const cuda::stream_ref s = r.world.create();
  r.layer.deallocate_async(r.layer.allocate_async(4096, 256, s), 4096, 256, s);  // s owns the layer
  const std::size_t in_use = r.layer.usage().in_use;
  void* p = r.layer.allocate_async(65536, 256, s);
  CHECK(r.layer.usage().in_use > in_use);
  r.fail() = true;
  r.layer.deallocate_async(p, 65536, 256, s);
  CHECK(r.layer.stats().abandoned_blocks == 0);
  CHECK(r.layer.usage().in_use == in_use);
  r.fail() = false;
  CHECK(r.layer.allocate_async(65536, 256, s) == p);  // reused: it was returned, not lost
}

} // namespace capture_query_failure_tests
