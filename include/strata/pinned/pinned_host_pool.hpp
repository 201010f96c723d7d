#pragma once
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/emptied_on_move.hpp>
#include <strata/pinned/host_pinning.hpp>
#include <strata/pinned/pinning_backend.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/pinning_source.hpp>
#include <strata/stream/cuda_events.hpp>

namespace strata {

namespace detail {
/// What a pinned_host_pool counts beside its policy.
struct pinned_pool_counts {
  std::size_t requested = 0, waiting = 0, waiting_blocks = 0, tracked = 0;  // tracked: live blocks with recorded uses
  std::size_t allocations = 0, frees = 0, events_made = 0, events_recorded = 0, host_waits = 0;
};
} // namespace detail

// Note [pinned reuse waits for the copy, not the stream]: the host writes a pinned block the moment it gets
// it, outside any stream's order, so a block a copy may still be reading is handed to no one, not even to
// work on that copy's own stream (which is where stream_ordered's device rule would hand it). Each use is an
// event recorded after the copy was enqueued (record_use, as PyTorch records one for a non_blocking copy); a
// freed block joins the pool once all its events are done, found by querying, never by waiting, except when
// pinning more memory has failed.

/// Pinned host memory at its exact size, for copies between host and GPU: requests are rounded to 4 KiB
/// pages (whole 2 MiB huge pages from options::huge_from), carved from chunks pinned at the size they are
/// needed, split and merged by a coalescing_pool over a pinning_source. Requests up to options::small_limit
/// share huge-page-sized chunks; a larger one that no free block holds gets a chunk of its own exact size, so
/// nothing is rounded to a power of two. Idle chunks stay pinned (reusing them pins nothing) until release()
/// unpins them. The pinning backend is a template parameter: host_pinning (fast parallel faulting, huge pages,
/// the GPU's NUMA node, one cudaHostRegister per chunk) on a GPU, simulated_pinning in the host tests; so is
/// the event backend (cuda_events, or simulated_events over simulated_streams). Cross-stream safety follows
/// Note [pinned reuse waits for the copy, not the stream].
///
/// Models: resource, owning, releasable, sized, usage-reporting; host_accessible and device_accessible.
/// Alignment up to 4096 (every block starts on a page). Cost: allocate and free O(1) in the pool (a hash
/// insert or erase beside it), plus one event query per recorded use of each freed block still waiting, made
/// at the next allocate or release; a pin (slow: the host locks every page) only when no free block fits.
/// record_use: an event record (a CUDA call). No host wait, except for the waiting blocks when pinning more
/// fails (counted in stats().host_waits). Unsynchronized. Move-only. Strong guarantee, except that an
/// allocation that could not pin more may have let finished waiting blocks join the pool and unpinned idle
/// chunks, as it does before it fails.
template <pinning_backend Pinning = host_pinning, event_backend Events = cuda_events>
class pinned_host_pool : public forward_properties<pinned_host_pool<Pinning, Events>, pinning_source<Pinning>>,
                         public sync_names<pinned_host_pool<Pinning, Events>> {
public:
  using event = typename Events::event;
  using policy_type = coalescing_pool<pinning_source<Pinning>>;
  static constexpr std::size_t max_alignment = pinned_pages::small;
  /// Larger than any host could pin: refused before anything is mapped.
  static constexpr std::size_t max_request = std::size_t{1} << 48;

  struct options {
    /// Requests at least this large are rounded to whole huge pages (under 1% more than asked from here).
    std::size_t huge_from = std::size_t{256} << 20;
    /// Requests up to this share chunks of small_chunk bytes; larger ones get chunks of their own size.
    std::size_t small_limit = std::size_t{256} << 10;
    std::size_t small_chunk = pinned_pages::huge;
    /// Unpin wholly free chunks before pinning more (pinning is slow, so off: release() does it when asked).
    bool return_free_chunks = false;
  };

  /// What the pool holds and did: `pinned` from the host, `in_use` by the caller (rounded), `requested` by
  /// the caller (as asked), `waiting` freed but not yet reusable (a copy may still read it).
  struct figures {
    std::size_t pinned = 0, peak_pinned = 0, in_use = 0, requested = 0, waiting = 0;
    std::size_t blocks = 0, waiting_blocks = 0;
    std::size_t allocations = 0, frees = 0, pins = 0, unpins = 0, events_recorded = 0, host_waits = 0;
    std::uint64_t pin_ns = 0, unpin_ns = 0;  ///< time spent pinning and unpinning
  };

  pinned_host_pool() requires std::default_initializable<Pinning> && std::default_initializable<Events>
      : pinned_host_pool(Pinning{}, Events{}, options{})
  {}
  pinned_host_pool(Pinning pinning, Events events) : pinned_host_pool(std::move(pinning), std::move(events), options{}) {}
  pinned_host_pool(Pinning pinning, Events events, options opts)
      : pool_(pinning_source<Pinning>(std::move(pinning)), policy_options(opts)), events_(std::move(events)), opts_(opts)
  {
    if (opts.huge_from == 0) throw std::invalid_argument("pinned_host_pool: huge_from must be positive");
  }

  pinned_host_pool(pinned_host_pool&&) noexcept = default;
  pinned_host_pool& operator=(pinned_host_pool&& other) noexcept
  {
    if (this != &other) {
      finish_waiting_blocks();
      destroy_events();
      pool_ = std::move(other.pool_);
      events_ = std::move(other.events_);
      opts_ = other.opts_;
      live_ = std::move(other.live_);
      waiting_ = std::move(other.waiting_);
      spare_events_ = std::move(other.spare_events_);
      counts_ = std::move(other.counts_);
    }
    return *this;
  }
  pinned_host_pool(const pinned_host_pool&) = delete;
  pinned_host_pool& operator=(const pinned_host_pool&) = delete;
  /// Waits for the copies still reading freed blocks before the chunks are unpinned.
  ~pinned_host_pool()
  {
    finish_waiting_blocks();
    destroy_events();
  }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("pinned_host_pool", alignment, max_alignment);
    if (bytes == 0) return nullptr;
    if (bytes > max_request)
      throw out_of_memory("pinned_host_pool", bytes, "more than any host can pin (2^48 bytes)");
    const std::size_t size = good_size(bytes);
    live_.reserve(live_.size() + 1);  // the insert below cannot rehash, so cannot fail after the pool gave
    join_finished_blocks();
    void* p = take(size, bytes);
    try {
      live_.try_emplace(p, block{.size = size, .requested = bytes, .uses = {}, .freed = false});
    } catch (...) {
      pool_.deallocate(p, size);
      throw;
    }
    counts_.requested += bytes;
    ++counts_.allocations;
    return p;
  }

