// libstrata_torch_hooks.so: what PyTorch 2.11 keeps out of Python's reach, done from C++ against its headers.
//
// 1. The allocator hooks. torch.cuda.memory.CUDAPluggableAllocator's Python object offers no set_*_fn methods
//    in 2.11, so init, empty_cache, the memory fraction, record_stream, the base allocation and the CUDA-graph
//    pool hooks would never reach the plug-in. strata_torch_wire_hooks() sets all eight on the process-wide
//    allocator (after torch.cuda.memory.change_current_allocator).
// 2. torch.OutOfMemoryError. PyTorch raises it only for its own C++ type, c10::OutOfMemoryError; any other
//    exception from the allocator becomes a RuntimeError. strata_torch_wire_hooks() also hands the plug-in a
//    function that throws that type, which strata_malloc_or_throw calls when a device is out of memory.
//
// Built only where CMake finds PyTorch (find_package(Torch)); it links libtorch and libstrata_alloc.
#include <exception>
#include <memory>
#include <string>

#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <strata_alloc.h>

namespace {

[[noreturn]] void throw_torch_out_of_memory(const char* message)
{
  // C10_THROW_ERROR fills in the source location PyTorch's message shows.
  C10_THROW_ERROR(OutOfMemoryError, std::string("CUDA out of memory (strata plug-in): ") + message);
}

// The hooks' types must be exactly PyTorch's, or the std::function would not wrap them: checked here.
using plugged = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
static_assert(std::is_same_v<c10::cuda::MempoolId_t, std::pair<unsigned long long, unsigned long long>>,
          "PyTorch's MempoolId_t changed: strata_alloc.h's graph-pool hooks must follow");

} // namespace

extern "C" STRATA_ALLOC_API int strata_torch_wire_hooks(void)
{
  try {
    const auto current = torch::cuda::CUDAPluggableAllocator::getCurrentAllocator();
    const auto allocator = std::dynamic_pointer_cast<plugged>(current);
    if (!allocator) {
      strata_report_error("strata_torch_wire_hooks: PyTorch's current allocator is not a CUDAPluggableAllocator: "
                          "call torch.cuda.memory.change_current_allocator first");
      return 1;
    }
    allocator->set_init_fn(&strata_init);
    allocator->set_reset_fn(&strata_reset);
    allocator->set_memory_fraction_fn(&strata_set_memory_fraction);
    allocator->set_base_alloc_fn(&strata_base_alloc);
    allocator->set_record_stream_fn(&strata_record_stream);
    allocator->set_begin_allocate_to_pool(&strata_begin_allocate_to_pool);
    allocator->set_end_allocate_to_pool_fn(&strata_end_allocate_to_pool);
    allocator->set_release_pool(&strata_release_pool);
    strata_set_oom_handler(&throw_torch_out_of_memory);
    return 0;
  } catch (const std::exception& e) {
    strata_report_error((std::string("strata_torch_wire_hooks: ") + e.what()).c_str());
    return 1;
  }
}
