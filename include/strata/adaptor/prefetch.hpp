#pragma once
#include <concepts>
#include <array>
#include <atomic>
#include <cstddef>
#include <optional>
#include <type_traits>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/detail/adaptor_base.hpp>
#include <strata/detail/cuda_check.hpp>

namespace strata {

namespace detail {

inline cudaMemLocation device_location(int device) noexcept
{
  cudaMemLocation where{};
  where.type = cudaMemLocationTypeDevice;
  where.id = device;
  return where;
}
inline cudaMemLocation host_location() noexcept
{
  cudaMemLocation where{};
  where.type = cudaMemLocationTypeHost;
  where.id = 0;
  return where;
}

/// Whether `device` can migrate managed pages on demand (prefetch and advice mean something there). A
/// device's answer never changes: it is asked once and remembered, so explicit prefetches make one CUDA call.
inline bool concurrent_managed_access(int device)
{
  static std::array<std::atomic<signed char>, 64> known{};  // 0: not asked yet, 1: no, 2: yes
  const bool cacheable = device >= 0 && device < static_cast<int>(known.size());
  if (cacheable) {
    if (const signed char k = known[device].load(std::memory_order_relaxed); k != 0) return k == 2;
  }
  int value = 0;
  cuda_check(cudaDeviceGetAttribute(&value, cudaDevAttrConcurrentManagedAccess, device),
             "cudaDeviceGetAttribute(cudaDevAttrConcurrentManagedAccess)");
  if (cacheable) known[device].store(value != 0 ? 2 : 1, std::memory_order_relaxed);
  return value != 0;
}

} // namespace detail

/// Migrates [p, p + bytes) of managed memory to `device`, in stream order (cudaMemPrefetchAsync with a
/// cudaMemLocation, the CUDA 13 form). A no-op on devices without concurrent managed access.
inline void prefetch_to_device(const void* p, std::size_t bytes, int device, cuda::stream_ref stream)
{
  if (p == nullptr || bytes == 0 || !detail::concurrent_managed_access(device)) return;
  detail::cuda_check(cudaMemPrefetchAsync(p, bytes, detail::device_location(device), 0, stream.get()), "cudaMemPrefetchAsync");
}

/// Migrates [p, p + bytes) of managed memory to the host, in stream order. A no-op where the current device
/// has no concurrent managed access.
inline void prefetch_to_host(const void* p, std::size_t bytes, cuda::stream_ref stream)
{
  if (p == nullptr || bytes == 0 || !detail::concurrent_managed_access(detail::current_device())) return;
  detail::cuda_check(cudaMemPrefetchAsync(p, bytes, detail::host_location(), 0, stream.get()), "cudaMemPrefetchAsync");
}

/// Over managed memory: applies the configured advice to each block handed out (exactly the block, never the
/// rest of the chunk it was carved from) and prefetches it, on the allocating stream, to the stream's device
/// (or a configured device, or the host), so the first kernel touching it runs at device bandwidth instead of
/// faulting pages in. The synchronous allocate prefetches on the legacy default stream to the current device.
/// On a device without concurrent managed access (cudaDevAttrConcurrentManagedAccess = 0: Windows, some
/// older GPUs) prefetch and advice are documented no-ops and the blocks behave as plain managed memory.
/// When the upstream is not stream-ordered, deallocate_async waits for the stream before freeing.
/// Models: stream_resource (always), the upstream's optional capabilities and properties. Cost: the
/// upstream's, plus one cudaMemPrefetchAsync and one cudaMemAdvise per advice per allocation. Move-only;
/// move-assignable when the upstream is.
template <resource Upstream>
class prefetch : public detail::adaptor_base<prefetch<Upstream>, Upstream> {
  using base = detail::adaptor_base<prefetch<Upstream>, Upstream>;

public:
  using base::allocate;
  using base::deallocate;

  enum class target { stream_device, fixed_device, host, none };

  struct options {
    target to = target::stream_device;
    int device = 0;                          ///< for target::fixed_device
    std::optional<int> preferred_location{}; ///< cudaMemAdviseSetPreferredLocation: a device, or -1 for the host
    std::optional<int> accessed_by{};        ///< cudaMemAdviseSetAccessedBy: a device that maps the pages
    bool read_mostly = false;                ///< cudaMemAdviseSetReadMostly
  };

