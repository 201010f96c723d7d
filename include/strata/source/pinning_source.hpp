#pragma once
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/detail/emptied_on_move.hpp>
#include <strata/pinned/pinning_backend.hpp>

namespace strata {

/// What a pinning_source did: bytes pinned now, calls made, and time spent pinning and unpinning.
struct pinning_counters {
  std::size_t pinned = 0;
  std::size_t peak_pinned = 0;
  std::size_t pins = 0;
  std::size_t unpins = 0;
  std::size_t refusals = 0;
  std::uint64_t pin_ns = 0;    ///< time spent in the backend's pin, in nanoseconds
  std::uint64_t unpin_ns = 0;
};

/// Pinned host memory at the size asked, rounded up to whole 4 KiB pages, from a pinning backend
/// (host_pinning on a GPU, simulated_pinning in tests): the upstream of pinned_host_pool, or of any policy that
/// should carve pinned memory. It counts what it pinned and how long pinning took, and keeps the reason of the
/// last refusal, so a pool above it can name the limit that refused.
/// Models: resource, host_accessible, device_accessible. Alignment up to 4096. Cost: the backend's (a pin is
/// slow: the host locks every page); O(1) bookkeeping. Thread-safe when only the backend is shared; the counters
/// are the caller's to guard. Move-only (a move hands the counters over).
template <pinning_backend Backend>
class pinning_source : public sync_names<pinning_source<Backend>> {
public:
  static constexpr std::size_t max_alignment = pinned_pages::small;

  using counters = pinning_counters;

  explicit pinning_source(Backend backend) noexcept(std::is_nothrow_move_constructible_v<Backend>) : backend_(std::move(backend)) {}
  pinning_source(pinning_source&&) noexcept = default;
  pinning_source& operator=(pinning_source&&) noexcept = default;
  pinning_source(const pinning_source&) = delete;
  pinning_source& operator=(const pinning_source&) = delete;
  ~pinning_source() = default;

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("pinning_source", alignment, max_alignment);
    if (bytes == 0) return nullptr;
    if (bytes > max_bytes) throw out_of_memory("pinning_source", bytes, "more than the address space holds");
    const std::size_t size = align_up(bytes, pinned_pages::small);
    const auto start = std::chrono::steady_clock::now();
    void* p = nullptr;
    try {
      p = backend_.pin(size);
    } catch (const out_of_memory& e) {
      last_refusal_ = e.what();
      ++counts_.refusals;
      throw;
    }
    counts_.pin_ns += elapsed_ns(start);
    counts_.pinned += size;
    counts_.peak_pinned = std::max(counts_.peak_pinned, counts_.pinned);
    ++counts_.pins;
    return p;
  }

  void deallocate(void* p, std::size_t bytes, std::size_t = default_alignment) noexcept
  {
    if (p == nullptr) return;
    const std::size_t size = align_up(bytes, pinned_pages::small);
    const auto start = std::chrono::steady_clock::now();
    backend_.unpin(p, size);
    counts_.unpin_ns += elapsed_ns(start);
    counts_.pinned -= size;
    ++counts_.unpins;
  }

  const counters& stats() const noexcept { return counts_; }
  /// The message of the backend's last refusal (empty when it never refused): which limit, how much was pinned.
  const std::string& last_refusal() const noexcept { return last_refusal_; }

  Backend& backend() noexcept { return backend_; }
  const Backend& backend() const noexcept { return backend_; }

  friend bool operator==(const pinning_source& a, const pinning_source& b) noexcept { return &a == &b; }
  friend constexpr void get_property(const pinning_source&, host_accessible) noexcept {}
  friend constexpr void get_property(const pinning_source&, device_accessible) noexcept {}

private:
  static std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point start) noexcept
  {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  }

  static constexpr std::size_t max_bytes = std::size_t{1} << 56;  // beyond any host: refused before any call

  Backend backend_;
  detail::emptied_on_move<counters> counts_;
  std::string last_refusal_;
};

namespace detail::pinning_source_claims {
struct backend {  // the least a pinning backend can be
  void* pin(std::size_t);
  void unpin(void*, std::size_t) noexcept;
  int numa_node() const noexcept;
};
using S = pinning_source<backend>;
static_assert(pinning_backend<backend> && resource<S> && answers_to_cccl31_names<S>);
static_assert(cccl::synchronous_resource_with<S, host_accessible, device_accessible>);
static_assert(!std::is_copy_constructible_v<S> && std::is_nothrow_move_constructible_v<S>);
} // namespace detail::pinning_source_claims

} // namespace strata
