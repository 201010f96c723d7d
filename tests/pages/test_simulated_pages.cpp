#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include <strata/core/errors.hpp>
#include <strata/pages/simulated_pages.hpp>

using strata::simulated_pages;

namespace {
constexpr std::size_t page = std::size_t{2} << 20;
}

TEST_CASE("simulated_pages keeps the rules the driver enforces")
{
  simulated_pages pages;
  const std::uintptr_t base = pages.reserve(64 * page, std::size_t{1} << 30);
  CHECK(base % (std::size_t{1} << 30) == 0);
  const auto a = pages.create(4 * page);
  CHECK(pages.bytes_alive() == 4 * page);
  pages.map(base, a, 4 * page);
  CHECK_FALSE(pages.is_usable(base, 4 * page));  // mapped, but no access yet
  pages.set_access(base, 4 * page);
  CHECK(pages.is_usable(base + 100, 3 * page));
  CHECK_FALSE(pages.is_usable(base, 5 * page));
  const auto b = pages.create(page);
  CHECK_THROWS_AS(pages.map(base + 2 * page, b, page), std::logic_error);      // over a mapping
  CHECK_THROWS_AS(pages.map(base + 4 * page, b, 2 * page), std::logic_error);  // part of an allocation
  CHECK_THROWS_AS(pages.set_access(base + 4 * page, page), std::logic_error);  // nothing mapped there
  CHECK_THROWS_AS(pages.unmap(base, 2 * page), std::logic_error);              // part of a mapping
  CHECK_THROWS_AS(pages.unmap(base + page, page), std::logic_error);           // not where a mapping starts
  // One allocation at two addresses (aliases, as the driver allows): both count as mapped; one physical.
  pages.map(base + 8 * page, a, 4 * page);
  CHECK(pages.times_mapped(a) == 2);
  CHECK(pages.bytes_mapped() == 8 * page);
  CHECK(pages.bytes_alive() == 5 * page);
  pages.unmap(base + 8 * page, 4 * page);
  CHECK(pages.times_mapped(a) == 1);
  pages.unmap(base, 4 * page);
  CHECK(pages.bytes_mapped() == 0);
  CHECK(pages.times_mapped(a) == 0);
  pages.destroy(a);
  pages.destroy(b);
  CHECK(pages.bytes_alive() == 0);
  CHECK(pages.peak_bytes() == 5 * page);
  pages.unreserve(base, 64 * page);
  CHECK(pages.ranges_reserved() == 0);
  const auto& c = pages.counts();
  CHECK(c.creates == 2);
  CHECK(c.releases == 2);
  CHECK(c.maps == 2);
  CHECK(c.unmaps == 2);
  CHECK(c.access_calls == 1);
}

TEST_CASE("simulated_pages: capacity, injected failures and bad page sizes")
{
  CHECK_THROWS_AS(simulated_pages(3 << 20), std::invalid_argument);
  CHECK_THROWS_AS(simulated_pages(100), std::invalid_argument);
  simulated_pages pages(page, 4 * page);
  const auto a = pages.create(3 * page);
  CHECK_THROWS_AS((void)pages.create(2 * page), strata::out_of_memory);
  pages.fail_after(simulated_pages::operation::create, 0);
  CHECK_THROWS_AS((void)pages.create(page), strata::out_of_memory);
  const auto b = pages.create(page);  // the injected failure happened once
  pages.fail_after(simulated_pages::operation::synchronize, 1);
  pages.synchronize();
  CHECK_THROWS_AS(pages.synchronize(), std::runtime_error);
  pages.synchronize();
  pages.destroy(a);
  pages.destroy(b);
}

TEST_CASE("simulated_pages keeps contents per allocation: aliases see the same bytes, copies cross mappings, a destroyed allocation forgets")
{
  simulated_pages pages(page, 16 * page);
  const std::uintptr_t base = pages.reserve(16 * page, page);
  const auto a = pages.create(2 * page), b = pages.create(page);
  pages.map(base, a, 2 * page);
  pages.map(base + 2 * page, b, page);
  pages.set_access(base, 3 * page);
  std::vector<unsigned char> in(3000), out(3000);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 13);
  const std::uintptr_t across = base + 2 * page - 1000;  // the last 1000 bytes of a, the first 2000 of b
  pages.copy_to_device(across, in.data(), in.size());
  pages.copy_to_host(out.data(), across, out.size());
  CHECK(out == in);
  pages.map(base + 5 * page, a, 2 * page);  // an alias of a
  pages.set_access(base + 5 * page, 2 * page);
  unsigned char x = 0;
  pages.read(base + 7 * page - 1, &x, 1);
  CHECK(x == in[999]);
  unsigned char zero = 1;
  pages.read(base, &zero, 1);
  CHECK(zero == 0);  // never written
  CHECK_THROWS_AS(pages.read(base + 3 * page, &x, 1), std::logic_error);  // nothing mapped
  pages.unmap(base + 2 * page, page);
  pages.destroy(b);
  const auto c = pages.create(page);
  pages.map(base + 2 * page, c, page);
  pages.set_access(base + 2 * page, page);
  pages.read(base + 2 * page, &x, 1);
  CHECK(x == 0);  // b's bytes went with it
  CHECK(pages.free_bytes() == 16 * page - 3 * page);
  pages.unmap(base, 2 * page);
  pages.unmap(base + 5 * page, 2 * page);
  pages.unmap(base + 2 * page, page);
  pages.destroy(a);
  pages.destroy(c);
}

TEST_CASE("simulated_pages pins plain host memory, counted, and refuses pins and copies on request")
{
  simulated_pages pages;
  void* p = pages.pin(1000);
  CHECK(pages.pinned_bytes() == 1000);
  pages.fail_after(simulated_pages::operation::pin, 0);
  CHECK_THROWS_AS(pages.pin(10), strata::out_of_memory);
  pages.fail_after(simulated_pages::operation::finish_copies, 0);
  CHECK_THROWS_AS(pages.finish_copies(), std::runtime_error);
  pages.finish_copies();  // once
  pages.unpin(p, 1000);
  CHECK(pages.pinned_bytes() == 0);
}

TEST_CASE("simulated_pages: one access call may cover allocations mapped back to back, never a hole between them")
{
  simulated_pages pages;
  const std::uintptr_t base = pages.reserve(16 * page, std::size_t{1} << 30);
  const auto a = pages.create(2 * page), b = pages.create(page), c = pages.create(page);
  pages.map(base, a, 2 * page);
  pages.map(base + 2 * page, b, page);
  pages.map(base + 4 * page, c, page);  // page 3 left unmapped
  CHECK_THROWS_AS(pages.set_access(base, 5 * page), std::logic_error);
  CHECK_FALSE(pages.is_usable(base, page));  // the refused call granted nothing
  pages.set_access(base, 3 * page);
  CHECK(pages.is_usable(base, 3 * page));
  CHECK_FALSE(pages.is_usable(base + 4 * page, page));
  CHECK(pages.counts().access_calls == 1);
  pages.unmap(base, 2 * page);
  pages.unmap(base + 2 * page, page);
  pages.unmap(base + 4 * page, page);
  for (const auto p : {a, b, c}) pages.destroy(p);
  CHECK(pages.bytes_alive() == 0);
}
