#pragma once
#include <concepts>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <type_traits>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/concepts.hpp>
#include <strata/detail/adaptor_base.hpp>

namespace strata {

/// Remembers every live allocation — pointer, size, alignment, stream, the tag in force when it was made,
/// and its sequence number — for leak reports on demand and, optionally, at destruction.
/// Tags name phases: `auto t = pool.tag("forward");` tags everything allocated until `t` goes away.
/// Models: whatever the upstream models; its properties. Cost: a mutex and a hash-map insert or erase per
/// call. Thread-safe itself. Move-only.
template <resource Upstream>
class tracking : public detail::adaptor_base<tracking<Upstream>, Upstream> {
  using base = detail::adaptor_base<tracking<Upstream>, Upstream>;

public:
  using base::allocate;
  using base::deallocate;

  struct options {
    bool report_at_destruction = false;
    std::ostream* report_to = &std::cerr;
  };

  struct allocation {
    const void* pointer = nullptr;
    std::size_t bytes = 0;
    std::size_t alignment = 0;
    std::uintptr_t stream = 0;  ///< the stream handle for stream-ordered allocations (0: synchronous/default)
    std::string tag;
    std::uint64_t sequence = 0;  ///< the n-th allocation through this box
  };

  /// RAII: the tag for allocations made while it lives (restores the previous one after).
  class tag_scope {
  public:
    tag_scope(const tag_scope&) = delete;
    tag_scope& operator=(const tag_scope&) = delete;
    ~tag_scope()
    {
      std::lock_guard lock(owner_->mutex_);
      owner_->current_tag_ = previous_;
    }

  private:
    friend class tracking;
    tag_scope(tracking& owner, std::string tag) : owner_(&owner)
    {
      std::lock_guard lock(owner.mutex_);
      previous_ = owner.current_tag_;
      owner.current_tag_ = owner.intern(std::move(tag));
    }
    tracking* owner_;
    std::size_t previous_ = 0;
  };

  tracking() requires std::default_initializable<Upstream> : tracking(Upstream{}) {}
  explicit tracking(Upstream upstream, options opts = {}) : upstream_(std::move(upstream)), opts_(opts)
  {
    tags_.emplace_back();
  }
  tracking(tracking&& other) noexcept
      : upstream_(std::move(other.upstream_)), opts_(other.opts_), live_(std::move(other.live_)),
        tags_(std::move(other.tags_)), current_tag_(std::exchange(other.current_tag_, 0)), sequence_(other.sequence_)
  {
    other.live_.clear();
    other.tags_.clear();  // "no tag" comes back with the first tag interned: a noexcept move must not allocate
  }
  /// Reports what this box still tracks (as its destruction would), then takes the other's upstream and records.
  tracking& operator=(tracking&& other) noexcept(std::is_nothrow_move_assignable_v<Upstream>)
    requires std::is_move_assignable_v<Upstream>
  {
    if (this != &other) {
      report_leftovers();
      upstream_ = std::move(other.upstream_);
      opts_ = other.opts_;
      live_ = std::move(other.live_);
      other.live_.clear();
      tags_ = std::move(other.tags_);
      other.tags_.clear();
      current_tag_ = std::exchange(other.current_tag_, 0);
      sequence_ = other.sequence_;
    }
    return *this;
  }
  ~tracking() { report_leftovers(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    auto node = make_slot();  // the record's memory first: once the box has served, recording cannot fail
    void* p = upstream_.allocate(bytes, alignment);
    remember(std::move(node), p, bytes, alignment, 0);
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    forget(p);
    upstream_.deallocate(p, bytes, alignment);
  }
  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires stream_resource<Upstream>
  {
    auto node = make_slot();
    void* p = upstream_.allocate_async(bytes, alignment, stream);
    remember(std::move(node), p, bytes, alignment, reinterpret_cast<std::uintptr_t>(stream.get()));
    return p;
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
    requires stream_resource<Upstream>
  {
    forget(p);
    upstream_.deallocate_async(p, bytes, alignment, stream);
  }

  [[nodiscard]] tag_scope tag(std::string name) { return tag_scope(*this, std::move(name)); }

  /// Live allocations, oldest first.
  std::vector<allocation> live() const
  {
    std::lock_guard lock(mutex_);
    std::vector<allocation> out;
    out.reserve(live_.size());
    for (const auto& [p, r] : live_) out.push_back({p, r.bytes, r.alignment, r.stream, tags_[r.tag], r.sequence});
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.sequence < b.sequence; });
    return out;
  }
  std::size_t live_blocks() const
  {
    std::lock_guard lock(mutex_);
    return live_.size();
  }