  /// Frees a block. Without recorded uses still running it is reusable at once; otherwise it waits for them
  /// (Note [pinned reuse waits for the copy, not the stream]). A pointer the pool did not hand out is ignored
  /// (undefined by the rules; checked<> reports it).
  void deallocate(void* p, std::size_t, std::size_t = default_alignment) noexcept
  {
    if (p == nullptr) return;
    const auto it = live_.find(p);
    if (it == live_.end() || it->second.freed) return;
    block& b = it->second;
    counts_.requested -= b.requested;
    ++counts_.frees;
    if (!finished(b)) {
      b.freed = true;
      waiting_.push_back(p);  // capacity reserved by record_use: one place per block with uses
      ++counts_.waiting_blocks;
      counts_.waiting += b.size;
      return;
    }
    retire(it);
  }

  /// Records that work now enqueued on `stream` uses block `p` (a copy from or to it): once freed, the block is
  /// reused only after that work. `p` must be a block this pool handed out and that is not yet freed
  /// (std::invalid_argument otherwise); a stream being captured into a CUDA graph is refused (usage_error):
  /// a captured event marks no point the pool could wait for. Cost: a capture query and an event record
  /// (an event is made only when no spare one is left). Strong guarantee.
  void record_use(void* p, cuda::stream_ref stream)
  {
    const auto it = live_.find(p);
    if (it == live_.end() || it->second.freed)
      throw std::invalid_argument("pinned_host_pool: record_use of a pointer that is not a live block of this pool");
    if (events_.capturing(stream))
      throw usage_error("pinned_host_pool: record_use on a stream being captured (record uses outside the capture)");
    block& b = it->second;
    b.uses.reserve(b.uses.size() + 1);
    if (b.uses.empty()) waiting_.reserve(counts_.tracked + 1);  // its free will never allocate
    spare_events_.reserve(counts_.events_made + 1);  // every event made fits among the spares: returning one never allocates
    event e{};
    if (spare_events_.empty()) {
      e = events_.make_event();
      ++counts_.events_made;
    } else {
      e = spare_events_.back();
      spare_events_.pop_back();
    }
    try {
      events_.record(e, stream);
    } catch (...) {
      spare_events_.push_back(e);
      throw;
    }
    if (b.uses.empty()) ++counts_.tracked;
    b.uses.push_back(e);
    ++counts_.events_recorded;
  }

