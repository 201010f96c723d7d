// mapped_pool's tags, pause and resume over simulated pages, whose contents are real host bytes written and
// read through the pretend device (the pool's pointers are PROT_NONE address space: never touched).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/sleep/tag_scope.hpp>

using namespace strata;
using pool_t = mapped_pool<simulated_pages>;
using op = simulated_pages::operation;

namespace {

constexpr std::size_t page = std::size_t{2} << 20;
constexpr std::size_t mib = std::size_t{1} << 20;

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

/// Writes a pattern drawn from `seed` over the block's first and last 64 bytes (all of it when smaller).
void stamp(pool_t& pool, void* p, std::size_t bytes, std::uint32_t seed)
{
  std::vector<unsigned char> v(std::min<std::size_t>(bytes, 64));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<unsigned char>(seed * 131 + i * 7 + 1);
  pool.backend().write(addr(p), v.data(), v.size());
  pool.backend().write(addr(p) + bytes - v.size(), v.data(), v.size());
}

bool stamped(const pool_t& pool, const void* p, std::size_t bytes, std::uint32_t seed)
{
  std::vector<unsigned char> want(std::min<std::size_t>(bytes, 64)), got(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<unsigned char>(seed * 131 + i * 7 + 1);
  pool.backend().read(addr(p), got.data(), got.size());
  if (got != want) return false;
  pool.backend().read(addr(p) + bytes - got.size(), got.data(), got.size());
  return got == want;
}

/// The pool agrees with the device: what it holds exists, nothing exists it does not hold.
void check_device(const pool_t& pool)
{
  REQUIRE(pool.physical_bytes() == pool.backend().bytes_alive());
  REQUIRE(pool.backend().bytes_mapped() == pool.backend().bytes_alive() + pool.stale_bytes());
  REQUIRE(pool.backup_bytes() == pool.backend().pinned_bytes());
}

} // namespace

TEST_CASE("mapped_pool tags: a scope or a call names the tag; tags never share a mapping")
{
  pool_t pool;
  CHECK(current_tag() == 0);
  std::map<tag_id, std::vector<void*>> by_tag;
  for (int round = 0; round < 20; ++round) {
    by_tag[0].push_back(pool.allocate(300 * 1024));
    {
      tag_scope one(1);
      CHECK(current_tag() == 1);
      by_tag[1].push_back(pool.allocate(300 * 1024));
      {
        tag_scope two(2);
        by_tag[2].push_back(pool.allocate(5 * mib));
      }
      CHECK(current_tag() == 1);
    }
    by_tag[3].push_back(pool.allocate_tagged(3, 100 * 1024));
  }
  CHECK(current_tag() == 0);
  std::map<simulated_pages::page, tag_id> owner;
  std::map<std::uintptr_t, tag_id> page_owner;
  std::size_t checked = 0;
  for (const auto& [tag, blocks] : by_tag)
    for (void* p : blocks) {
      for (const auto& b : pool.backing_of(p)) {
        const auto [it, fresh] = owner.emplace(b.page, tag);
        CHECK(it->second == tag);  // one physical allocation, one tag
        for (std::uintptr_t a = b.address; a < b.address + b.bytes; a += page) {
          const auto [pit, pfresh] = page_owner.emplace(a, tag);
          CHECK(pit->second == tag);
        }
        ++checked;
      }
    }
  CHECK(checked >= 80);
  CHECK(pool.in_use(1) == 20 * 300 * 1024);
  CHECK(pool.in_use(2) == 20 * 5 * mib);
  CHECK(pool.usage().in_use == pool.in_use(0) + pool.in_use(1) + pool.in_use(2) + pool.in_use(3));
  CHECK(pool.physical_bytes() == pool.physical_bytes(0) + pool.physical_bytes(1) + pool.physical_bytes(2) + pool.physical_bytes(3));
  for (auto& [tag, blocks] : by_tag)
    for (void* p : blocks) {
      CHECK(pool.owns(p));
      pool.deallocate(p, 1);
      CHECK_FALSE(pool.owns(p));
    }
  CHECK(pool.usage().in_use == 0);
  CHECK(pool.release() > 0);
  CHECK(pool.physical_bytes() == 0);
  check_device(pool);
}

TEST_CASE("mapped_pool pause/resume: contents come back at the same addresses; a paused tag holds no memory")
{
  pool_t pool;
  std::vector<std::pair<void*, std::size_t>> blocks;
  std::size_t exact = 0;
  for (std::size_t i = 0; i < 40; ++i) {
    const std::size_t bytes = (i % 3 == 0 ? 3 * mib + 1000 * i : 4096 + 777 * i);
    blocks.emplace_back(pool.allocate_tagged(7, bytes), bytes);
    stamp(pool, blocks.back().first, bytes, static_cast<std::uint32_t>(i));
    exact += pool.good_size(bytes);
  }
  void* untagged = pool.allocate(10 * mib);
  stamp(pool, untagged, 10 * mib, 99);
  const std::size_t tag0_held = pool.physical_bytes(0);

  pool.pause({7});
  CHECK(pool.paused(7));
  CHECK(pool.physical_bytes(7) == 0);
  CHECK(pool.physical_bytes() == tag0_held);
  CHECK(pool.backend().bytes_alive() == tag0_held);
  CHECK(pool.backup_bytes() == exact);  // exact sizes, nothing rounded to pages
  CHECK(pool.paused_bytes(7) == exact);
  for (const auto& [p, n] : blocks) CHECK(pool.owns(p));
  CHECK(stamped(pool, untagged, 10 * mib, 99));  // other tags run on
  check_device(pool);

  pool.resume({7});
  CHECK_FALSE(pool.paused(7));
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    CHECK(pool.owns(blocks[i].first));
    CHECK(pool.backend().is_usable(addr(blocks[i].first), blocks[i].second));
    CHECK(stamped(pool, blocks[i].first, blocks[i].second, static_cast<std::uint32_t>(i)));
  }
  CHECK(pool.in_use(7) == exact);
  CHECK(pool.backup_bytes() == exact);  // kept for the next pause
  check_device(pool);
  for (const auto& [p, n] : blocks) pool.deallocate(p, n);
  pool.deallocate(untagged, 10 * mib);
}

