// The five calls bench/peers needs from RMM: make a pool or arena over cudaMalloc memory that counts what
// it holds, allocate, free, report the bytes held from the device, destroy.
#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <variant>

#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/version_config.hpp>

namespace {

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
};

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
void* strata_rmm_allocate(void* mr, std::size_t bytes)
{
  auto* h = static_cast<holder*>(mr);
  return h->pool ? h->pool->allocate_sync(bytes, 256) : h->arena->allocate_sync(bytes, 256);
}
void strata_rmm_deallocate(void* mr, void* p, std::size_t bytes)
{
  auto* h = static_cast<holder*>(mr);
  if (h->pool) h->pool->deallocate_sync(p, bytes, 256);
  else h->arena->deallocate_sync(p, bytes, 256);
}
std::size_t strata_rmm_reserved(void* mr) { return static_cast<holder*>(mr)->held.load(); }
void strata_rmm_destroy(void* mr) { delete static_cast<holder*>(mr); }
}
