#pragma once
// The blocks the torch backend has handed to PyTorch, and PyTorch's private pools (CUDA graphs,
// torch.cuda.MemPool), without PyTorch so the host tests check them.
//
// Why blocks are parked: a CUDA graph replays at the addresses it captured, and torch.compile's graph trees
// rewind a pool to an earlier checkpoint (setCheckpointPoolState), which must hand out the checkpoint's blocks
// again at the same addresses. A block freed into a live private pool therefore stays with strata, parked in
// its pool, and the pool's release gives it back to strata. PyTorch's own allocator keeps a pool's memory
// until its release too.
//
// A pool's memory is a set of segments, each taken from strata for the pool at PyTorch's size (Note [Private
// pools are laid out as PyTorch lays them out], pool_layout.hpp). A segment is cut into pieces, each live
// (handed to PyTorch) or parked. An allocation in the pool takes the smallest settled parked piece of its
// stream and its kind (small or large) that fits (best fit) and, where PyTorch would split it, cuts the rest
// off as a parked piece of its own; a piece parked next to a settled parked piece of its segment merges with
// it. So a backward pass reuses what the forward freed, whatever the sizes. A segment goes back to strata
// whole, once its pool is released and none of its pieces is live.
//
// Note (a parked block's reuse is stream-ordered): nothing orders the work queued on a block before its free
// with the work of its next owner except the stream both run on. A segment therefore serves one stream, the
// one it was allocated on, and a parked piece is revived only once it is settled: a block recorded on other
// streams (record_stream) waits, parked but unsettled, until events recorded on those streams at its free have
// completed (pool_waits.hpp). While an allocation to some private pool is under way (a capture may be running,
// and an event recorded in a capture can never be queried) the free is deferred instead: the events are
// recorded once no allocation to a pool is under way. This is the contract of PyTorch's caching allocator.
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "pool_layout.hpp"

namespace strata::plugin {

/// PyTorch's MempoolId_t: {n, 0} for a graph's pool, {0, n} for a user's MemPool, {0, 0} for none.
struct pool_id {
  unsigned long long first = 0;
  unsigned long long second = 0;
  constexpr bool none() const noexcept { return first == 0 && second == 0; }
  constexpr bool operator==(const pool_id&) const = default;
  constexpr bool operator<(const pool_id& o) const noexcept
  {
    return first != o.first ? first < o.first : second < o.second;
  }
  std::string text() const { return "(" + std::to_string(first) + ", " + std::to_string(second) + ")"; }
};

/// A block handed to PyTorch: what its free needs (size, stream) and what snapshots show.
template <class Context>
struct live_block {
  std::size_t size = 0;       ///< bytes asked of strata
  std::size_t requested = 0;  ///< bytes PyTorch asked for
  void* stream = nullptr;
  pool_id pool{};
  Context context{};          ///< where it was allocated (history recording), empty otherwise
  std::vector<void*> uses{};  ///< streams besides `stream` it was recorded on (record_stream), in a private pool
};

/// What erase() did with a live block: returned it to the caller to free (parked false), or parked it in its
/// pool. A parked block with a nonzero ticket is unsettled (see the Note on stream-ordered reuse): the caller
/// starts its wait (pool_waits::hold) unless the free was deferred, and settles it with this ticket.
template <class Context>
struct freed_block {
  live_block<Context> b;
  bool parked = false;
  std::uint64_t ticket = 0;
  /// What the caller gives back to strata now, if anything: the block itself (outside the pools), or the
  /// whole segment it was cut from (its pool released and no piece of it live), with the streams its pieces
  /// were recorded on.
  std::optional<std::pair<std::uintptr_t, live_block<Context>>> to_strata;
};

/// A piece of a pool's segment (snapshots list them).
struct pool_piece {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  bool live = false;
};

/// An unsettled parked block whose free was deferred, now to wait on its recorded streams (take_deferred).
struct deferred_free {
  std::uintptr_t address = 0;
  std::uint64_t ticket = 0;
  std::vector<void*> uses;
};

/// A private pool's blocks at one moment: what setCheckpointPoolState restores.
template <class Context>
struct pool_checkpoint {
  int device = 0;
  pool_id pool{};
  std::vector<std::pair<std::uintptr_t, live_block<Context>>> blocks;  ///< address order
};

/// What restoring a checkpoint changed: blocks PyTorch must forget, blocks it is handed again.
template <class Context>
struct checkpoint_delta {
  std::vector<std::uintptr_t> freed;
  std::vector<std::pair<std::uintptr_t, live_block<Context>>> revived;
};

/// Values by address, in one array: open addressing with linear probing, at most half full, and deletion that
/// shifts the rest of the probe run back instead of leaving tombstones. Why not std::unordered_map: a live block
/// is inserted and erased once per tensor, and a node-based map allocates and frees a node each time, which is
/// most of the table's cost on that path. Address 0 marks an empty slot (no block lives at 0). Cost: O(1)
/// expected per find/insert/take, O(capacity) per iteration and growth; insert is the only member that
/// allocates, and it leaves the table as it was when that throws.
template <class Value>
class address_table {
public:
  std::size_t size() const noexcept { return size_; }

