#pragma once
#include <cstddef>
#include <memory>

#include <strata/core/alignment.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/config.hpp>

namespace strata {

/// Serves the temporary storage of Thrust's CUDA algorithms from a stream-ordered strata stack, on the
/// algorithm's stream: `thrust::sort(thrust::cuda::par(alloc).on(stream), ...)` with
/// `thrust_temp_allocator alloc{pool, stream}`. Temporaries are allocated and freed in stream order, so a
/// stream_ordered pool reuses them at once for the next algorithm on that stream.
/// Models: what Thrust asks of an execution-policy allocator (value_type char, allocate(n) -> char*,
/// deallocate(char*, n)). Cost: R's allocate_async/deallocate_async. Refers to R, which must outlive it.
template <stream_resource R>
class thrust_temp_allocator {
public:
  using value_type = char;

  thrust_temp_allocator(R& resource, cuda::stream_ref stream) noexcept : resource_(std::addressof(resource)), stream_(stream) {}

  char* allocate(std::ptrdiff_t bytes)
  {
    return static_cast<char*>(resource_->allocate_async(static_cast<std::size_t>(bytes), default_alignment, stream_));
  }
  void deallocate(char* p, std::size_t bytes) noexcept { resource_->deallocate_async(p, bytes, default_alignment, stream_); }

  cuda::stream_ref stream() const noexcept { return stream_; }
  R& resource() const noexcept { return *resource_; }

  friend bool operator==(const thrust_temp_allocator& a, const thrust_temp_allocator& b) noexcept
  {
    return *a.resource_ == *b.resource_ && a.stream_ == b.stream_;
  }

private:
  R* resource_;
  cuda::stream_ref stream_;
};

} // namespace strata