  prefetch() requires std::default_initializable<Upstream> : prefetch(Upstream{}) {}
  explicit prefetch(Upstream upstream, options opts = options{}) : upstream_(std::move(upstream)), opts_(opts)
  {
    int device = 0;
    detail::cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    enabled_ = detail::concurrent_managed_access(opts.to == target::fixed_device ? opts.device : device);
  }
  prefetch(prefetch&&) noexcept = default;
  prefetch& operator=(prefetch&&) noexcept(std::is_nothrow_move_assignable_v<Upstream>) = default;

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
  {
    void* p = nullptr;
    if constexpr (stream_resource<Upstream>) p = upstream_.allocate_async(bytes, alignment, stream);
    else p = upstream_.allocate(bytes, alignment);
    try {
      place(p, bytes, stream);
    } catch (...) {
      if constexpr (stream_resource<Upstream>) upstream_.deallocate_async(p, bytes, alignment, stream);
      else upstream_.deallocate(p, bytes, alignment);
      throw;
    }
    return p;
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
  {
    if (p == nullptr) return;
    if constexpr (stream_resource<Upstream>) {
      upstream_.deallocate_async(p, bytes, alignment, stream);
    } else {
      detail::cuda_check_noexcept(cudaStreamSynchronize(stream.get()));  // the pool may hand it out at once
      upstream_.deallocate(p, bytes, alignment);
    }
  }

  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment = default_alignment)
  {
    return allocate_async(bytes, alignment, stream);
  }
  void deallocate(cuda::stream_ref stream, void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    deallocate_async(p, bytes, alignment, stream);
  }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    void* p = upstream_.allocate(bytes, alignment);
    try {
      place(p, bytes, cuda::stream_ref{cudaStreamLegacy});
    } catch (...) {
      upstream_.deallocate(p, bytes, alignment);
      throw;
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    upstream_.deallocate(p, bytes, alignment);
  }

  /// False where the device cannot migrate managed pages: then nothing is prefetched or advised.
  bool enabled() const noexcept { return enabled_; }
  const options& settings() const noexcept { return opts_; }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }

  friend bool operator==(const prefetch& a, const prefetch& b) noexcept { return &a == &b; }

private:
  static cudaMemLocation location_of(int device_or_host) noexcept
  {
    return device_or_host < 0 ? detail::host_location() : detail::device_location(device_or_host);
  }

  void place(void* p, std::size_t bytes, cuda::stream_ref stream)
  {
    if (p == nullptr || !enabled_) return;
    if (opts_.preferred_location)
      detail::cuda_check(cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, location_of(*opts_.preferred_location)),
                         "cudaMemAdvise(SetPreferredLocation)");
    if (opts_.accessed_by)
      detail::cuda_check(cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, location_of(*opts_.accessed_by)),
                         "cudaMemAdvise(SetAccessedBy)");
    if (opts_.read_mostly)
      detail::cuda_check(cudaMemAdvise(p, bytes, cudaMemAdviseSetReadMostly, detail::device_location(0)),
                         "cudaMemAdvise(SetReadMostly)");
    switch (opts_.to) {
    case target::none: return;
    case target::host:
      detail::cuda_check(cudaMemPrefetchAsync(p, bytes, detail::host_location(), 0, stream.get()), "cudaMemPrefetchAsync");
      return;
    case target::fixed_device:
      detail::cuda_check(cudaMemPrefetchAsync(p, bytes, detail::device_location(opts_.device), 0, stream.get()), "cudaMemPrefetchAsync");
      return;
    case target::stream_device: {
      int device = 0;
      detail::cuda_check(cudaStreamGetDevice(stream.get(), &device), "cudaStreamGetDevice");
      detail::cuda_check(cudaMemPrefetchAsync(p, bytes, detail::device_location(device), 0, stream.get()), "cudaMemPrefetchAsync");
      return;
    }
    }
  }

  [[no_unique_address]] Upstream upstream_;
  options opts_;
  bool enabled_ = false;
};

namespace detail::prefetch_claims {
using P = prefetch<archetype_resource>;
static_assert(stream_resource<P> && answers_to_cccl31_stream_names<P>);
static_assert(cccl::stream_resource_with<P, device_accessible>);
} // namespace detail::prefetch_claims

} // namespace strata
