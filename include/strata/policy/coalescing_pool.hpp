#pragma once
#include <concepts>
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/address_range.hpp>
#include <strata/detail/emptied_on_move.hpp>
#include <strata/detail/object_pool.hpp>
#include <strata/detail/pointer_map.hpp>
#include <strata/detail/tlsf_lists.hpp>
#include <strata/detail/tlsf_mapping.hpp>
#include <strata/detail/upstream_chunks.hpp>

namespace strata {

/// The general-purpose pool: two-level segregated fit (TLSF) over chunks taken from the upstream
/// (docs/architecture.md, "The coalescing pool"). Free blocks are filed by size in TLSF lists
/// (detail/tlsf_lists.hpp), split to the request (rounded to 256 bytes) and merged with their free neighbours
/// inside their chunk at once (detail/address_range.hpp). Small requests are carved from small chunks of
/// their own, and from the large chunks' free space only when no small chunk has room; before growing, the
/// pool hands wholly free chunks back. Block headers live in host memory.
///
/// Models: resource, owning, releasable, sized, usage, snapshot, room-reporting; the upstream's properties.
/// Any power-of-two alignment up to largest_alignment(). Cost: O(1) allocate and free (bit scans, a scan
/// of at most `exact_fit_scan` blocks of one list, a hash lookup by address), no lock; an upstream call
/// only to grow (after handing back the wholly free chunks, one call each) or release. Strong guarantee:
/// after any exception (the upstream out of memory, or a host std::bad_alloc in the bookkeeping) the pool
/// is as it was; the one exception is when the upstream refuses a new chunk and then also refuses to give
/// back a wholly free chunk just handed to it (another user took the memory): that chunk stays returned.
/// Unsynchronized. Move-only.
template <resource Upstream>
class coalescing_pool : public forward_properties<coalescing_pool<Upstream>, Upstream>,
                        public sync_names<coalescing_pool<Upstream>> {
public:
  struct options {
    std::size_t initial_chunk = std::size_t{2} << 20;  ///< the first chunk for large requests; then geometric
    std::size_t max_chunk = std::size_t{32} << 20;     ///< growth stops here, or at initial_chunk if larger
                                                       ///< (a larger request gets a chunk of its own size)
    std::size_t max_reserved = SIZE_MAX;               ///< never hold more than this from the upstream
    double growth_factor = 2.0;                        ///< each new large chunk is this times the last (>= 1)
    std::size_t small_limit = std::size_t{256} << 10;  ///< requests up to this use small chunks only (0: no split)
    std::size_t small_chunk = std::size_t{2} << 20;    ///< the size of every small chunk (capped by max_chunk)
    std::size_t chunk_granularity = std::size_t{2} << 20;  ///< chunk sizes are rounded up to a multiple of this
    unsigned exact_fit_scan = 16;                      ///< blocks of the request's own list tried for a fit
    /// A new large chunk is at most this many times the request (never below initial_chunk; 0: no cap).
    /// Late in a run the series stands at max_chunk, and a small request that fits nowhere would otherwise
    /// add a whole max_chunk of which it uses a sliver; 32 keeps such a chunk a few percent of what
    /// follows it while requests of max_chunk / 32 or more still grow by the series.
    std::size_t chunk_request_multiple = 32;
    /// A small request that fits no small chunk takes a free block of the large chunks before a new small
    /// chunk is taken: the pool holds that memory anyway, and a new chunk would add to the peak.
    bool small_uses_large_free = true;
    bool return_free_chunks = true;                    ///< hand wholly free chunks back before growing
  };

  coalescing_pool() requires std::default_initializable<Upstream> : coalescing_pool(Upstream{}, options{}) {}
  explicit coalescing_pool(Upstream upstream) : coalescing_pool(std::move(upstream), options{}) {}
  coalescing_pool(Upstream upstream, options opts) : chunks_(std::move(upstream)), opts_(opts)
  {
    if (opts.initial_chunk == 0 || opts.max_chunk == 0 || !(opts.growth_factor >= 1.0))
      throw std::invalid_argument("coalescing_pool: initial_chunk and max_chunk must be positive, growth_factor >= 1");
    if (opts.chunk_granularity == 0 || opts.chunk_granularity > max_request)
      throw std::invalid_argument("coalescing_pool: chunk_granularity " + std::to_string(opts.chunk_granularity) + " must be in 1 .. 2^56");
    if (opts.small_limit > 0 && opts.small_chunk == 0)
      throw std::invalid_argument("coalescing_pool: small_chunk 0 with small_limit " + std::to_string(opts.small_limit) + ": small chunks must hold something");
    opts_.chunk_granularity = align_up(opts.chunk_granularity, granule);
    opts_.max_chunk = std::max(opts.max_chunk, opts.initial_chunk);  // a first chunk asked for is honoured
    next_chunk_ = first_chunk();
  }

  // The chunks go back to the upstream with chunks_ (on destruction, and before a move assignment takes the
  // other pool's); every other member is left empty by a move.
  coalescing_pool(coalescing_pool&&) noexcept = default;
  coalescing_pool& operator=(coalescing_pool&&) noexcept = default;
  coalescing_pool(const coalescing_pool&) = delete;
  coalescing_pool& operator=(const coalescing_pool&) = delete;
  ~coalescing_pool() = default;

  /// Moves max_reserved while the pool lives (a per-process memory fraction set late). Chunks already above a
  /// lowered cap stay until they are wholly free and handed back; no new chunk lifts the pool over it. O(1).
  void set_max_reserved(std::size_t bytes) noexcept { opts_.max_reserved = bytes; }
  std::size_t max_reserved() const noexcept { return opts_.max_reserved; }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("coalescing_pool", alignment, largest_alignment());
    if (bytes == 0) return nullptr;
    if (bytes > max_request) throw_oom(bytes);
    const std::size_t align = effective_alignment(alignment);
    const std::size_t size = align_up(bytes, granule);
    const std::size_t search = size + (align - granule);  // room to align inside any block found
    const unsigned band = band_for(search);
    // Every host allocation the call may need happens before anything changes: the strong guarantee.
    ensure_spares();
    block* b = find_free(band, search);
    if (b == nullptr) b = grow(search, bytes, band, nullptr);
    else if (too_large_to_carve(b, search)) b = grow(search, bytes, band, b);
    const std::uintptr_t start = align_address(b->address, align);
    block* used = start > b->address ? spares_.node[spares_.count - 1] : b;  // carve's `rest` is the next spare
    try {
      used_.insert(reinterpret_cast<void*>(start), used);
    } catch (...) {
      abandon_growth();
      throw;
    }
    commit_growth();
    remove_free(b);
    block* rest = start > b->address ? take_spare() : nullptr;  // the spare `used` names
    block* tail = start + size < b->address + b->size ? take_spare() : nullptr;
    b = detail::address_range::carve(b, start, size, rest, tail, [this](block* piece) { insert_free(piece); });
    held_.in_use += b->size;
    return reinterpret_cast<void*>(b->address);
  }

