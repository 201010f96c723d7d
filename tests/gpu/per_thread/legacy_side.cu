// Compiled WITHOUT --default-stream per-thread, linked into a program whose main.cu is compiled with it: the
// same library functions, instantiated in both modes, must stay distinct.
#include <cstdint>

#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/stream/stream_ordered.hpp>

namespace per_thread_test {

std::uint64_t legacy_side_id_of_handle_zero() { return strata::identify(cuda::stream_ref{cudaStream_t{}}).id(); }

/// The stream a free on handle 0 is filed under, in this translation unit's mode.
std::uint64_t legacy_side_owner_after_free_on_handle_zero()
{
  strata::stream_ordered<strata::coalescing_pool<strata::device_source>> layer;
  void* p = layer.allocate_async(4096, 256, cuda::stream_ref{cudaStream_t{}});
  layer.deallocate_async(p, 4096, 256, cuda::stream_ref{cudaStream_t{}});
  return layer.owner().value_or(0);
}

} // namespace per_thread_test
