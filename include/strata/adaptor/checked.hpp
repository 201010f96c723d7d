#pragma once
#include <concepts>
#include <cstddef>
#include <bit>
#include <cstdint>
#include <deque>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/stream/identified_stream.hpp>

namespace strata {

/// Catches misuse that the plain boxes leave undefined (docs/architecture.md, rule 5) with a usage_error saying
/// what happened, before anything reaches the upstream, so the pool stays intact: a double free, a pointer
/// the box never handed out (or one inside a live block), a free whose size or alignment differs from the
/// allocation's, a stream-ordered free on a stream the block was neither allocated on nor recorded as used
/// on (record_use), and allocations still outstanding at destruction (reported to a handler; check_no_leaks()
/// throws instead).
///
/// Streams are compared by id, never by handle: handle 0 and cudaStreamLegacy are one stream, and a new stream
/// that got a destroyed stream's handle is another. The id is the upstream's (`stream_id(stream)`, as
/// stream_ordered files frees under) when it has one, else `options::stream_id`, else strata::identify (a
/// driver call). A double free is recognised for the last `remembered_frees` freed addresses (older ones are
/// forgotten, oldest first, so the record stays bounded in long runs; a forgotten one is still reported, as a
/// pointer the box never handed out). Every call through any name (deallocate_sync included) reports misuse
/// by throwing; none terminates.
///
/// Its frees throw, so it is not a strata::resource (whose frees are noexcept): it is the top of a stack,
/// the box the application calls while being debugged. It still satisfies cuda::mr::resource.
/// Models: cuda::mr::resource (and async_resource when the upstream is stream-ordered); owns; the upstream's
/// properties. Cost: a mutex and an ordered-map lookup per call, and a stream id lookup per stream-ordered
/// call. Thread-safe itself. Move-only.
template <resource Upstream>
class checked : public forward_properties<checked<Upstream>, Upstream>, public sync_names<checked<Upstream>> {
public:
  struct options {
    bool cross_stream_frees_are_errors = true;
    /// How many freed addresses are remembered to tell a double free from a foreign pointer.
    std::size_t remembered_frees = std::size_t{1} << 16;
    /// Tells streams apart where the upstream cannot (default: strata::identify).
    std::function<std::uint64_t(cuda::stream_ref)> stream_id{};
    /// Called at destruction with a report when allocations are outstanding (default: written to stderr).
    std::function<void(const std::string&)> on_leaks = [](const std::string& report) { std::cerr << report; };
  };

  checked() requires std::default_initializable<Upstream> : checked(Upstream{}) {}
  explicit checked(Upstream upstream, options opts = options{})
      : upstream_(std::move(upstream)), opts_(std::move(opts))
  {}
  checked(checked&& other) noexcept
      : upstream_(std::move(other.upstream_)), opts_(std::move(other.opts_)), live_(std::move(other.live_)),
        freed_(std::move(other.freed_)), freed_order_(std::move(other.freed_order_)), frees_(other.frees_)
  {
    other.live_.clear();
    other.freed_.clear();
    other.freed_order_.clear();
  }
  checked& operator=(checked&&) = delete;
  ~checked()
  {
    if (!live_.empty() && opts_.on_leaks) {
      try {
        opts_.on_leaks(leak_report());
      } catch (...) {
      }
    }
  }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    void* p = upstream_.allocate(bytes, alignment);
    remember(p, bytes, alignment, no_stream, [&] { upstream_.deallocate(p, bytes, alignment); });
    return p;
  }
  /// Throws usage_error on misuse (and frees nothing then).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment)
  {
    if (p == nullptr) return;
    verify_and_forget(p, bytes, alignment, no_stream);
    upstream_.deallocate(p, bytes, alignment);
  }
  /// The CCCL 3.1 name: throws like deallocate (sync_names' version is noexcept, which would terminate).
  void deallocate_sync(void* p, std::size_t bytes, std::size_t alignment = default_alignment)
  {
    deallocate(p, bytes, alignment);
  }

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires stream_resource<Upstream>
  {
    void* p = upstream_.allocate_async(bytes, alignment, stream);
    remember(p, bytes, alignment, id_of(stream), [&] { upstream_.deallocate_async(p, bytes, alignment, stream); });
    return p;
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires stream_resource<Upstream>
  {
    if (p == nullptr) return;
    verify_and_forget(p, bytes, alignment, id_of(stream));
    upstream_.deallocate_async(p, bytes, alignment, stream);
  }
  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment = default_alignment)
    requires stream_resource<Upstream>
  {
    return allocate_async(bytes, alignment, stream);
  }
  void deallocate(cuda::stream_ref stream, void* p, std::size_t bytes, std::size_t alignment = default_alignment)
    requires stream_resource<Upstream>
  {
    deallocate_async(p, bytes, alignment, stream);
  }

  /// Declares that the block is also used on `stream` (after the program ordered that stream's work with
  /// the allocating one), so that freeing it there is not reported.
  void record_use(const void* p, cuda::stream_ref stream)
  {
    std::lock_guard lock(mutex_);
    const auto it = live_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == live_.end()) throw usage_error(describe(p) + ": record_use of a pointer that is not a live allocation");
    it->second.used_on.insert(id_of(stream));
  }

  bool owns(const void* p) const noexcept
  {
    std::lock_guard lock(mutex_);
    return live_.count(reinterpret_cast<std::uintptr_t>(p)) != 0;
  }
  std::size_t outstanding() const
  {
    std::lock_guard lock(mutex_);
    return live_.size();
  }
  /// Freed addresses remembered for double-free reports (at most options::remembered_frees).
  std::size_t remembered_frees() const
  {
    std::lock_guard lock(mutex_);
    return freed_.size();
  }
  /// Throws usage_error listing every allocation still outstanding.
  void check_no_leaks() const
  {
    std::lock_guard lock(mutex_);
    if (!live_.empty()) throw usage_error(leak_report());
  }

  Upstream& upstream() noexcept { return upstream_; }

  friend bool operator==(const checked& a, const checked& b) noexcept { return &a == &b; }

