#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/peer_access.hpp>
#include <strata/core/properties.hpp>
#include <strata/detail/cuda_check.hpp>

namespace strata {

/// Stream-ordered device memory from cudaMallocFromPoolAsync / cudaFreeAsync on a cudaMemPool_t.
/// By default it creates its own pool on the current device with the release threshold at the maximum (the
/// pool keeps what it has instead of returning it at every synchronisation), optionally exportable through an
/// IPC handle type; or it borrows an existing pool (e.g. the device's default pool) without destroying it.
/// The synchronous allocate/deallocate use the legacy default stream of the pool's device (made current for
/// the call, so they mean the same whatever device the caller has current): allocate synchronizes it so the
/// block is usable from any stream at once; deallocate enqueues the free there. A pool it creates may be
/// opened to `peers` (cudaMemPoolSetAccess: read and write from those devices' kernels; runtime peer access
/// does not reach pool memory); a peer without a path to the device is a peer_access_error.
/// Models: stream_resource, device_accessible. Alignment up to 256. Equal when they share the pool.
/// Cost: a call into the driver's stream-ordered allocator (which takes its own lock); the synchronous calls add a
/// cudaGetDevice, and a cudaSetDevice pair when another device is current. Thread-safe. Move-only.
class async_source : public stream_names<async_source> {
public:
  using stream_names<async_source>::allocate;
  using stream_names<async_source>::deallocate;
  static constexpr std::size_t max_alignment = default_alignment;

  struct options {
    int device = -1;  ///< -1: the current device
    std::uint64_t release_threshold = UINT64_MAX;
    cudaMemAllocationHandleType handle_type = cudaMemHandleTypeNone;
    std::vector<int> peers{};  ///< devices whose kernels may read and write the pool's memory
  };

  async_source() : async_source(options{}) {}

  explicit async_source(options opts)
  {
    const int device = opts.device < 0 ? detail::current_device() : opts.device;
    for (const int peer : opts.peers)
      if (peer != device) detail::check_peer_path("async_source", device, peer);
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = opts.handle_type;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    detail::cuda_check(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate");
    owned_ = true;
    device_ = device;
    std::uint64_t threshold = opts.release_threshold;
    cudaError_t status = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold);
    const char* call = "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)";
    if (status == cudaSuccess && !opts.peers.empty()) {
      status = grant_access(opts.peers);
      call = "cudaMemPoolSetAccess";
    }
    if (status != cudaSuccess) {
      detail::cuda_check_noexcept(cudaMemPoolDestroy(pool_));
      pool_ = nullptr;
      owned_ = false;
      detail::cuda_check(status, call);
    }
  }

  /// Uses `pool` without owning it: the pool must outlive this source. `device`: the pool's device, whose
  /// legacy stream the synchronous calls use (-1: whatever device is current at each call).
  static async_source borrow(cudaMemPool_t pool, int device = -1) noexcept { return async_source(pool, device); }

  /// The device's default pool (what plain cudaMallocAsync uses), borrowed.
  static async_source default_pool(int device = -1)
  {
    cudaMemPool_t pool = nullptr;
    if (device < 0) device = detail::current_device();
    detail::cuda_check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
    return async_source(pool, device);
  }

  async_source(async_source&& other) noexcept
      : pool_(std::exchange(other.pool_, nullptr)), owned_(std::exchange(other.owned_, false)), device_(other.device_)
  {}
  async_source& operator=(async_source&& other) noexcept
  {
    if (this != &other) {
      destroy();
      pool_ = std::exchange(other.pool_, nullptr);
      owned_ = std::exchange(other.owned_, false);
      device_ = other.device_;
    }
    return *this;
  }
  async_source(const async_source&) = delete;
  async_source& operator=(const async_source&) = delete;
  ~async_source() { destroy(); }

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
  {
    check_alignment("async_source", alignment, max_alignment);
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    detail::cuda_check_alloc(cudaMallocFromPoolAsync(&p, bytes, pool_, stream.get()), "cudaMallocFromPoolAsync",
                             "async_source", bytes, "pool reserved " + std::to_string(attribute(cudaMemPoolAttrReservedMemCurrent)) +
                                                      " bytes, in use " + std::to_string(attribute(cudaMemPoolAttrUsedMemCurrent)) + " bytes");
    return p;
  }

