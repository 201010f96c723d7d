// detail::event_ledger: events recorded after frees, retired into spares and recorded into again.
#include <doctest/doctest.h>

#include <stdexcept>
#include <utility>

#include <strata/detail/stream/event_ledger.hpp>
#include <strata/stream/simulated_streams.hpp>

using namespace strata;

TEST_CASE("event_ledger: a retired event is recorded into again instead of a new one being made")
{
  simulated_streams world;
  simulated_events backend(world);
  const auto s = world.create();
  detail::event_ledger<simulated_events::event> ledger;
  detail::event_ledger<simulated_events::event>::queue q;
  const auto record = [&](auto e) { backend.record(e, s); };
  ledger.record_into(q, backend, 0, 3, record);
  ledger.record_into(q, backend, 0, 7, record);
  CHECK(ledger.pending() == 2);
  CHECK(world.live_events() == 2);
  CHECK(q.front().covers_below == 3);
  ledger.retire_front(q);
  CHECK(ledger.pending() == 1);
  ledger.record_into(q, backend, 0, 9, record);
  CHECK(world.live_events() == 2);  // the spare was used
  CHECK(q.back().covers_below == 9);
  detail::event_ledger<simulated_events::event>::destroy(backend, q);
  ledger.destroy_own(backend);
  CHECK(world.live_events() == 0);
  CHECK(ledger.empty());
}

TEST_CASE("event_ledger: a failed record leaves the event spare and nothing pending")
{
  simulated_streams world;
  simulated_events backend(world);
  detail::event_ledger<simulated_events::event> ledger;
  detail::event_ledger<simulated_events::event>::queue q;
  CHECK_THROWS_AS(ledger.record_into(q, backend, 0, 1, [](auto) { throw std::runtime_error("record failed"); }),
                  std::runtime_error);
  CHECK(q.empty());
  CHECK(ledger.pending() == 0);
  CHECK_FALSE(ledger.empty());  // one spare
  ledger.destroy_own(backend);
  CHECK(world.live_events() == 0);
}

TEST_CASE("event_ledger: a move hands the owner's events and the spares over and leaves the ledger empty")
{
  simulated_streams world;
  simulated_events backend(world);
  const auto s = world.create();
  detail::event_ledger<simulated_events::event> a;
  a.record_into(a.owner_events(), backend, 0, 5, [&](auto e) { backend.record(e, s); });
  detail::event_ledger<simulated_events::event> b(std::move(a));
  CHECK(a.empty());
  CHECK(a.pending() == 0);
  CHECK(b.pending() == 1);
  CHECK(b.owner_events().size() == 1);
  a = std::move(b);
  CHECK(b.empty());
  CHECK(a.owner_events().back().covers_below == 5);
  a.destroy_own(backend);
  CHECK(world.live_events() == 0);
}