  Value* find(std::uintptr_t key) noexcept
  {
    const std::size_t i = index_of(key);
    return i == npos ? nullptr : &slots_[i].value;
  }
  const Value* find(std::uintptr_t key) const noexcept { return const_cast<address_table*>(this)->find(key); }

  /// Room for `n` entries, so that inserting up to that many allocates nothing.
  void reserve(std::size_t n)
  {
    while (2 * n > slots_.size()) grow();
  }

  /// Adds a key that is not in the table (the caller checked), not 0.
  void insert(std::uintptr_t key, Value value)
  {
    reserve(size_ + 1);
    place(key, std::move(value));
  }

  /// Removes the key and returns its value; nullopt when it is not in the table.
  std::optional<Value> take(std::uintptr_t key) noexcept
  {
    const std::size_t i = index_of(key);
    if (i == npos) return std::nullopt;
    std::optional<Value> out{std::move(slots_[i].value)};
    remove_at(i);
    return out;
  }

  /// The slot a key's probe starts at, and the slots there are (tests build colliding keys from them).
  std::size_t home_of(std::uintptr_t key) const noexcept { return slots_.empty() ? 0 : home(key); }
  std::size_t capacity() const noexcept { return slots_.size(); }

  /// f(key, value) for every entry, in no particular order.
  template <class F>
  void for_each(F&& f) const
  {
    for (const slot& s : slots_)
      if (s.key != 0) f(s.key, s.value);
  }

private:
  struct slot {
    std::uintptr_t key = 0;
    Value value{};
  };
  static constexpr std::size_t npos = SIZE_MAX;

  /// Fibonacci hashing: blocks are aligned, so their low bits alone would crowd a few slots.
  std::size_t home(std::uintptr_t key) const noexcept
  {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  std::size_t index_of(std::uintptr_t key) const noexcept
  {
    if (size_ == 0 || key == 0) return npos;
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return i;
      if (slots_[i].key == 0) return npos;
    }
  }

  void place(std::uintptr_t key, Value&& value) noexcept
  {
    std::size_t i = home(key);
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i].key = key;
    slots_[i].value = std::move(value);
    ++size_;
  }

  /// Empties slot i, moving back each later entry of the run whose home does not lie after the gap, so that a
  /// lookup may stop at the first empty slot.
  void remove_at(std::size_t i) noexcept
  {
    for (std::size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      const std::size_t h = home(slots_[j].key);
      const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);  // h cyclically in (i, j]
      if (stays) continue;
      slots_[i].key = slots_[j].key;
      slots_[i].value = std::move(slots_[j].value);
      i = j;
    }
    slots_[i].key = 0;
    slots_[i].value = Value{};  // what the entry held (a context) goes now, not when the slot is reused
    --size_;
  }

  void grow()
  {
    const std::size_t capacity = slots_.empty() ? 64 : 2 * slots_.size();
    std::vector<slot> bigger(capacity);  // the only allocation: nothing has changed if it throws
    std::swap(slots_, bigger);
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(capacity));
    size_ = 0;
    for (slot& s : bigger)
      if (s.key != 0) place(s.key, std::move(s.value));
  }

  std::vector<slot> slots_;
  std::size_t size_ = 0;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
};

/// Live blocks by address and the private pools with their segments. Models: the bookkeeping of PyTorch's
/// allocator interface (raw_delete by pointer, pool use counts, record_stream inside a pool, best-fit reuse
/// with splitting and merging inside a pool, checkPoolLiveAllocations, checkpoints). Cost: O(1) expected per
/// insert/erase outside the pools (address_table); O(log n) per allocation, free and settle in a pool (n: its
/// pieces), O(pools) to find a piece's pool; O(pieces of the pool) per checkpoint, restore and deferred list;
/// no lock (the backend holds the device's); no CUDA call (the events of unsettled pieces are the caller's,
/// pool_waits.hpp). Every throwing member leaves the table as it was.
template <class Context>
class block_table {
public:
  using block = live_block<Context>;
  using returned = std::pair<std::uintptr_t, block>;

