// detail::borrowed_pages: the page backend mapped_pool lends to every tag's pool, forwarding each call to its
// owner; waits the owner has covered are skipped.
#include <doctest/doctest.h>

#include <strata/detail/pages/borrowed_pages.hpp>
#include <strata/pages/simulated_pages.hpp>

using namespace strata;

TEST_CASE("borrowed_pages: every call reaches the lender, which a move can re-point")
{
  simulated_pages a(2 << 20, 8 << 20), b(2 << 20);
  detail::borrowed_pages<simulated_pages> pages(&a);
  static_assert(copying_page_backend<detail::borrowed_pages<simulated_pages>>);
  const auto base = pages.reserve(4 << 20, 2 << 20);
  const auto p = pages.create(2 << 20);
  pages.map(base, p, 2 << 20);
  pages.set_access(base, 2 << 20);
  CHECK(a.is_usable(base, 2 << 20));
  const unsigned char in[4] = {1, 2, 3, 4};
  pages.copy_to_device(base + 8, in, 4);
  unsigned char out[4] = {};
  pages.copy_to_host(out, base + 8, 4);
  CHECK(out[3] == 4);
  CHECK(pages.free_bytes() == (6u << 20));
  pages.unmap(base, 2 << 20);
  pages.destroy(p);
  pages.unreserve(base, 4 << 20);
  CHECK(a.counts().creates == 1);
  CHECK(&pages.counts() == &a.counts());
  pages.lend(&b);
  CHECK(&pages.lender() == &b);
}

TEST_CASE("borrowed_pages: with its waits covered, synchronize waits for nothing; the other calls still reach the lender")
{
  simulated_pages lender(2 << 20);
  detail::borrowed_pages<simulated_pages> one(&lender), two(&lender);
  one.synchronize();
  CHECK(lender.counts().synchronizes == 1);
  one.cover_waits(true);
  one.synchronize();  // the owner's last wait covers this borrower's memory
  two.synchronize();  // another borrower of the same lender is not covered
  CHECK(lender.counts().synchronizes == 2);
  const auto base = one.reserve(2 << 20, 2 << 20);
  const auto p = one.create(2 << 20);
  one.map(base, p, 2 << 20);
  one.unmap(base, 2 << 20);
  CHECK(lender.counts().unmaps == 1);
  one.destroy(p);
  one.unreserve(base, 2 << 20);
  one.cover_waits(false);
  one.synchronize();
  CHECK(lender.counts().synchronizes == 3);
}