  /// A human-readable leak report: totals per tag, then every live allocation, oldest first.
  std::string report() const
  {
    const auto blocks = live();
    std::ostringstream out;
    std::size_t total = 0;
    std::map<std::string, std::pair<std::size_t, std::size_t>> by_tag;
    for (const auto& a : blocks) {
      total += a.bytes;
      auto& [n, bytes] = by_tag[a.tag.empty() ? "(untagged)" : a.tag];
      ++n;
      bytes += a.bytes;
    }
    out << "strata::tracking: " << blocks.size() << " live allocation(s), " << total << " bytes\n";
    for (const auto& [tag, nb] : by_tag) out << "  tag " << tag << ": " << nb.first << " allocation(s), " << nb.second << " bytes\n";
    for (const auto& a : blocks) {
      out << "  #" << a.sequence << " " << a.pointer << " " << a.bytes << " bytes, alignment " << a.alignment;
      if (a.stream != 0) out << ", stream 0x" << std::hex << a.stream << std::dec;
      if (!a.tag.empty()) out << ", tag " << a.tag;
      out << "\n";
    }
    return out.str();
  }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }

  friend bool operator==(const tracking& a, const tracking& b) noexcept { return &a == &b; }

private:
  struct record {
    std::size_t bytes, alignment;
    std::uintptr_t stream;
    std::size_t tag;
    std::uint64_t sequence;
  };

  void report_leftovers() noexcept
  {
    try {
      if (opts_.report_at_destruction && opts_.report_to != nullptr && !live_.empty()) *opts_.report_to << report();
    } catch (...) {
      // A report that cannot be written (host out of memory) is not worth a std::terminate.
    }
  }

  std::size_t intern(std::string tag)
  {
    if (tags_.empty()) tags_.emplace_back();  // index 0: "no tag" (a moved-from box has none yet)
    const auto it = std::find(tags_.begin(), tags_.end(), tag);
    if (it != tags_.end()) return static_cast<std::size_t>(it - tags_.begin());
    tags_.push_back(std::move(tag));
    return tags_.size() - 1;
  }

  using slot = typename std::unordered_map<const void*, record>::node_type;

  /// A map node, and room in the buckets for it, taken before the box is asked: the lock is not held across
  /// the box's call (it may come back in), and after it nothing but another thread's insert can make
  /// recording allocate.
  slot make_slot()
  {
    std::lock_guard lock(mutex_);
    live_.reserve(live_.size() + 1);
    static const char placeholder = 0;
    slot n = live_.extract(live_.emplace(&placeholder, record{}).first);
    return n;
  }

  void remember(slot n, void* p, std::size_t bytes, std::size_t alignment, std::uintptr_t stream)
  {
    if (p == nullptr) return;
    try {
      std::lock_guard lock(mutex_);
      n.key() = p;
      n.mapped() = {bytes, alignment, stream, current_tag_, ++sequence_};
      live_.reserve(live_.size() + 1);  // a no-op unless another thread filled the room taken
      live_.insert(std::move(n));
    } catch (...) {
      upstream_.deallocate(p, bytes, alignment);  // untracked memory would be a leak the report cannot see
      throw;
    }
  }
  void forget(void* p) noexcept
  {
    if (p == nullptr) return;
    std::lock_guard lock(mutex_);
    live_.erase(p);
  }

  [[no_unique_address]] Upstream upstream_;
  options opts_;
  mutable std::mutex mutex_;
  std::unordered_map<const void*, record> live_;
  std::vector<std::string> tags_;  ///< interned; index 0 is "no tag"
  std::size_t current_tag_ = 0;
  std::uint64_t sequence_ = 0;
};

namespace detail::tracking_claims {
using T = tracking<archetype_resource>;
static_assert(resource<T> && !stream_resource<T> && answers_to_cccl31_names<T>);
static_assert(cccl::synchronous_resource_with<T, device_accessible>);
} // namespace detail::tracking_claims

} // namespace strata