  /// Records a block handed out (from strata). In a private pool it becomes a segment of that pool of the
  /// block's size, wholly live (insert_segment). Throws std::logic_error if the address is already live (a
  /// stack bug).
  void insert(std::uintptr_t address, block b)
  {
    if (!b.pool.none()) {
      const std::size_t whole = b.size;
      (void)insert_segment(address, whole, std::move(b));
      return;
    }
    if (live_.find(address) != nullptr) throw std::logic_error("block_table: address " + std::to_string(address) + " is already live");
    const bool small = pool_layout::is_small(pool_layout::block_bytes(b.size));
    live_.reserve(live_.size() + 1);
    if (small) small_pages_.reserve(small_pages_.size() + 2);  // a small block lies in at most two pages
    if (small) count_small_pages(address, b.size, +1);  // reserved: cannot fail from here on
    live_.insert(address, std::move(b));
  }

  /// The small pool's pages outside the private pools: 2 MiB pages (PyTorch's small segment) holding at least
  /// one live small block (Note [The small pool outside the private pools]). O(1).
  std::size_t small_pages() const noexcept { return small_pages_.size(); }

  /// A segment of `segment_bytes` taken from strata for b's pool at `base`, its first `b.size` bytes handed
  /// out; the rest is parked where PyTorch would split it (pool_layout::splits), else handed out too. The
  /// segment's kind is the block's. Returns the live block's size. Throws std::invalid_argument (an unknown
  /// pool, a block of 0 or more than the segment) or std::logic_error (the address already live), the table
  /// unchanged.
  std::size_t insert_segment(std::uintptr_t base, std::size_t segment_bytes, block b)
  {
    if (live_.find(base) != nullptr) throw std::logic_error("block_table: address " + std::to_string(base) + " is already live");
    pool_state& p = pool_of(b.pool, "insert");
    if (p.segments.count(base) != 0)
      throw std::logic_error("block_table: pool " + b.pool.text() + " already has a segment at " + std::to_string(base));
    if (b.size == 0 || b.size > segment_bytes)
      throw std::invalid_argument("block_table: a block of " + std::to_string(b.size) + " bytes does not fit a segment of " +
                                  std::to_string(segment_bytes));
    const bool small = pool_layout::is_small(b.size);
    const bool split = !p.no_split && pool_layout::splits(segment_bytes, b.size, small);
    if (!split) b.size = segment_bytes;
    live_.reserve(live_.size() + 1);
    if (split) free_index_reserve(p);
    const auto seg = p.segments.emplace(base, segment{segment_bytes, b.stream, small}).first;
    try {
      p.pieces.emplace(base, piece{b.size, true, 0, false, b.stream, {}, small});
      if (split) p.pieces.emplace(base + b.size, piece{segment_bytes - b.size, false, 0, false, b.stream, {}, small});
    } catch (...) {
      p.pieces.erase(base);
      p.segments.erase(seg);
      throw;
    }
    const std::size_t k = pool_figures::index(small);
    ++figures_.segments[k];
    figures_.segment_bytes[k] += segment_bytes;
    figures_.live_bytes[k] += b.size;
    if (split) {
      figures_.parked_bytes[k] += segment_bytes - b.size;
      ++figures_.parked_blocks[k];
      try {
        p.free_index.emplace(b.stream, small, segment_bytes - b.size, base + b.size);
      } catch (...) {  // after free_index_reserve's probe this fails only if memory ran out since: it stays unoffered
      }
    }
    ++p.live;
    const std::size_t handed = b.size;
    live_.insert(base, std::move(b));  // reserved: cannot fail
    return handed;
  }

  const block* find(std::uintptr_t address) const noexcept { return live_.find(address); }

  /// record_stream of a live block in a private pool: its reuse in the pool must wait for `stream`'s work at
  /// its free. False (nothing noted) for a block outside the pools or not live: the caller notes the use where
  /// the block's free goes (strata's stack). Recording the allocation stream notes nothing: its order covers it.
  bool record_use(std::uintptr_t address, void* stream)
  {
    block* b = live_.find(address);
    if (b == nullptr || b->pool.none()) return false;
    if (stream != b->stream && std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end()) b->uses.push_back(stream);
    return true;
  }

