#pragma once
// stream_ordered's per-stream cache: the blocks each stream freed and may reuse at once, binned by shape and
// tag, with the events recorded after them.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/config.hpp>
#include <strata/core/tags.hpp>

#include <strata/detail/stream/event_ledger.hpp>
#include <strata/detail/object_pool.hpp>

namespace strata::detail {

/// What a request costs and how it is filed: blocks with one key and one tag are interchangeable.
struct block_shape {
  std::size_t request;    ///< what the policy is asked for, and given back on free: the same for one key
  std::size_t footprint;  ///< what the block costs the policy (its good size)
  std::size_t align;
  std::uint64_t key;  ///< request and log2(alignment)
  tag_id tag = 0;     ///< the allocation's tag (detail/block_tags.hpp): a block lies in its own tag's mappings
};

/// How stream_ordered files a request to `policy`. Requests of one good size share a key when the policy's good
/// size is its own good size (asking for it consumes exactly it): then any of them may reuse the block, and the
/// policy always sees that one request. Otherwise (e.g. alignment slack added on top) the key is the request
/// rounded to 256 bytes. A good size equal to that rounding is the request either way, so the policy is asked
/// a second time only when they differ.
template <class Policy>
block_shape shape_for(const Policy& policy, std::size_t bytes, std::size_t alignment, tag_id tag = 0) noexcept
{
  const std::size_t align = effective_alignment(alignment);
  std::size_t request = align_up(bytes, default_alignment);
  std::size_t footprint = request;
  if constexpr (sized_resource<Policy>) {
    footprint = policy.good_size(bytes, align);
    if (footprint != request && policy.good_size(footprint, align) == footprint) request = footprint;
  }
  return {request, footprint, align, (std::uint64_t{request} << 6) | static_cast<std::uint64_t>(std::countr_zero(align)), tag};
}

/// The shapes of recent requests, so that a request of a size and alignment seen lately (a pair's free, a
/// loop's next allocation, a model's few tensor sizes) is filed without asking the policy again: shape_for
/// answers from its arguments alone (a policy's good size is a function of the request). Direct-mapped by
/// size: a collision only asks the policy again. Held with the policy it was asked of. Cost: a multiply and
/// two comparisons; a miss, shape_for.
struct shape_memo {
  template <class Policy>
  [[gnu::always_inline]] block_shape of(const Policy& policy, std::size_t bytes, std::size_t alignment, tag_id tag = 0) noexcept
  {
    entry& e = slots_[slot(bytes)];
    if (bytes != e.bytes || alignment != e.alignment || !e.known) [[unlikely]] learn(e, policy, bytes, alignment);
    return {e.request, e.footprint, e.align, e.key, tag};
  }

private:
  struct entry {
    std::size_t bytes = 0;
    std::size_t alignment = 0;
    std::size_t request = 0;
    std::size_t footprint = 0;
    std::size_t align = 0;
    std::uint64_t key = 0;
    bool known = false;
  };
  static constexpr unsigned slot_bits = 4;

  static std::size_t slot(std::size_t bytes) noexcept
  {
    return static_cast<std::size_t>((std::uint64_t{bytes} * 0x9E3779B97F4A7C15u) >> (64 - slot_bits));
  }

  template <class Policy>
  [[gnu::noinline]] static void learn(entry& e, const Policy& policy, std::size_t bytes, std::size_t alignment) noexcept
  {
    const block_shape sh = shape_for(policy, bytes, alignment);
    e = {bytes, alignment, sh.request, sh.footprint, sh.align, sh.key, true};
  }

  entry slots_[std::size_t{1} << slot_bits]{};
};

/// A bin: blocks of one key and one tag. A block of another tag never serves, or pausing its tag would
/// unmap the memory of the allocation it served.
struct bin_key {
  std::uint64_t key;
  tag_id tag;
  bool operator==(const bin_key&) const = default;
};
struct bin_key_hash {
  std::size_t operator()(const bin_key& k) const noexcept { return std::hash<std::uint64_t>{}(k.key ^ (std::uint64_t{k.tag} << 52)); }
};

/// A block cached by a stream, linked into its bin and its stream's age list.
struct cached_block {
  void* p = nullptr;
  std::size_t request = 0;
  std::size_t size = 0;  ///< footprint
  std::size_t align = 0;
  std::uint64_t key = 0;
  tag_id tag = 0;
  std::uint64_t seq = 0;  ///< the stream's free counter when freed: events cover frees below a number
  cached_block* bin_prev = nullptr;
  cached_block* bin_next = nullptr;
  cached_block* older = nullptr;
  cached_block* newer = nullptr;
};

/// One stream's free blocks: bins by key and tag (newest first, for cache-warm same-stream reuse) threaded
/// through an age list (oldest first, the order events cover them in), and its recorded events, oldest first.
/// O(1) per block, one hash lookup per bin.
template <class Event>
struct stream_free_lists {
  std::uint64_t id = 0;
  int device = 0;  ///< whose work the stream runs: its events are made there
  cuda::stream_ref handle{cudaStreamLegacy};  ///< as last seen (the owner's events are recorded on it)
  std::uint64_t ordered_after = 0;  ///< this stream waits for the owner's policy frees numbered up to this
  std::uint64_t recent_frees = 0;   ///< since ownership was last weighed
  std::unordered_map<bin_key, cached_block*, bin_key_hash> bins;
  cached_block* oldest = nullptr;
  cached_block* newest = nullptr;
  std::uint64_t next_seq = 0;
  std::uint64_t covered_seq = 0;
  std::size_t uncovered_blocks = 0;
  std::size_t uncovered_bytes = 0;
  std::size_t blocks = 0;  ///< cached on this stream
  std::size_t bytes = 0;
  std::size_t blocks_at_cover = 0;  ///< what was cached when the last event was recorded
  std::size_t bytes_at_cover = 0;
  typename event_ledger<Event>::queue events;

