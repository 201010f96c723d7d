// detail::capture_guard: captures seen in calls on their streams, and the host waits refused meanwhile.
#include <doctest/doctest.h>

#include <utility>

#include <strata/core/errors.hpp>
#include <strata/detail/stream/capture_guard.hpp>
#include <strata/stream/simulated_streams.hpp>

using namespace strata;

TEST_CASE("capture_guard: a capture seen refuses host waits until a call on its stream sees it end")
{
  simulated_streams world;
  simulated_events backend(world);
  const auto s = world.create();
  detail::capture_guard guard;
  guard.refuse_host_wait(backend);  // nothing captures: allowed
  world.begin_capture(s);
  CHECK(guard.captures(backend, s));
  CHECK(guard.any());
  CHECK_THROWS_AS(guard.refuse_host_wait(backend), usage_error);
  world.end_capture(s);
  CHECK_THROWS_AS(guard.refuse_host_wait(backend), usage_error);  // not asked about the stream since
  CHECK_FALSE(guard.captures(backend, s));
  CHECK_FALSE(guard.any());
  guard.refuse_host_wait(backend);
}

TEST_CASE("capture_guard: a capture known by id is forgotten when its graph goes, one routed when its route ends")
{
  simulated_streams world;
  simulated_events backend(world);
  const auto a = world.create(), b = world.create();
  detail::capture_guard guard;
  const std::uint64_t id = world.begin_capture(a);
  world.begin_capture(b);
  guard.note(backend, a);  // the id is asked of the backend
  const std::uint64_t pool = 42, other_id = world.capture_of(b).id;
  guard.note(backend, b, &other_id, &pool);
  guard.forget_capture(id);
  CHECK(guard.any());
  guard.forget_route(7);
  CHECK(guard.any());
  guard.forget_route(pool);
  CHECK_FALSE(guard.any());
}

TEST_CASE("capture_guard: the capture mode is relaxed around a call only while a capture may go on")
{
  simulated_streams world;
  simulated_events backend(world);
  const auto s = world.create();
  detail::capture_guard guard;
  const auto exchanges = world.mode_exchanges();
  CHECK(guard.relaxed(backend, [] { return 3; }) == 3);
  CHECK(world.mode_exchanges() == exchanges);
  world.begin_capture(s);
  guard.note(backend, s);
  CHECK(guard.relaxed(backend, [] { return 4; }) == 4);
  CHECK(world.mode_exchanges() == exchanges + 2);  // relaxed, then restored
  detail::capture_guard moved(std::move(guard));
  CHECK_FALSE(guard.any());
  CHECK(moved.any());
  world.end_capture(s);
}

TEST_CASE("capture_guard: a capture query asked together with the id is filed as captures() files it")
{
  simulated_streams world;
  simulated_events backend(world);
  const auto s = world.create(), t = world.create();
  detail::capture_guard guard;
  const std::uint64_t capture = world.begin_capture(s);
  const stream_query q = backend.capture_then_id(s);
  CHECK(q.capturing);
  CHECK(guard.saw(backend, s, q.capturing));
  CHECK(guard.any());
  CHECK_THROWS_AS(guard.refuse_host_wait(backend), usage_error);
  const stream_query other = backend.capture_then_id(t);
  CHECK_FALSE(guard.saw(backend, t, other.capturing));  // another stream not capturing: s stays known
  CHECK(guard.any());
  guard.forget_capture(capture);  // its id was asked when it was first seen
  CHECK_FALSE(guard.any());
  guard.saw(backend, s, true);
  world.end_capture(s);
  CHECK_FALSE(guard.saw(backend, s, backend.capture_then_id(s).capturing));  // a call on s sees it over
  CHECK_FALSE(guard.any());
  guard.refuse_host_wait(backend);
}
