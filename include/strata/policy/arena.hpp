#pragma once
#include <concepts>
#include <algorithm>
#include <cstddef>
#include <cstdint>
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

namespace strata {

/// Monotonic bump allocation over chunks from the upstream: the recipe for loops that allocate scratch memory
/// every iteration. Chunks grow geometrically up to a cap (a request larger than the cap gets a chunk of its
/// own size). Freeing the block at the top rolls the bump pointer back, so strictly nested (LIFO) frees reuse
/// memory at once; other frees are no-ops until reset(). reset() makes every chunk reusable without returning
/// it; checkpoint()/rewind() do the same for a nested scope; release() returns the chunks to the upstream.
/// Any size the upstream can give is served (a request above the cap gets its own chunk); a size whose
/// chunk would overflow is out_of_memory. After any exception the arena is as it was.
/// Models: resource, owning, releasable, resettable, usage, snapshot; the upstream's properties.
/// Any power-of-two alignment up to the largest chunk. Cost: O(1) bump, no lock; an upstream call only when a
/// new chunk is needed. Unsynchronized. Move-only.
template <resource Upstream>
class arena : public forward_properties<arena<Upstream>, Upstream>, public sync_names<arena<Upstream>> {
public:
  struct options {
    std::size_t initial_chunk = std::size_t{1} << 20;
    std::size_t max_chunk = std::size_t{1} << 30;
    std::size_t growth_factor = 2;
  };

  /// Where the arena stood: rewind(mark) forgets everything allocated after checkpoint() returned it.
  struct mark {
    std::size_t chunk;
    std::size_t offset;
    std::size_t blocks;
    std::size_t live_bytes;
  };

  arena() requires std::default_initializable<Upstream> : arena(Upstream{}, options{}) {}
  explicit arena(Upstream upstream) : arena(std::move(upstream), options{}) {}
  arena(Upstream upstream, options opts) : upstream_(std::move(upstream)), opts_(opts), next_chunk_(opts.initial_chunk)
  {
    if (opts.initial_chunk == 0 || opts.growth_factor == 0)
      throw std::invalid_argument("arena: initial_chunk and growth_factor must be positive");
  }

  arena(arena&& other) noexcept
      : upstream_(std::move(other.upstream_)), opts_(other.opts_), chunks_(std::exchange(other.chunks_, {})),
        current_(std::exchange(other.current_, 0)), offset_(std::exchange(other.offset_, 0)),
        blocks_(std::exchange(other.blocks_, 0)),
        live_bytes_(std::exchange(other.live_bytes_, 0)),
        next_chunk_(other.next_chunk_)
  {}
  arena& operator=(arena&& other) noexcept
  {
    if (this != &other) {
      release_chunks();
      upstream_ = std::move(other.upstream_);
      opts_ = other.opts_;
      chunks_ = std::exchange(other.chunks_, {});
      current_ = std::exchange(other.current_, 0);
      offset_ = std::exchange(other.offset_, 0);
      blocks_ = std::exchange(other.blocks_, 0);
      live_bytes_ = std::exchange(other.live_bytes_, 0);
      next_chunk_ = other.next_chunk_;
    }
    return *this;
  }
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;
  ~arena() { release_chunks(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_alignment("arena", alignment, opts_.max_chunk);
    if (bytes == 0) return nullptr;
    std::size_t size = 0;
    if (!checked_align_up(bytes, default_alignment, size)) throw out_of_memory("arena", bytes, figures(reserved(), in_use()));
    const std::size_t align = effective_alignment(alignment);
    // Find the first chunk from the current one on that fits, without moving until the block is certain.
    std::size_t chunk = current_, offset = offset_;
    for (; chunk < chunks_.size(); ++chunk, offset = 0) {
      const std::uintptr_t end = chunks_[chunk].base + chunks_[chunk].size;
      const std::uintptr_t start = align_address(chunks_[chunk].base + offset, align);
      if (start <= end && size <= end - start) return commit(chunk, start, size);  // no sum that can wrap
    }
    add_chunk(size, align, bytes);  // may throw: nothing has moved yet
    return commit(chunk, align_address(chunks_[chunk].base, align), size);
  }

  /// Rolls back when p is the block at the top of the current chunk; otherwise only counts the free.
  void deallocate(void* p, std::size_t bytes, std::size_t = default_alignment) noexcept
  {
    if (p == nullptr) return;
    --blocks_;
    live_bytes_ -= align_up(bytes, default_alignment);
    if (current_ >= chunks_.size()) return;
    const auto start = reinterpret_cast<std::uintptr_t>(p);
    const chunk_info& c = chunks_[current_];
    if (start >= c.base && start + align_up(bytes, default_alignment) == c.base + offset_) offset_ = start - c.base;
  }

  /// Every chunk reusable from its start; nothing handed out may be used afterwards.
  void reset() noexcept
  {
    current_ = 0;
    offset_ = 0;
    blocks_ = 0;
    live_bytes_ = 0;
  }

  mark checkpoint() const noexcept { return {current_, offset_, blocks_, live_bytes_}; }

  /// Back to `m` (taken since the last reset): blocks allocated after it are gone.
  void rewind(const mark& m) noexcept
  {
    current_ = m.chunk;
    offset_ = m.offset;
    blocks_ = m.blocks;
    live_bytes_ = m.live_bytes;
  }

  /// Returns every chunk to the upstream (implies reset()).
  void release() noexcept
  {
    release_chunks();
    reset();
    next_chunk_ = opts_.initial_chunk;
  }

  bool owns(const void* p) const noexcept
  {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    return std::any_of(chunks_.begin(), chunks_.end(), [a](const chunk_info& c) { return a >= c.base && a < c.base + c.size; });
  }

  strata::usage usage() const noexcept
  {
    strata::usage u{.reserved = reserved(), .in_use = in_use(), .chunks = chunks_.size(), .used_blocks = blocks_};
    for (std::size_t i = current_; i < chunks_.size(); ++i) {
      const std::size_t left = chunks_[i].size - (i == current_ ? offset_ : 0);
      u.largest_free = std::max(u.largest_free, left);
      u.free_blocks += left > 0;
    }
    return u;
  }

  strata::snapshot snapshot() const
  {
    strata::snapshot s{.box = "arena", .segments = {}};
    for (std::size_t i = 0; i < chunks_.size(); ++i) {
      const std::size_t used = i < current_ ? chunks_[i].size : i == current_ ? offset_ : 0;
      segment_info seg{.address = chunks_[i].base, .size = chunks_[i].size, .blocks = {}, .mapped = {}};
      if (used > 0) seg.blocks.push_back({0, used, false, -1});
      if (used < chunks_[i].size) seg.blocks.push_back({used, chunks_[i].size - used, true, -1});
      s.segments.push_back(std::move(seg));
    }
    return s;
  }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }

  friend bool operator==(const arena& a, const arena& b) noexcept { return &a == &b; }

private:
  struct chunk_info {
    std::uintptr_t base;
    std::size_t size;
    std::size_t alignment;  ///< what the chunk was asked for with, to free it the same way
  };

  void* commit(std::size_t chunk, std::uintptr_t start, std::size_t size) noexcept
  {
    current_ = chunk;
    offset_ = start + size - chunks_[chunk].base;
    ++blocks_;
    live_bytes_ += size;
    return reinterpret_cast<void*>(start);
  }

  void add_chunk(std::size_t size, std::size_t align, std::size_t bytes)
  {
    const std::size_t chunk_align = std::min(align, max_alignment_of<Upstream>);
    if (size > SIZE_MAX - (align - chunk_align)) throw out_of_memory("arena", bytes, figures(reserved(), in_use()));
    const std::size_t needed = size + (align - chunk_align);
    std::size_t chunk_size = std::max(needed, next_chunk_);
    void* base = nullptr;
    try {
      base = upstream_.allocate(chunk_size, chunk_align);
    } catch (const out_of_memory&) {
      if (chunk_size == needed) throw out_of_memory("arena", bytes, figures(reserved(), in_use()));
      chunk_size = needed;  // the smallest chunk that fits, before giving up
      try {
        base = upstream_.allocate(chunk_size, chunk_align);
      } catch (const out_of_memory&) {
        throw out_of_memory("arena", bytes, figures(reserved(), in_use()));
      }
    }
    try {
      chunks_.push_back({reinterpret_cast<std::uintptr_t>(base), chunk_size, chunk_align});
    } catch (...) {
      upstream_.deallocate(base, chunk_size, chunk_align);
      throw;
    }
    next_chunk_ = next_chunk_ > opts_.max_chunk / opts_.growth_factor ? opts_.max_chunk : next_chunk_ * opts_.growth_factor;
  }

  std::size_t reserved() const noexcept
  {
    std::size_t total = 0;
    for (const auto& c : chunks_) total += c.size;
    return total;
  }

  /// The live blocks' bytes: what frees that cannot roll the bump pointer back leave behind is free memory
  /// (not reusable until reset), so in_use is the sum of the live blocks' sizes, as in every policy.
  std::size_t in_use() const noexcept { return live_bytes_; }

  void release_chunks() noexcept
  {
    for (const auto& c : chunks_) upstream_.deallocate(reinterpret_cast<void*>(c.base), c.size, c.alignment);
    chunks_.clear();
  }

  [[no_unique_address]] Upstream upstream_;
  options opts_;
  std::vector<chunk_info> chunks_;
  std::size_t current_ = 0;
  std::size_t offset_ = 0;
  std::size_t blocks_ = 0;
  std::size_t live_bytes_ = 0;  ///< the live blocks' sizes, rounded to 256 bytes
  std::size_t next_chunk_;
};

namespace detail::arena_claims {
using P = arena<archetype_resource>;
static_assert(resource<P> && owning_resource<P> && releasable_resource<P> && resettable_resource<P> && usage_reporting_resource<P> && snapshot_resource<P>);
static_assert(cccl::synchronous_resource_with<P, device_accessible> && !has_property<P, host_accessible>);  // forwarded
static_assert(answers_to_cccl31_names<P> && !stream_resource<P>);
static_assert(!std::is_copy_constructible_v<P> && std::is_nothrow_move_constructible_v<P>);
} // namespace detail::arena_claims

} // namespace strata