  /// Forgets a live block. Returns it, whether it stays parked in its pool, and what goes back to strata now.
  /// nullopt when the address is not live (not this table's). A piece recorded on other streams is parked
  /// unsettled (a ticket); `defer` says an allocation to a private pool is under way, so its wait starts
  /// later (take_deferred).
  std::optional<freed_block<Context>> erase(std::uintptr_t address, bool defer = false)
  {
    block* found = live_.find(address);
    if (found == nullptr) return std::nullopt;
    freed_block<Context> out;
    if (found->pool.none()) {
      out.to_strata.emplace(address, *found);  // the copy may throw: the table is unchanged then
      out.b = std::move(*live_.take(address));
      if (pool_layout::is_small(pool_layout::block_bytes(out.b.size))) count_small_pages(address, out.b.size, -1);
      return out;
    }
    pool_state& p = pools_.at(found->pool);
    const auto it = p.pieces.find(address);
    piece& pc = it->second;
    const bool released = p.use_count == 0;
    std::vector<void*> uses = found->uses;  // may throw, before anything changes
    std::uint64_t ticket = 0;
    if (!released && !uses.empty()) ticket = ++last_ticket_;
    if (ticket == 0 && !released) free_index_reserve(p);
    out.b = std::move(*live_.take(address));
    --p.live;
    pc.live = false;
    pc.stream = out.b.stream;
    pc.uses = std::move(uses);
    pc.ticket = ticket;
    pc.deferred = ticket != 0 && defer;
    if (pc.deferred) ++deferred_blocks_;
    const std::size_t k = pool_figures::index(pc.small);
    figures_.live_bytes[k] -= pc.size;
    figures_.parked_bytes[k] += pc.size;
    ++figures_.parked_blocks[k];
    out.parked = true;
    out.ticket = ticket;
    if (released) {
      out.parked = false;
      if (auto seg = give_back_if_free(p, segment_of(p, address))) out.to_strata = std::move(*seg);
      erase_pool_if_empty(found_pool_after(out.b.pool));
    } else if (ticket == 0) {
      index_and_merge(p, it);
    }
    return out;
  }

  /// The unsettled parked piece's wait is over (its events completed): it may be revived. False when no piece
  /// is parked there under that ticket (its pool was released, or a checkpoint took it back).
  bool settle(std::uintptr_t address, std::uint64_t ticket) noexcept
  {
    if (ticket == 0) return false;
    for (auto& [id, p] : pools_) {
      const auto it = p.pieces.find(address);
      if (it == p.pieces.end() || it->second.live || it->second.ticket != ticket) continue;
      if (it->second.deferred) --deferred_blocks_;
      it->second.ticket = 0;
      it->second.deferred = false;
      it->second.uses.clear();
      try {
        free_index_reserve(p);
      } catch (...) {
        return true;  // settled, just not offered until the next merge around it indexes it
      }
      index_and_merge(p, it);
      return true;
    }
    return false;
  }

  /// The deferred frees, now to wait on their recorded streams (no allocation to a pool is under way): they
  /// stay unsettled, no longer deferred.
  std::vector<deferred_free> take_deferred()
  {
    std::vector<deferred_free> out;
    if (deferred_blocks_ == 0) return out;
    for (auto& [id, p] : pools_)
      for (auto& [a, pc] : p.pieces)
        if (!pc.live && pc.deferred) out.push_back({a, pc.ticket, pc.uses});
    for (auto& [id, p] : pools_)  // nothing below throws
      for (auto& [a, pc] : p.pieces) pc.deferred = false;
    deferred_blocks_ = 0;
    return out;
  }

  /// Parked pieces whose wait has not ended (deferred or waiting on events).
  std::size_t unsettled_blocks() const noexcept
  {
    std::size_t n = 0;
    for (const auto& [id, p] : pools_)
      for (const auto& [a, pc] : p.pieces) n += !pc.live && pc.ticket != 0 ? 1 : 0;
    return n;
  }

  // ---- private pools -------------------------------------------------------------------------------------
  /// createOrIncrefPool (and beginAllocateToPool): a new pool starts at one use.
  void create_or_incref(pool_id id)
  {
    if (id.none()) throw std::invalid_argument("private pool id (0, 0) is PyTorch's default pool, not a private one");
    ++pools_[id].use_count;
  }
  int use_count(pool_id id) const noexcept
  {
    const auto it = pools_.find(id);
    return it == pools_.end() ? 0 : it->second.use_count;
  }
  bool known(pool_id id) const noexcept { return pools_.count(id) != 0; }
  void set_use_on_oom(pool_id id, bool on) { pool_of(id, "setUseOnOOM").use_on_oom = on; }
  /// setNoSplit: the pool hands its parked pieces out whole (a pool whose blocks are registered whole with
  /// another library, NCCL's); best fit still chooses among them.
  void set_no_split(pool_id id) { pool_of(id, "setNoSplit").no_split = true; }
  bool use_on_oom(pool_id id) const noexcept
  {
    const auto it = pools_.find(id);
    return it != pools_.end() && it->second.use_on_oom;
  }