  bool empty() const noexcept { return oldest == nullptr && events.empty(); }

  cached_block* take(std::uint64_t key, tag_id tag = 0) noexcept
  {
    const auto it = bins.find(bin_key{key, tag});
    if (it == bins.end() || it->second == nullptr) return nullptr;
    cached_block* n = it->second;
    it->second = n->bin_next;
    if (n->bin_next != nullptr) n->bin_next->bin_prev = nullptr;
    unlink_age(n);
    forget_uncovered(n);
    return n;
  }

  /// Files a freed block; may throw only when the key has no bin yet (a new hash node).
  void put(cached_block* n)
  {
    cached_block*& head = bins[bin_key{n->key, n->tag}];
    n->seq = next_seq++;
    n->bin_prev = nullptr;
    n->bin_next = head;
    if (head != nullptr) head->bin_prev = n;
    head = n;
    n->older = newest;
    n->newer = nullptr;
    (newest != nullptr ? newest->newer : oldest) = n;
    newest = n;
    ++uncovered_blocks;
    uncovered_bytes += n->size;
    ++blocks;
    bytes += n->size;
  }

  /// Whether more blocks lack an event than `frees_per_event`, or than twice what was cached at the last
  /// event (a stream cycling through its usual shapes then records nothing); likewise in bytes.
  bool wants_event(std::size_t frees_per_event, std::size_t bytes_per_event) const noexcept
  {
    return uncovered_blocks >= std::max(frees_per_event, 2 * blocks_at_cover) ||
           uncovered_bytes >= std::max(bytes_per_event, 2 * bytes_at_cover);
  }

  /// Every block cached so far is covered by the event just recorded.
  void mark_covered() noexcept
  {
    covered_seq = next_seq;
    uncovered_blocks = 0;
    uncovered_bytes = 0;
    blocks_at_cover = blocks;
    bytes_at_cover = bytes;
  }

  /// Everything it held went back (no block, no event left): nothing is uncovered. The counts at the last
  /// event stay, so the stream's next frees are weighed against its usual rhythm.
  void drained() noexcept
  {
    covered_seq = next_seq;
    uncovered_blocks = 0;
    uncovered_bytes = 0;
  }

  /// A block of `key` covered by one of this stream's events (that event in `cover`), or null: another
  /// stream may take it once it waits for that event.
  cached_block* covered_block(bin_key key, const pending_event<Event>*& cover) noexcept
  {
    const auto bin = bins.find(key);
    if (bin == bins.end()) return nullptr;
    for (cached_block* n = bin->second; n != nullptr; n = n->bin_next) {
      if (n->seq >= covered_seq) continue;
      for (const pending_event<Event>& pe : events)
        if (pe.covers_below > n->seq) {
          cover = &pe;
          return n;
        }
      // No event covers it: cannot happen, a completed event's blocks were reaped with it.
    }
    return nullptr;
  }

  /// Unlinks any block (the handover and reclaim paths).
  void remove(cached_block* n) noexcept
  {
    if (n->bin_prev != nullptr) {
      n->bin_prev->bin_next = n->bin_next;
    } else {
      const auto it = bins.find(bin_key{n->key, n->tag});
      it->second = n->bin_next;
      if (it->second == nullptr) bins.erase(it);
    }
    if (n->bin_next != nullptr) n->bin_next->bin_prev = n->bin_prev;
    unlink_age(n);
    forget_uncovered(n);
  }

private:
  void unlink_age(cached_block* n) noexcept
  {
    --blocks;
    bytes -= n->size;
    (n->older != nullptr ? n->older->newer : oldest) = n->newer;
    (n->newer != nullptr ? n->newer->older : newest) = n->older;
  }
  void forget_uncovered(const cached_block* n) noexcept
  {
    if (n->seq < covered_seq) return;
    --uncovered_blocks;
    uncovered_bytes -= n->size;
  }
};

/// Every stream's free lists, by stream id, with the totals stream_ordered reports and the devices whose
/// streams it has seen. A lookup is O(1) (the last stream is remembered); a block cached or taken is O(1)
/// and allocates only for a new key or a new stream. A move hands everything over and leaves it empty.
template <class Event>
class stream_cache {
public:
  using lists = stream_free_lists<Event>;