  /// The bytes a block for `bytes` holds: whole 4 KiB pages, whole 2 MiB pages from options::huge_from.
  std::size_t good_size(std::size_t bytes, std::size_t = default_alignment) const noexcept
  {
    if (bytes == 0) return 0;
    if (bytes > max_request) return SIZE_MAX;
    return align_up(bytes, bytes >= opts_.huge_from ? pinned_pages::huge : pinned_pages::small);
  }

  bool owns(const void* p) const noexcept { return pool_.owns(p); }

  /// Unpins every wholly free chunk, after letting in the freed blocks whose uses are done; returns the bytes
  /// unpinned. Blocks still waiting for a copy stay pinned.
  std::size_t release()
  {
    join_finished_blocks();
    return pool_.release();
  }

  /// reserved: bytes pinned; in_use: the caller's blocks, rounded (blocks waiting for a copy are not in use).
  strata::usage usage() const noexcept
  {
    strata::usage u = pool_.usage();
    u.in_use -= counts_.waiting;
    u.used_blocks -= counts_.waiting_blocks;
    return u;
  }

  figures stats() const noexcept
  {
    const auto& s = pool_.upstream().stats();
    const strata::usage u = usage();
    return {.pinned = u.reserved, .peak_pinned = s.peak_pinned, .in_use = u.in_use, .requested = counts_.requested,
            .waiting = counts_.waiting, .blocks = u.used_blocks, .waiting_blocks = counts_.waiting_blocks,
            .allocations = counts_.allocations, .frees = counts_.frees, .pins = s.pins, .unpins = s.unpins,
            .events_recorded = counts_.events_recorded, .host_waits = counts_.host_waits, .pin_ns = s.pin_ns,
            .unpin_ns = s.unpin_ns};
  }

  /// The NUMA node the pinned memory is placed on (-1: none chosen).
  int numa_node() const noexcept { return pool_.upstream().backend().numa_node(); }

  const policy_type& policy() const noexcept { return pool_; }
  Pinning& pinning() noexcept { return pool_.upstream().backend(); }
  Events& events() noexcept { return events_; }

  friend bool operator==(const pinned_host_pool& a, const pinned_host_pool& b) noexcept { return &a == &b; }

private:
  struct block {
    std::size_t size = 0;
    std::size_t requested = 0;
    std::vector<event> uses;  // events recorded after work using the block
    bool freed = false;       // freed, waiting for its uses
  };
  using block_map = std::unordered_map<void*, block>;

  using own_counts = detail::pinned_pool_counts;

  static typename policy_type::options policy_options(const options& o)
  {
    typename policy_type::options p;
    // A large request that no free block holds gets a chunk of exactly its own size (the series stays at one
    // page and may grow to no more than the request); small ones share small_chunk-sized chunks.
    p.initial_chunk = pinned_pages::small;
    p.max_chunk = o.small_chunk;
    p.growth_factor = 1.0;
    p.chunk_request_multiple = 1;
    p.small_limit = o.small_limit;
    p.small_chunk = o.small_chunk;
    p.chunk_granularity = pinned_pages::small;
    p.return_free_chunks = o.return_free_chunks;
    return p;
  }

