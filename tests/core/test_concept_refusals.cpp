// Every concept of strata's vocabulary and backends, refused for a type that lacks exactly one of its
// requirements (CCCL's positive and negative concept tests): each refusal is a static_assert, so a concept
// that stops checking one of its clauses fails this file's build. The types start from one that meets the
// concept (asserted first) and take one member away (`= delete` hides the inherited one) or change its
// signature. The file has no test case: its build is the test.
#include <cstddef>
#include <cstdint>

#include <strata/core/concepts.hpp>
#include <strata/core/devices.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/usage.hpp>
#include <strata/pages/page_backend.hpp>
#include <strata/pages/simulated_pages.hpp>
#include <strata/pinned/pinning_backend.hpp>
#include <strata/pinned/simulated_pinning.hpp>
#include <strata/stream/cuda_events.hpp>
#include <strata/stream/simulated_streams.hpp>

using namespace strata;

namespace {

// A resource with every optional capability.
struct full {
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
  void* allocate_async(std::size_t, std::size_t, cuda::stream_ref) { return nullptr; }
  void deallocate_async(void*, std::size_t, std::size_t, cuda::stream_ref) noexcept {}
  bool owns(const void*) const noexcept { return false; }
  void release() {}
  std::size_t good_size(std::size_t bytes, std::size_t) const { return bytes; }
  strata::usage usage() const { return {}; }
  strata::snapshot snapshot() const { return {}; }
  bool has_room_for(std::size_t, std::size_t) const noexcept { return false; }
  void reset() {}
  friend bool operator==(const full&, const full&) noexcept { return true; }
};
static_assert(resource<full> && stream_resource<full> && owning_resource<full> && releasable_resource<full>);
static_assert(sized_resource<full> && usage_reporting_resource<full> && snapshot_resource<full>);
static_assert(room_reporting_resource<full> && resettable_resource<full>);

struct allocate_returns_int : full {
  int allocate(std::size_t, std::size_t) { return 0; }
};
struct deallocate_may_throw : full {
  void deallocate(void*, std::size_t, std::size_t) {}
};
struct no_allocate_async : full {
  void* allocate_async(std::size_t, std::size_t, cuda::stream_ref) = delete;
};
struct deallocate_async_may_throw : full {
  void deallocate_async(void*, std::size_t, std::size_t, cuda::stream_ref) {}
};
struct owns_may_throw : full {
  bool owns(const void*) const { return false; }
};
struct no_release : full {
  void release() = delete;
};
struct good_size_returns_int : full {
  int good_size(std::size_t, std::size_t) const { return 0; }
};
struct usage_of_another_type : full {
  std::size_t usage() const { return 0; }
};
struct no_snapshot : full {
  strata::snapshot snapshot() const = delete;
};
struct room_query_may_throw : full {
  bool has_room_for(std::size_t, std::size_t) const { return false; }
};
struct no_reset : full {
  void reset() = delete;
};

static_assert(!resource<allocate_returns_int>);
static_assert(!resource<deallocate_may_throw>);
static_assert(!stream_resource<no_allocate_async> && resource<no_allocate_async>);
static_assert(!stream_resource<deallocate_async_may_throw>);
static_assert(!owning_resource<owns_may_throw> && resource<owns_may_throw>);
static_assert(!releasable_resource<no_release> && resource<no_release>);
static_assert(!sized_resource<good_size_returns_int>);
static_assert(!usage_reporting_resource<usage_of_another_type>);
static_assert(!snapshot_resource<no_snapshot>);
static_assert(!room_reporting_resource<room_query_may_throw>);
static_assert(!resettable_resource<no_reset>);
// A capability never makes a non-resource one.
static_assert(!owning_resource<deallocate_may_throw> && !releasable_resource<deallocate_may_throw>);

// Page backends: simulated_pages meets all three; each derived type hides one requirement.
static_assert(page_backend<simulated_pages> && copying_page_backend<simulated_pages> && lends_pins<simulated_pages>);

struct pages_without_reserve : simulated_pages {
  std::uintptr_t reserve(std::size_t, std::size_t) = delete;
};
struct pages_without_unmap : simulated_pages {
  void unmap(std::uintptr_t, std::size_t) = delete;
};
struct pages_destroy_may_throw : simulated_pages {
  void destroy(page) {}
};
struct pages_without_counts : simulated_pages {
  const page_counters& counts() const noexcept = delete;
};
struct pages_without_pin : simulated_pages {
  void* pin(std::size_t) = delete;
};
struct pages_without_finish : simulated_pages {
  void finish_copies() = delete;
};
struct pages_without_lender : simulated_pages {
  void lend_pins_from(pin_lender) noexcept = delete;
};

static_assert(!page_backend<pages_without_reserve>);
static_assert(!page_backend<pages_without_unmap>);
static_assert(!page_backend<pages_destroy_may_throw>);
static_assert(!page_backend<pages_without_counts>);
static_assert(page_backend<pages_without_pin> && !copying_page_backend<pages_without_pin>);
static_assert(!copying_page_backend<pages_without_finish>);
static_assert(copying_page_backend<pages_without_lender> && !lends_pins<pages_without_lender>);

// Pinning backends.
static_assert(pinning_backend<simulated_pinning>);
struct pinning_without_numa : simulated_pinning {
  int numa_node() const noexcept = delete;
};
struct pinning_unpin_may_throw : simulated_pinning {
  void unpin(void*, std::size_t) {}
};
static_assert(!pinning_backend<pinning_without_numa>);
static_assert(!pinning_backend<pinning_unpin_may_throw>);

// Event backends and their optional capabilities.
static_assert(event_backend<simulated_events> && permanent_stream_backend<simulated_events>);
static_assert(capture_then_id_backend<simulated_events> && graph_backend<simulated_events>);

struct events_without_done : simulated_events {
  bool done(event) const = delete;
};
struct events_without_order_after : simulated_events {
  void order_after(cuda::stream_ref, event) = delete;
};
struct events_destroy_may_throw : simulated_events {
  void destroy_event(event) {}
};
struct events_without_record_on : simulated_events {
  void record_on(event, cuda::stream_ref, int) = delete;
};
struct events_without_capture_of : simulated_events {
  capture_info capture_of(cuda::stream_ref) const = delete;
};
/// Redefines one question of the pair (to count it, say): capture_then_id must not answer for it.
struct events_counting_capturing : simulated_events {
  bool capturing(cuda::stream_ref s) const { return simulated_events::capturing(s); }
};

static_assert(!event_backend<events_without_done>);
static_assert(!event_backend<events_without_order_after>);
static_assert(!event_backend<events_destroy_may_throw>);
static_assert(event_backend<events_without_record_on> && !permanent_stream_backend<events_without_record_on>);
static_assert(event_backend<events_without_capture_of> && !graph_backend<events_without_capture_of>);
static_assert(event_backend<events_counting_capturing> && !capture_then_id_backend<events_counting_capturing>);

// Device backends.
struct devices_full {
  int count() const { return 1; }
  int current() const { return 0; }
  void make_current(int) const {}
  int device_of(const void*) const { return -1; }
};
struct devices_without_device_of : devices_full {
  int device_of(const void*) const = delete;
};
struct devices_not_copyable : devices_full {
  devices_not_copyable() = default;
  devices_not_copyable(const devices_not_copyable&) = delete;
};
static_assert(device_backend<devices_full>);
static_assert(!device_backend<devices_without_device_of>);
static_assert(!device_backend<devices_not_copyable>);

} // namespace
