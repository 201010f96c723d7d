#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include <strata/detail/emptied_on_move.hpp>

using strata::detail::emptied_on_move;

namespace {
struct totals {
  std::size_t reserved = 0;
  std::size_t in_use = 0;
  int* last = nullptr;
};
} // namespace

static_assert(std::is_nothrow_move_constructible_v<emptied_on_move<totals>> && std::is_nothrow_move_assignable_v<emptied_on_move<totals>>);
static_assert(!std::is_copy_constructible_v<emptied_on_move<totals>>);

TEST_CASE("emptied_on_move: a move hands the value over and leaves a default one behind")
{
  int x = 0;
  emptied_on_move<totals> a;
  a.reserved = 10;
  a.in_use = 4;
  a.last = &x;
  emptied_on_move<totals> b(std::move(a));
  CHECK(b.reserved == 10);
  CHECK(b.in_use == 4);
  CHECK(b.last == &x);
  CHECK(a.reserved == 0);
  CHECK(a.in_use == 0);
  CHECK(a.last == nullptr);
  a.reserved = 3;  // usable again
  a = std::move(b);
  CHECK(a.reserved == 10);
  CHECK(b.reserved == 0);
  CHECK(b.last == nullptr);
}

TEST_CASE("emptied_on_move: containers and arrays come out empty")
{
  emptied_on_move<std::vector<int>> v;
  v.assign({1, 2, 3});
  emptied_on_move<std::vector<int>> w(std::move(v));
  CHECK(w.size() == 3);
  CHECK(v.empty());
  emptied_on_move<std::array<int*, 2>> p;
  int x = 0;
  p[0] = p[1] = &x;
  emptied_on_move<std::array<int*, 2>> q;
  q = std::move(p);
  CHECK(q[1] == &x);
  CHECK(p[0] == nullptr);
  CHECK(p[1] == nullptr);
}
