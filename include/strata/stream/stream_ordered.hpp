#pragma once
#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/object_pool.hpp>
#include <strata/stream/cuda_events.hpp>
#include <strata/stream/identified_stream.hpp>

namespace strata {

/// Makes any policy stream-ordered. A block freed on stream s goes to s's free lists (binned by the size the
/// policy would give it and the alignment): the next request of that shape on s takes it back at once, since
/// stream order already puts the new work after the old. Another stream t may have it only once the work s
/// enqueued before the free has finished: s records an event after such blocks (batched: once
/// `frees_per_event` blocks or `bytes_per_event` bytes lack one, or when s itself misses), and once an event
/// has completed its blocks may go back to the policy, where they merge and serve anyone. They go back when
/// the policy would otherwise have to grow (asked through `has_room_for` where the policy has it; always
/// otherwise), so a stream cycling through a few shapes keeps its blocks. Nothing waits on the host in the
/// normal course. When the policy runs out, a block of the same shape freed on another stream is
/// handed over with t made to wait on that stream's event (cudaStreamWaitEvent); failing that, the host waits
/// for every pending free, returns them all, and the policy is asked once more before out_of_memory.
///
/// Streams are told apart by the backend's ids (for cuda_events, strata::identify: the driver's
/// cuStreamGetId), so a handle reused after cudaStreamDestroy never inherits the old stream's blocks; the
/// legacy and per-thread default streams are ordinary streams with ids of their own. The id lookup is a
/// driver call (about 25 ns); pass an `identified_stream` (strata::identify(stream), once) to skip it. The
/// synchronous allocate/deallocate run on the legacy default stream; a synchronous allocate that reuses a
/// cached block waits for that stream, so the block is ready for the host and every stream when it returns.
///
/// Models: stream_resource (CCCL 3.0 async_resource and the 3.1 names), owning/sized/usage when the policy
/// is; the policy's properties. Cost of a cached allocate or free: a hash lookup for the shape, O(1), plus
/// the id lookup (strata::identify) unless the stream is an identified_stream; no other CUDA call. A miss
/// costs the policy's allocate, and, when the policy has no room, one event record and an event query per
/// stream with pending events. Unsynchronized. Move-only.
template <resource Policy, event_backend Backend = cuda_events>
class stream_ordered : public forward_properties<stream_ordered<Policy, Backend>, Policy>,
                       public stream_names<stream_ordered<Policy, Backend>> {
public:
  using stream_names<stream_ordered>::allocate;
  using stream_names<stream_ordered>::deallocate;
  using event = typename Backend::event;

  /// A stream records an event after its cached blocks once more of them lack one than this, or than twice
  /// what it cached when it last recorded (a stream cycling through its usual shapes then records nothing).
  struct options {
    std::size_t frees_per_event = 8;
    std::size_t bytes_per_event = std::size_t{16} << 20;  ///< ... or once they hold more bytes than this
  };

  /// What the layer did, for tuning and tests.
  struct counters {
    std::uint64_t hits = 0;         ///< served from the stream's own free lists
    std::uint64_t misses = 0;       ///< went to the policy
    std::uint64_t events = 0;       ///< events recorded
    std::uint64_t handovers = 0;    ///< blocks taken from another stream with a cudaStreamWaitEvent
    std::uint64_t host_waits = 0;   ///< times the host waited for pending frees (out of memory, release)
  };

  explicit stream_ordered(Policy policy = Policy{}, options opts = options{}, Backend backend = Backend{})
      : policy_(std::move(policy)), backend_(std::move(backend)), opts_(opts)
  {
    if (opts.frees_per_event == 0 || opts.bytes_per_event == 0)
      throw std::invalid_argument("stream_ordered: frees_per_event and bytes_per_event must be positive");
  }

  stream_ordered(stream_ordered&& other) noexcept
      : policy_(std::move(other.policy_)), backend_(std::move(other.backend_)), opts_(other.opts_)
  {
    take(other);
  }
  stream_ordered& operator=(stream_ordered&& other) noexcept
  {
    if (this != &other) {
      return_everything();
      policy_ = std::move(other.policy_);
      backend_ = std::move(other.backend_);
      opts_ = other.opts_;
      take(other);
    }
    return *this;
  }
  stream_ordered(const stream_ordered&) = delete;
  stream_ordered& operator=(const stream_ordered&) = delete;
  ~stream_ordered() { return_everything(); }

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
  {
    check_alignment("stream_ordered", alignment, largest_alignment);
    if (bytes == 0) return nullptr;
    return allocate_on(bytes, alignment, stream, backend_.id_of(stream), /*for_host=*/false);
  }

  /// The same, with the stream's id known: no backend call on a hit.
  void* allocate_async(std::size_t bytes, std::size_t alignment, const identified_stream& stream)
  {
    check_alignment("stream_ordered", alignment, largest_alignment);
    if (bytes == 0) return nullptr;
    return allocate_on(bytes, alignment, stream.stream(), stream.id(), /*for_host=*/false);
  }

  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
  {
    if (p == nullptr) return;
    std::uint64_t id = 0;
    try {
      id = backend_.id_of(stream);
    } catch (...) {
      return_unordered(p, shape_of(bytes, alignment));  // an unknown stream: nothing to order the reuse by
      return;
    }
    deallocate_on(p, bytes, alignment, stream, id);
  }

  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, const identified_stream& stream) noexcept
  {
    if (p != nullptr) deallocate_on(p, bytes, alignment, stream.stream(), stream.id());
  }