TEST_CASE("mapped_pool pause/resume: the backup is pinned once and reused; reserve ahead; release on request")
{
  pool_t pool;
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(pool.allocate_tagged(1, 4 * mib));
  pool.reserve_backup(32 * mib);
  CHECK(pool.backup_bytes() == 32 * mib);
  const std::size_t pinned = pool.backend().pinned_bytes();
  for (int cycle = 0; cycle < 50; ++cycle) {
    for (std::size_t i = 0; i < blocks.size(); ++i) stamp(pool, blocks[i], 4 * mib, static_cast<std::uint32_t>(cycle * 10 + i));
    pool.pause({1});
    CHECK(pool.backend().pinned_bytes() == pinned);  // no pin in steady state
    CHECK(pool.physical_bytes(1) == 0);
    pool.resume({1});
    for (std::size_t i = 0; i < blocks.size(); ++i) CHECK(stamped(pool, blocks[i], 4 * mib, static_cast<std::uint32_t>(cycle * 10 + i)));
  }
  CHECK(pool.backup_bytes() == 32 * mib);
  CHECK(pool.release_backup() == 32 * mib);
  CHECK(pool.backup_bytes() == 0);
  CHECK(pool.backend().pinned_bytes() == 0);
  // Two tags asleep at once: one region each; a later single pause fits in what is pinned.
  void* other = pool.allocate_tagged(2, 8 * mib);
  pool.pause({1, 2});
  CHECK(pool.backup_bytes() == 40 * mib);
  pool.resume({1, 2});
  pool.pause({1});
  CHECK(pool.backup_bytes() == 40 * mib);
  pool.resume({1});
  pool.deallocate(other, 8 * mib);
  for (void* p : blocks) pool.deallocate(p, 4 * mib);
}

TEST_CASE("mapped_pool pause without backup: addresses come back, contents do not, nothing is pinned")
{
  pool_t pool;
  void* p = pool.allocate_tagged(4, 6 * mib);
  stamp(pool, p, 6 * mib, 5);
  pool.pause({4}, /*backup=*/false);
  CHECK(pool.backup_bytes() == 0);
  CHECK(pool.physical_bytes(4) == 0);
  pool.resume({4});
  CHECK(pool.owns(p));
  CHECK(pool.backend().is_usable(addr(p), 6 * mib));
  CHECK_FALSE(stamped(pool, p, 6 * mib, 5));  // new pages read as zeros here
  pool.deallocate(p, 6 * mib);
}

