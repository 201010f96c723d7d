// The least an allocator plugged into PyTorch can cost: blocks cached by exact size on a free list, cudaMalloc
// on a miss, never given back, one stream assumed (a measuring tool for alloc_cost.py --alloc floor, not an
// allocator anyone should use). What alloc_cost.py measures with it is PyTorch's own path for plugged
// allocators (CUDAPluggableAllocator's bookkeeping and call), the floor under the strata plug-in's figure.
//   g++ -O2 -shared -fPIC floor_alloc.cpp -o libfloor_alloc.so -I<cuda>/include -L<cuda>/lib64 -lcudart
#include <cuda_runtime_api.h>

#include <cstddef>
#include <unordered_map>
#include <vector>

namespace {
std::unordered_map<std::size_t, std::vector<void*>>& lists()
{
  static std::unordered_map<std::size_t, std::vector<void*>> l;
  return l;
}
} // namespace

extern "C" {
void* floor_malloc(std::size_t size, int, cudaStream_t)
{
  auto& l = lists()[size];
  if (!l.empty()) {
    void* p = l.back();
    l.pop_back();
    return p;
  }
  void* p = nullptr;
  return cudaMalloc(&p, size) == cudaSuccess ? p : nullptr;
}
void floor_free(void* p, std::size_t size, int, cudaStream_t) { lists()[size].push_back(p); }
}