  /// On the legacy default stream; a reused block is waited for, so it is ready for the host and any stream.
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("stream_ordered", alignment, largest_alignment);
    if (bytes == 0) return nullptr;
    const cuda::stream_ref legacy{cudaStreamLegacy};
    return allocate_on(bytes, alignment, legacy, backend_.id_of(legacy), /*for_host=*/true);
  }

  /// On the legacy default stream: later work on any blocking stream is ordered after the free.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    deallocate_async(p, bytes, alignment, cuda::stream_ref{cudaStreamLegacy});
  }

  /// Waits (on the host) for every pending free, returns every cached block to the policy, then releases
  /// the policy's free chunks when it can.
  void release()
  {
    wait_for_pending_frees();
    if constexpr (releasable_resource<Policy>) policy_.release();
  }

  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const
    requires sized_resource<Policy>
  {
    return policy_.good_size(bytes, alignment);
  }

  bool owns(const void* p) const noexcept
    requires owning_resource<Policy>
  {
    return policy_.owns(p);
  }

  /// The policy's figures, with cached blocks counted as free.
  strata::usage usage() const noexcept
    requires usage_reporting_resource<Policy>
  {
    strata::usage u = policy_.usage();
    u.in_use -= cached_bytes_;
    u.used_blocks -= cached_blocks_;
    u.free_blocks += cached_blocks_;
    return u;
  }

  /// Bytes and blocks freed by streams and not yet back in the policy.
  std::size_t cached_bytes() const noexcept { return cached_bytes_; }
  std::size_t cached_blocks() const noexcept { return cached_blocks_; }
  /// Events recorded and not yet seen complete.
  std::size_t pending_events() const noexcept
  {
    std::size_t n = 0;
    for (const auto& [id, s] : streams_) n += s->events.size();
    return n;
  }
  /// Streams with cached blocks or pending events.
  std::size_t streams_tracked() const noexcept { return streams_.size(); }
  const counters& stats() const noexcept { return counters_; }

  Policy& policy() noexcept { return policy_; }
  const Policy& policy() const noexcept { return policy_; }
  Backend& backend() noexcept { return backend_; }

  friend bool operator==(const stream_ordered& a, const stream_ordered& b) noexcept { return &a == &b; }

