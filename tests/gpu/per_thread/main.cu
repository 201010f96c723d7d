// Built with `nvcc --default-stream per-thread` (legacy_side.cu beside it without): handle 0 means the calling
// thread's per-thread default stream here and the legacy stream there, and strata must honour each file's
// meaning (no inline function compiled both ways). Also: an identified_stream made from
// cudaStreamPerThread on one thread and used on another files its frees under the stream of the thread that
// uses it. Exits 77 without a GPU (reported as skipped), 1 on a failed check.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/stream/stream_ordered.hpp>

#if !defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#error "main.cu must be compiled with --default-stream per-thread"
#endif

namespace per_thread_test {
std::uint64_t legacy_side_id_of_handle_zero();
std::uint64_t legacy_side_owner_after_free_on_handle_zero();
} // namespace per_thread_test

namespace {

int failures = 0;

void check(bool ok, const char* what)
{
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
  if (!ok) ++failures;
}

} // namespace

int main()
{
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    const char* require = std::getenv("STRATA_REQUIRE_GPU");
    if (require != nullptr && std::strcmp(require, "1") == 0) return 1;
    std::printf("per-thread default stream tests skipped: no CUDA device\n");
    return 77;
  }
  using layer_t = strata::stream_ordered<strata::coalescing_pool<strata::device_source>>;
  const std::uint64_t legacy = strata::identify(cuda::stream_ref{cudaStreamLegacy}).id();
  const std::uint64_t per_thread = strata::identify(cuda::stream_ref{cudaStreamPerThread}).id();
  check(legacy != per_thread, "the legacy and this thread's per-thread stream are different streams");
  check(strata::identify(cuda::stream_ref{cudaStream_t{}}).id() == per_thread, "here, handle 0 is the per-thread stream");
  check(per_thread_test::legacy_side_id_of_handle_zero() == legacy, "in the legacy file, handle 0 is the legacy stream");
  check(strata::identify(cuda::stream_ref{cudaStream_t{}}).stream().get() == cudaStreamPerThread,
        "identify makes handle 0 explicit");
  {
    layer_t layer;
    void* p = layer.allocate_async(4096, 256, cuda::stream_ref{cudaStream_t{}});
    layer.deallocate_async(p, 4096, 256, cuda::stream_ref{cudaStream_t{}});
    check(layer.owner().value_or(0) == per_thread, "here, a free on handle 0 is filed under the per-thread stream");
  }
  check(per_thread_test::legacy_side_owner_after_free_on_handle_zero() == legacy,
        "in the legacy file, a free on handle 0 is filed under the legacy stream");
  {
    layer_t layer;
    const strata::identified_stream mine = strata::identify(cuda::stream_ref{cudaStreamPerThread});
    std::uint64_t theirs = 0;
    void* p = nullptr;
    std::thread([&] {
      theirs = strata::identify(cuda::stream_ref{cudaStreamPerThread}).id();
      p = layer.allocate_async(1 << 20, 256, mine);  // on this thread, cudaStreamPerThread is this thread's stream
      layer.deallocate_async(p, 1 << 20, 256, mine);
      (void)cudaStreamSynchronize(cudaStreamPerThread);
    }).join();
    check(theirs != per_thread, "each thread has its own per-thread stream");
    check(layer.owner().value_or(0) == theirs, "an identified per-thread stream used on another thread files under that thread's stream");
    void* q = layer.allocate_async(1 << 20, 256, mine);
    check(layer.stats().hits == 0, "this thread took nothing in stream order from the other thread's stream");
    layer.deallocate_async(q, 1 << 20, 256, mine);
  }
  check(cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess, "no CUDA error");
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