  /// A block of `size` from the pool. When pinning more fails, the host waits once for the copies of freed
  /// blocks still waiting and asks again, then unpins the idle chunks and asks again; the refusal after that
  /// names the limit the host refused by.
  void* take(std::size_t size, std::size_t bytes)
  {
    const std::size_t refusals = pool_.upstream().stats().refusals;
    try {
      return pool_.allocate(size, default_alignment);
    } catch (const out_of_memory&) {
    }
    if (counts_.waiting_blocks > 0 && wait_for_waiting_blocks()) {
      try {
        return pool_.allocate(size, default_alignment);
      } catch (const out_of_memory&) {
      }
    }
    if (pool_.release() > 0) {
      try {
        return pool_.allocate(size, default_alignment);
      } catch (const out_of_memory&) {
      }
    }
    refuse(bytes, refusals);
  }

  /// out_of_memory with the backend's own reason when it refused during this call (it names the limit).
  [[noreturn]] void refuse(std::size_t bytes, std::size_t refusals_before) const
  {
    const auto& source = pool_.upstream();
    const strata::usage u = usage();
    throw out_of_memory("pinned_host_pool", bytes,
                        (source.stats().refusals != refusals_before ? source.last_refusal() + "; " : std::string()) +
                            strata::figures(u.reserved, u.in_use));
  }

  static bool finished_event(Events& events, event e) noexcept
  {
    try {
      return events.done(e);
    } catch (...) {  // a failed query: the copy may still run
      return false;
    }
  }

  bool finished(block& b) noexcept
  {
    for (const event e : b.uses)
      if (!finished_event(events_, e)) return false;
    return true;
  }

  /// The block's events go back to the spares and its memory to the pool.
  void retire(typename block_map::iterator it) noexcept
  {
    for (const event e : it->second.uses) spare_events_.push_back(e);  // capacity reserved by record_use
    if (!it->second.uses.empty()) --counts_.tracked;
    pool_.deallocate(it->first, it->second.size);
    live_.erase(it);
  }

  void join_finished_blocks() noexcept
  {
    for (std::size_t i = 0; i < waiting_.size();) {
      const auto it = live_.find(waiting_[i]);
      if (!finished(it->second)) {
        ++i;
        continue;
      }
      --counts_.waiting_blocks;
      counts_.waiting -= it->second.size;
      retire(it);
      waiting_[i] = waiting_.back();
      waiting_.pop_back();
    }
  }

  /// Waits on the host for every waiting block's uses and lets them in; false when a wait failed (the GPU's
  /// state is unknown: those blocks stay out).
  bool wait_for_waiting_blocks() noexcept
  {
    bool all = true;
    for (void* p : waiting_) {
      for (const event e : live_.find(p)->second.uses) {
        try {
          events_.wait_host(e);
          ++counts_.host_waits;
        } catch (...) {
          all = false;
        }
      }
    }
    join_finished_blocks();
    return all;
  }

  void finish_waiting_blocks() noexcept
  {
    if (counts_.waiting_blocks > 0) (void)wait_for_waiting_blocks();
  }

  void destroy_events() noexcept
  {
    for (auto& [p, b] : live_)
      for (const event e : b.uses) events_.destroy_event(e);
    for (const event e : spare_events_) events_.destroy_event(e);
    spare_events_.clear();
    live_.clear();
    waiting_.clear();
  }

  policy_type pool_;
  Events events_;
  options opts_;
  detail::emptied_on_move<block_map> live_;
  detail::emptied_on_move<std::vector<void*>> waiting_;  // freed blocks whose uses may still run
  detail::emptied_on_move<std::vector<event>> spare_events_;
  detail::emptied_on_move<own_counts> counts_;
};

namespace detail::pinned_host_pool_claims {
using P = pinned_host_pool<pinning_source_claims::backend, cuda_events>;
static_assert(resource<P> && owning_resource<P> && releasable_resource<P> && sized_resource<P> && usage_reporting_resource<P>);
static_assert(cccl::synchronous_resource_with<P, host_accessible, device_accessible> && answers_to_cccl31_names<P>);
static_assert(!std::is_copy_constructible_v<P> && std::is_nothrow_move_constructible_v<P>);
} // namespace detail::pinned_host_pool_claims

} // namespace strata