  void deallocate_async(void* p, std::size_t, std::size_t, cuda::stream_ref stream) noexcept
  {
    if (p == nullptr) return;
    detail::cuda_check_noexcept(cudaFreeAsync(p, stream.get()));
  }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    const on_pool_device on(device_);
    void* p = allocate_async(bytes, alignment, cuda::stream_ref{cudaStreamLegacy});
    if (p != nullptr) {
      const cudaError_t status = cudaStreamSynchronize(cudaStreamLegacy);
      if (status != cudaSuccess) {
        deallocate_async(p, bytes, alignment, cuda::stream_ref{cudaStreamLegacy});
        detail::cuda_check(status, "cudaStreamSynchronize");
      }
    }
    return p;
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    const int previous = enter_pool_device();
    deallocate_async(p, bytes, alignment, cuda::stream_ref{cudaStreamLegacy});
    if (previous >= 0) detail::cuda_check_noexcept(cudaSetDevice(previous));
  }

  /// Returns the pool's unused memory to the system, keeping at least `bytes_to_keep` reserved.
  void trim(std::size_t bytes_to_keep)
  {
    detail::cuda_check(cudaMemPoolTrimTo(pool_, bytes_to_keep), "cudaMemPoolTrimTo");
  }

  /// Bytes the pool holds from the device (cudaMemPoolAttrReservedMemCurrent).
  std::uint64_t reserved_bytes() const { return attribute(cudaMemPoolAttrReservedMemCurrent); }
  std::uint64_t used_bytes() const { return attribute(cudaMemPoolAttrUsedMemCurrent); }

  /// Lets each of `peers` read and write the pool's memory (cudaMemPoolSetAccess), checking every peer first.
  void grant(const std::vector<int>& peers)
  {
    for (const int peer : peers)
      if (peer != device_) detail::check_peer_path("async_source", device_, peer);
    detail::cuda_check(grant_access(peers), "cudaMemPoolSetAccess");
  }

  cudaMemPool_t pool() const noexcept { return pool_; }
  /// The pool's device (-1 for a borrowed pool whose device was not given).
  int device() const noexcept { return device_; }
  bool owns_pool() const noexcept { return owned_; }

  friend bool operator==(const async_source& a, const async_source& b) noexcept { return a.pool_ == b.pool_; }
  friend constexpr void get_property(const async_source&, device_accessible) noexcept {}

private:
  explicit async_source(cudaMemPool_t borrowed, int device) noexcept : pool_(borrowed), owned_(false), device_(device) {}

  /// The pool's device current for a synchronous call (nothing when the device is not known).
  struct on_pool_device {
    explicit on_pool_device(int device)
    {
      if (device >= 0) on.emplace(device);
    }
    std::optional<detail::scoped_device> on;
  };

  /// For a free, which cannot throw: makes the pool's device current if it is not; returns the device to
  /// restore, or -1 (nothing changed; on failure the free goes to the current device's legacy stream).
  int enter_pool_device() const noexcept
  {
    int previous = -1;
    if (device_ < 0) return -1;
    if (cudaGetDevice(&previous) != cudaSuccess || (previous != device_ && cudaSetDevice(device_) != cudaSuccess)) {
      detail::clear_last_error();
      return -1;
    }
    return previous == device_ ? -1 : previous;
  }

  cudaError_t grant_access(const std::vector<int>& peers) noexcept
  {
    std::vector<cudaMemAccessDesc> access;
    try {
      for (const int peer : peers) {
        if (peer == device_) continue;
        cudaMemAccessDesc desc{};
        desc.location.type = cudaMemLocationTypeDevice;
        desc.location.id = peer;
        desc.flags = cudaMemAccessFlagsProtReadWrite;
        access.push_back(desc);
      }
    } catch (const std::bad_alloc&) {
      return cudaErrorMemoryAllocation;
    }
    return access.empty() ? cudaSuccess : cudaMemPoolSetAccess(pool_, access.data(), access.size());
  }

  std::uint64_t attribute(cudaMemPoolAttr attr) const
  {
    std::uint64_t value = 0;
    detail::cuda_check(cudaMemPoolGetAttribute(pool_, attr, &value), "cudaMemPoolGetAttribute");
    return value;
  }

  void destroy() noexcept
  {
    if (owned_ && pool_ != nullptr) detail::cuda_check_noexcept(cudaMemPoolDestroy(pool_));
    pool_ = nullptr;
    owned_ = false;
  }

  cudaMemPool_t pool_ = nullptr;
  bool owned_ = false;
  int device_ = -1;
};

static_assert(stream_resource<async_source>);
static_assert(cccl::stream_resource_with<async_source, device_accessible>);
static_assert(answers_to_cccl31_stream_names<async_source>);

} // namespace strata
