#include <doctest/doctest.h>

#include <cstddef>
#include <limits>

#include <strata/core/errors.hpp>
#include <strata/sleep/pinned_host.hpp>

TEST_CASE("pin_host: nothing to pin is a null pointer, and unpinning it is a no-op")
{
  CHECK(strata::pin_host(0) == nullptr);
  strata::unpin_host(nullptr, 0);
}

TEST_CASE("pin_host: a size whose rounding to whole chunks would wrap is out_of_memory before any call")
{
  constexpr std::size_t most = std::numeric_limits<std::size_t>::max();
  for (const std::size_t bytes : {most, most - 1, most - strata::pinned_host_layout::chunk, most - 2 * strata::pinned_host_layout::chunk + 1})
    CHECK_THROWS_AS(strata::pin_host(bytes), strata::out_of_memory);
}
