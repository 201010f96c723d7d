// Thrust and std::pmr on real memory: device_vectors over strata pools, algorithms on 10^7 elements with
// pool-served temporaries on a non-default stream (checked against the host), universal vectors over managed
// memory, thrust::mr over thrust_resource, and std::pmr containers on a pinned pool read by a kernel.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory_resource>
#include <numeric>
#include <random>
#include <unordered_map>
#include <vector>

#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/functional.h>
#include <thrust/mr/allocator.h>
#include <thrust/reduce.h>
#include <thrust/scan.h>
#include <thrust/sort.h>
#include <thrust/transform.h>
#include <thrust/universal_vector.h>

#include <strata/adaptor/statistics.hpp>
#include <strata/core/ref.hpp>
#include <strata/interop/pmr_adaptor.hpp>
#include <strata/interop/thrust_allocator.hpp>
#include <strata/interop/thrust_resource.hpp>
#include <strata/interop/thrust_temp_allocator.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/managed_source.hpp>
#include <strata/source/pinned_source.hpp>
#include <strata/stream/stream_ordered.hpp>

using namespace strata;

namespace {
using device_pool = statistics<coalescing_pool<device_source>>;
using temp_pool = statistics<stream_ordered<coalescing_pool<device_source>>>;
template <class T>
using pool_vector = thrust::device_vector<T, thrust_allocator<T, device_pool>>;

struct times_three_plus_one {
  __host__ __device__ long long operator()(int x) const { return 3LL * x + 1; }
};

__global__ void sum_kernel(const int* values, std::size_t n, const long long* const* extra, std::size_t m, long long* out)
{
  long long s = 0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) s += values[i];
  for (std::size_t i = threadIdx.x; i < m; i += blockDim.x) s += *extra[i];
  atomicAdd(reinterpret_cast<unsigned long long*>(out), static_cast<unsigned long long>(s));
}
} // namespace

TEST_SUITE("gpu")
{
TEST_CASE("thrust: device_vector over a pool: construct, resize, copy, assign across allocators")
{
  device_pool first, second;
  {
    pool_vector<int> a(1000, 7, thrust_allocator<int, device_pool>(first));
    CHECK(first.snapshot_counts().current_blocks == 1);
    a.resize(5000, 9);
    CHECK(a[999] == 7);
    CHECK(a[4999] == 9);
    pool_vector<int> b(a.begin(), a.end(), thrust_allocator<int, device_pool>(second));
    CHECK(second.snapshot_counts().current_blocks == 1);
    CHECK(thrust::reduce(b.begin(), b.end(), 0LL) == 1000LL * 7 + 4000LL * 9);
    pool_vector<int> c(10, 1, thrust_allocator<int, device_pool>(second));
    c = a;  // different allocators, equal element types: the elements are copied into c's own pool
    CHECK(c.size() == 5000);
    CHECK(c.get_allocator() == thrust_allocator<int, device_pool>(second));
    CHECK(second.snapshot_counts().current_bytes >= 2 * 5000 * sizeof(int));
    thrust::device_vector<int> plain = c;  // and into Thrust's own allocator
    CHECK(plain[4999] == 9);
    std::vector<int> host(c.size());
    thrust::copy(c.begin(), c.end(), host.begin());
    CHECK(host[0] == 7);
  }
  CHECK(first.snapshot_counts().current_bytes == 0);
  CHECK(second.snapshot_counts().current_bytes == 0);
}

TEST_CASE("thrust: sort, reduce, transform, exclusive_scan on 10^7 elements with pool temporaries on a stream")
{
  constexpr std::size_t n = 10'000'000;
  std::vector<int> host(n);
  std::mt19937 rng(5);
  for (auto& x : host) x = static_cast<int>(rng() % 1'000'000) - 500'000;

  device_pool storage;
  temp_pool temporaries;
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  thrust_temp_allocator<temp_pool> temp(temporaries, stream);
  const auto on_stream = thrust::cuda::par(temp).on(stream);
  {
    pool_vector<int> keys(host.begin(), host.end(), thrust_allocator<int, device_pool>(storage));
    pool_vector<long long> out(n, 0, thrust_allocator<long long, device_pool>(storage));

    auto temporaries_used = [&] { return temporaries.snapshot_counts().total_blocks; };
    std::size_t before = temporaries_used();
    thrust::sort(on_stream, keys.begin(), keys.end());
    CHECK(temporaries_used() > before);
    before = temporaries_used();
    const long long total = thrust::reduce(on_stream, keys.begin(), keys.end(), 0LL);
    CHECK(temporaries_used() > before);
    thrust::transform(on_stream, keys.begin(), keys.end(), out.begin(), times_three_plus_one{});
    before = temporaries_used();
    thrust::exclusive_scan(on_stream, out.begin(), out.end(), out.begin(), 0LL);
    CHECK(temporaries_used() > before);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);

    std::vector<int> sorted = host;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> got(n);
    thrust::copy(keys.begin(), keys.end(), got.begin());
    CHECK(got == sorted);
    CHECK(total == std::accumulate(host.begin(), host.end(), 0LL));
    std::vector<long long> scanned(n);
    long long running = 0;
    for (std::size_t i = 0; i < n; ++i) {
      scanned[i] = running;
      running += 3LL * sorted[i] + 1;
    }
    std::vector<long long> got_scan(n);
    thrust::copy(out.begin(), out.end(), got_scan.begin());
    CHECK(got_scan == scanned);
    CHECK(temporaries.snapshot_counts().current_bytes == 0);  // every temporary came back, in stream order
    MESSAGE("temporaries through the pool: " << temporaries.snapshot_counts().total_blocks << ", peak "
                                              << temporaries.snapshot_counts().peak_bytes << " bytes");
  }
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
  CHECK(storage.snapshot_counts().current_bytes == 0);
}

