#pragma once
// Exporting a block to another process, one function per kind of memory (block_handle.hpp says the contract).
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include <strata/core/config.hpp>
#include <strata/detail/cuda_check.hpp>
#include <strata/ipc/block_handle.hpp>
#include <strata/pages/driver_pages.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/source/async_source.hpp>

namespace strata::ipc {

namespace detail {
inline int device_of(const void* p)
{
  cudaPointerAttributes a{};
  strata::detail::cuda_check(cudaPointerGetAttributes(&a, p), "cudaPointerGetAttributes");
  if (a.type != cudaMemoryTypeDevice)
    throw std::invalid_argument("strata::ipc: the pointer is not device memory (cudaPointerGetAttributes)");
  return a.device;
}
} // namespace detail

static_assert(sizeof(cudaIpcMemHandle_t) == block_handle::opaque_bytes);
static_assert(sizeof(cudaMemPoolPtrExportData) == block_handle::opaque_bytes);

/// A block of cudaMalloc'd memory (from device_source, or carved by any pool from its chunks): the IPC handle of
/// the allocation it lies in (found with cuMemGetAddressRange, so no pool needs to say where its chunk starts)
/// and the block's offset there. The importer maps the whole allocation. Driver calls; no descriptors.
inline exported_block export_cuda_malloc(const void* p, std::size_t bytes)
{
  if (p == nullptr || bytes == 0) throw std::invalid_argument("strata::ipc::export_cuda_malloc: an empty block");
  using range_fn = decltype(&::cuMemGetAddressRange);
  static const range_fn range = strata::detail::driver_entry_point<range_fn>("cuMemGetAddressRange");
  if (range == nullptr) throw std::runtime_error("strata::ipc: the driver has no cuMemGetAddressRange");
  CUdeviceptr base = 0;
  std::size_t size = 0;
  strata::detail::driver_check(range(&base, &size, reinterpret_cast<CUdeviceptr>(p)), "cuMemGetAddressRange");
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  if (start + bytes > base + size)
    throw std::invalid_argument("strata::ipc::export_cuda_malloc: the block runs past its allocation's end");
  exported_block out;
  out.handle.kind = memory_kind::cuda_malloc;
  out.handle.device = detail::device_of(p);
  out.handle.bytes = bytes;
  out.handle.offset = start - base;
  cudaIpcMemHandle_t handle{};
  strata::detail::cuda_check(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)), "cudaIpcGetMemHandle");
  std::memcpy(out.handle.opaque.data(), &handle, sizeof handle);
  return out;
}

/// A block of an async_source pool created with handle_type cudaMemHandleTypePosixFileDescriptor: the pool's
/// shareable descriptor (cudaMemPoolExportToShareableHandle) and the block's export data
/// (cudaMemPoolExportPointer). The importer opens the pool and the pointer, and must free its import (its
/// imported_block does) before the exporter frees the block. Two runtime calls; one descriptor.
inline exported_block export_pool_block(const async_source& source, const void* p, std::size_t bytes)
{
  if (p == nullptr || bytes == 0) throw std::invalid_argument("strata::ipc::export_pool_block: an empty block");
  exported_block out;
  out.handle.kind = memory_kind::memory_pool;
  out.handle.device = source.device() >= 0 ? source.device() : detail::device_of(p);
  out.handle.bytes = bytes;
  int fd = -1;
  const cudaError_t status =
    cudaMemPoolExportToShareableHandle(&fd, source.pool(), cudaMemHandleTypePosixFileDescriptor, 0);
  if (status == cudaErrorInvalidValue || status == cudaErrorNotSupported) {
    strata::detail::clear_last_error();
    throw std::invalid_argument("strata::ipc::export_pool_block: the pool cannot be exported (create the async_source "
                                "with handle_type = cudaMemHandleTypePosixFileDescriptor)");
  }
  strata::detail::cuda_check(status, "cudaMemPoolExportToShareableHandle");
  out.fds.emplace_back(fd);
  cudaMemPoolPtrExportData data{};
  strata::detail::cuda_check(cudaMemPoolExportPointer(&data, const_cast<void*>(p)), "cudaMemPoolExportPointer");
  std::memcpy(out.handle.opaque.data(), &data, sizeof data);
  return out;
}

/// A block of a mapped_pool over driver_pages made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: one descriptor
/// per physical allocation behind the block (cuMemExportToShareableHandle), their sizes, and the block's
/// offset in the first. p must start a live block. A driver call per allocation.
inline exported_block export_mapped_block(const mapped_pool<driver_pages>& pool, const void* p, std::size_t bytes)
{
  const auto backing = pool.backing_of(p);
  if (backing.empty()) throw std::invalid_argument("strata::ipc::export_mapped_block: the pointer does not start a live block of this pool");
  exported_block out;
  out.handle.kind = memory_kind::mapped_pages;
  out.handle.device = pool.backend().device();
  out.handle.bytes = bytes;
  out.handle.offset = reinterpret_cast<std::uintptr_t>(p) - backing.front().address;
  for (const auto& b : backing) {
    out.fds.emplace_back(pool.backend().export_fd(b.page));
    out.handle.mapping_bytes.push_back(b.bytes);
  }
  return out;
}

} // namespace strata::ipc
