#pragma once
// Private pools for CUDA graphs (what PyTorch calls a graph's private memory pool): the blocks a graph's
// captured allocations were given stay reserved for that graph while it lives, because the graph may be
// replayed at any time and every replay uses the same addresses. A block freed inside the pool is reused only
// by later allocations of the same pool in the same stream order (same capture and capturing stream, or same
// uncaptured stream); nobody outside the pool ever gets it until the pool is released.
//
// A block serves only allocations under its own tag (docs/sleep_wake.md): a tag's blocks sleep and wake with
// it, so a block of a sleeping tag handed to another tag's allocation would have no memory behind it.
//
// This is host bookkeeping only: it never calls CUDA and never touches the memory. stream_ordered decides
// where pool blocks come from (its policy) and where they go when a pool is released.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <strata/core/tags.hpp>

namespace strata::detail {

/// The stream order a pool block was freed in; a later allocation with the same tag may reuse it at once.
/// Under capture: the capture's id and the capturing stream's handle (a capturing stream is alive, and its id
/// may not be asked while it captures); outside capture: capture 0 and the stream's id.
struct reuse_tag {
  std::uint64_t capture = 0;
  std::uint64_t stream = 0;
  friend auto operator<=>(const reuse_tag&, const reuse_tag&) = default;

  /// A free with no stream to order it by (a synchronous free of a pool block): never reused in the pool.
  static constexpr reuse_tag nowhere() noexcept { return {~std::uint64_t{0}, ~std::uint64_t{0}}; }
};

/// A pool's name: a caller's pool id (begin_allocate_to_pool), or a capture id (automatic mode). The two
/// spaces are kept apart so a caller's id never collides with a capture's.
struct pool_name {
  std::uint64_t id = 0;
  bool automatic = false;
  friend auto operator<=>(const pool_name&, const pool_name&) = default;
};

/// Every private pool of one stream_ordered layer. `Block` is what the layer needs to give a block back (its
/// pointer first); `key` is the layer's shape key (blocks with one key are interchangeable); `tag` the
/// block's tag (the allocation's, when it was taken from the policy).
/// Costs: take and put O(log b) in the pool's bins; owner_of a hash lookup; adopt a hash insert.
/// Strong guarantee: open, adopt and put either succeed or change nothing. Unsynchronized.
template <class Block>
class graph_pools {
public:
  struct pool {
    pool_name name;
    std::map<std::tuple<std::uint64_t, std::uint64_t, tag_id, std::uint64_t>, std::vector<Block>> bins;  ///< (order, tag, key)
    std::size_t live_blocks = 0;  ///< handed out and not freed back
    std::size_t free_blocks = 0;  ///< in the bins
    std::size_t bytes = 0;        ///< of every block the pool holds, live or free (as the caller counts them)
    bool released = false;        ///< its graphs are gone: free blocks left, live ones leave when freed
  };

  bool empty() const noexcept { return pools_.empty(); }
  std::size_t size() const noexcept { return pools_.size(); }

  pool* find(pool_name name) noexcept
  {
    const auto it = pools_.find(name);
    return it == pools_.end() ? nullptr : &it->second;
  }
  const pool* find(pool_name name) const noexcept
  {
    const auto it = pools_.find(name);
    return it == pools_.end() ? nullptr : &it->second;
  }

  /// The pool of that name, made empty if new (second: whether it was made).
  std::pair<pool*, bool> open(pool_name name)
  {
    auto [it, fresh] = pools_.try_emplace(name);
    it->second.name = name;
    return {&it->second, fresh};
  }

  /// Blocks the pool of that name holds, live and free; 0 for none.
  std::size_t blocks_in(pool_name name) const noexcept
  {
    const pool* pl = find(name);
    return pl == nullptr ? 0 : pl->live_blocks + pl->free_blocks;
  }

  /// A pool's name used again after its release: the blocks it still holds are its own again.
  static void reopen(pool& pl) noexcept { pl.released = false; }

  /// Forgets a pool holding nothing (a failed first allocation, or a released pool whose last block left).
  void erase_if_empty(pool& pl) noexcept
  {
    if (pl.live_blocks == 0 && pl.free_blocks == 0) pools_.erase(pl.name);
  }

  /// The first pool satisfying `pred`, or null.
  template <class Pred>
  pool* first_where(Pred pred) noexcept
  {
    for (auto& [name, pl] : pools_)
      if (pred(pl)) return &pl;
    return nullptr;
  }

  /// The pool a block belongs to, or null.
  pool* owner_of(const void* p) noexcept
  {
    if (owners_.empty()) return nullptr;
    const auto it = owners_.find(p);
    return it == owners_.end() ? nullptr : it->second;
  }

  /// A block of this tag and key freed in the pool in the same stream order, now handed out again; false if none.
  bool take(pool& pl, reuse_tag order, tag_id tag, std::uint64_t key, Block& out) noexcept
  {
    const auto it = pl.bins.find({order.capture, order.stream, tag, key});
    if (it == pl.bins.end()) return false;
    out = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) pl.bins.erase(it);
    --pl.free_blocks;
    ++pl.live_blocks;
    return true;
  }

  /// Makes the next adopt() unable to fail: a spare hash node and room in the table. Call it before taking
  /// the block from anywhere, so a host allocation failure leaves nothing to undo.
  void prepare_adopt()
  {
    if (spare_.empty()) {
      owners_.emplace(&spare_, nullptr);  // a key no block can have
      spare_ = owners_.extract(&spare_);
    }
    owners_.reserve(owners_.size() + 1);
  }