  stream_cache() = default;
  stream_cache(stream_cache&& other) noexcept { *this = std::move(other); }
  stream_cache& operator=(stream_cache&& other) noexcept
  {
    if (this != &other) {
      streams_ = std::move(other.streams_);
      other.streams_.clear();
      nodes_ = std::move(other.nodes_);
      devices_ = std::move(other.devices_);
      other.devices_.clear();
      bytes_ = std::exchange(other.bytes_, 0);
      blocks_ = std::exchange(other.blocks_, 0);
      last_ = std::exchange(other.last_, nullptr);
      last_id_ = std::exchange(other.last_id_, 0);
    }
    return *this;
  }
  stream_cache(const stream_cache&) = delete;
  stream_cache& operator=(const stream_cache&) = delete;
  ~stream_cache() = default;

  /// The lists of stream `id`, made on first sight (`device_of()` says where its work runs). The second
  /// value: the stream is new.
  template <class DeviceOf>
  std::pair<lists*, bool> find_or_add(std::uint64_t id, cuda::stream_ref stream, DeviceOf&& device_of)
  {
    if (last_ != nullptr && id == last_id_) [[likely]] {  // inline: the stream of the last call, a loop's case
      last_->handle = stream;
      return {last_, false};
    }
    return look_up(id, stream, device_of);
  }

  /// Caches a block freed on `s`. Throws (nothing changed) only on host memory exhaustion.
  void file(lists& s, void* p, const block_shape& sh)
  {
    cached_block* n = nodes_.make(cached_block{.p = p, .request = sh.request, .size = sh.footprint, .align = sh.align, .key = sh.key, .tag = sh.tag});
    try {
      s.put(n);
    } catch (...) {
      nodes_.recycle(n);
      throw;
    }
    bytes_ += sh.footprint;
    ++blocks_;
  }

  /// Puts back a block just taken from `s` (its bin exists: cannot throw).
  void put_back(lists& s, cached_block* n) noexcept { s.put(n); }

  /// A block leaves the cache (already unlinked from its lists): its address, and what the policy is to be
  /// given back for it.
  struct released {
    void* p;
    std::size_t request;
    std::size_t align;
  };
  released release(cached_block* n) noexcept
  {
    const released r{n->p, n->request, n->align};
    bytes_ -= n->size;
    --blocks_;
    nodes_.recycle(n);
    return r;
  }

  /// Forgets streams with nothing cached and no event pending, except `keep` and `owner` (destroyed streams
  /// never come back).
  void forget_empty(const lists& keep, const lists* owner) noexcept
  {
    for (auto it = streams_.begin(); it != streams_.end();) {
      lists& s = *it->second;
      if (s.empty() && &s != &keep && &s != owner) {
        if (last_ == &s) last_ = nullptr;
        it = streams_.erase(it);
      } else {
        ++it;
      }
    }
  }

  /// Drops every stream and block without giving anything back (the caller has, or has abandoned them).
  void clear() noexcept
  {
    for (auto& [id, s] : streams_)
      while (s->oldest != nullptr) {
        cached_block* n = s->oldest;
        s->remove(n);
        nodes_.recycle(n);
      }
    streams_.clear();
    devices_.clear();
    bytes_ = blocks_ = 0;
    last_ = nullptr;
  }

  template <class F>
  void for_each(F&& f)
  {
    for (auto& [id, s] : streams_) f(*s);
  }
  template <class F>
  void for_each(F&& f) const
  {
    for (const auto& [id, s] : streams_) f(static_cast<const lists&>(*s));
  }

  /// The lists of a stream whose handle is `stream`, if any (a capturing stream cannot be asked its id).
  const lists* with_handle(cuda::stream_ref stream) const noexcept
  {
    for (const auto& [id, s] : streams_)
      if (s->handle.get() == stream.get()) return s.get();
    return nullptr;
  }

  std::size_t bytes() const noexcept { return bytes_; }
  std::size_t blocks() const noexcept { return blocks_; }
  std::size_t streams() const noexcept { return streams_.size(); }
  bool no_streams() const noexcept { return streams_.empty(); }
  const std::vector<int>& devices() const noexcept { return devices_; }

private:
  template <class DeviceOf>
  [[gnu::noinline]] std::pair<lists*, bool> look_up(std::uint64_t id, cuda::stream_ref stream, DeviceOf& device_of)
  {
    bool added = false;
    auto it = streams_.find(id);
    if (it == streams_.end()) {
      const int device = device_of();
      if (std::find(devices_.begin(), devices_.end(), device) == devices_.end()) devices_.push_back(device);
      auto fresh = std::make_unique<lists>();
      fresh->id = id;
      fresh->device = device;
      it = streams_.emplace(id, std::move(fresh)).first;
      added = true;
    }
    last_id_ = id;
    last_ = it->second.get();
    last_->handle = stream;
    return {last_, added};
  }

  std::unordered_map<std::uint64_t, std::unique_ptr<lists>> streams_;
  object_pool<cached_block> nodes_;
  std::vector<int> devices_;  ///< of every stream seen
  std::size_t bytes_ = 0;
  std::size_t blocks_ = 0;
  lists* last_ = nullptr;  ///< the stream of the last lookup
  std::uint64_t last_id_ = 0;
};

} // namespace strata::detail