private:
  static constexpr std::uint64_t no_stream = ~std::uint64_t{0};

  struct record {
    std::size_t bytes, alignment;
    std::uint64_t stream;  ///< the stream's id
    std::set<std::uint64_t> used_on;
  };

  std::uint64_t id_of(cuda::stream_ref stream) const
  {
    if constexpr (requires(const Upstream& u) {
                    { u.stream_id(stream) } -> std::convertible_to<std::uint64_t>;
                  }) {
      return upstream_.stream_id(stream);
    } else {
      if (opts_.stream_id) return opts_.stream_id(stream);
      return identify(stream).id();
    }
  }
  static std::string describe(const void* p)
  {
    std::ostringstream out;
    out << "strata::checked: " << p;
    return out.str();
  }
  static std::string stream_name(std::uint64_t s)
  {
    if (s == no_stream) return "no stream (synchronous)";
    return "the stream with id " + std::to_string(s);
  }

  template <class Undo>
  void remember(void* p, std::size_t bytes, std::size_t alignment, std::uint64_t stream, Undo undo)
  {
    if (p == nullptr) return;
    try {
      std::lock_guard lock(mutex_);
      const auto address = reinterpret_cast<std::uintptr_t>(p);
      freed_.erase(address);
      live_[address] = {bytes, alignment, stream, {}};
    } catch (...) {
      undo();
      throw;
    }
  }

  void verify_and_forget(const void* p, std::size_t bytes, std::size_t alignment, std::uint64_t stream)
  {
    if (!std::has_single_bit(alignment))
      throw usage_error(describe(p) + ": freed with alignment " + std::to_string(alignment) + ", not a power of two");
    std::lock_guard lock(mutex_);
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    const auto it = live_.find(address);
    if (it == live_.end()) throw usage_error(describe(p) + ": " + why_not_live(address));
    const record& r = it->second;
    if (bytes != r.bytes)
      throw usage_error(describe(p) + ": freed with " + std::to_string(bytes) + " bytes, but allocated with " +
                        std::to_string(r.bytes));
    if (effective_alignment(alignment) != effective_alignment(r.alignment))
      throw usage_error(describe(p) + ": freed with alignment " + std::to_string(alignment) + ", but allocated with " +
                        std::to_string(r.alignment));
    if (opts_.cross_stream_frees_are_errors && stream != no_stream && r.stream != no_stream && stream != r.stream &&
        r.used_on.count(stream) == 0)
      throw usage_error(describe(p) + ": freed on " + stream_name(stream) + " but allocated on " + stream_name(r.stream) +
                        " and never recorded as used there: work on the allocating stream may still use it; order "
                        "the streams and call record_use(p, stream) first");
    remember_free(address);  // may throw bad_alloc: before anything changed
    live_.erase(it);
  }

  /// Bounded: past `remembered_frees`, the oldest free is forgotten (unless its address was freed again since).
  void remember_free(std::uintptr_t address)
  {
    if (opts_.remembered_frees == 0) return;
    const std::uint64_t generation = ++frees_;
    freed_order_.emplace_back(address, generation);
    try {
      freed_[address] = generation;
    } catch (...) {
      freed_order_.pop_back();
      throw;
    }
    while (freed_order_.size() > opts_.remembered_frees) {
      const auto [old, old_generation] = freed_order_.front();
      freed_order_.pop_front();
      const auto it = freed_.find(old);
      if (it != freed_.end() && it->second == old_generation) freed_.erase(it);
    }
  }

  std::string why_not_live(std::uintptr_t address) const
  {
    if (freed_.count(address) != 0) return "double free (this block was already freed)";
    auto next = live_.upper_bound(address);
    if (next != live_.begin()) {
      const auto& [start, r] = *std::prev(next);
      if (address < start + r.bytes) {
        std::ostringstream out;
        out << "interior pointer: " << (address - start) << " bytes into the live block of " << r.bytes
            << " bytes at " << reinterpret_cast<const void*>(start);
        return out.str();
      }
    }
    return "this box never handed out this pointer";
  }

  std::string leak_report() const
  {
    std::ostringstream out;
    std::size_t total = 0;
    for (const auto& [a, r] : live_) total += r.bytes;
    out << "strata::checked: " << live_.size() << " allocation(s) outstanding, " << total << " bytes\n";
    for (const auto& [a, r] : live_)
      out << "  " << reinterpret_cast<const void*>(a) << " " << r.bytes << " bytes, " << stream_name(r.stream) << "\n";
    return out.str();
  }

  [[no_unique_address]] Upstream upstream_;
  options opts_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, record> live_;
  std::unordered_map<std::uintptr_t, std::uint64_t> freed_;  ///< address -> the free's generation
  std::deque<std::pair<std::uintptr_t, std::uint64_t>> freed_order_;
  std::uint64_t frees_ = 0;
};

namespace detail::checked_claims {
using C = checked<archetype_resource>;
static_assert(!resource<C>, "checked's frees throw: not a strata::resource, by design");
static_assert(has_property<C, device_accessible> && !has_property<C, host_accessible>);  // forwarded
} // namespace detail::checked_claims

} // namespace strata