  /// releasePool: one use fewer. At zero every segment with no live piece is returned (for strata to free,
  /// with the streams its unsettled pieces were recorded on, which strata's stack then waits for); the others
  /// follow as their last live piece is freed, and the pool is forgotten once it holds nothing.
  std::vector<returned> release(pool_id id)
  {
    pool_state& p = pool_of(id, "releasePool");
    if (p.use_count == 0) throw std::logic_error("releasePool: pool " + id.text() + " has no use left to release");
    std::vector<returned> out;
    if (p.use_count > 1) {
      --p.use_count;
      return out;
    }
    out.reserve(p.segments.size());
    std::vector<std::uintptr_t> bases;
    bases.reserve(p.segments.size());
    for (const auto& [base, seg] : p.segments) bases.push_back(base);
    --p.use_count;  // nothing below throws: the vectors have their room
    for (std::uintptr_t base : bases)
      if (auto seg = give_back_if_free(p, base)) out.push_back(std::move(*seg));
    erase_pool_if_empty(pools_.find(id));
    return out;
  }

  /// The smallest settled parked piece of the pool allocated on `stream`, of the kind of a block for `size`
  /// bytes, that holds that block (pool_layout::block_bytes), cut to it where PyTorch would split it (the rest
  /// stays parked) and made live (nullopt: none). The live block's size is the piece's. See the Note on
  /// stream-ordered reuse.
  std::optional<std::uintptr_t> revive(pool_id id, std::size_t size, std::size_t requested, void* stream, Context context = {})
  {
    const auto pit = pools_.find(id);
    if (pit == pools_.end() || size == 0) return std::nullopt;
    pool_state& p = pit->second;
    const std::size_t wanted = pool_layout::block_bytes(size);
    const bool small = pool_layout::is_small(wanted);
    const auto fit = p.free_index.lower_bound({stream, small, wanted, 0});
    if (fit == p.free_index.end() || std::get<0>(*fit) != stream || std::get<1>(*fit) != small) return std::nullopt;
    const std::uintptr_t address = std::get<3>(*fit);
    const auto it = p.pieces.find(address);
    piece& pc = it->second;
    const bool split = !p.no_split && pool_layout::splits(pc.size, wanted, small);
    const std::size_t taken = split ? wanted : pc.size;
    live_.reserve(live_.size() + 1);  // the allocations first: nothing below may fail once things move
    std::optional<typename std::map<std::uintptr_t, piece>::iterator> rest;
    if (split) {
      free_index_reserve(p);
      rest = p.pieces.emplace_hint(std::next(it), address + taken, piece{pc.size - taken, false, 0, false, stream, {}, small});
    }
    p.free_index.erase(fit);
    const std::size_t k = pool_figures::index(small);
    if (rest) {
      p.free_index.emplace(stream, small, pc.size - taken, address + taken);  // room made by free_index_reserve
    } else {
      --figures_.parked_blocks[k];
    }
    figures_.parked_bytes[k] -= taken;
    figures_.live_bytes[k] += taken;
    pc.size = taken;
    pc.live = true;
    ++p.live;
    live_.insert(address, block{taken, requested, stream, id, std::move(context), {}});
    return address;
  }

  /// After strata ran out of memory: revive() in the pools marked use_on_oom (setUseOnOOM), first that serves.
  std::optional<std::uintptr_t> revive_on_oom(std::size_t size, std::size_t requested, void* stream, Context context = {})
  {
    for (auto& [id, p] : pools_)
      if (p.use_on_oom)
        if (auto address = revive(id, size, requested, stream, context)) return address;
    return std::nullopt;
  }

  /// checkPoolLiveAllocations: the pool's live blocks are exactly `expected`.
  bool pool_live_matches(pool_id id, const std::unordered_set<void*>& expected) const
  {
    std::size_t count = 0;
    bool all_expected = true;
    live_.for_each([&](std::uintptr_t a, const block& b) {
      if (b.pool != id) return;
      all_expected = all_expected && expected.count(reinterpret_cast<void*>(a)) != 0;
      ++count;
    });
    return all_expected && count == expected.size();
  }