TEST_CASE("mapped_pool resume without room: out_of_memory naming the tag and the bytes; nothing lost; retryable")
{
  pool_t pool(simulated_pages(page, 64 * mib));
  void* a = pool.allocate_tagged(1, 30 * mib);
  stamp(pool, a, 30 * mib, 11);
  pool.pause({1});
  void* hog = pool.allocate(50 * mib);  // tag 0 takes the device
  try {
    pool.resume({1});
    FAIL("resume fitted where it cannot");
  } catch (const out_of_memory& e) {
    const std::string what = e.what();
    CHECK(what.find("tag 1") != std::string::npos);
    CHECK(what.find("needs 31457280 bytes") != std::string::npos);
    CHECK(what.find("free") != std::string::npos);
  }
  CHECK(pool.paused(1));
  CHECK(pool.physical_bytes(1) == 0);
  CHECK(pool.backup_bytes() == 30 * mib);
  check_device(pool);
  pool.deallocate(hog, 50 * mib);  // idle now: resume gives it back first
  pool.resume({1});
  CHECK(stamped(pool, a, 30 * mib, 11));
  check_device(pool);
  pool.deallocate(a, 30 * mib);
}

TEST_CASE("mapped_pool tags: max_physical caps all tags together; other tags' idle memory goes first")
{
  pool_t pool(simulated_pages(page), {.max_physical = 64 * mib});
  void* a = pool.allocate_tagged(1, 40 * mib);
  try {
    (void)pool.allocate_tagged(2, 40 * mib);
    FAIL("two tags went over the cap together");
  } catch (const out_of_memory& e) {
    CHECK(std::string(e.what()).find("all tags together") != std::string::npos);
  }
  CHECK(pool.physical_bytes() <= 64 * mib);
  pool.pause({1});
  void* b = pool.allocate_tagged(2, 40 * mib);
  try {
    pool.resume({1});
    FAIL("resumed over the cap");
  } catch (const out_of_memory& e) {
    CHECK(std::string(e.what()).find("the pool's cap") != std::string::npos);
  }
  CHECK(pool.paused(1));
  pool.deallocate(b, 40 * mib);  // idle in tag 2: given back to make room
  pool.resume({1});
  CHECK(pool.physical_bytes(2) == 0);
  CHECK(pool.physical_bytes() <= 64 * mib);
  void* c = pool.allocate_tagged(3, 20 * mib);  // fits beside tag 1
  pool.deallocate(c, 20 * mib);
  pool.deallocate(a, 40 * mib);
}

TEST_CASE("mapped_pool pause: one device-wide wait per call however many tags; unmapping waits no more; release() waits once for all tags")
{
  pool_t pool;
  std::vector<std::pair<void*, tag_id>> live;
  for (const tag_id t : {tag_id{0}, tag_id{1}, tag_id{2}, tag_id{3}}) {
    live.emplace_back(pool.allocate_tagged(t, 5 * mib), t);
    pool.deallocate(pool.allocate_tagged(t, 9 * mib), 9 * mib);  // idle memory in every tag
    stamp(pool, live.back().first, 5 * mib, t);
  }
  const auto waits = [&] { return pool.page_calls().synchronizes; };
  std::uint64_t before = waits();
  const std::uint64_t unmaps = pool.page_calls().unmaps;
  pool.pause({1, 2, 3});
  CHECK(waits() == before + 1);  // not one per tag, and none before the unmaps
  CHECK(pool.page_calls().unmaps > unmaps);
  for (const tag_id t : {tag_id{1}, tag_id{2}, tag_id{3}}) CHECK(pool.physical_bytes(t) == 0);
  check_device(pool);
  before = waits();
  pool.resume({1, 2, 3});
  CHECK(waits() == before);  // only the copies are waited for
  for (const auto& [p, t] : live) CHECK(stamped(pool, p, 5 * mib, t));
  before = waits();
  pool.pause({2}, /*backup=*/false);
  CHECK(waits() == before + 1);
  pool.resume({2});

  for (const tag_id t : {tag_id{0}, tag_id{1}, tag_id{3}}) pool.deallocate(pool.allocate_tagged(t, 9 * mib), 9 * mib);
  REQUIRE(pool.idle_bytes() > 0);
  before = waits();
  CHECK(pool.release() > 0);
  CHECK(waits() == before + 1);  // one wait, then every tag's idle memory
  CHECK(pool.idle_bytes() == 0);
  check_device(pool);
  before = waits();
  CHECK(pool.release() == 0);
  CHECK(waits() == before);  // nothing idle: no wait
  for (const auto& [p, t] : live) pool.deallocate(p, 5 * mib);
}

