// strata's recommended stack as RMM's current device resource: every RMM container and Thrust algorithm of
// the program then allocates from it, untouched. Build: examples/rmm_thrust/CMakeLists.txt (needs librmm).
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime_api.h>

#include <rmm/cuda_stream.hpp>
#include <rmm/device_buffer.hpp>
#include <rmm/device_uvector.hpp>
#include <rmm/exec_policy.hpp>

#include <thrust/functional.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform.h>

#include <strata/default_pool.hpp>
#include <strata/interop/rmm_current.hpp>

namespace {
struct square {
  __device__ long long operator()(int x) const { return static_cast<long long>(x) * x; }
};
bool check(bool ok, const char* what)
{
  if (!ok) std::printf("FAILED: %s\n", what);
  return ok;
}
} // namespace

int main()
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("rmm_thrust: no GPU, skipped\n");
    return 77;
  }
  // Keep one copy to look at the stack; RMM holds another until it is replaced.
  strata::rmm_resource pool(strata::make_default_pool());
  auto previous = strata::make_current_rmm(pool);
  const auto in_use = [&] { return pool.with_stack<strata::default_pool>([](auto& s) { return s.usage().in_use; }); };

  bool ok = true;
  {
    rmm::cuda_stream stream;
    constexpr int n = 1 << 20;  // the sum of squares below stays within long long
    rmm::device_uvector<int> values(n, stream);  // from the current resource: strata's
    ok &= check(in_use() >= n * sizeof(int), "device_uvector's memory comes from strata");
    thrust::sequence(rmm::exec_policy(stream), values.begin(), values.end());
    // Sorting takes temporary storage through rmm::exec_policy: strata's as well.
    thrust::sort(rmm::exec_policy(stream), values.begin(), values.end(), thrust::greater<int>());
    rmm::device_uvector<long long> squares(n, stream);
    thrust::transform(rmm::exec_policy(stream), values.begin(), values.end(), squares.begin(), square{});
    const long long sum = thrust::reduce(rmm::exec_policy(stream), squares.begin(), squares.end(), 0LL);
    const long long expected = static_cast<long long>(n - 1) * n * (2LL * n - 1) / 6;
    ok &= check(sum == expected, "the sum of squares");

    rmm::device_buffer copy(values.data(), values.size() * sizeof(int), stream);  // a raw buffer, same resource
    int first = 0, last = 0;
    cudaMemcpyAsync(&first, copy.data(), sizeof(int), cudaMemcpyDeviceToHost, stream.value());
    cudaMemcpyAsync(&last, static_cast<const int*>(copy.data()) + n - 1, sizeof(int), cudaMemcpyDeviceToHost, stream.value());
    stream.synchronize();
    ok &= check(first == n - 1 && last == 0, "sorted descending, copied by device_buffer");
    std::printf("rmm_thrust: sum of squares %lld, %zu bytes in use in strata's pool\n", sum, in_use());
  }
  ok &= check(in_use() == 0, "everything freed back to strata");
  rmm::mr::set_current_device_resource(std::move(previous));  // RMM's copy of the pool goes; ours remains
  ok &= check(pool.use_count() == 1, "RMM let go of the pool");
  std::printf("rmm_thrust: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
