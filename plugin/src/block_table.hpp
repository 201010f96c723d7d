#pragma once
// The blocks the torch backend has handed to PyTorch, and PyTorch's private pools (CUDA graphs,
// torch.cuda.MemPool), without PyTorch so the host tests check them.
//
// Why blocks are parked: a CUDA graph replays at the addresses it captured, and torch.compile's graph trees
// rewind a pool to an earlier checkpoint (setCheckpointPoolState), which must hand out the checkpoint's blocks
// again at the same addresses. A block freed into a live private pool therefore stays with strata, parked in
// its pool: a later allocation of the same size in that pool revives it, a checkpoint restores it, and the
// pool's release gives it back to strata. PyTorch's own allocator keeps a pool's memory until its release too.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

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

/// Live blocks by address and the private pools with their parked blocks. Models: the bookkeeping of
/// PyTorch's allocator interface (raw_delete by pointer, pool use counts, checkPoolLiveAllocations, checkpoints).
/// Cost: O(1) expected per insert/erase (address_table), O(log n) per park/revive, O(blocks of the pool) per
/// checkpoint; no lock (the backend holds the device's); no CUDA call. Every throwing member leaves the table
/// as it was.
template <class Context>
class block_table {
public:
  using block = live_block<Context>;

  /// Records a block handed out. Throws std::logic_error if the address is already live (a stack bug).
  void insert(std::uintptr_t address, block b)
  {
    if (live_.find(address) != nullptr) throw std::logic_error("block_table: address " + std::to_string(address) + " is already live");
    pool_state* p = b.pool.none() ? nullptr : &pool_of(b.pool, "insert");
    live_.insert(address, std::move(b));  // the only allocation: before anything else changes
    if (p != nullptr) ++p->live;
  }

  const block* find(std::uintptr_t address) const noexcept { return live_.find(address); }

