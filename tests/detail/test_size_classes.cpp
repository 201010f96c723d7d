// detail/size_classes.hpp and detail/tlsf_mapping.hpp: the generated tables and mappings.
#include <doctest/doctest.h>

#include <bit>

#include <strata/detail/size_classes.hpp>
#include <strata/detail/tlsf_mapping.hpp>

using namespace strata::detail;

TEST_CASE("size classes: 256-byte steps to 2 KiB, then four per doubling, generated")
{
  constexpr auto table = make_class_table<std::size_t{1} << 20>();
  static_assert(table.front() == 256 && table.back() == (1 << 20));
  static_assert(table.size() == 8 + 4 * 9);
  CHECK(table[7] == 2048);
  CHECK(table[8] == 2560);
  CHECK(table[11] == 4096);
  for (std::size_t i = 1; i < table.size(); ++i) CHECK(table[i] > table[i - 1]);  // monotone
  for (std::size_t i = 0; i < table.size(); ++i) CHECK(table[i] % 256 == 0);
}

TEST_CASE("size classes: every size maps to the smallest class that fits, wasting at most 20% above 2 KiB")
{
  constexpr std::size_t largest = std::size_t{1} << 20;
  constexpr auto table = make_class_table<largest>();
  double worst = 0;
  for (std::size_t bytes = 1; bytes <= largest; bytes += (bytes < 65536 ? 1 : 97)) {
    const std::size_t c = class_index(bytes);
    REQUIRE(c < table.size());
    REQUIRE(table[c] >= bytes);
    if (c > 0) REQUIRE(table[c - 1] < bytes);
    if (bytes > 2048) worst = std::max(worst, 1.0 - static_cast<double>(bytes) / static_cast<double>(table[c]));
  }
  for (std::size_t c = 0; c < table.size(); ++c) {  // the exact boundaries
    CHECK(class_index(table[c]) == c);
    if (table[c] > 256) CHECK(class_index(table[c] - 1) == (c > 0 && table[c] - 1 <= table[c - 1] ? c - 1 : c));
    if (c + 1 < table.size()) CHECK(class_index(table[c] + 1) == c + 1);
  }
  CHECK(worst <= 0.20);
  CHECK(worst > 0.19);  // the bound is tight: 2049 bytes take a 2560-byte block
}

TEST_CASE("TLSF mapping around every power of two")
{
  using namespace strata::detail::tlsf;
  for (std::size_t granules = 1; granules < 64; ++granules) {
    const auto i = mapping_insert(granules);
    CHECK(list_floor(i) <= granules);
  }
  for (unsigned e = 5; e < 50; ++e) {
    for (std::size_t granules : {(std::size_t{1} << e) - 1, std::size_t{1} << e, (std::size_t{1} << e) + 1}) {
      CAPTURE(granules);
      const auto filed = mapping_insert(granules);
      const auto searched = mapping_search(granules);
      CHECK(list_floor(filed) <= granules);        // a block is filed in a list whose floor it reaches
      CHECK(list_floor(searched) >= granules);     // every block in the searched list is large enough
      // The rounding of a search loses at most 1/32 of the request.
      CHECK(static_cast<double>(list_floor(searched) - granules) <= static_cast<double>(granules) / 32.0 + 1);
      if (granules == (std::size_t{1} << e)) CHECK(filed == searched);
    }
  }
  CHECK(mapping_insert(32).first == 1);
  CHECK(mapping_insert(32).second == 0);
  CHECK(mapping_insert(63).second == 31);
}