TEST_CASE("mapped_pool pause: a failed device wait pauses none of the tags named")
{
  pool_t pool;
  void* a = pool.allocate_tagged(1, 3 * mib);
  void* b = pool.allocate_tagged(2, 3 * mib);
  stamp(pool, a, 3 * mib, 1);
  stamp(pool, b, 3 * mib, 2);
  const auto calls = pool.page_calls();
  pool.backend().fail_after(op::synchronize, 0);
  CHECK_THROWS_AS(pool.pause({1, 2}), std::runtime_error);
  CHECK_FALSE(pool.paused(1));
  CHECK_FALSE(pool.paused(2));
  CHECK(pool.page_calls().unmaps == calls.unmaps);
  CHECK(pool.backup_bytes() == 0);
  CHECK(stamped(pool, a, 3 * mib, 1));
  pool.pause({1, 2});
  pool.resume({1, 2});
  CHECK(stamped(pool, b, 3 * mib, 2));
  pool.deallocate(a, 3 * mib);
  pool.deallocate(b, 3 * mib);
}

TEST_CASE("mapped_pool tags: max_physical counts the pages every tag maps, room mapped ahead included")
{
  pool_t pool(simulated_pages(page), {.max_physical = 2048 * mib});
  void* a = pool.allocate_tagged(1, 1024 * mib);  // enough held that a new mapping at its edge takes a page ahead
  void* b = pool.allocate_tagged(2, 1022 * mib);
  REQUIRE(pool.physical_bytes() == 2046 * mib);
  void* c = pool.allocate_tagged(1, 2 * mib);  // fits exactly: the page ahead does not
  CHECK(pool.physical_bytes() == 2048 * mib);
  CHECK(pool.backend().bytes_alive() == 2048 * mib);
  CHECK_THROWS_AS(pool.allocate_tagged(1, 2 * mib), out_of_memory);
  CHECK_THROWS_AS(pool.allocate_tagged(2, 2 * mib), out_of_memory);
  CHECK(pool.physical_bytes() == 2048 * mib);
  pool.deallocate(c, 2 * mib);
  pool.deallocate(b, 1022 * mib);
  pool.deallocate(a, 1024 * mib);
}

TEST_CASE("mapped_pool tags: at the cap a tag gives its own idle memory back to make room, not only the other tags'")
{
  pool_t pool(simulated_pages(page), {.max_physical = 64 * mib});
  std::vector<void*> small;
  for (int i = 0; i < 20; ++i) small.push_back(pool.allocate_tagged(1, mib));  // the small requests' range
  for (void* p : small) pool.deallocate(p, mib);
  REQUIRE(pool.idle_bytes() == pool.physical_bytes(1));
  REQUIRE(pool.physical_bytes(1) >= 20 * mib);
  void* other = pool.allocate_tagged(2, 40 * mib);
  void* big = pool.allocate_tagged(1, 20 * mib);  // the large range: tag 1's idle pages cannot hold it
  CHECK(pool.physical_bytes() <= 64 * mib);
  CHECK(pool.physical_bytes(2) == 40 * mib);  // the other tag's live memory stays
  pool.deallocate(big, 20 * mib);
  pool.deallocate(other, 40 * mib);
}