private:
  static constexpr std::size_t largest_alignment = std::size_t{1} << 56;
  static constexpr std::size_t largest_cached = std::size_t{1} << 56;

  struct shape {
    std::size_t request;    ///< what the policy is asked for, and given back on free: the same for one key
    std::size_t footprint;  ///< what the block costs the policy (its good size)
    std::size_t align;
    std::uint64_t key;  ///< request and log2(alignment): blocks with one key are interchangeable
  };

  struct node {
    void* p = nullptr;
    std::size_t request = 0;
    std::size_t size = 0;  ///< footprint
    std::size_t align = 0;
    std::uint64_t key = 0;
    std::uint64_t seq = 0;  ///< the stream's free counter when freed: events cover frees below a number
    node* bin_prev = nullptr;
    node* bin_next = nullptr;
    node* older = nullptr;
    node* newer = nullptr;
  };

  struct pending_event {
    event e;
    std::uint64_t covers_below;  ///< frees numbered below this happened before the event was recorded
  };

  /// One stream's free blocks: bins by key (newest first, for cache-warm same-stream reuse) threaded through
  /// an age list (oldest first, the order events cover them in), and its recorded events, oldest first.
  struct stream_state {
    std::unordered_map<std::uint64_t, node*> bins;
    node* oldest = nullptr;
    node* newest = nullptr;
    std::uint64_t next_seq = 0;
    std::uint64_t covered_seq = 0;
    std::size_t uncovered_blocks = 0;
    std::size_t uncovered_bytes = 0;
    std::size_t blocks = 0;  ///< cached on this stream
    std::size_t bytes = 0;
    std::size_t blocks_at_cover = 0;  ///< what was cached when the last event was recorded
    std::size_t bytes_at_cover = 0;
    std::deque<pending_event> events;

    bool empty() const noexcept { return oldest == nullptr && events.empty(); }

    node* take(std::uint64_t key) noexcept
    {
      const auto it = bins.find(key);
      if (it == bins.end() || it->second == nullptr) return nullptr;
      node* n = it->second;
      it->second = n->bin_next;
      if (n->bin_next != nullptr) n->bin_next->bin_prev = nullptr;
      unlink_age(n);
      forget_uncovered(n);
      return n;
    }

    /// Files a freed block; may throw only when the key has no bin yet (a new hash node).
    void put(node* n)
    {
      node*& head = bins[n->key];
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

    bool wants_event(const options& opts) const noexcept
    {
      return uncovered_blocks >= std::max(opts.frees_per_event, 2 * blocks_at_cover) ||
             uncovered_bytes >= std::max(opts.bytes_per_event, 2 * bytes_at_cover);
    }

    /// Unlinks any block (the handover and reclaim paths).
    void remove(node* n) noexcept
    {
      if (n->bin_prev != nullptr) {
        n->bin_prev->bin_next = n->bin_next;
      } else {
        const auto it = bins.find(n->key);
        it->second = n->bin_next;
        if (it->second == nullptr) bins.erase(it);
      }
      if (n->bin_next != nullptr) n->bin_next->bin_prev = n->bin_prev;
      unlink_age(n);
      forget_uncovered(n);
    }

  private:
    void unlink_age(node* n) noexcept
    {
      --blocks;
      bytes -= n->size;
      (n->older != nullptr ? n->older->newer : oldest) = n->newer;
      (n->newer != nullptr ? n->newer->older : newest) = n->older;
    }
    void forget_uncovered(const node* n) noexcept
    {
      if (n->seq < covered_seq) return;
      --uncovered_blocks;
      uncovered_bytes -= n->size;
    }
  };

  /// Requests of one good size share a key when the policy's good size is its own good size (asking for it
  /// consumes exactly it): then any of them may reuse the block, and the policy always sees that one request.
  /// Otherwise (e.g. alignment slack added on top) the key is the request rounded to 256 bytes.
  shape shape_of(std::size_t bytes, std::size_t alignment) const noexcept
  {
    const std::size_t align = effective_alignment(alignment);
    std::size_t request = align_up(bytes, default_alignment);
    std::size_t footprint = request;
    if constexpr (sized_resource<Policy>) {
      footprint = policy_.good_size(bytes, align);
      if (policy_.good_size(footprint, align) == footprint) request = footprint;
    }
    return {request, footprint, align, (std::uint64_t{request} << 6) | static_cast<std::uint64_t>(std::countr_zero(align))};
  }

  /// `for_host`: the block must be ready for the host and every stream when this returns (the synchronous
  /// allocate): a reused block is waited for, a handed-over one too.
  void* allocate_on(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, std::uint64_t id, bool for_host)
  {
    if (bytes > largest_cached) return policy_.allocate(bytes, alignment);  // fails there, naming the policy
    const shape sh = shape_of(bytes, alignment);
    stream_state& s = state_of(id);
    if (node* n = s.take(sh.key)) {
      if (for_host) {
        try {
          backend_.wait_stream(stream);
        } catch (...) {
          s.put(n);  // cannot throw: the bin for this key exists
          throw;
        }
      }
      return hand_out(n);
    }
    return allocate_on_miss(sh, stream, s, for_host);
  }

  void deallocate_on(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, std::uint64_t id) noexcept
  {
    const shape sh = shape_of(bytes, alignment);
    stream_state* s = nullptr;
    try {
      s = &state_of(id);
      node* n = nodes_.make(node{.p = p, .request = sh.request, .size = sh.footprint, .align = sh.align, .key = sh.key});
      try {
        s->put(n);
      } catch (...) {
        nodes_.recycle(n);
        throw;
      }
    } catch (...) {
      return_unordered(p, sh);
      return;
    }
    cached_bytes_ += sh.footprint;
    ++cached_blocks_;
    if (s->wants_event(opts_)) {
      try {
        cover(*s, stream);
      } catch (...) {
        // Left uncovered: the blocks are still reused on this stream, and reclaimed by a later event or wait.
      }
    }
  }

  /// No bookkeeping possible: make the block safe for everyone the slow way, then hand it back.
  void return_unordered(void* p, const shape& sh) noexcept
  {
    try {
      backend_.wait_device();
    } catch (...) {
    }
    policy_.deallocate(p, sh.request, sh.align);
  }

  stream_state& state_of(std::uint64_t id)
  {
    if (last_state_ != nullptr && id == last_id_) return *last_state_;
    auto it = streams_.find(id);
    if (it == streams_.end()) {
      auto fresh = std::make_unique<stream_state>();
      it = streams_.emplace(id, std::move(fresh)).first;
    }
    last_id_ = id;
    last_state_ = it->second.get();
    return *last_state_;
  }

  void* hand_out(node* n) noexcept
  {
    void* p = n->p;
    cached_bytes_ -= n->size;
    --cached_blocks_;
    nodes_.recycle(n);
    ++counters_.hits;
    return p;
  }

  void give_back(node* n) noexcept
  {
    policy_.deallocate(n->p, n->request, n->align);
    cached_bytes_ -= n->size;
    --cached_blocks_;
    nodes_.recycle(n);
  }

  event spare_event()
  {
    if (spare_events_.empty()) return backend_.make_event();
    const event e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }

  /// Records an event after the stream's uncovered blocks, so they can be reclaimed once it completes.
  void cover(stream_state& s, cuda::stream_ref stream)
  {
    if (s.uncovered_blocks == 0) return;
    reap(s);
    spare_events_.reserve(spare_events_.size() + 1);  // the failure path below must not throw
    const event e = spare_event();
    try {
      backend_.record(e, stream);
      s.events.push_back({e, s.next_seq});
    } catch (...) {
      spare_events_.push_back(e);
      throw;
    }
    ++counters_.events;
    s.covered_seq = s.next_seq;
    s.uncovered_blocks = 0;
    s.uncovered_bytes = 0;
    s.blocks_at_cover = s.blocks;
    s.bytes_at_cover = s.bytes;
  }

  /// Returns to the policy every block of s whose covering event has completed.
  void reap(stream_state& s)
  {
    while (!s.events.empty() && backend_.done(s.events.front().e)) {
      const std::uint64_t below = s.events.front().covers_below;
      spare_events_.push_back(s.events.front().e);
      s.events.pop_front();
      while (s.oldest != nullptr && s.oldest->seq < below) {
        node* n = s.oldest;
        s.remove(n);
        give_back(n);
      }
    }
  }

  /// Reaps every stream and forgets streams with nothing left (destroyed streams never come back).
  void reap_all(const stream_state& keep)
  {
    for (auto it = streams_.begin(); it != streams_.end();) {
      stream_state& s = *it->second;
      reap(s);
      if (s.empty() && &s != &keep) {
        if (last_state_ == &s) last_state_ = nullptr;
        it = streams_.erase(it);
      } else {
        ++it;
      }
    }
  }

  /// Cached blocks go back to the policy only when it would otherwise grow: a stream cycling through a few
  /// shapes keeps its blocks, while a block no stream reuses returns as soon as its event has completed and
  /// the policy needs room.
  void* allocate_on_miss(const shape& sh, cuda::stream_ref stream, stream_state& s, bool for_host)
  {
    ++counters_.misses;
    bool reaped = false;
    if (!policy_has_room(sh)) {
      cover(s, stream);  // this stream's blocks of other shapes become reclaimable once it passes this point
      reap_all(s);
      reaped = true;
    }
    try {
      return policy_.allocate(sh.request, sh.align);
    } catch (const std::bad_alloc&) {
      if (cached_blocks_ == 0) throw;
    }
    if (!reaped) {
      cover(s, stream);
      reap_all(s);
      try {
        return policy_.allocate(sh.request, sh.align);
      } catch (const std::bad_alloc&) {
        if (cached_blocks_ == 0) throw;
      }
    }
    if (void* p = hand_over(sh.key, stream, s, for_host)) return p;
    wait_for_pending_frees();
    return policy_.allocate(sh.request, sh.align);
  }

  bool policy_has_room(const shape& sh) const noexcept
  {
    if constexpr (room_reporting_resource<Policy>) return policy_.has_room_for(sh.request, sh.align);
    else return false;
  }

  /// A block of this shape freed on another stream and covered by an event: the requesting stream is made
  /// to wait on that event (the host, for a synchronous allocate), and gets the block.
  void* hand_over(std::uint64_t key, cuda::stream_ref stream, stream_state& self, bool for_host)
  {
    for (auto& [id, state] : streams_) {
      stream_state& other = *state;
      if (&other == &self) continue;
      const auto bin = other.bins.find(key);
      if (bin == other.bins.end()) continue;
      for (node* n = bin->second; n != nullptr; n = n->bin_next) {
        if (n->seq >= other.covered_seq) continue;
        const pending_event* cover = nullptr;
        for (const pending_event& pe : other.events)
          if (pe.covers_below > n->seq) {
            cover = &pe;
            break;
          }
        if (cover == nullptr) continue;  // cannot happen: a completed event's blocks were reaped with it
        if (for_host) {
          ++counters_.host_waits;
          backend_.wait_host(cover->e);
        } else {
          backend_.order_after(stream, cover->e);
        }
        ++counters_.handovers;
        other.remove(n);
        return hand_out(n);
      }
    }
    return nullptr;
  }

  /// Host-waits for every pending free and returns every cached block to the policy. Blocks freed after a
  /// stream's last event have nothing to wait on but the device.
  void wait_for_pending_frees()
  {
    if (cached_blocks_ == 0) return;
    ++counters_.host_waits;
    bool uncovered = false;
    for (const auto& [id, s] : streams_) uncovered |= s->uncovered_blocks > 0;
    if (uncovered) {
      backend_.wait_device();
    } else {
      for (const auto& [id, s] : streams_)
        for (const pending_event& pe : s->events) backend_.wait_host(pe.e);
    }
    for (auto& [id, s] : streams_) drain(*s);
  }

  /// Everything s holds goes back: only after its work is known to be complete.
  void drain(stream_state& s) noexcept
  {
    for (const pending_event& pe : s.events) spare_events_.push_back(pe.e);
    s.events.clear();
    while (s.oldest != nullptr) {
      node* n = s.oldest;
      s.remove(n);
      give_back(n);
    }
    s.covered_seq = s.next_seq;
  }

  void return_everything() noexcept
  {
    if (streams_.empty() && spare_events_.empty()) return;
    try {
      wait_for_pending_frees();
    } catch (...) {
      // The runtime may already be gone at exit; the policy's own teardown frees the chunks regardless.
    }
    for (auto& [id, s] : streams_) {
      for (const pending_event& pe : s->events) backend_.destroy_event(pe.e);
      s->events.clear();
      drain(*s);
    }
    streams_.clear();
    for (event e : spare_events_) backend_.destroy_event(e);
    spare_events_.clear();
    last_state_ = nullptr;
  }

  void take(stream_ordered& other) noexcept
  {
    streams_ = std::move(other.streams_);
    nodes_ = std::move(other.nodes_);
    spare_events_ = std::move(other.spare_events_);
    cached_bytes_ = std::exchange(other.cached_bytes_, 0);
    cached_blocks_ = std::exchange(other.cached_blocks_, 0);
    counters_ = std::exchange(other.counters_, counters{});
    last_state_ = nullptr;
    other.streams_.clear();
    other.spare_events_.clear();
    other.last_state_ = nullptr;
  }

  [[no_unique_address]] Policy policy_;
  [[no_unique_address]] Backend backend_;
  options opts_;
  std::unordered_map<std::uint64_t, std::unique_ptr<stream_state>> streams_;
  std::uint64_t last_id_ = 0;
  stream_state* last_state_ = nullptr;
  detail::object_pool<node> nodes_;
  std::vector<event> spare_events_;
  std::size_t cached_bytes_ = 0;
  std::size_t cached_blocks_ = 0;
  counters counters_;
};

namespace detail::stream_ordered_claims {
using S = stream_ordered<archetype_resource>;
static_assert(stream_resource<S> && !owning_resource<S> && !sized_resource<S>);
static_assert(cccl::stream_resource_with<S, device_accessible> && !has_property<S, host_accessible>);
static_assert(answers_to_cccl31_stream_names<S>);
static_assert(!std::is_copy_constructible_v<S> && std::is_nothrow_move_constructible_v<S>);
} // namespace detail::stream_ordered_claims

} // namespace strata
