// Sleep/wake's backup and the pinned pool as one budget (Note [One pinned budget]): mapped_pool over
// simulated pages whose pins are lent by a pinned_host_pool over a simulated pinning host, which counts every
// pin, so "pins nothing" is a figure that could fail.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <strata/core/errors.hpp>
#include <strata/pages/simulated_pages.hpp>
#include <strata/pinned/pin_lender.hpp>
#include <strata/pinned/pinned_host_pool.hpp>
#include <strata/pinned/simulated_pinning.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/stream/simulated_streams.hpp>

using namespace strata;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

using pinned_t = pinned_host_pool<simulated_pinning, simulated_events>;
using pool_t = mapped_pool<simulated_pages>;

static_assert(lends_pins<simulated_pages>);

struct budget {
  simulated_pinning_host host;
  simulated_streams world;
  pinned_t pinned{simulated_pinning(host), simulated_events(world)};
  pool_t pool;
  std::vector<void*> blocks;

  explicit budget(std::size_t lockable = SIZE_MAX) : host(lockable)
  {
    pool.lend_pins_from(pin_lender(pinned));
    for (int i = 0; i < 8; ++i) blocks.push_back(pool.allocate_tagged(1, 4 * mib));
  }
  ~budget()
  {
    for (void* p : blocks) pool.deallocate(p, 4 * mib);
  }

  void stamp(std::uint32_t seed)
  {
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const std::uint32_t v = seed * 97 + static_cast<std::uint32_t>(i);
      pool.backend().write(reinterpret_cast<std::uintptr_t>(blocks[i]), &v, sizeof v);
    }
  }
  bool stamped(std::uint32_t seed) const
  {
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      std::uint32_t v = 0;
      pool.backend().read(reinterpret_cast<std::uintptr_t>(blocks[i]), &v, sizeof v);
      if (v != seed * 97 + static_cast<std::uint32_t>(i)) return false;
    }
    return true;
  }
};

} // namespace

TEST_CASE("one pinned budget: a pause borrows its backup from the pinned pool and a resume gives it back at once")
{
  budget b;
  CHECK(b.pool.backend().pins_lent());
  b.stamp(1);
  b.pool.pause({1});
  CHECK(b.host.pins() == 1);
  CHECK(b.host.pinned() >= 32 * mib);
  CHECK(b.pinned.usage().in_use >= 32 * mib);  // the backup is a block of the pinned pool
  CHECK(b.pool.backup_bytes() == 32 * mib);
  b.pool.resume({1});
  CHECK(b.stamped(1));
  CHECK(b.pool.backup_bytes() == 0);  // back in the pinned pool, not kept aside
  CHECK(b.pinned.usage().in_use == 0);
  CHECK(b.host.pinned() >= 32 * mib);  // still pinned, for whoever asks next
  CHECK(b.host.unpins() == 0);
}

TEST_CASE("one pinned budget: offload buffers reuse what a resume gave back, and the next pause reuses theirs; nothing pinned twice")
{
  budget b;
  b.stamp(2);
  b.pool.pause({1});
  b.pool.resume({1});
  const std::size_t pins = b.host.pins(), pinned_bytes = b.host.pinned();
  // Offload: three buffers from the memory the backup used.
  std::vector<void*> offload;
  for (int i = 0; i < 3; ++i) offload.push_back(b.pinned.allocate(8 * mib));
  CHECK(b.host.pins() == pins);
  for (void* p : offload) b.pinned.deallocate(p, 8 * mib);
  // Cycles of sleep and wake with offload between them: no pin, no unpin.
  for (std::uint32_t cycle = 0; cycle < 20; ++cycle) {
    b.stamp(100 + cycle);
    b.pool.pause({1});
    void* during = b.pinned.allocate(mib);  // the pool serves offload while the tag sleeps
    b.pinned.deallocate(during, mib);
    b.pool.resume({1});
    CHECK(b.stamped(100 + cycle));
    void* after = b.pinned.allocate(24 * mib);
    b.pinned.deallocate(after, 24 * mib);
  }
  CHECK(b.host.pins() <= pins + 1);  // at most the 1 MiB the sleeping tag's backup left no room for
  CHECK(b.host.unpins() == 0);
  CHECK(b.host.pinned() <= pinned_bytes + 2 * mib);
  // release() of the pinned pool is what unpins: everything, once nothing is out.
  const std::size_t held = b.host.pinned();  // read before release(): the operands of == are unsequenced
  CHECK(b.pinned.release() == held);
  CHECK(b.host.pinned() == 0);
  CHECK(b.host.mismatched_unpins() == 0);
}

TEST_CASE("one pinned budget: while offload holds the pinned memory, a pause pins only what no free block holds")
{
  budget b;
  void* held = b.pinned.allocate(64 * mib);
  const std::size_t pins = b.host.pins();
  b.stamp(3);
  b.pool.pause({1});
  CHECK(b.host.pins() == pins + 1);  // the offload buffer is not touched
  b.pool.resume({1});
  CHECK(b.stamped(3));
  b.pinned.deallocate(held, 64 * mib);
  b.stamp(4);
  b.pool.pause({1});  // fits in the free blocks now
  CHECK(b.host.pins() == pins + 1);
  b.pool.resume({1});
  CHECK(b.stamped(4));
}

