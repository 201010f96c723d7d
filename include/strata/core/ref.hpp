#pragma once
#include <cstddef>
#include <memory>

#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/properties.hpp>

namespace strata {

/// A non-owning handle to a box, so that several stacks can share one pool (policies hold their upstream
/// by value; `ref` is the value to hold when the upstream lives elsewhere). The referee must outlive it.
/// Models: whatever R models — resource, stream_resource, and each optional capability R has.
/// Cost: one indirection; no lock, no CUDA call of its own.
template <resource R>
class ref : public forward_properties<ref<R>, R>, public sync_names<ref<R>>, public stream_first_names<ref<R>, stream_resource<R>> {
public:
  using stream_first_names<ref, stream_resource<R>>::allocate;
  using stream_first_names<ref, stream_resource<R>>::deallocate;
  static constexpr std::size_t max_alignment = max_alignment_of<R>;

  explicit ref(R& referee) noexcept : referee_(std::addressof(referee)) {}

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    return referee_->allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    referee_->deallocate(p, bytes, alignment);
  }

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires stream_resource<R>
  {
    return referee_->allocate_async(bytes, alignment, stream);
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
    requires stream_resource<R>
  {
    referee_->deallocate_async(p, bytes, alignment, stream);
  }

  bool owns(const void* p) const noexcept
    requires owning_resource<R>
  {
    return referee_->owns(p);
  }
  void release()
    requires releasable_resource<R>
  {
    referee_->release();
  }
  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const
    requires sized_resource<R>
  {
    return referee_->good_size(bytes, alignment);
  }
  strata::usage usage() const
    requires usage_reporting_resource<R>
  {
    return referee_->usage();
  }
  strata::snapshot snapshot() const
    requires snapshot_resource<R>
  {
    return referee_->snapshot();
  }
  void reset()
    requires resettable_resource<R>
  {
    referee_->reset();
  }

  R& get() const noexcept { return *referee_; }

  friend bool operator==(const ref& a, const ref& b) { return *a.referee_ == *b.referee_; }

private:
  R* referee_;
};

} // namespace strata