  /// A block newly given to the pool, handed out (taken from the policy, or freed under capture from outside
  /// the pools: then put() follows at once). After prepare_adopt(): allocates nothing, cannot fail.
  void adopt(pool& pl, const void* p, std::size_t bytes) noexcept
  {
    spare_.key() = p;
    spare_.mapped() = &pl;
    owners_.insert(std::move(spare_));
    ++pl.live_blocks;
    pl.bytes += bytes;
  }

  /// A live block of the pool freed: filed for reuse in the same stream order, under its own tag.
  void put(pool& pl, reuse_tag order, tag_id tag, std::uint64_t key, const Block& b)
  {
    auto& bin = pl.bins[{order.capture, order.stream, tag, key}];
    try {
      bin.push_back(b);
    } catch (...) {
      if (bin.empty()) pl.bins.erase({order.capture, order.stream, tag, key});
      throw;
    }
    --pl.live_blocks;
    ++pl.free_blocks;
  }

  /// A live block leaves the pool (freed after its pool was released): the caller frees it the common way.
  void disown(pool& pl, const void* p, std::size_t bytes) noexcept
  {
    owners_.erase(p);
    --pl.live_blocks;
    pl.bytes -= bytes;
    if (pl.released) erase_if_empty(pl);
  }

  /// Hands every free block of a pool to `sink` (noexcept) and forgets them; the pool stays while it has live
  /// blocks, marked released.
  template <class Sink>
  void drain(pool& pl, std::size_t (*bytes_of)(const Block&), Sink&& sink) noexcept
  {
    for (auto& [where, bin] : pl.bins)
      for (const Block& b : bin) {
        owners_.erase(b.p);
        pl.bytes -= bytes_of(b);
        sink(b);
      }
    pl.bins.clear();
    pl.free_blocks = 0;
    pl.released = true;
    erase_if_empty(pl);
  }

  /// Blocks in all pools, free ones, and their bytes (live and free).
  std::size_t blocks() const noexcept { return owners_.size(); }
  std::size_t free_blocks() const noexcept
  {
    std::size_t n = 0;
    for (const auto& [name, pl] : pools_) n += pl.free_blocks;
    return n;
  }
  std::size_t bytes() const noexcept
  {
    std::size_t n = 0;
    for (const auto& [name, pl] : pools_) n += pl.bytes;
    return n;
  }

  /// Moves leave the source empty.
  graph_pools() = default;
  graph_pools(graph_pools&& other) noexcept
      : pools_(std::move(other.pools_)), owners_(std::move(other.owners_)), spare_(std::move(other.spare_))
  {
    other.pools_.clear();
    other.owners_.clear();
  }
  graph_pools& operator=(graph_pools&& other) noexcept
  {
    pools_ = std::move(other.pools_);
    owners_ = std::move(other.owners_);
    spare_ = std::move(other.spare_);
    other.pools_.clear();
    other.owners_.clear();
    return *this;
  }

private:
  std::map<pool_name, pool> pools_;  // node-based: a pool's address is stable (owners_ points at it)
  std::unordered_map<const void*, pool*> owners_;
  typename std::unordered_map<const void*, pool*>::node_type spare_;  ///< for adopt(), made by prepare_adopt()
};

/// Where a graph's end is reported: a CUDA user object's destructor runs on a CUDA internal thread, where no
/// CUDA call may be made, so it only posts the pool's id here under a small lock; the layer collects the ids
/// at its next call (an atomic load when there are none). Shared (shared_ptr) between the layer and every
/// graph token, so a graph outliving its layer posts into an inbox nobody reads, harmlessly.
class graph_release_inbox {
public:
  /// Room for one more post, made before a token is handed to CUDA: post() itself never allocates.
  void expect_one()
  {
    std::lock_guard lock(mutex_);
    posted_.reserve(posted_.size() + expected_ + 1);
    ++expected_;
  }
  /// A token handed out by expect_one() will never post (CUDA refused it).
  void unexpect_one() noexcept
  {
    std::lock_guard lock(mutex_);
    --expected_;
  }

  void post(std::uint64_t id) noexcept
  {
    std::lock_guard lock(mutex_);
    posted_.push_back(id);  // capacity reserved by expect_one
    --expected_;
    any_.store(true, std::memory_order_release);
  }

  bool any() const noexcept { return any_.load(std::memory_order_acquire); }

  /// The oldest posted id (false if none); pop() once it has been dealt with.
  bool front(std::uint64_t& id) noexcept
  {
    std::lock_guard lock(mutex_);
    if (posted_.empty()) return false;
    id = posted_.front();
    return true;
  }
  void pop() noexcept
  {
    std::lock_guard lock(mutex_);
    posted_.erase(posted_.begin());
    if (posted_.empty()) any_.store(false, std::memory_order_release);
  }

  /// What CUDA calls when the last graph or executable graph holding the token is gone.
  struct token {
    std::shared_ptr<graph_release_inbox> inbox;
    std::uint64_t id;
  };
  static void on_graph_destroyed(void* t) noexcept
  {
    auto* tok = static_cast<token*>(t);
    tok->inbox->post(tok->id);
    delete tok;
  }

private:
  std::mutex mutex_;
  std::vector<std::uint64_t> posted_;
  std::size_t expected_ = 0;  ///< tokens out that may still post
  std::atomic<bool> any_{false};
};

} // namespace strata::detail