  /// Forgets a live block. Returns it and whether it was parked in its pool (then strata keeps it); nullopt
  /// when the address is not live (not this table's).
  std::optional<std::pair<block, bool>> erase(std::uintptr_t address)
  {
    std::optional<block> taken = live_.take(address);
    if (!taken) return std::nullopt;
    block& b = *taken;
    bool parked = false;
    if (!b.pool.none()) {
      pool_state& p = pools_.at(b.pool);
      --p.live;
      if (p.use_count > 0) {
        p.parked.emplace(address, b);
        parked_bytes_ += b.size;
        ++parked_blocks_;
        parked = true;
      } else if (p.live == 0 && p.parked.empty()) {
        pools_.erase(b.pool);  // released earlier with this block live: its last block is gone, so is it
      }
    }
    return std::pair{std::move(b), parked};
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
  bool use_on_oom(pool_id id) const noexcept
  {
    const auto it = pools_.find(id);
    return it != pools_.end() && it->second.use_on_oom;
  }

  /// releasePool: one use fewer. At zero the pool's parked blocks are returned (for strata to free) and the
  /// pool is forgotten once no live block remains in it.
  std::vector<std::pair<std::uintptr_t, block>> release(pool_id id)
  {
    pool_state& p = pool_of(id, "releasePool");
    if (p.use_count == 0) throw std::logic_error("releasePool: pool " + id.text() + " has no use left to release");
    std::vector<std::pair<std::uintptr_t, block>> out;
    if (--p.use_count > 0) return out;
    out.reserve(p.parked.size());
    for (auto& [a, b] : p.parked) {
      parked_bytes_ -= b.size;
      --parked_blocks_;
      out.emplace_back(a, std::move(b));
    }
    p.parked.clear();
    if (p.live == 0) pools_.erase(id);
    return out;
  }

  /// A parked block of exactly `size` in the pool, made live again (nullopt: none).
  std::optional<std::uintptr_t> revive(pool_id id, std::size_t size, std::size_t requested, void* stream, Context context = {})
  {
    const auto it = pools_.find(id);
    if (it == pools_.end()) return std::nullopt;
    pool_state& p = it->second;
    const auto parked = std::find_if(p.parked.begin(), p.parked.end(), [&](const auto& e) { return e.second.size == size; });
    if (parked == p.parked.end()) return std::nullopt;
    const std::uintptr_t address = parked->first;
    block b = parked->second;
    b.requested = requested;
    b.stream = stream;
    b.context = std::move(context);
    live_.reserve(live_.size() + 1);  // the only allocation: before anything moves
    p.parked.erase(parked);
    parked_bytes_ -= b.size;
    --parked_blocks_;
    ++p.live;
    live_.insert(address, std::move(b));
    return address;
  }

  /// After strata ran out of memory: a parked block of exactly `size` in a pool marked use_on_oom (setUseOnOOM)
  /// made live again in that pool; nullopt when none has one.
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

  /// setCheckpointPoolState: every live block of the pool is parked, then the checkpoint's blocks are revived
  /// at their addresses. Throws std::invalid_argument (table unchanged) if a checkpoint block is neither live
  /// nor parked in the pool with its size: its memory went back to strata, so the address cannot be restored.
  checkpoint_delta<Context> restore(const pool_checkpoint<Context>& c)
  {
    pool_state& p = pool_of(c.pool, "setCheckpointPoolState");
    for (const auto& [a, b] : c.blocks) {
      const block* live = live_.find(a);
      const bool is_live = live != nullptr && live->pool == c.pool && live->size == b.size;
      const auto parked = p.parked.find(a);
      const bool is_parked = parked != p.parked.end() && parked->second.size == b.size;
      if (!is_live && !is_parked)
        throw std::invalid_argument("setCheckpointPoolState: the block at " + std::to_string(a) + " (" + std::to_string(b.size) +
                                    " bytes) of pool " + c.pool.text() + " is no longer held by the pool");
    }
    if (p.use_count == 0) throw std::invalid_argument("setCheckpointPoolState: pool " + c.pool.text() + " was released");
    checkpoint_delta<Context> d;
    live_.for_each([&](std::uintptr_t a, const block& b) {
      if (b.pool == c.pool) d.freed.push_back(a);
    });
    live_.reserve(live_.size() + c.blocks.size());
    for (std::uintptr_t a : d.freed) {
      block b = std::move(*live_.take(a));
      parked_bytes_ += b.size;
      ++parked_blocks_;
      --p.live;
      p.parked.emplace(a, std::move(b));
    }
    for (const auto& [a, b] : c.blocks) {
      p.parked.erase(a);
      parked_bytes_ -= b.size;
      --parked_blocks_;
      ++p.live;
      live_.insert(a, b);
      d.revived.emplace_back(a, b);
    }
    return d;
  }

  std::size_t live_blocks() const noexcept { return live_.size(); }
  std::size_t parked_bytes() const noexcept { return parked_bytes_; }
  std::size_t parked_blocks() const noexcept { return parked_blocks_; }
  /// Whether `address` is parked in some pool (snapshots show it inactive).
  bool parked(std::uintptr_t address) const noexcept
  {
    for (const auto& [id, p] : pools_)
      if (p.parked.count(address) != 0) return true;
    return false;
  }
  template <class F>
  void for_each_live(F&& f) const
  {
    live_.for_each(f);
  }

private:
  struct pool_state {
    int use_count = 0;
    bool use_on_oom = false;
    std::size_t live = 0;
    std::map<std::uintptr_t, block> parked;
  };

  pool_state& pool_of(pool_id id, const char* where)
  {
    const auto it = pools_.find(id);
    if (it == pools_.end()) throw std::invalid_argument(std::string(where) + ": pool " + id.text() + " is not a private pool of this allocator");
    return it->second;
  }

  address_table<block> live_;
  std::map<pool_id, pool_state> pools_;
  std::size_t parked_bytes_ = 0;
  std::size_t parked_blocks_ = 0;
};

} // namespace strata::plugin