TEST_CASE("one pinned budget: a pause the pinned pool cannot serve is out_of_memory and changes nothing")
{
  budget b(16 * mib);  // the host locks at most 16 MiB: the 32 MiB backup cannot be pinned
  b.stamp(5);
  CHECK_THROWS_AS(b.pool.pause({1}), out_of_memory);
  CHECK_FALSE(b.pool.paused(1));
  CHECK(b.stamped(5));
  CHECK(b.pool.backup_bytes() == 0);
  CHECK(b.host.pinned() == 0);
  CHECK(b.pinned.usage().in_use == 0);
  b.host.set_lockable(SIZE_MAX);  // usable afterwards
  b.pool.pause({1});
  b.pool.resume({1});
  CHECK(b.stamped(5));
}

namespace {

/// Lends from the pinned pool and keeps account: what is out, and every give of memory it never lent.
struct tally {
  explicit tally(pinned_t& pool) : pinned(&pool) {}

  pinned_t* pinned;
  std::set<void*> out;
  int foreign = 0;

  pin_lender lender()
  {
    return pin_lender(
        this,
        [](void* t, std::size_t bytes) -> void* {
          auto& self = *static_cast<tally*>(t);
          void* p = self.pinned->allocate(bytes, pin_lender::page_alignment);
          self.out.insert(p);
          return p;
        },
        [](void* t, void* p, std::size_t bytes) noexcept {
          auto& self = *static_cast<tally*>(t);
          if (self.out.erase(p) == 0) ++self.foreign;  // not ours: the pinned pool must never see it
          else self.pinned->deallocate(p, bytes, pin_lender::page_alignment);
        });
  }
};

} // namespace

TEST_CASE("one pinned budget: lending while a tag is paused is a usage_error naming the tag, and changes nothing")
{
  budget b;
  b.stamp(6);
  b.pool.pause({1});
  const std::size_t in_use = b.pinned.usage().in_use;
  tally t(b.pinned);
  try {
    b.pool.lend_pins_from(t.lender());
    FAIL("lend_pins_from with tag 1 paused did not throw");
  } catch (const usage_error& e) {
    CHECK(std::string(e.what()).find("paused (1)") != std::string::npos);
  }
  CHECK(b.pool.paused(1));
  CHECK(b.pool.backup_bytes() == 32 * mib);
  CHECK(b.pinned.usage().in_use == in_use);
  b.pool.resume({1});  // still lent from the first lender: back to it, none to the refused one
  CHECK(b.stamped(6));
  CHECK(t.out.empty());
  CHECK(t.foreign == 0);
  CHECK(b.pinned.usage().in_use == 0);
  b.pool.lend_pins_from(t.lender());  // allowed once nothing sleeps
  CHECK(b.pool.backend().pins_lent());
}

TEST_CASE("one pinned budget: backup pinned ahead before lending is unpinned the backend's own way, never given to the lender")
{
  simulated_pinning_host host;
  simulated_streams world;
  pinned_t pinned{simulated_pinning(host), simulated_events(world)};
  pool_t pool;
  void* block = pool.allocate_tagged(1, 4 * mib);
  pool.reserve_backup(16 * mib);  // the backend's own pins
  CHECK(pool.backup_bytes() == 16 * mib);
  CHECK(pool.backend().pinned_bytes() == 16 * mib);
  tally t(pinned);
  pool.lend_pins_from(t.lender());
  CHECK(pool.backup_bytes() == 0);
  CHECK(pool.backend().pinned_bytes() == 0);  // unpinned before the lender came
  CHECK(host.pins() == 0);
  CHECK(t.foreign == 0);
  pool.reserve_backup(8 * mib);  // now from the lender, ahead
  CHECK(t.out.size() == 1);
  CHECK(pinned.usage().in_use >= 8 * mib);
  pool.pause({1});
  pool.resume({1});  // gives the backup back to the lender
  CHECK(pool.backup_bytes() == 0);
  CHECK(t.out.empty());
  CHECK(t.foreign == 0);
  CHECK(pinned.usage().in_use == 0);
  pool.reserve_backup(8 * mib);
  pool.lend_pins_from(pin_lender{});  // back to the backend's own pins: the lent region goes back first
  CHECK(t.out.empty());
  CHECK(t.foreign == 0);
  CHECK_FALSE(pool.backend().pins_lent());
  pool.pause({1});
  pool.resume({1});
  CHECK(t.foreign == 0);
  CHECK(pinned.usage().in_use == 0);
  pool.deallocate(block, 4 * mib);
  const std::size_t held = host.pinned();  // read before release(): the operands of == are unsequenced
  CHECK(pinned.release() == held);
  CHECK(host.pinned() == 0);
  CHECK(host.mismatched_unpins() == 0);
}