  void deallocate(void* p, std::size_t, std::size_t = default_alignment) noexcept
  {
    if (p == nullptr) return;
    block* b = nullptr;
    if (!used_.take(p, &b)) return;  // not ours: undefined by the rules; checked<> reports it
    held_.in_use -= b->size;
    insert_free(detail::address_range::merge_free(b, [this](block* n) { remove_free(n); }, [this](block* n) { recycle(n); }));
  }

  /// The bytes a block for `bytes` really holds. A size the pool can never serve (allocate throws
  /// out_of_memory for it) has no good size: SIZE_MAX, never a wrapped-around small number.
  std::size_t good_size(std::size_t bytes, std::size_t = default_alignment) const noexcept
  {
    if (bytes == 0) return 0;
    return bytes > max_request ? SIZE_MAX : align_up(bytes, granule);
  }

  /// Whether allocate would serve the request without taking a chunk from the upstream (false may be
  /// pessimistic when the request's own list holds more than exact_fit_scan blocks).
  bool has_room_for(std::size_t bytes, std::size_t alignment = default_alignment) const noexcept
  {
    if (bytes == 0) return true;
    if (bytes > max_request) return false;
    const std::size_t search = align_up(bytes, granule) + (effective_alignment(alignment) - granule);
    const block* b = find_free(band_for(search), search);
    return b != nullptr && !too_large_to_carve(b, search);
  }

