// The CUDA sources on a real device: conformance, kernels writing and reading their memory, errors.
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include <strata/core/ref.hpp>
#include <strata/source/async_source.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/managed_source.hpp>
#include <strata/source/pinned_source.hpp>
#include "../support/conformance.hpp"
#include "kernels.cuh"

using namespace strata;
using strata::testing::check_conformance;
using strata::testing::check_device_round_trip;

namespace {
std::size_t device_total_memory()
{
  std::size_t free_bytes = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess);
  return total;
}
} // namespace

TEST_SUITE("gpu")
{
TEST_CASE("device_source conforms and its memory is usable by kernels")
{
  device_source r;
  check_conformance(r, {.device_accessible = true, .huge = device_total_memory() * 2});
  CHECK(cudaGetLastError() == cudaSuccess);  // the refused requests left no sticky error behind
  void* p = r.allocate(1 << 24);
  check_device_round_trip(p, 1 << 24);
  r.deallocate(p, 1 << 24);
  CHECK(r == device_source(0));
}

TEST_CASE("device_source: a request larger than the device names the box and the size")
{
  device_source r;
  const std::size_t too_much = device_total_memory() + (std::size_t{1} << 30);
  try {
    (void)r.allocate(too_much);
    FAIL("allocated more than the device has");
  } catch (const out_of_memory& e) {
    const std::string what = e.what();
    CHECK(what.find("device_source") == 0);
    CHECK(what.find(std::to_string(too_much)) != std::string::npos);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("device_source restores the caller's current device")
{
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  device_source last(count - 1);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  void* p = last.allocate(4096);
  int current = -1;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  CHECK(current == 0);
  cudaPointerAttributes attributes{};
  REQUIRE(cudaPointerGetAttributes(&attributes, p) == cudaSuccess);
  CHECK(attributes.device == count - 1);
  last.deallocate(p, 4096);
}

TEST_CASE("async_source conforms, is stream-ordered, trims and borrows")
{
  async_source r;
  check_conformance(r, {.device_accessible = true, .huge = device_total_memory() * 2});
  CHECK(cudaGetLastError() == cudaSuccess);

  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  void* p = r.allocate_async(1 << 24, 256, stream);
  check_device_round_trip(p, 1 << 24, 9, stream);
  r.deallocate_async(p, 1 << 24, 256, stream);
  // The CCCL 3.1 stream-first names reach the same pool.
  void* q = r.allocate(cuda::stream_ref{stream}, 1 << 20);
  r.deallocate(cuda::stream_ref{stream}, q, 1 << 20);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(r.reserved_bytes() >= (1u << 24));  // release threshold at the maximum: the pool keeps its memory
  r.trim(0);
  CHECK(r.reserved_bytes() == 0);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);

  auto borrowed = async_source::borrow(r.pool());
  CHECK(borrowed == r);
  CHECK_FALSE(borrowed.owns_pool());
  void* b = borrowed.allocate(4096);
  r.deallocate(b, 4096);  // equal resources free each other's memory

  auto default_pool = async_source::default_pool();
  CHECK_FALSE(default_pool == r);
  void* d = default_pool.allocate(4096);
  check_device_round_trip(d, 4096);
  default_pool.deallocate(d, 4096);

  async_source moved(std::move(r));
  CHECK(moved.owns_pool());
  CHECK(r.pool() == nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("async_source can create an IPC-exportable pool")
{
  async_source r(async_source::options{.handle_type = cudaMemHandleTypePosixFileDescriptor});
  void* p = r.allocate(1 << 20);
  check_device_round_trip(p, 1 << 20);
  r.deallocate(p, 1 << 20);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("managed_source conforms; host and kernels share its memory")
{
  managed_source r;
  // No huge request here: asking for more managed memory than the card has can hang the GPU.
  check_conformance(r, {.host_accessible = true, .device_accessible = true, .huge = 0});
  auto* p = static_cast<std::uint32_t*>(r.allocate(1 << 20));
  check_device_round_trip(p, 1 << 20, 11);
  CHECK(p[1] == (11u ^ 2654435761u));  // the host reads what the kernel wrote
  r.deallocate(p, 1 << 20);
}

TEST_CASE("pinned_source conforms; a kernel reads pinned memory through its device pointer")
{
  pinned_source r(cudaHostAllocMapped | cudaHostAllocPortable);
  check_conformance(r, {.host_accessible = true, .device_accessible = true});
  CHECK(cudaGetLastError() == cudaSuccess);
  auto* p = static_cast<std::uint32_t*>(r.allocate(1 << 20));
  for (std::uint32_t i = 0; i < (1 << 18); ++i) p[i] = 5u ^ static_cast<std::uint32_t>(i * 2654435761u);
  void* device_pointer = nullptr;
  REQUIRE(cudaHostGetDevicePointer(&device_pointer, p, 0) == cudaSuccess);
  CHECK(strata::testing::mismatches(device_pointer, 1 << 20, 5) == 0);
  CHECK(strata::testing::mismatches(p, 1 << 20, 5) == 0);  // unified addressing: the host pointer works too
  r.deallocate(p, 1 << 20);
}

TEST_CASE("cuda::mr::resource_ref wraps each GPU source")
{
  device_source device;
  managed_source managed;
  pinned_source pinned;
  async_source async;
  ref<async_source> async_handle{async};  // CCCL 3.2+ wrappers hold copyable resources; async_source is move-only
  strata::cccl::synchronous_resource_ref<cuda::mr::device_accessible> refs[] = {device, managed, pinned, async_handle};
  for (auto& r : refs) {
    void* p = strata::cccl::allocate_sync(r, 4096, 256);
    check_device_round_trip(p, 4096);
    strata::cccl::deallocate_sync(r, p, 4096, 256);
  }
  strata::cccl::synchronous_resource_ref<cuda::mr::host_accessible, cuda::mr::device_accessible> both[] = {managed, pinned};
  for (auto& r : both) {
    void* p = strata::cccl::allocate_sync(r, 4096, 256);
    std::memset(p, 0, 4096);
    strata::cccl::deallocate_sync(r, p, 4096, 256);
  }
  strata::cccl::stream_resource_ref<cuda::mr::device_accessible> stream_ref{async_handle};
  void* p = strata::cccl::allocate(stream_ref, cuda::stream_ref{cudaStreamLegacy}, 4096, 256);
  strata::cccl::deallocate(stream_ref, cuda::stream_ref{cudaStreamLegacy}, p, 4096, 256);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}
}
