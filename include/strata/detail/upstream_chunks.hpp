#pragma once
// The chunks a pool holds from its upstream resource, by base address (a std::map: O(log chunks)), together
// with the upstream itself: the memory a pool owns. Every chunk goes back to the upstream when the set is
// destroyed, and before a move assignment takes the other set's chunks; a move leaves the other set empty,
// over its moved-from upstream. So a pool holding one has correct defaulted moves. A Chunk records at
// least `std::size_t size` and `std::size_t alignment`, what the upstream is handed back.
#include <cstdint>
#include <map>
#include <utility>

namespace strata::detail {

template <class Upstream, class Chunk>
class upstream_chunks : public std::map<std::uintptr_t, Chunk> {
  using map = std::map<std::uintptr_t, Chunk>;

public:
  explicit upstream_chunks(Upstream upstream) : upstream_(std::move(upstream)) {}
  upstream_chunks(upstream_chunks&& other) noexcept : map(std::exchange(static_cast<map&>(other), map{})), upstream_(std::move(other.upstream_)) {}
  upstream_chunks& operator=(upstream_chunks&& other) noexcept
  {
    if (this != &other) {
      give_back_all();
      upstream_ = std::move(other.upstream_);
      static_cast<map&>(*this) = std::exchange(static_cast<map&>(other), map{});
    }
    return *this;
  }
  upstream_chunks(const upstream_chunks&) = delete;
  upstream_chunks& operator=(const upstream_chunks&) = delete;
  ~upstream_chunks() { give_back_all(); }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }

  /// Hands every chunk back to the upstream.
  void give_back_all() noexcept
  {
    for (const auto& [base, chunk] : *this) upstream_.deallocate(reinterpret_cast<void*>(base), chunk.size, chunk.alignment);
    map::clear();
  }

private:
  [[no_unique_address]] Upstream upstream_;
};

} // namespace strata::detail