  bool owns(const void* p) const noexcept
  {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = chunks_.upper_bound(a);
    return it != chunks_.begin() && a < std::prev(it)->first + std::prev(it)->second.size;
  }

  /// Returns every wholly free chunk to the upstream; returns how many bytes went back.
  std::size_t release()
  {
    std::size_t returned = 0;
    while (idle_.head != nullptr) {
      block* b = idle_.head;
      remove_free(b);
      const auto it = chunks_.find(b->address);
      const chunk_info chunk = it->second;
      chunks_.erase(it);
      nodes_.recycle(b);
      returned += chunk.size;
      held_.reserved -= chunk.size;
      chunks_.upstream().deallocate(reinterpret_cast<void*>(b->address), chunk.size, chunk.alignment);
    }
    if (chunks_.empty()) next_chunk_ = first_chunk();
    return returned;
  }

  /// The largest alignment any request can get; a larger one is std::invalid_argument, never out_of_memory
  /// (docs/architecture.md, Note [Alignments no chunk can honour]): max(max_chunk, 1 GiB), and where the
  /// upstream aligns less than that, no more than a chunk within max_reserved has room to align to.
  std::size_t largest_alignment() const noexcept
  {
    const std::size_t by_design = std::max({opts_.max_chunk, std::size_t{1} << 30, default_alignment});
    if (opts_.max_reserved >= by_design || max_alignment_of<Upstream> >= by_design) return by_design;
    return std::max(max_alignment_of<Upstream>, std::bit_floor(opts_.max_reserved));
  }

  /// The bytes of the wholly free chunks: what release() would hand back. O(1).
  std::size_t idle_bytes() const noexcept { return idle_.bytes; }

  strata::usage usage() const noexcept
  {
    return {.reserved = held_.reserved, .in_use = held_.in_use, .largest_free = std::max(bands_[0].largest(), bands_[1].largest()),
            .chunks = chunks_.size(), .used_blocks = used_.size(), .free_blocks = bands_[0].count() + bands_[1].count()};
  }

  strata::snapshot snapshot() const
  {
    strata::snapshot s{.box = "coalescing_pool", .segments = {}};
    for (const auto& [base, chunk] : chunks_) {
      segment_info seg{.address = base, .size = chunk.size, .blocks = {}, .mapped = {}};
      for (const block* b = chunk.first; b != nullptr; b = b->next) seg.blocks.push_back({b->address - base, b->size, b->free, -1});
      s.segments.push_back(std::move(seg));
    }
    return s;
  }

  Upstream& upstream() noexcept { return chunks_.upstream(); }
  const Upstream& upstream() const noexcept { return chunks_.upstream(); }

  friend bool operator==(const coalescing_pool& a, const coalescing_pool& b) noexcept { return &a == &b; }

private:
  static constexpr std::size_t granule = detail::tlsf::granule;
  static constexpr std::size_t max_request = std::size_t{1} << 56;
  static constexpr unsigned small_band = 0, large_band = 1;
  static constexpr unsigned spare_count = 3;  // one for a new chunk, two for the splits