  /// getCheckpointState: the pool's live blocks now.
  pool_checkpoint<Context> checkpoint(int device, pool_id id) const
  {
    pool_checkpoint<Context> c{device, id, {}};
    live_.for_each([&](std::uintptr_t a, const block& b) {
      if (b.pool == id) c.blocks.emplace_back(a, b);
    });
    std::sort(c.blocks.begin(), c.blocks.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    return c;
  }

  /// setCheckpointPoolState: every live block of the pool is parked, each segment's pieces become one, then
  /// the checkpoint's blocks are cut out of them at their addresses and made live (whether the pieces were
  /// settled or not: the graphs that own them order their work). What stays parked of a segment some of
  /// whose pieces were recorded on other streams is unsettled and deferred, as a free during a capture is.
  /// Throws std::invalid_argument (table unchanged) if a checkpoint block does not lie inside a segment of
  /// the pool (its memory went back to strata), or the pool was released.
  checkpoint_delta<Context> restore(const pool_checkpoint<Context>& c)
  {
    pool_state& p = pool_of(c.pool, "setCheckpointPoolState");
    if (p.use_count == 0) throw std::invalid_argument("setCheckpointPoolState: pool " + c.pool.text() + " was released");
    std::map<std::uintptr_t, std::vector<std::pair<std::uintptr_t, const block*>>> cuts;  // by segment
    for (const auto& [a, b] : c.blocks) {
      const std::uintptr_t base = segment_of(p, a);
      if (base == 0 || a + b.size > base + p.segments.at(base).size)
        throw std::invalid_argument("setCheckpointPoolState: the block at " + std::to_string(a) + " (" + std::to_string(b.size) +
                                    " bytes) of pool " + c.pool.text() + " is no longer held by the pool");
      cuts[base].emplace_back(a, &b);
    }
    checkpoint_delta<Context> d;
    live_.for_each([&](std::uintptr_t a, const block& b) {
      if (b.pool == c.pool) d.freed.push_back(a);
    });
    d.revived.reserve(c.blocks.size());
    // Every allocation of the rebuild is made here, in new containers: the swap below cannot fail.
    std::map<std::uintptr_t, piece> pieces;
    free_index_type index;
    std::vector<block> revived;
    revived.reserve(c.blocks.size());
    pool_figures before, after;  // this pool's pieces, before and after
    std::size_t deferred = 0;
    for (const auto& entry : p.segments) {
      const std::uintptr_t base = entry.first;
      const segment& seg = entry.second;  // not a structured binding: the lambda below captures it
      std::vector<void*> uses;
      for (auto it = p.pieces.lower_bound(base); it != p.pieces.end() && it->first < base + seg.size; ++it) {
        const std::vector<void*>* u = &it->second.uses;
        if (it->second.live) u = &live_.find(it->first)->uses;
        for (void* s : *u)
          if (std::find(uses.begin(), uses.end(), s) == uses.end()) uses.push_back(s);
      }
      std::uintptr_t at = base;
      const auto add_parked = [&](std::uintptr_t from, std::uintptr_t to) {
        if (to <= from) return;
        piece pc{to - from, false, 0, false, seg.stream, uses, seg.small};
        if (!uses.empty()) {
          pc.ticket = ++last_ticket_;
          pc.deferred = true;
          ++deferred;
        } else {
          index.emplace(seg.stream, seg.small, to - from, from);
        }
        pieces.emplace(from, std::move(pc));
        after.parked_bytes[pool_figures::index(seg.small)] += to - from;
        ++after.parked_blocks[pool_figures::index(seg.small)];
      };
      auto& mine = cuts[base];
      std::sort(mine.begin(), mine.end());
      for (const auto& [a, b] : mine) {
        add_parked(at, a);
        pieces.emplace(a, piece{b->size, true, 0, false, seg.stream, {}, seg.small});
        after.live_bytes[pool_figures::index(seg.small)] += b->size;
        at = a + b->size;
      }
      add_parked(at, base + seg.size);
    }
    for (const auto& [a, b] : c.blocks) revived.push_back(b);
    live_.reserve(live_.size() + c.blocks.size());
    // From here on nothing allocates.
    for (std::uintptr_t a : d.freed) (void)live_.take(a);
    p.live = 0;
    for (std::size_t i = 0; i < c.blocks.size(); ++i) {
      live_.insert(c.blocks[i].first, revived[i]);
      ++p.live;
    }
    for (const auto& [a, pc] : p.pieces) {
      const std::size_t k = pool_figures::index(pc.small);
      if (pc.live) {
        before.live_bytes[k] += pc.size;
        continue;
      }
      before.parked_bytes[k] += pc.size;
      ++before.parked_blocks[k];
      if (pc.deferred) --deferred_blocks_;
    }
    p.pieces.swap(pieces);
    p.free_index.swap(index);
    for (std::size_t k = 0; k < 2; ++k) {
      figures_.live_bytes[k] += after.live_bytes[k] - before.live_bytes[k];  // unsigned: wraps back into range
      figures_.parked_bytes[k] += after.parked_bytes[k] - before.parked_bytes[k];
      figures_.parked_blocks[k] += after.parked_blocks[k] - before.parked_blocks[k];
    }
    deferred_blocks_ += deferred;
    for (const auto& [a, b] : c.blocks) d.revived.emplace_back(a, b);  // reserved
    return d;
  }

  std::size_t live_blocks() const noexcept { return live_.size(); }
  std::size_t parked_bytes() const noexcept { return figures_.parked_bytes[0] + figures_.parked_bytes[1]; }
  std::size_t parked_blocks() const noexcept { return figures_.parked_blocks[0] + figures_.parked_blocks[1]; }
  /// The pools' segments and pieces by kind. O(1).
  const pool_figures& figures() const noexcept { return figures_; }
  /// Whether a piece is parked at `address` in some pool (snapshots show it inactive).
  bool parked(std::uintptr_t address) const noexcept
  {
    for (const auto& [id, p] : pools_) {
      const auto it = p.pieces.find(address);
      if (it != p.pieces.end() && !it->second.live) return true;
    }
    return false;
  }
  /// f(pool_piece) for each piece of the pool segment at `base`, in address order; returns the pool, or (0, 0)
  /// (f not called) when no pool has a segment there.
  template <class F>
  pool_id for_each_piece(std::uintptr_t base, F&& f) const
  {
    for (const auto& [id, p] : pools_) {
      const auto seg = p.segments.find(base);
      if (seg == p.segments.end()) continue;
      for (auto it = p.pieces.lower_bound(base); it != p.pieces.end() && it->first < base + seg->second.size; ++it)
        f(pool_piece{it->first, it->second.size, it->second.live});
      return id;
    }
    return {};
  }
  /// A private pool's segment, as snapshots list it apart from strata's own memory.
  struct segment_view {
    std::uintptr_t base = 0;
    std::size_t size = 0;
    pool_id pool{};
    bool small = false;
    void* stream = nullptr;
  };
  /// The pool segment at `base`, if one starts there. O(pools).
  std::optional<segment_view> segment_at(std::uintptr_t base) const noexcept
  {
    for (const auto& [id, p] : pools_)
      if (const auto it = p.segments.find(base); it != p.segments.end()) return segment_view{base, it->second.size, id, it->second.small, it->second.stream};
    return std::nullopt;
  }
  /// Segments held by private pools, and their bytes.
  std::size_t pool_segments() const noexcept { return figures_.segments[0] + figures_.segments[1]; }
  std::size_t pool_segment_bytes() const noexcept { return figures_.segment_bytes[0] + figures_.segment_bytes[1]; }
  template <class F>
  void for_each_live(F&& f) const
  {
    live_.for_each(f);
  }

private:
  struct segment {
    std::size_t size = 0;
    void* stream = nullptr;  ///< the stream strata handed it out on, which every piece of it serves
    bool small = false;      ///< PyTorch's pool kind of the blocks it serves
  };
  struct piece {
    std::size_t size = 0;
    bool live = false;
    std::uint64_t ticket = 0;  ///< parked and nonzero: unsettled, waiting on its recorded streams
    bool deferred = false;     ///< unsettled, its wait not started yet (take_deferred)
    void* stream = nullptr;
    std::vector<void*> uses;   ///< parked and unsettled: the streams it waits for
    bool small = false;        ///< its segment's kind
  };
  /// Settled parked pieces: (stream, small, size, address), so that best fit is one lower_bound.
  using free_index_type = std::set<std::tuple<void*, bool, std::size_t, std::uintptr_t>>;
  struct pool_state {
    int use_count = 0;
    bool use_on_oom = false;
    bool no_split = false;
    std::size_t live = 0;
    std::map<std::uintptr_t, segment> segments;
    std::map<std::uintptr_t, piece> pieces;  ///< every segment's, live and parked
    free_index_type free_index;
  };

  pool_state& pool_of(pool_id id, const char* where)
  {
    const auto it = pools_.find(id);
    if (it == pools_.end()) throw std::invalid_argument(std::string(where) + ": pool " + id.text() + " is not a private pool of this allocator");
    return it->second;
  }

  typename std::map<pool_id, pool_state>::iterator found_pool_after(pool_id id) { return pools_.find(id); }

  /// The base of the pool's segment holding `address`, or 0.
  static std::uintptr_t segment_of(const pool_state& p, std::uintptr_t address) noexcept
  {
    auto it = p.segments.upper_bound(address);
    if (it == p.segments.begin()) return 0;
    --it;
    return address < it->first + it->second.size ? it->first : 0;
  }

  /// Index insertions allocate a node each: a std::set has no reserve, so the insertion points that must not
  /// fail are preceded by this check of the host's memory, made by inserting and erasing a probe entry.
  static void free_index_reserve(pool_state& p)
  {
    const auto probe = p.free_index.emplace(nullptr, true, SIZE_MAX, UINTPTR_MAX).first;
    p.free_index.erase(probe);
  }

  /// A settled parked piece: merged with its settled parked neighbours in its segment, then offered.
  void index_and_merge(pool_state& p, typename std::map<std::uintptr_t, piece>::iterator it) noexcept
  {
    const std::uintptr_t base = segment_of(p, it->first);
    auto mergeable = [&](const auto& other) {
      return !other->second.live && other->second.ticket == 0 && segment_of(p, other->first) == base;
    };
    if (it != p.pieces.begin()) {
      auto prev = std::prev(it);
      if (mergeable(prev) && prev->first + prev->second.size == it->first) {
        p.free_index.erase({prev->second.stream, prev->second.small, prev->second.size, prev->first});
        prev->second.size += it->second.size;
        p.pieces.erase(it);
        it = prev;
        --figures_.parked_blocks[pool_figures::index(it->second.small)];
      }
    }
    auto next = std::next(it);
    if (next != p.pieces.end() && mergeable(next) && it->first + it->second.size == next->first) {
      p.free_index.erase({next->second.stream, next->second.small, next->second.size, next->first});
      it->second.size += next->second.size;
      p.pieces.erase(next);
      --figures_.parked_blocks[pool_figures::index(it->second.small)];
    }
    try {
      p.free_index.emplace(it->second.stream, it->second.small, it->second.size, it->first);
    } catch (...) {  // after free_index_reserve's probe this fails only if memory ran out since: it stays unoffered
    }
  }

  /// Adds `delta` live small blocks to each 2 MiB page [address, address + size) touches, forgetting a page
  /// whose count falls to zero. Insertions need room made beforehand (address_table::reserve).
  void count_small_pages(std::uintptr_t address, std::size_t size, int delta) noexcept
  {
    const std::uintptr_t first = address / pool_layout::small_segment;
    const std::uintptr_t last = (address + (size == 0 ? 1 : size) - 1) / pool_layout::small_segment;
    for (std::uintptr_t page = first; page <= last; ++page) {
      const std::uintptr_t key = page + 1;  // address_table keeps 0 for empty slots
      if (std::size_t* n = small_pages_.find(key)) {
        if (delta > 0) ++*n;
        else if (--*n == 0) (void)small_pages_.take(key);
      } else if (delta > 0) {
        small_pages_.insert(key, 1);
      }
    }
  }

  /// The segment at `base` of a released pool, when none of its pieces is live: forgotten here and returned
  /// (for strata to free) with the streams its unsettled pieces were recorded on.
  std::optional<returned> give_back_if_free(pool_state& p, std::uintptr_t base) noexcept
  {
    const auto seg = p.segments.find(base);
    if (seg == p.segments.end()) return std::nullopt;
    const std::uintptr_t end = base + seg->second.size;
    for (auto it = p.pieces.lower_bound(base); it != p.pieces.end() && it->first < end; ++it)
      if (it->second.live) return std::nullopt;
    returned out{base, block{seg->second.size, seg->second.size, seg->second.stream, {}, {}, {}}};
    for (auto it = p.pieces.lower_bound(base); it != p.pieces.end() && it->first < end;) {
      for (void* s : it->second.uses)
        if (std::find(out.second.uses.begin(), out.second.uses.end(), s) == out.second.uses.end()) {
          try {
            out.second.uses.push_back(s);
          } catch (...) {  // no host memory for one pointer: the segment goes back without that stream's wait
          }
        }
      p.free_index.erase({it->second.stream, it->second.small, it->second.size, it->first});
      figures_.parked_bytes[pool_figures::index(it->second.small)] -= it->second.size;
      --figures_.parked_blocks[pool_figures::index(it->second.small)];
      if (it->second.deferred) --deferred_blocks_;
      it = p.pieces.erase(it);
    }
    const std::size_t k = pool_figures::index(seg->second.small);
    --figures_.segments[k];
    figures_.segment_bytes[k] -= seg->second.size;
    p.segments.erase(seg);
    return out;
  }

  void erase_pool_if_empty(typename std::map<pool_id, pool_state>::iterator it) noexcept
  {
    if (it != pools_.end() && it->second.use_count == 0 && it->second.segments.empty()) pools_.erase(it);
  }

  address_table<block> live_;
  address_table<std::size_t> small_pages_;  ///< live small blocks outside the pools, per 2 MiB page
  std::map<pool_id, pool_state> pools_;
  pool_figures figures_{};
  std::size_t deferred_blocks_ = 0;
  std::uint64_t last_ticket_ = 0;
};

} // namespace strata::plugin
