#pragma once
// A spy upstream for tests: it records every live allocation, checks that each free matches one (pointer,
// size, alignment), counts what is outstanding, and can be told to refuse requests to provoke
// out-of-memory paths (every refusal, its own or its upstream's, is counted: a test can tell whether an
// out_of_memory came from here). Everything a policy takes from it must come back. Its own bookkeeping keeps
// the strong guarantee under host out-of-memory, so a fault injected there is the box's to handle.
#include <cstddef>
#include <map>
#include <string>

#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>

namespace strata::testing {

template <resource Upstream>
class spy : public forward_properties<spy<Upstream>, Upstream>, public sync_names<spy<Upstream>> {
public:
  static constexpr std::size_t max_alignment = max_alignment_of<Upstream>;

  explicit spy(Upstream upstream = Upstream{}) : upstream_(std::move(upstream)) {}
  spy(spy&&) = default;
  spy& operator=(spy&&) = default;

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    ++calls_;
    const bool refuse_this_call = calls_ == refuse_call_;
    if (bytes > refuse_above_ || refuse_this_call || (refusals_left_ > 0 && refusals_left_-- > 0)) {
      ++refusals_;
      throw out_of_memory("spy", bytes, "refused on purpose");
    }
    void* p = nullptr;
    try {
      p = upstream_.allocate(bytes, alignment);
    } catch (const out_of_memory&) {
      ++refusals_;
      throw;
    }
    if (p == nullptr) return p;
    try {
      live_.emplace(p, record{bytes, alignment});
    } catch (...) {
      upstream_.deallocate(p, bytes, alignment);
      throw;
    }
    outstanding_ += bytes;
    ++allocations_;
    return p;
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    auto it = live_.find(p);
    if (it == live_.end() || it->second.bytes != bytes || it->second.alignment != alignment) {
      ++mismatches_;  // never pass a bad free on: it would corrupt the upstream
      return;
    }
    outstanding_ -= bytes;
    live_.erase(it);
    ++frees_;
    upstream_.deallocate(p, bytes, alignment);
  }

  /// Refuse every request above `bytes` from now on (SIZE_MAX: refuse none).
  void refuse_above(std::size_t bytes) noexcept { refuse_above_ = bytes; }
  /// Refuse the next `n` requests whatever their size.
  void refuse_next(int n) noexcept { refusals_left_ = n; }
  /// Refuse only the n-th allocate call from now (1: the next one; 0: none).
  void refuse_call(std::size_t n) noexcept { refuse_call_ = n == 0 ? 0 : calls_ + n; }

  /// Allocate calls so far, refused ones included.
  std::size_t calls() const noexcept { return calls_; }
  /// Requests refused with out_of_memory, on purpose or by the upstream.
  std::size_t refusals() const noexcept { return refusals_; }

  std::size_t outstanding_bytes() const noexcept { return outstanding_; }
  std::size_t outstanding_blocks() const noexcept { return live_.size(); }
  std::size_t allocations() const noexcept { return allocations_; }
  std::size_t frees() const noexcept { return frees_; }
  std::size_t mismatches() const noexcept { return mismatches_; }
  bool holds(const void* p) const noexcept { return live_.count(const_cast<void*>(p)) != 0; }
  Upstream& upstream() noexcept { return upstream_; }

  friend bool operator==(const spy& a, const spy& b) noexcept { return &a == &b; }

private:
  struct record {
    std::size_t bytes;
    std::size_t alignment;
  };
  Upstream upstream_;
  std::map<void*, record> live_;
  std::size_t outstanding_ = 0;
  std::size_t allocations_ = 0;
  std::size_t frees_ = 0;
  std::size_t mismatches_ = 0;
  std::size_t refuse_above_ = SIZE_MAX;
  int refusals_left_ = 0;
  std::size_t calls_ = 0;
  std::size_t refuse_call_ = 0;
  std::size_t refusals_ = 0;
};

} // namespace strata::testing
