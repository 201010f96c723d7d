#include <doctest/doctest.h>

#include <thread>

#include <strata/sleep/tag_scope.hpp>

using namespace strata;

TEST_CASE("tag_scope: nests, restores, and belongs to its thread")
{
  CHECK(current_tag() == 0);
  {
    tag_scope a(3);
    CHECK(current_tag() == 3);
    {
      tag_scope b(9);
      CHECK(current_tag() == 9);
      tag_id seen = 99;
      std::thread([&] { seen = current_tag(); }).join();
      CHECK(seen == 0);
    }
    CHECK(current_tag() == 3);
  }
  CHECK(current_tag() == 0);
}