  /// A block's header, in host memory. prev/next: address neighbours in the chunk; free_prev/free_next: the
  /// free list it is filed in; idle_prev/idle_next: the list of wholly free chunks, when it is one.
  struct block {
    std::uintptr_t address = 0;
    std::size_t size = 0;
    block* prev = nullptr;
    block* next = nullptr;
    block* free_prev = nullptr;
    block* free_next = nullptr;
    block* idle_prev = nullptr;
    block* idle_next = nullptr;
    unsigned band = 0;
    bool free = false;
    void inherit_from(const block& whole) noexcept { band = whole.band; }  // a piece stays in its chunk's band
  };
  struct chunk_info {
    std::size_t size = 0;
    std::size_t alignment = 0;
    block* first = nullptr;
  };
  using chunk_map = detail::upstream_chunks<Upstream, chunk_info>;

  [[noreturn]] void throw_oom(std::size_t bytes) const { throw out_of_memory("coalescing_pool", bytes, figures(held_.reserved, held_.in_use)); }

  unsigned band_for(std::size_t search) const noexcept { return search <= opts_.small_limit ? small_band : large_band; }

  std::size_t first_chunk() const noexcept { return align_up(std::min(opts_.initial_chunk, opts_.max_chunk), granule); }

  static bool whole_chunk(const block* b) noexcept { return b->prev == nullptr && b->next == nullptr; }

  /// A free block for `search` bytes of a request of `band`, or null: the band's own lists, then, for a
  /// small request, the large ones (the piece stays in its chunk's band: it merges back there when freed),
  /// but never a wholly free large chunk: a small block there would keep the whole chunk from going back.
  block* find_free(unsigned band, std::size_t search) const noexcept
  {
    block* b = bands_[band].find(search, opts_.exact_fit_scan);
    if (b == nullptr && band == small_band && opts_.small_uses_large_free) {
      b = bands_[large_band].find(search, opts_.exact_fit_scan);
      if (b != nullptr && whole_chunk(b)) b = nullptr;
    }
    return b;
  }

  void insert_free(block* b) noexcept
  {
    b->free = true;
    bands_[b->band].insert(b);
    if (!whole_chunk(b)) return;
    b->idle_prev = nullptr;
    b->idle_next = idle_.head;
    if (idle_.head != nullptr) idle_.head->idle_prev = b;
    idle_.head = b;
    ++idle_.count;
    idle_.bytes += b->size;
  }

  void remove_free(block* b) noexcept
  {
    bands_[b->band].remove(b);
    if (!whole_chunk(b)) return;
    if (b->idle_prev != nullptr) b->idle_prev->idle_next = b->idle_next;
    else idle_.head = b->idle_next;
    if (b->idle_next != nullptr) b->idle_next->idle_prev = b->idle_prev;
    b->idle_prev = b->idle_next = nullptr;
    --idle_.count;
    idle_.bytes -= b->size;
  }

  /// A wholly free chunk far larger than the request (more than three times, and by more than max_chunk)
  /// is worth more handed back than carved: the block would pin all of it, and the next request of the
  /// chunk's own size would grow the pool. Growth hands it back first, then takes a chunk sized to this one.
  bool too_large_to_carve(const block* b, std::size_t needed) const noexcept
  {
    if (!opts_.return_free_chunks || !whole_chunk(b)) return false;
    const std::size_t slack = b->size - needed;
    return slack > std::max(opts_.max_chunk, opts_.chunk_granularity) && slack / 2 > needed;
  }

  void ensure_spares()
  {
    while (spares_.count < spare_count) spares_.node[spares_.count++] = nodes_.make();
  }
  block* take_spare() noexcept { return spares_.node[--spares_.count]; }
  void recycle(block* b) noexcept
  {
    if (spares_.count < spare_count) spares_.node[spares_.count++] = b;
    else nodes_.recycle(b);
  }

  static std::size_t round_up(std::size_t n, std::size_t step) noexcept { return (n + step - 1) / step * step; }