TEST_CASE("mapped_pool resume: the room needed counts only the blocks still asleep, not those freed while the tag slept")
{
  pool_t pool(simulated_pages(page), {.max_physical = 64 * mib});
  void* a = pool.allocate_tagged(1, 30 * mib);
  void* b = pool.allocate_tagged(1, 30 * mib);
  stamp(pool, a, 30 * mib, 1);
  pool.pause({1});
  void* other = pool.allocate_tagged(2, 30 * mib);
  pool.deallocate(b, 30 * mib);  // freed asleep: resume brings back 30 MiB, not 60
  CHECK_NOTHROW(pool.resume({1}));
  CHECK_FALSE(pool.paused(1));
  CHECK(stamped(pool, a, 30 * mib, 1));
  CHECK_FALSE(pool.owns(b));
  CHECK(pool.physical_bytes() <= 64 * mib);
  pool.deallocate(a, 30 * mib);
  pool.deallocate(other, 30 * mib);
}

TEST_CASE("mapped_pool sleep: a paused tag's bytes are not in use; freeing one of its blocks asleep subtracts nothing")
{
  pool_t pool;
  void* a = pool.allocate_tagged(1, 3 * mib);
  void* b = pool.allocate_tagged(1, 5 * mib);
  void* c = pool.allocate(mib);
  const std::size_t all = pool.good_size(3 * mib) + pool.good_size(5 * mib) + pool.good_size(mib);
  REQUIRE(pool.usage().in_use == all);
  pool.pause({1});
  CHECK(pool.usage().in_use == pool.good_size(mib));  // on the device, only tag 0's block
  CHECK(pool.usage().used_blocks == 1);
  CHECK(pool.usage().in_use <= pool.usage().reserved);
  CHECK(pool.paused_bytes(1) == 8 * mib);
  pool.deallocate(a, 3 * mib);
  CHECK(pool.usage().in_use == pool.good_size(mib));
  CHECK(pool.paused_bytes(1) == 5 * mib);
  pool.resume({1});
  CHECK(pool.usage().in_use == all - pool.good_size(3 * mib));
  CHECK(pool.usage().used_blocks == 2);
  pool.deallocate(b, 5 * mib);
  pool.deallocate(c, mib);
  CHECK(pool.usage().in_use == 0);
}

TEST_CASE("mapped_pool sleep: bad use is refused before anything changes")
{
  pool_t pool;
  void* p = pool.allocate_tagged(2, mib);
  CHECK_THROWS_AS(pool.pause({3}), usage_error);  // never used
  CHECK_THROWS_AS(pool.resume({2}), usage_error);  // running
  CHECK_THROWS_AS(pool.pause({max_tags}), std::invalid_argument);
  CHECK_THROWS_AS(pool.allocate_tagged(max_tags, 10), std::invalid_argument);
  CHECK_THROWS_AS(pool.pause({2, 3}), usage_error);  // one bad tag: none paused
  CHECK_THROWS_AS(pool.pause({2, 2}), usage_error);  // named twice: none paused
  CHECK_FALSE(pool.paused(2));
  pool.pause({2});
  CHECK_THROWS_AS(pool.pause({2}), usage_error);
  CHECK_THROWS_AS(pool.allocate_tagged(2, 10), usage_error);
  {
    tag_scope s(2);
    CHECK_THROWS_AS(pool.allocate(10), usage_error);
    CHECK_FALSE(pool.has_room_for(10));
  }
  try {
    pool.allocate_tagged(2, 10);
  } catch (const usage_error& e) {
    CHECK(std::string(e.what()).find("tag 2, which is paused") != std::string::npos);
  }
  // Freeing a sleeping block drops it from the backup: resume does not bring it back.
  CHECK(pool.owns(p));
  pool.deallocate(p, mib);
  CHECK_FALSE(pool.owns(p));
  CHECK(pool.paused_bytes(2) == 0);
  pool.resume({2});
  CHECK(pool.in_use(2) == 0);
  CHECK(pool.physical_bytes(2) == 0);
  // Tag 0 sleeps too.
  void* q = pool.allocate(mib);
  stamp(pool, q, mib, 3);
  pool.pause({0});
  CHECK_THROWS_AS(pool.allocate(10), usage_error);
  pool.resume({0});
  CHECK(stamped(pool, q, mib, 3));
  pool.deallocate(q, mib);
}

