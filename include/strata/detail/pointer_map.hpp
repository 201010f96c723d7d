#pragma once
// An open-addressing hash map keyed by block address, for the lookups on a pool's hot path (which block
// does this pointer start?). std::unordered_map allocates a node per insert; this keeps one flat array,
// probes linearly, and deletes by shifting back, so a find is a multiply and one or two cache lines.
// Construction and moves allocate nothing (a pool's noexcept move hands its maps over and leaves empty ones
// behind); the slot array is allocated by the first insert. An insert that throws changes nothing.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace strata::detail {

template <class Value>
class pointer_map {
public:
  pointer_map() noexcept = default;
  pointer_map(pointer_map&& other) noexcept
      : slots_(std::exchange(other.slots_, {})), mask_(std::exchange(other.mask_, 0)), shift_(std::exchange(other.shift_, 64)),
        size_(std::exchange(other.size_, 0))
  {}
  pointer_map& operator=(pointer_map&& other) noexcept
  {
    if (this != &other) {
      slots_ = std::exchange(other.slots_, {});
      mask_ = std::exchange(other.mask_, 0);
      shift_ = std::exchange(other.shift_, 64);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  pointer_map(const pointer_map&) = default;
  pointer_map& operator=(const pointer_map&) = default;

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }

  /// Inserts or overwrites.
  void insert(const void* key, Value value)
  {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? initial_slots : slots_.size() * 2);
    if (place(slots_, to_key(key), std::move(value))) ++size_;
  }

  Value* find(const void* key) noexcept
  {
    if (slots_.empty()) return nullptr;
    const auto k = to_key(key);
    for (std::size_t i = home(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return &slots_[i].value;
      if (slots_[i].key == empty_key) return nullptr;
    }
  }
  const Value* find(const void* key) const noexcept { return const_cast<pointer_map*>(this)->find(key); }
  bool contains(const void* key) const noexcept { return find(key) != nullptr; }

  /// Removes the key; false if it was not there.
  bool erase(const void* key) noexcept { return take(key, nullptr); }

  /// Removes the key and moves its value to *out (when out is not null), in one probe; false if absent.
  bool take(const void* key, Value* out) noexcept
  {
    if (slots_.empty()) return false;
    const auto k = to_key(key);
    std::size_t i = home(k);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].key == k) break;
      if (slots_[i].key == empty_key) return false;
    }
    if (out != nullptr) *out = std::move(slots_[i].value);
    // Backward-shift deletion: pull later entries of the probe run into the hole so no tombstones pile up.
    for (std::size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      if (slots_[j].key == empty_key) break;
      const std::size_t h = home(slots_[j].key);
      const bool between = i <= j ? (h > i && h <= j) : (h > i || h <= j);
      if (!between) {
        slots_[i] = std::move(slots_[j]);
        i = j;
      }
    }
    slots_[i].key = empty_key;
    --size_;
    return true;
  }

  template <class F>
  void for_each(F&& f) const
  {
    for (const auto& s : slots_)
      if (s.key != empty_key) f(reinterpret_cast<void*>(s.key), s.value);
  }

  void clear() noexcept
  {
    for (auto& s : slots_) s.key = empty_key;
    size_ = 0;
  }

private:
  static constexpr std::uintptr_t empty_key = 0;  // no block starts at address 0
  static constexpr std::size_t initial_slots = 16;
  struct slot {
    std::uintptr_t key = empty_key;
    Value value{};
  };

  static std::uintptr_t to_key(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

  std::size_t home(std::uintptr_t k) const noexcept
  {
    // Blocks are 256-byte aligned: drop those bits, then Fibonacci hashing spreads the rest.
    return static_cast<std::size_t>(((k >> 8) * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  /// Inserts or overwrites k in `slots` (which has a free slot); true if k is new.
  bool place(std::vector<slot>& slots, std::uintptr_t k, Value&& value) noexcept
  {
    for (std::size_t i = home(k);; i = (i + 1) & mask_) {
      if (slots[i].key == k) {
        slots[i].value = std::move(value);
        return false;
      }
      if (slots[i].key == empty_key) {
        slots[i] = {k, std::move(value)};
        return true;
      }
    }
  }

  /// Moves every entry into a new array of `capacity` slots. Strong guarantee: only the allocation can throw,
  /// and it comes before anything has moved.
  void rehash(std::size_t capacity)
  {
    static_assert(std::is_nothrow_move_constructible_v<Value> && std::is_nothrow_move_assignable_v<Value>,
                  "rehash moves values after allocating: their moves must not throw");
    std::vector<slot> fresh(capacity);
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(capacity));
    for (auto& s : slots_)
      if (s.key != empty_key) place(fresh, s.key, std::move(s.value));
    slots_.swap(fresh);
  }

  std::vector<slot> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
};

} // namespace strata::detail
