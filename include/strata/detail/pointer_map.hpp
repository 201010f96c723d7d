#pragma once
// An open-addressing hash map keyed by block address, for the lookups on a pool's hot path (which block
// does this pointer start?). std::unordered_map allocates a node per insert; this keeps one flat array,
// probes linearly, and deletes by shifting back, so a find is a multiply and one or two cache lines.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace strata::detail {

template <class Value>
class pointer_map {
public:
  pointer_map() { rehash(16); }

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }

  /// Inserts or overwrites.
  void insert(const void* key, Value value)
  {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
    const auto k = to_key(key);
    for (std::size_t i = home(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) {
        slots_[i].value = std::move(value);
        return;
      }
      if (slots_[i].key == empty_key) {
        slots_[i] = {k, std::move(value)};
        ++size_;
        return;
      }
    }
  }

  Value* find(const void* key) noexcept
  {
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

  void rehash(std::size_t capacity)
  {
    std::vector<slot> old = std::move(slots_);
    slots_.assign(capacity, slot{});
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(capacity));
    size_ = 0;
    for (auto& s : old)
      if (s.key != empty_key) insert(reinterpret_cast<const void*>(s.key), std::move(s.value));
  }

  std::vector<slot> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
};

} // namespace strata::detail