TEST_CASE("thrust: universal_vector over managed memory; thrust::mr over thrust_resource")
{
  coalescing_pool<managed_source> managed{managed_source{}, {.initial_chunk = 16 << 20}};
  {
    using alloc = thrust_universal_allocator<int, coalescing_pool<managed_source>>;
    thrust::universal_vector<int, alloc> v(1 << 20, 2, alloc(managed));
    v[5] = 40;  // written from the host
    thrust::transform(thrust::device, v.begin(), v.end(), v.begin(), thrust::negate<int>());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(v[5] == -40);  // read from the host
    CHECK(v[6] == -2);
  }
  CHECK(managed.usage().in_use == 0);

  thrust_resource<coalescing_pool<device_source>> resource;
  thrust_resource<coalescing_pool<device_source>> other;
  CHECK(resource.is_equal(resource));
  CHECK(!resource.is_equal(other));
  {
    thrust::mr::allocator<int, thrust_resource<coalescing_pool<device_source>>> alloc(&resource);
    thrust::device_vector<int, decltype(alloc)> v(1 << 16, 3, alloc);
    CHECK(thrust::reduce(v.begin(), v.end()) == 3 * (1 << 16));
    CHECK(resource.resource().usage().in_use >= (1 << 16) * sizeof(int));
  }
  CHECK(resource.resource().usage().in_use == 0);
}

TEST_CASE("std::pmr containers on a pinned pool, read by a kernel")
{
  pmr_adaptor<size_class_pool<pinned_source>> pinned;
  std::pmr::vector<int> values(&pinned);
  for (int i = 1; i <= 10'000; ++i) values.push_back(i);
  std::pmr::unordered_map<int, long long> table(&pinned);
  for (int i = 0; i < 100; ++i) table.emplace(i, 1000LL * i);
  std::pmr::vector<const long long*> extra(&pinned);  // pointers into the map's nodes, in pinned memory
  for (const auto& [k, v] : table) extra.push_back(&v);
  long long* out = nullptr;
  REQUIRE(cudaMallocManaged(&out, sizeof *out) == cudaSuccess);
  *out = 0;
  sum_kernel<<<1, 256>>>(values.data(), values.size(), extra.data(), extra.size(), out);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(*out == 10'000LL * 10'001 / 2 + 1000LL * (99 * 100 / 2));
  REQUIRE(cudaFree(out) == cudaSuccess);
}
}