  /// The size of a new chunk for a request needing `needed` bytes: small chunks all alike, large ones the
  /// next size in the geometric series but at most chunk_request_multiple times the request (not below
  /// initial_chunk); a request above max_chunk gets a chunk of its own size. Rounded up to
  /// chunk_granularity (without passing max_chunk), since the upstream would take that much anyway.
  std::size_t chunk_size_for(std::size_t needed, unsigned band) const noexcept
  {
    const std::size_t g = opts_.chunk_granularity;
    if (needed > opts_.max_chunk) return round_up(needed, g);
    std::size_t step = band == small_band ? std::min(opts_.small_chunk, opts_.max_chunk) : next_chunk_;
    if (band == large_band && opts_.chunk_request_multiple > 0) {
      const std::size_t cap = needed > SIZE_MAX / opts_.chunk_request_multiple ? SIZE_MAX : needed * opts_.chunk_request_multiple;
      step = std::min(step, std::max(cap, first_chunk()));
    }
    return std::min(round_up(std::max(needed, step), g), std::max(opts_.max_chunk / granule * granule, needed));
  }

  static std::size_t chunk_alignment(std::size_t size) noexcept { return std::min(std::bit_floor(size), max_alignment_of<Upstream>); }

  /// Adds a chunk holding at least `needed` bytes, after handing the wholly free chunks back (they are
  /// kept aside and taken again if the growth fails: see abandon_growth). Returns the chunk's one free
  /// block. Until commit_growth or abandon_growth, the growth can be undone. Strong guarantee.
  block* grow(std::size_t needed, std::size_t bytes, unsigned band, block* retire_first)
  {
    // The new chunk's map node is made now, so that nothing can fail once memory has moved.
    auto entry = chunks_.extract(chunks_.emplace(0, chunk_info{}).first);
    if (opts_.return_free_chunks && idle_.count > 0) {
      retired_.reserve(idle_.count);
      retire_free_chunks(chunk_size_for(needed, band), retire_first);
    }
    if (needed > opts_.max_reserved || held_.reserved > opts_.max_reserved - needed) {
      restore_retired();
      throw_oom(bytes);
    }
    std::size_t size = chunk_size_for(needed, band);
    size = std::max(needed, std::min(size, (opts_.max_reserved - held_.reserved) / granule * granule));
    void* p = nullptr;
    try {
      p = take_chunk(size, needed);
    } catch (const out_of_memory&) {
      restore_retired();
      throw_oom(bytes);
    } catch (...) {  // anything else the upstream throws (a cuda_error, a host bad_alloc) passes through
      restore_retired();
      throw;
    }
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    block* b = take_spare();
    *b = block{.address = base, .size = size, .band = band};
    entry.key() = base;
    entry.mapped() = chunk_info{size, chunk_alignment(size), b};
    chunks_.insert(std::move(entry));
    insert_free(b);
    held_.reserved += size;
    grown_ = b;
    grown_from_series_ = band == large_band && needed <= opts_.max_chunk;
    if (grown_from_series_) {
      previous_next_chunk_ = next_chunk_;
      const double grown = static_cast<double>(next_chunk_) * opts_.growth_factor;
      next_chunk_ = align_up(static_cast<std::size_t>(std::min(grown, static_cast<double>(opts_.max_chunk))), granule);
    }
    return b;
  }

  /// A chunk of `size` bytes from the upstream or, when it refuses that, of exactly `needed`; sets `size`.
  void* take_chunk(std::size_t& size, std::size_t needed)
  {
    try {
      return chunks_.upstream().allocate(size, chunk_alignment(size));
    } catch (const out_of_memory&) {
      if (size == needed) throw;
    }
    void* p = chunks_.upstream().allocate(needed, chunk_alignment(needed));
    size = needed;
    return p;
  }

  /// Hands wholly free chunks back to the upstream, keeping their map entries and nodes aside, until
  /// `enough` bytes went back (the size of the chunk about to be taken: the pool does not grow then).
  /// Handing back more would only make later growths take them again.
  void retire_free_chunks(std::size_t enough, block* first) noexcept
  {
    std::size_t retired = 0;
    while (idle_.head != nullptr && retired < enough) {
      block* b = first != nullptr ? std::exchange(first, nullptr) : idle_.head;
      remove_free(b);
      auto entry = chunks_.extract(b->address);
      chunks_.upstream().deallocate(reinterpret_cast<void*>(b->address), entry.mapped().size, entry.mapped().alignment);
      held_.reserved -= entry.mapped().size;
      retired += entry.mapped().size;
      retired_.push_back(std::move(entry));  // capacity reserved by the caller
    }
  }

