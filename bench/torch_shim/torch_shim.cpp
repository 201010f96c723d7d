// What bench/peers needs from PyTorch's CUDA caching allocator, behind a C interface and called from C++ as
// a C++ user of libtorch would (no Python anywhere): choose the allocator settings, allocate on a stream
// (raw_alloc_with_stream), free (raw_delete: on the stream the block was allocated on), read the allocator's
// own reserved / allocated figures, and empty its cache between measurements.
//
// Settings change at run time: PyTorch keeps `expandable_segments` in an atomic that it reads when it makes
// a new segment, so after emptyCache (no segment left) the next segments follow the new setting. One process
// therefore measures both "default" and "expandable_segments:True".
#include <cstddef>
#include <cstdio>
#include <exception>
#include <string>

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/headeronly/version.h>

namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;
constexpr auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);

struct handle {
  c10::DeviceIndex device = 0;
  std::string last_error;
};

void empty_and_reset(c10::DeviceIndex device)
{
  alloc::emptyCache();
  alloc::resetPeakStats(device);
  alloc::resetAccumulatedStats(device);
}

} // namespace

extern "C" {

const char* strata_torch_version() { return "PyTorch " TORCH_VERSION; }

/// `settings`: PYTORCH_CUDA_ALLOC_CONF's syntax, e.g. "expandable_segments:False" or "expandable_segments:True".
/// nullptr (with the reason on stderr) when PyTorch refuses them.
void* strata_torch_create(const char* settings)
{
  try {
    auto* h = new handle;
    h->device = c10::cuda::current_device();  // through torch's own CUDA runtime, not the caller's copy
    alloc::init(c10::cuda::device_count());  // what libtorch's CUDA initialisation does; harmless if done
    empty_and_reset(h->device);
    c10::CachingAllocator::setAllocatorSettings(settings);
    return h;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch shim: %s\n", e.what());
    return nullptr;
  }
}

/// nullptr when PyTorch throws (its out-of-memory error); strata_torch_last_error says why.
void* strata_torch_allocate(void* h, std::size_t bytes, cudaStream_t stream)
{
  try {
    return alloc::raw_alloc_with_stream(bytes, stream);
  } catch (const std::exception& e) {
    static_cast<handle*>(h)->last_error = e.what();
    return nullptr;
  }
}
void strata_torch_deallocate(void*, void* p) { alloc::raw_delete(p); }

const char* strata_torch_last_error(void* h) { return static_cast<handle*>(h)->last_error.c_str(); }

/// The allocator's own statistics (all pools of the device): bytes reserved from the device now, at peak, and
/// peak bytes allocated to callers (PyTorch's max_memory_reserved / max_memory_allocated).
void strata_torch_stats(void* h, std::size_t* reserved_now, std::size_t* reserved_peak, std::size_t* allocated_peak)
{
  const auto stats = alloc::getDeviceStats(static_cast<handle*>(h)->device);
  *reserved_now = static_cast<std::size_t>(stats.reserved_bytes[aggregate].current);
  *reserved_peak = static_cast<std::size_t>(stats.reserved_bytes[aggregate].peak);
  *allocated_peak = static_cast<std::size_t>(stats.allocated_bytes[aggregate].peak);
}

/// The device calls the allocator made since it was set up (its num_device_alloc and num_device_free: cudaMalloc
/// and cudaFree, with expandable segments the ranges it mapped and unmapped).
void strata_torch_device_calls(void* h, std::size_t* allocs, std::size_t* frees)
{
  const auto stats = alloc::getDeviceStats(static_cast<handle*>(h)->device);
  *allocs = static_cast<std::size_t>(stats.num_device_alloc);
  *frees = static_cast<std::size_t>(stats.num_device_free);
}

/// Returns every cached segment to the device (the caller has freed everything it allocated).
void strata_torch_destroy(void* h)
{
  auto* hd = static_cast<handle*>(h);
  empty_and_reset(hd->device);
  delete hd;
}
}