TEST_CASE("mapped_pool sleep: moves take the tags, their sleep and the backup along")
{
  pool_t a;
  void* p = a.allocate_tagged(5, 3 * mib);
  stamp(a, p, 3 * mib, 8);
  a.pause({5});
  pool_t b = std::move(a);
  CHECK(b.paused(5));
  CHECK_FALSE(a.paused(5));
  CHECK(a.backup_bytes() == 0);
  CHECK(a.usage().reserved == 0);
  void* q = a.allocate_tagged(5, 1000);  // the moved-from pool is usable
  a.deallocate(q, 1000);
  b.resume({5});
  CHECK(stamped(b, p, 3 * mib, 8));
  a = std::move(b);
  CHECK(a.owns(p));
  CHECK(stamped(a, p, 3 * mib, 8));
  a.deallocate(p, 3 * mib);
}

TEST_CASE("mapped_pool sleep: every pause and resume call refused in turn leaves the pool consistent and the backup whole")
{
  const op ops[] = {op::create, op::map, op::set_access, op::unmap, op::synchronize, op::pin, op::copy_to_host, op::copy_to_device, op::finish_copies};
  std::size_t refusals_seen = 0, cycles = 0, first_call_refused = 0;
  for (op o : ops)
    for (std::uint64_t after = 0; after < 6; ++after) {
      pool_t pool;
      std::vector<std::pair<void*, std::size_t>> blocks;
      for (std::size_t i = 0; i < 6; ++i) {
        const std::size_t n = i % 2 == 0 ? 5 * mib + 256 * i : 2048 * (i + 1);
        blocks.emplace_back(pool.allocate_tagged(1, n), n);
        stamp(pool, blocks.back().first, n, static_cast<std::uint32_t>(i + 10 * after));
      }
      void* other = pool.allocate(3 * mib);
      pool.backend().fail_after(o, after);
      bool refused = false;
      try {
        pool.pause({1});
      } catch (const std::exception&) {
        refused = true;
      }
      check_device(pool);
      if (pool.paused(1)) {
        for (int tries = 0; tries < 20 && pool.paused(1); ++tries) {
          try {
            pool.resume({1});
          } catch (const std::exception&) {
            refused = true;
            CHECK(pool.paused(1));  // all or nothing
            CHECK(pool.backend().bytes_alive() == pool.physical_bytes());
          }
        }
      }
      REQUIRE_FALSE(pool.paused(1));
      (void)pool.release();  // a refused unmap or wait leaves idle memory behind: it goes now
      pool.backend().fail_after(o, 1000000);  // disarm
      check_device(pool);
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        REQUIRE(pool.owns(blocks[i].first));
        REQUIRE(pool.backend().is_usable(addr(blocks[i].first), blocks[i].second));
        REQUIRE(stamped(pool, blocks[i].first, blocks[i].second, static_cast<std::uint32_t>(i + 10 * after)));
      }
      refusals_seen += refused ? 1 : 0;
      first_call_refused += refused && after == 0 ? 1 : 0;
      ++cycles;
      for (const auto& [p, n] : blocks) pool.deallocate(p, n);
      pool.deallocate(other, 3 * mib);
    }
  CHECK(cycles == 54);
  MESSAGE("refusals that hit pause or resume: " << refusals_seen << " of " << cycles);
  // Every kind of call pause and resume make, refused the first time, reaches the caller, except a refused
  // create: resume takes it for the device running out, gives other tags' idle memory back and tries again.
  CHECK(first_call_refused == 8);
  CHECK(refusals_seen >= 25);
}

