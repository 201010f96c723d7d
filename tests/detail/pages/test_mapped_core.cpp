#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include <strata/detail/pages/mapped_core.hpp>
#include <strata/pages/simulated_pages.hpp>

using namespace strata;
using core_t = detail::mapped_core<simulated_pages>;

namespace {
constexpr std::size_t mib = std::size_t{1} << 20;
}

TEST_CASE("mapped_core: live blocks listed in address order come back at their addresses after being freed")
{
  core_t pool;
  std::vector<void*> ps;
  for (std::size_t n : {std::size_t{100 * 1024}, 3 * mib, std::size_t{4096}, 7 * mib, std::size_t{256}}) ps.push_back(pool.allocate(n));
  CHECK(pool.in_ranges(ps[0]));
  CHECK_FALSE(pool.in_ranges(&pool));
  const auto live = pool.live_blocks();
  REQUIRE(live.size() == 5);
  for (std::size_t i = 1; i < live.size(); ++i) CHECK(live[i - 1].first < live[i].first);
  for (void* p : ps) CHECK(pool.take_back(p));
  CHECK_FALSE(pool.take_back(ps[0]));
  CHECK(pool.release() > 0);
  CHECK(pool.physical_bytes() == 0);
  pool.restore(live);
  for (const auto& [address, size] : live) {
    CHECK(pool.owns(reinterpret_cast<void*>(address)));
    CHECK(pool.backend().is_usable(address, size));
  }
  CHECK(pool.usage().in_use == 3 * mib + 7 * mib + 100 * 1024 + 4096 + 256);
  CHECK_THROWS_AS(pool.restore({live[0]}), std::logic_error);  // not free
}

TEST_CASE("mapped_core: a restore the device refuses half way hands nothing out and keeps nothing")
{
  core_t pool(simulated_pages(2 * mib, 64 * mib), {});
  void* a = pool.allocate(20 * mib);
  void* b = pool.allocate(20 * mib);
  const auto live = pool.live_blocks();
  (void)pool.take_back(a);
  (void)pool.take_back(b);
  (void)pool.release();
  pool.backend().fail_after(simulated_pages::operation::map, 1);
  CHECK_THROWS(pool.restore(live));
  CHECK(pool.usage().in_use == 0);
  CHECK(pool.physical_bytes() == 0);
  CHECK(pool.backend().bytes_alive() == 0);
  pool.restore(live);
  CHECK(pool.owns(a));
  CHECK(pool.owns(b));
}
