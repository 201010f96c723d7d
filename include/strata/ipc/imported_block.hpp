#pragma once
// The importing side: a block another process exported, mapped here until this object goes away.
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include <strata/core/config.hpp>
#include <strata/detail/cuda_check.hpp>
#include <strata/ipc/block_handle.hpp>
#include <strata/pages/driver_pages.hpp>

namespace strata::ipc {

/// Another process's block, usable here: `get()` points at its first byte, `size()` bytes may be touched
/// (block_handle.hpp says the contract). Destruction closes the mapping: cudaIpcCloseMemHandle (cuda_malloc),
/// cudaFree of the imported pointer then cudaMemPoolDestroy of the imported pool (memory_pool), cuMemUnmap,
/// cuMemRelease and cuMemAddressFree (mapped_pages) — after which the importer may tell the exporter it is done.
/// `peers`: other devices of this process that should reach the memory too (cudaMemPoolSetAccess /
/// cuMemSetAccess; cuda_malloc imports use cudaIpcMemLazyEnablePeerAccess instead).
/// Cost: opening is a handful of driver calls (and a mapping); closing the same. Move-only. Not thread-safe.
class imported_block {
public:
  /// Opens what receive_block returned. std::invalid_argument for a description without its descriptors;
  /// strata::cuda_error / std::runtime_error when CUDA refuses (nothing stays open then).
  static imported_block open(exported_block block, const std::vector<int>& peers = {})
  {
    const block_handle& h = block.handle;
    if (block.fds.size() != h.fds_needed())
      throw std::invalid_argument("strata::ipc::imported_block: " + std::to_string(block.fds.size()) +
                                  " descriptors for a handle that needs " + std::to_string(h.fds_needed()));
    imported_block b;
    b.kind_ = h.kind;
    b.device_ = h.device;
    b.size_ = h.bytes;
    const strata::detail::scoped_device on(h.device);
    switch (h.kind) {
    case memory_kind::cuda_malloc: b.open_cuda_malloc(h); break;
    case memory_kind::memory_pool: b.open_pool(h, block.fds[0], peers); break;
    case memory_kind::mapped_pages: b.open_mapped(h, block.fds, peers); break;
    }
    return b;
  }

  imported_block(imported_block&& other) noexcept { take(other); }
  imported_block& operator=(imported_block&& other) noexcept
  {
    if (this != &other) {
      close();
      take(other);
    }
    return *this;
  }
  imported_block(const imported_block&) = delete;
  imported_block& operator=(const imported_block&) = delete;
  ~imported_block() { close(); }

  void* get() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  memory_kind kind() const noexcept { return kind_; }
  explicit operator bool() const noexcept { return data_ != nullptr; }

  /// Closes the mapping now (what the destructor does); the object is empty after.
  void close() noexcept
  {
    if (data_ == nullptr && mapped_base_ == 0 && pool_ == nullptr && ipc_base_ == nullptr) return;
    switch (kind_) {
    case memory_kind::cuda_malloc:
      if (ipc_base_ != nullptr) strata::detail::cuda_check_noexcept(cudaIpcCloseMemHandle(ipc_base_));
      break;
    case memory_kind::memory_pool:
      if (data_ != nullptr) strata::detail::cuda_check_noexcept(cudaFree(data_));
      if (pool_ != nullptr) strata::detail::cuda_check_noexcept(cudaMemPoolDestroy(pool_));
      break;
    case memory_kind::mapped_pages: unmap_all(); break;
    }
    data_ = nullptr;
    ipc_base_ = nullptr;
    pool_ = nullptr;
    mapped_base_ = 0;
    mapped_span_ = 0;
    handles_.clear();
    mapped_count_ = 0;
  }

private:
  imported_block() = default;

  void take(imported_block& o) noexcept
  {
    kind_ = o.kind_;
    device_ = o.device_;
    size_ = std::exchange(o.size_, 0);
    data_ = std::exchange(o.data_, nullptr);
    ipc_base_ = std::exchange(o.ipc_base_, nullptr);
    pool_ = std::exchange(o.pool_, nullptr);
    mapped_base_ = std::exchange(o.mapped_base_, 0);
    mapped_span_ = std::exchange(o.mapped_span_, 0);
    handles_ = std::exchange(o.handles_, {});
    sizes_ = std::exchange(o.sizes_, {});
    mapped_count_ = std::exchange(o.mapped_count_, 0);
  }