TEST_CASE("mapped_pool sleep: a randomized workload over four tags with pauses and resumes")
{
  std::mt19937_64 rnd(20261126);
  pool_t pool(simulated_pages(page, 48 * mib));  // small: allocations and resumes run out now and then
  struct live {
    tag_id tag;
    std::size_t bytes;
    std::uint32_t seed;
  };
  std::map<void*, live> blocks;
  std::set<tag_id> asleep;
  std::set<tag_id> backed;
  std::size_t allocs = 0, frees = 0, pauses = 0, resumes = 0, refused_room = 0, sleeping_frees = 0, checked_blocks = 0;
  std::uint32_t next_seed = 1;
  for (int step = 0; step < 10000; ++step) {
    const auto r = rnd() % 100;
    const tag_id tag = static_cast<tag_id>(rnd() % 4);
    if (r < 56) {
      if (asleep.count(tag) != 0) {
        CHECK_THROWS_AS(pool.allocate_tagged(tag, 100), usage_error);
        continue;
      }
      const std::size_t bytes = rnd() % 4 == 0 ? 1 + rnd() % (12 * mib) : 1 + rnd() % (256 * 1024);
      void* p = nullptr;
      try {
        p = pool.allocate_tagged(tag, bytes);
      } catch (const out_of_memory&) {
        continue;
      }
      REQUIRE(blocks.count(p) == 0);
      stamp(pool, p, bytes, next_seed);
      blocks[p] = {tag, bytes, next_seed++};
      ++allocs;
    } else if (r < 88) {
      if (blocks.size() < 20) continue;
      if (blocks.empty()) continue;
      auto it = blocks.begin();
      std::advance(it, static_cast<long>(rnd() % blocks.size()));
      if (asleep.count(it->second.tag) != 0) ++sleeping_frees;
      pool.deallocate(it->first, it->second.bytes);
      REQUIRE_FALSE(pool.owns(it->first));
      blocks.erase(it);
      ++frees;
    } else if (r < 94) {
      if (asleep.count(tag) != 0 || (tag != 0 && pool.physical_bytes(tag) == 0 && pool.in_use(tag) == 0 && rnd() % 2 == 0)) continue;
      const bool backup = rnd() % 8 != 0;
      try {
        pool.pause({tag}, backup);
      } catch (const usage_error&) {  // a tag never used
        continue;
      }
      asleep.insert(tag);
      if (backup) backed.insert(tag);
      else backed.erase(tag);
      ++pauses;
    } else {
      if (asleep.count(tag) == 0) continue;
      try {
        pool.resume({tag});
      } catch (const out_of_memory&) {
        REQUIRE(pool.paused(tag));
        ++refused_room;
        continue;
      }
      asleep.erase(tag);
      ++resumes;
      for (auto& [p, b] : blocks)
        if (b.tag == tag) {
          if (backed.count(tag) != 0) {
            REQUIRE(stamped(pool, p, b.bytes, b.seed));
            ++checked_blocks;
          } else {
            stamp(pool, p, b.bytes, b.seed);  // dropped without a backup: written afresh
          }
        }
    }
    // After every step: running tags' blocks sit on usable memory; sleeping tags hold none; the device agrees.
    for (tag_id t : asleep) REQUIRE(pool.physical_bytes(t) == 0);
    check_device(pool);
    if (step % 50 == 0)
      for (const auto& [p, b] : blocks)
        if (asleep.count(b.tag) == 0) REQUIRE(pool.backend().is_usable(addr(p), b.bytes));
  }
  // The end: running tags' blocks go, then every sleeping tag wakes (one that cannot fit alone lets its
  // blocks go while asleep first).
  for (auto it = blocks.begin(); it != blocks.end();) {
    if (asleep.count(it->second.tag) != 0) {
      ++it;
      continue;
    }
    pool.deallocate(it->first, it->second.bytes);
    it = blocks.erase(it);
  }
  for (tag_id t : std::set<tag_id>(asleep)) {
    try {
      pool.resume({t});
    } catch (const out_of_memory&) {
      ++refused_room;
      for (auto it = blocks.begin(); it != blocks.end();) {
        if (it->second.tag != t) {
          ++it;
          continue;
        }
        pool.deallocate(it->first, it->second.bytes);
        it = blocks.erase(it);
      }
      pool.resume({t});
    }
    if (backed.count(t) == 0) asleep.erase(t);
  }
  for (const auto& [p, b] : blocks) {
    REQUIRE(pool.owns(p));
    REQUIRE(pool.backend().is_usable(addr(p), b.bytes));
    if (asleep.count(b.tag) == 0) REQUIRE(stamped(pool, p, b.bytes, b.seed));
  }
  MESSAGE("allocations " << allocs << ", frees " << frees << " (" << sleeping_frees << " asleep), pauses " << pauses << ", resumes "
                         << resumes << ", out of room " << refused_room << ", blocks with their contents " << checked_blocks << "/"
                         << blocks.size());
  CHECK(allocs > 2000);
  CHECK(frees > 1500);
  CHECK(pauses > 100);
  CHECK(resumes > 100);
  CHECK(sleeping_frees > 10);
  CHECK(checked_blocks > 800);  // blocks whose contents a resume brought back, checked byte for byte
  CHECK(refused_room > 5);      // resumes the device had no room for: the tag stayed asleep, woken later
}
