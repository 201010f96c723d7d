#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include <strata/core/ref.hpp>
#include <strata/detail/upstream_chunks.hpp>
#include <strata/source/simulated_source.hpp>
#include "support/spy.hpp"

using namespace strata;
using strata::testing::spy;

namespace {
struct chunk {
  std::size_t size = 0;
  std::size_t alignment = 0;
  int tag = 0;
};
using chunks_t = detail::upstream_chunks<ref<spy<simulated_source>>, chunk>;

void take(chunks_t& chunks, std::size_t size)
{
  void* p = chunks.upstream().allocate(size, 256);
  chunks.emplace(reinterpret_cast<std::uintptr_t>(p), chunk{size, 256, 1});
}
} // namespace

TEST_CASE("upstream_chunks: every chunk goes back to the upstream when the set goes")
{
  spy<simulated_source> upstream;
  {
    chunks_t chunks{ref(upstream)};
    take(chunks, 4096);
    take(chunks, 8192);
    CHECK(upstream.outstanding_bytes() == 4096 + 8192);
  }
  CHECK(upstream.outstanding_bytes() == 0);
}

TEST_CASE("upstream_chunks: a move hands the chunks over and leaves an empty, usable set")
{
  spy<simulated_source> upstream;
  chunks_t a{ref(upstream)};
  take(a, 4096);
  chunks_t b(std::move(a));
  CHECK(b.size() == 1);
  CHECK(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from set is specified empty
  CHECK(upstream.outstanding_bytes() == 4096);
  b.give_back_all();
  CHECK(b.empty());
  CHECK(upstream.outstanding_bytes() == 0);
}

TEST_CASE("upstream_chunks: a move assignment gives the assigned-to set's chunks back first")
{
  spy<simulated_source> first, second;
  chunks_t a{ref(first)};
  chunks_t b{ref(second)};
  take(a, 4096);
  take(b, 8192);
  a = std::move(b);
  CHECK(first.outstanding_bytes() == 0);  // a's chunk went back to a's own upstream
  CHECK(second.outstanding_bytes() == 8192);
  CHECK(a.size() == 1);
  CHECK(&a.upstream().get() == &second);
  CHECK(b.empty());  // NOLINT(bugprone-use-after-move)
  take(b, 256);  // usable: over the moved-from upstream, which refers to the same source
  CHECK(second.outstanding_bytes() == 8192 + 256);
}