  void open_cuda_malloc(const block_handle& h)
  {
    cudaIpcMemHandle_t handle{};
    std::memcpy(&handle, h.opaque.data(), sizeof handle);
    strata::detail::cuda_check(cudaIpcOpenMemHandle(&ipc_base_, handle, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    data_ = static_cast<char*>(ipc_base_) + h.offset;
  }

  void open_pool(const block_handle& h, const unique_fd& fd, const std::vector<int>& peers)
  {
    strata::detail::cuda_check(
      cudaMemPoolImportFromShareableHandle(&pool_, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd.get())),
                                           cudaMemHandleTypePosixFileDescriptor, 0),
      "cudaMemPoolImportFromShareableHandle");
    try {
      // An imported pool is reachable from its own device only; other devices must be granted again here.
      for (const int peer : peers) {
        if (peer == h.device) continue;
        cudaMemAccessDesc desc{};
        desc.location.type = cudaMemLocationTypeDevice;
        desc.location.id = peer;
        desc.flags = cudaMemAccessFlagsProtReadWrite;
        strata::detail::cuda_check(cudaMemPoolSetAccess(pool_, &desc, 1), "cudaMemPoolSetAccess");
      }
      cudaMemPoolPtrExportData data{};
      std::memcpy(&data, h.opaque.data(), sizeof data);
      strata::detail::cuda_check(cudaMemPoolImportPointer(&data_, pool_, &data), "cudaMemPoolImportPointer");
    } catch (...) {
      strata::detail::cuda_check_noexcept(cudaMemPoolDestroy(pool_));
      pool_ = nullptr;
      throw;
    }
  }

  void open_mapped(const block_handle& h, const std::vector<unique_fd>& fds, const std::vector<int>& peers)
  {
    const auto& driver = strata::detail::vmm_driver::get();
    if (driver.import_handle == nullptr) throw std::runtime_error("strata::ipc: the driver has no cuMemImportFromShareableHandle");
    std::uint64_t span = 0;
    for (const std::uint64_t m : h.mapping_bytes) span += m;
    handles_.reserve(fds.size());
    sizes_ = h.mapping_bytes;
    try {
      for (const unique_fd& fd : fds) {
        CUmemGenericAllocationHandle handle = 0;
        strata::detail::driver_check(driver.import_handle(&handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd.get())),
                                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                                     "cuMemImportFromShareableHandle");
        handles_.push_back(handle);
      }
      CUdeviceptr base = 0;
      strata::detail::driver_check(driver.address_reserve(&base, span, 0, 0, 0), "cuMemAddressReserve");
      mapped_base_ = base;
      mapped_span_ = span;
      std::uint64_t at = 0;
      for (std::size_t i = 0; i < handles_.size(); ++i) {
        strata::detail::driver_check(driver.map(base + at, sizes_[i], 0, handles_[i], 0), "cuMemMap");
        ++mapped_count_;
        at += sizes_[i];
      }
      std::vector<CUmemAccessDesc> access;
      for (const int d : peers)
        if (d != h.device) access.push_back(strata::detail::access_for(d));
      access.push_back(strata::detail::access_for(h.device));
      strata::detail::driver_check(driver.set_access(base, span, access.data(), access.size()), "cuMemSetAccess");
    } catch (...) {
      unmap_all();
      throw;
    }
    data_ = reinterpret_cast<void*>(mapped_base_ + h.offset);
  }

  void unmap_all() noexcept
  {
    const auto& driver = strata::detail::vmm_driver::get();
    std::uint64_t at = 0;
    for (std::size_t i = 0; i < mapped_count_; ++i) {
      (void)driver.unmap(mapped_base_ + at, sizes_[i]);
      at += sizes_[i];
    }
    for (const CUmemGenericAllocationHandle handle : handles_) (void)driver.release(handle);
    if (mapped_base_ != 0) (void)driver.address_free(mapped_base_, mapped_span_);
    handles_.clear();
    mapped_count_ = 0;
    mapped_base_ = 0;
  }

  memory_kind kind_ = memory_kind::cuda_malloc;
  int device_ = -1;
  std::size_t size_ = 0;
  void* data_ = nullptr;
  void* ipc_base_ = nullptr;             // cuda_malloc: what cudaIpcOpenMemHandle mapped
  cudaMemPool_t pool_ = nullptr;         // memory_pool: the imported pool
  CUdeviceptr mapped_base_ = 0;          // mapped_pages: the reserved range and what is behind it
  std::uint64_t mapped_span_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;
  std::vector<std::uint64_t> sizes_;
  std::size_t mapped_count_ = 0;
};

} // namespace strata::ipc
