#pragma once
// The conformance suite every strata resource instantiates in a few lines:
//   TEST_CASE("host_source conforms") { host_source r; check_conformance(r, {.max_alignment = 1 << 20}); }
// It checks the rules of docs/architecture.md that hold for every box: alignment for every power of two it claims,
// sizes 0/1/odd/huge, bad alignments rejected, out-of-memory leaving it usable, equality, properties.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include "invariants.hpp"

namespace strata::testing {

struct conformance_limits {
  std::size_t max_alignment = default_alignment;  ///< alignments up to this are tried (and must be honoured)
  std::size_t rejects_above = default_alignment;  ///< twice this must be rejected; 0: the box has no limit to test
  bool host_accessible = false;                   ///< whether the memory may be touched from the host
  bool device_accessible = false;
  std::size_t huge = SIZE_MAX / 2;  ///< a request the box must refuse with out_of_memory; 0: do not try
};

template <class R>
void check_still_usable(R& r)
{
  void* p = r.allocate(1000, default_alignment);
  REQUIRE(p != nullptr);
  CHECK(is_aligned(p, default_alignment));
  r.deallocate(p, 1000, default_alignment);
}

/// DESIGN rule 6 for a pool over a spy: moving hands the blocks over, the moved-from pool reports nothing
/// held and serves again (its blocks are its own, not the new owner's).
template <class Pool>
void check_move_leaves_empty_usable(Pool a)
{
  void* p = a.allocate(1000);
  Pool b(std::move(a));
  CHECK(a.usage() == strata::usage{});  // NOLINT(bugprone-use-after-move): the rule under test
  void* q = a.allocate(1000);
  CHECK(a.owns(q));
  CHECK_FALSE(b.owns(q));
  a.deallocate(q, 1000);
  b.deallocate(p, 1000);
}

template <class R>
void check_conformance(R& r, const conformance_limits& limits)
{
  static_assert(resource<R>);
  static_assert(answers_to_cccl31_names<R>);
  CHECK(has_property<R, host_accessible> == limits.host_accessible);
  CHECK(has_property<R, device_accessible> == limits.device_accessible);
  CHECK(r == r);

  SUBCASE("every power-of-two alignment it claims")
  {
    for (std::size_t a = 1; a <= limits.max_alignment; a *= 2) {
      CAPTURE(a);
      void* p = r.allocate(100, a);
      REQUIRE(p != nullptr);
      CHECK(is_aligned(p, effective_alignment(a)));
      r.deallocate(p, 100, a);
    }
  }
  SUBCASE("sizes 0, 1, odd and large, without overlap")
  {
    CHECK(r.allocate(0, default_alignment) == nullptr);
    r.deallocate(nullptr, 0, default_alignment);
    r.deallocate(nullptr, 64, default_alignment);
    live_set live;
    for (std::size_t bytes : {std::size_t{1}, std::size_t{3}, std::size_t{255}, std::size_t{256}, std::size_t{257},
                              std::size_t{4097}, std::size_t{65'537}, std::size_t{3'000'001}}) {
      CAPTURE(bytes);
      void* p = r.allocate(bytes, default_alignment);
      REQUIRE(p != nullptr);
      CHECK(is_aligned(p, default_alignment));
      CHECK(live.add({p, bytes, default_alignment}));
      if constexpr (has_property<R, host_accessible>) std::memset(p, 0xab, bytes);
    }
    while (live.size() > 0) {
      const auto b = live.take(0);
      r.deallocate(b.p, b.bytes, b.alignment);
    }
  }
  SUBCASE("bad alignments are rejected and leave it usable")
  {
    for (std::size_t a : {std::size_t{0}, std::size_t{3}, std::size_t{24}, std::size_t{1000}}) {
      CAPTURE(a);
      CHECK_THROWS_AS((void)r.allocate(256, a), std::invalid_argument);
    }
    if (limits.rejects_above != 0) CHECK_THROWS_AS((void)r.allocate(256, limits.rejects_above * 2), std::invalid_argument);
    check_still_usable(r);
  }
  SUBCASE("huge requests are out_of_memory naming the size, and leave it usable")
  {
    if (limits.huge == 0) return;  // the box must not be asked (managed memory can hang the GPU)
    for (std::size_t bytes : {limits.huge, SIZE_MAX}) {
      CAPTURE(bytes);
      try {
        (void)r.allocate(bytes, default_alignment);
        FAIL("a request of " << bytes << " bytes succeeded");
      } catch (const out_of_memory& e) {
        CHECK(std::string(e.what()).find(std::to_string(bytes)) != std::string::npos);
        CHECK(e.requested() == bytes);
      }
    }
    check_still_usable(r);
  }
}

} // namespace strata::testing
