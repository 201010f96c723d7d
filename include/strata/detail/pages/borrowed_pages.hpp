#pragma once
// A page backend that forwards every call to one owned elsewhere: mapped_pool owns its backend once and lends
// it to the pool of every tag, so all tags share one device (its capacity, its counters, its refusal hooks).
#include <cstddef>
#include <cstdint>

#include <strata/core/properties.hpp>
#include <strata/detail/pages/page_backend.hpp>

namespace strata::detail {

/// Models page_backend (and copying_page_backend where the lender does) by forwarding to `*lender`, which
/// must outlive it; the owner re-points it after moving the lender (`lend`). While `waits_covered` is on,
/// synchronize() waits for nothing: the owner has just waited for the device and knows nothing was queued
/// since on the memory this borrower maps (one wait for several tags, or for a pause's copies and unmaps).
/// Costs: the lender's, plus one indirection. Copies point at the same lender.
template <page_backend Backend>
class borrowed_pages {
public:
  using page = typename Backend::page;

  explicit borrowed_pages(Backend* lender) noexcept : lender_(lender) {}

  void lend(Backend* lender) noexcept { lender_ = lender; }
  Backend& lender() const noexcept { return *lender_; }

  std::size_t page_size() const noexcept { return lender_->page_size(); }
  std::uintptr_t reserve(std::size_t bytes, std::size_t alignment) { return lender_->reserve(bytes, alignment); }
  void unreserve(std::uintptr_t address, std::size_t bytes) noexcept { lender_->unreserve(address, bytes); }
  page create(std::size_t bytes) { return lender_->create(bytes); }
  void destroy(page p) noexcept { lender_->destroy(p); }
  void map(std::uintptr_t address, page p, std::size_t bytes) { lender_->map(address, p, bytes); }
  void set_access(std::uintptr_t address, std::size_t bytes) { lender_->set_access(address, bytes); }
  void unmap(std::uintptr_t address, std::size_t bytes) { lender_->unmap(address, bytes); }
  void synchronize()
  {
    if (!waits_covered_) lender_->synchronize();
  }
  void cover_waits(bool covered) noexcept { waits_covered_ = covered; }
  const page_counters& counts() const noexcept { return lender_->counts(); }

  void* pin(std::size_t bytes) requires copying_page_backend<Backend> { return lender_->pin(bytes); }
  void unpin(void* host, std::size_t bytes) noexcept requires copying_page_backend<Backend> { lender_->unpin(host, bytes); }
  void copy_to_host(void* host, std::uintptr_t address, std::size_t bytes) requires copying_page_backend<Backend>
  {
    lender_->copy_to_host(host, address, bytes);
  }
  void copy_to_device(std::uintptr_t address, const void* host, std::size_t bytes) requires copying_page_backend<Backend>
  {
    lender_->copy_to_device(address, host, bytes);
  }
  void finish_copies() requires copying_page_backend<Backend> { lender_->finish_copies(); }
  std::size_t free_bytes() const requires copying_page_backend<Backend> { return lender_->free_bytes(); }

private:
  Backend* lender_;
  bool waits_covered_ = false;
};

} // namespace strata::detail