  /// Takes the retired chunks again (at new addresses; they are wholly free, so nothing refers to them).
  void restore_retired() noexcept
  {
    for (auto& entry : retired_) {
      block* b = entry.mapped().first;
      void* p = nullptr;
      try {
        p = chunks_.upstream().allocate(entry.mapped().size, entry.mapped().alignment);
      } catch (...) {
        recycle(b);  // the memory went elsewhere meanwhile: the chunk stays returned
        continue;
      }
      b->address = reinterpret_cast<std::uintptr_t>(p);
      entry.key() = b->address;
      chunks_.insert(std::move(entry));
      insert_free(b);
      held_.reserved += b->size;
    }
    retired_.clear();
  }

  void commit_growth() noexcept
  {
    // Straight to the node pool, never to the spares: allocate has already chosen the spare that its
    // front split will take, and a retired node filed among the spares would be taken in its place.
    for (auto& entry : retired_) nodes_.recycle(entry.mapped().first);
    retired_.clear();
    grown_ = nullptr;
  }

  /// Undoes the growth of this call (if any): the new chunk goes back, the retired ones are taken again.
  void abandon_growth() noexcept
  {
    if (grown_ == nullptr) return;
    block* b = grown_;
    grown_ = nullptr;
    remove_free(b);
    const auto it = chunks_.find(b->address);
    const chunk_info chunk = it->second;
    chunks_.erase(it);
    held_.reserved -= chunk.size;
    chunks_.upstream().deallocate(reinterpret_cast<void*>(b->address), chunk.size, chunk.alignment);
    recycle(b);
    if (grown_from_series_) next_chunk_ = previous_next_chunk_;
    restore_retired();
  }

  struct idle_chunks {
    block* head = nullptr;  // wholly free chunks, whichever band
    std::size_t count = 0;
    std::size_t bytes = 0;
  };
  struct spare_nodes {
    std::array<block*, spare_count> node{};  // made ahead, so no split can fail
    unsigned count = 0;
  };
  struct held_bytes {
    std::size_t reserved = 0;
    std::size_t in_use = 0;
  };

  chunk_map chunks_;  // owns the upstream and the memory
  options opts_;
  detail::emptied_on_move<detail::object_pool<block>> nodes_;
  detail::pointer_map<block*> used_;
  detail::emptied_on_move<std::array<detail::tlsf_lists<block>, 2>> bands_;  // small and large chunks' free blocks
  detail::emptied_on_move<idle_chunks> idle_;
  detail::emptied_on_move<spare_nodes> spares_;
  std::vector<typename chunk_map::node_type> retired_;  // chunks handed back by the growth under way
  block* grown_ = nullptr;                              // the chunk the growth under way added
  bool grown_from_series_ = false;
  std::size_t previous_next_chunk_ = 0;
  detail::emptied_on_move<held_bytes> held_;
  std::size_t next_chunk_ = 0;
};

namespace detail::coalescing_pool_claims {
using P = coalescing_pool<archetype_resource>;
static_assert(resource<P> && owning_resource<P> && releasable_resource<P> && sized_resource<P> && usage_reporting_resource<P> && snapshot_resource<P>);
static_assert(room_reporting_resource<P>);
static_assert(cccl::synchronous_resource_with<P, device_accessible> && !has_property<P, host_accessible>);  // forwarded
static_assert(answers_to_cccl31_names<P> && !stream_resource<P>);
static_assert(!std::is_copy_constructible_v<P> && std::is_nothrow_move_constructible_v<P>);
} // namespace detail::coalescing_pool_claims

} // namespace strata
