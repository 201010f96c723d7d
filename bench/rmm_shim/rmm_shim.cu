// What bench/peers needs from RMM, behind a C interface: make a pool or arena over cudaMalloc memory that
// counts what it holds, allocate and free on a stream (RMM's stream API: what rmm::device_buffer and
// device_uvector call) or through allocate_sync (which adds a cudaStreamSynchronize of the default stream per
// call in RMM 26.x: kept only for rows labelled "(sync)"), report the bytes held from the device, destroy.
#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>

#include <cuda_runtime_api.h>

#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/version_config.hpp>

namespace {

constexpr std::size_t alignment = 256;

/// cudaMalloc memory, counting the bytes held (copies share the counter, as any_resource copies them).
class counting_cuda {
public:
  explicit counting_cuda(std::atomic<std::size_t>* held) : held_(held) {}
  void* allocate(cuda::stream_ref s, std::size_t n, std::size_t a)
  {
    void* p = inner_.allocate(s, n, a);
    *held_ += n;
    return p;
  }
  void deallocate(cuda::stream_ref s, void* p, std::size_t n, std::size_t a) noexcept
  {
    inner_.deallocate(s, p, n, a);
    *held_ -= n;
  }
  void* allocate_sync(std::size_t n, std::size_t a)
  {
    void* p = inner_.allocate_sync(n, a);
    *held_ += n;
    return p;
  }
  void deallocate_sync(void* p, std::size_t n, std::size_t a) noexcept
  {
    inner_.deallocate_sync(p, n, a);
    *held_ -= n;
  }
  bool operator==(const counting_cuda& o) const noexcept { return held_ == o.held_; }
  bool operator!=(const counting_cuda& o) const noexcept { return held_ != o.held_; }
  friend void get_property(const counting_cuda&, cuda::mr::device_accessible) noexcept {}

private:
  rmm::mr::cuda_memory_resource inner_;
  std::atomic<std::size_t>* held_;
};

struct holder {
  std::atomic<std::size_t> held{0};
  std::unique_ptr<rmm::mr::pool_memory_resource> pool;
  std::unique_ptr<rmm::mr::arena_memory_resource> arena;

  template <class F>
  decltype(auto) with(F&& f)
  {
    return pool ? f(*pool) : f(*arena);
  }
};

holder* as_holder(void* mr) { return static_cast<holder*>(mr); }

} // namespace

extern "C" {

const char* strata_rmm_version() { return "RMM " RMM_STRINGIFY(RMM_VERSION_MAJOR) "." RMM_STRINGIFY(RMM_VERSION_MINOR); }

/// "pool": pool_memory_resource growing from empty (initial size 0, RMM's own growth); "arena":
/// arena_memory_resource with its default arena (half the device's free memory, taken up front).
void* strata_rmm_create(const char* kind)
{
  auto* h = new holder;
  if (std::strcmp(kind, "pool") == 0) h->pool = std::make_unique<rmm::mr::pool_memory_resource>(counting_cuda(&h->held), 0);
  else h->arena = std::make_unique<rmm::mr::arena_memory_resource>(counting_cuda(&h->held));
  return h;
}

/// RMM's stream API: `allocate(stream, bytes, alignment)`; nullptr when RMM throws (out of memory).
void* strata_rmm_allocate_async(void* mr, std::size_t bytes, cudaStream_t stream)
{
  try {
    return as_holder(mr)->with([&](auto& r) { return r.allocate(cuda::stream_ref{stream}, bytes, alignment); });
  } catch (...) {
    return nullptr;
  }
}
void strata_rmm_deallocate_async(void* mr, void* p, std::size_t bytes, cudaStream_t stream)
{
  as_holder(mr)->with([&](auto& r) { r.deallocate(cuda::stream_ref{stream}, p, bytes, alignment); });
}

/// allocate_sync / deallocate_sync: each call also synchronizes the default stream.
void* strata_rmm_allocate(void* mr, std::size_t bytes)
{
  try {
    return as_holder(mr)->with([&](auto& r) { return r.allocate_sync(bytes, alignment); });
  } catch (...) {
    return nullptr;
  }
}
void strata_rmm_deallocate(void* mr, void* p, std::size_t bytes)
{
  as_holder(mr)->with([&](auto& r) { r.deallocate_sync(p, bytes, alignment); });
}

std::size_t strata_rmm_reserved(void* mr) { return as_holder(mr)->held.load(); }
void strata_rmm_destroy(void* mr) { delete as_holder(mr); }
}
