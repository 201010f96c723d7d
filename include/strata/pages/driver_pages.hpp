#pragma once
// The CUDA driver's virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess,
// cuMemUnmap, cuMemRelease) as a page backend. The driver's functions are reached through the runtime's
// entry-point table, as strata::identify does: no link to libcuda, and a program without a GPU loads fine.
#include <cuda.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <cstdint>
#include <source_location>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/config.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/peer_access.hpp>
#include <strata/core/properties.hpp>
#include <strata/detail/cuda_check.hpp>
#include <strata/pages/page_backend.hpp>
#include <strata/pinned/pin_lender.hpp>
#include <strata/sleep/pinned_host.hpp>
#include <strata/source/device_source.hpp>

namespace strata {

namespace detail {

/// The driver entry points driver_pages uses, looked up once per process.
struct vmm_driver {
  decltype(&::cuMemAddressReserve) address_reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuGetErrorName) error_name = nullptr;
  // For sharing between processes (ipc/); null where the driver lacks them, which only IPC notices.
  decltype(&::cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) handle_properties = nullptr;

  static const vmm_driver& get()
  {
    static const vmm_driver driver = load();
    if (driver.create == nullptr)
      throw std::runtime_error("driver_pages: the CUDA driver offers no virtual memory management entry points");
    return driver;
  }

private:
  template <class F>
  static void find(F& fn, const char* name) noexcept
  {
    fn = driver_entry_point<F>(name);
  }
  static vmm_driver load() noexcept
  {
    vmm_driver d;
    find(d.address_reserve, "cuMemAddressReserve");
    find(d.address_free, "cuMemAddressFree");
    find(d.release, "cuMemRelease");
    find(d.map, "cuMemMap");
    find(d.unmap, "cuMemUnmap");
    find(d.set_access, "cuMemSetAccess");
    find(d.granularity, "cuMemGetAllocationGranularity");
    find(d.error_name, "cuGetErrorName");
    find(d.export_handle, "cuMemExportToShareableHandle");
    find(d.import_handle, "cuMemImportFromShareableHandle");
    find(d.handle_properties, "cuMemGetAllocationPropertiesFromHandle");
    find(d.create, "cuMemCreate");  // last: its presence says every lookup above ran
    if (!d.address_reserve || !d.address_free || !d.release || !d.map || !d.unmap || !d.set_access || !d.granularity)
      d.create = nullptr;
    return d;
  }
};

[[noreturn, gnu::cold]] inline void throw_driver_error(CUresult status, const char* call, std::source_location where)
{
  const char* name = nullptr;
  if (const auto fn = vmm_driver::get().error_name; fn == nullptr || fn(status, &name) != CUDA_SUCCESS) name = "unknown";
  throw std::runtime_error(std::string(call) + " failed: " + name + " (driver error " + std::to_string(status) + ") at " +
                           where.file_name() + ":" + std::to_string(where.line()));
}

inline void driver_check(CUresult status, const char* call, std::source_location where = std::source_location::current())
{
  if (status != CUDA_SUCCESS) throw_driver_error(status, call, where);
}

/// Two non-blocking streams on one device that pause and resume copy over, pieces alternating between them
/// so one piece's setup overlaps the other's transfer. Made on first use; destroyed with the last owner.
/// Models nothing (driver_pages' helper). Cost: made with two stream creations and destroyed with two stream
/// destructions; copy() one cudaMemcpyAsync per piece of at most 64 MiB, no host wait; finish() a host wait
/// on each stream. Unsynchronized: the owning pool serializes its calls.
struct copy_lanes {
  explicit copy_lanes(int device) : device(device)
  {
    scoped_device on(device);
    for (auto& s : streams) cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  ~copy_lanes()
  {
    for (auto& s : streams) cuda_check_noexcept(cudaStreamDestroy(s));
  }
  copy_lanes(const copy_lanes&) = delete;
  copy_lanes& operator=(const copy_lanes&) = delete;

  /// Queues dst <- src in pieces cut at multiples of pinned_host_layout::chunk of the host address (never
  /// across two registrations of pinned memory).
  void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, const unsigned char* host)
  {
    scoped_device on(device);
    constexpr std::size_t chunk = pinned_host_layout::chunk;
    for (std::size_t done = 0; done < bytes;) {
      const auto h = reinterpret_cast<std::uintptr_t>(host) + done;
      const std::size_t n = std::min(bytes - done, chunk - h % chunk);
      cuda_check(cudaMemcpyAsync(static_cast<unsigned char*>(dst) + done, static_cast<const unsigned char*>(src) + done, n, kind, streams[next]),
                 "cudaMemcpyAsync");
      next ^= 1u;
      done += n;
    }
  }
  void finish()
  {
    scoped_device on(device);
    for (auto& s : streams) cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }

  int device;
  std::array<cudaStream_t, 2> streams{};
  unsigned next = 0;
};

/// Read and write access for `device`, as cuMemSetAccess takes it: what every mapping strata makes (its own
/// pages, and pages imported from another process) grants to the devices that use it.
inline CUmemAccessDesc access_for(int device) noexcept
{
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return desc;
}

} // namespace detail

/// Physical memory of one device, mapped into address ranges reserved on it, accessible from that device and
/// the peer devices named at construction (cuMemSetAccess covers each of them: peer access enabled the
/// runtime way does not reach memory mapped this way).
/// Models page_backend and copying_page_backend; device_accessible. Cost: every call is a driver call, priced
/// per call whatever the size (bench/vmm_costs times each; cuMemSetAccess and cuMemUnmap cost most);
/// synchronize() is a cudaDeviceSynchronize of the device. For pause and resume: pin() is pin_host
/// (sleep/pinned_host.hpp: chunks registered by several threads), or a block of the pinned pool lent through
/// mapped_pool::lend_pins_from (Note [One pinned budget], pinned/pin_lender.hpp), copies go over two streams
/// of its own in pieces of at most 64 MiB, finish_copies() waits for both streams on the host.
/// Holds no mutable state but its counters and its copy streams (shared by copies of it), which the owning
/// pool guards.
class driver_pages {
public:
  using page = CUmemGenericAllocationHandle;

  /// `page_size` 0: the device's allocation granularity (2 MiB on H100/H200); otherwise a multiple of it.
  static constexpr std::size_t max_devices = 32;

  /// `handle_types`: what the physical allocations may be exported as (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
  /// to share blocks with other processes through ipc/; none by default, as cuMemCreate's default).
  explicit driver_pages(int device = detail::current_device(), std::size_t page_size = 0, const std::vector<int>& peers = {},
                        CUmemAllocationHandleType handle_types = CU_MEM_HANDLE_TYPE_NONE)
      : device_(device), handle_types_(handle_types)
  {
    const auto& driver = detail::vmm_driver::get();
    const CUmemAllocationProp prop = properties();
    std::size_t granularity = 0;
    detail::scoped_device on(device_);
    detail::driver_check(driver.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
    if (page_size == 0) page_size = granularity;
    if (page_size % granularity != 0 || !is_power_of_two(page_size))
      throw std::invalid_argument("driver_pages: page size " + std::to_string(page_size) +
                                  " is not a power-of-two multiple of device " + std::to_string(device) +
                                  "'s granularity of " + std::to_string(granularity) + " bytes");
    page_size_ = page_size;
    access_[devices_++] = detail::access_for(device_);
    for (int peer : peers) {
      if (peer == device_) continue;
      if (devices_ == max_devices) throw std::invalid_argument("driver_pages: more than 32 devices");
      detail::check_peer_path("driver_pages", device_, peer);  // peer_access_error, a std::invalid_argument
      access_[devices_++] = detail::access_for(peer);
    }
  }

  std::size_t page_size() const noexcept { return page_size_; }
  int device() const noexcept { return device_; }

  /// Adds `peer` to the devices each later set_access grants (what `peers` does at construction); existing
  /// mappings need set_access again (mapped_pool::add_peer does that). false, nothing changed, for this device
  /// or a peer granted already. peer_access_error (a std::invalid_argument) where the devices have no peer
  /// path; std::invalid_argument past max_devices. O(devices), a driver query.
  bool add_peer(int peer)
  {
    if (grants(peer)) return false;
    if (devices_ == max_devices) throw std::invalid_argument("driver_pages: more than 32 devices");
    detail::check_peer_path("driver_pages", device_, peer);
    access_[devices_++] = detail::access_for(peer);
    return true;
  }
  /// Takes a peer off the list add_peer put it on (never this device). O(devices).
  void remove_peer(int peer) noexcept
  {
    for (std::size_t i = 1; i < devices_; ++i)
      if (access_[i].location.id == peer) {
        for (std::size_t j = i + 1; j < devices_; ++j) access_[j - 1] = access_[j];
        --devices_;
        return;
      }
  }
  /// Whether set_access grants `device` (this one, or a peer).
  bool grants(int device) const noexcept
  {
    for (std::size_t i = 0; i < devices_; ++i)
      if (access_[i].location.id == device) return true;
    return false;
  }

  std::uintptr_t reserve(std::size_t bytes, std::size_t alignment)
  {
    CUdeviceptr address = 0;
    detail::scoped_device on(device_);
    const CUresult status = detail::vmm_driver::get().address_reserve(&address, bytes, alignment, 0, 0);
    if (status == CUDA_ERROR_OUT_OF_MEMORY) throw out_of_memory("driver_pages", bytes, "cuMemAddressReserve refused");
    detail::driver_check(status, "cuMemAddressReserve");
    ++counts_.reserves;
    return static_cast<std::uintptr_t>(address);
  }

  void unreserve(std::uintptr_t address, std::size_t bytes) noexcept
  {
    (void)detail::vmm_driver::get().address_free(static_cast<CUdeviceptr>(address), bytes);
  }

  page create(std::size_t bytes)
  {
    page p = 0;
    const CUmemAllocationProp prop = properties();
    detail::scoped_device on(device_);
    const CUresult status = detail::vmm_driver::get().create(&p, bytes, &prop, 0);
    if (status == CUDA_ERROR_OUT_OF_MEMORY)
      throw out_of_memory("driver_pages", bytes, "cuMemCreate refused; " + detail::device_memory_figures(device_));
    detail::driver_check(status, "cuMemCreate");
    ++counts_.creates;
    return p;
  }

  void destroy(page p) noexcept
  {
    if (detail::vmm_driver::get().release(p) == CUDA_SUCCESS) ++counts_.releases;
  }

  void map(std::uintptr_t address, page p, std::size_t bytes)
  {
    detail::scoped_device on(device_);  // the device's context, whatever the caller has current
    detail::driver_check(detail::vmm_driver::get().map(static_cast<CUdeviceptr>(address), bytes, 0, p, 0), "cuMemMap");
    ++counts_.maps;
  }

  void set_access(std::uintptr_t address, std::size_t bytes)
  {
    detail::scoped_device on(device_);
    detail::driver_check(detail::vmm_driver::get().set_access(static_cast<CUdeviceptr>(address), bytes, access_.data(), devices_),
                         "cuMemSetAccess");
    ++counts_.access_calls;
  }

  void unmap(std::uintptr_t address, std::size_t bytes)
  {
    detail::driver_check(detail::vmm_driver::get().unmap(static_cast<CUdeviceptr>(address), bytes), "cuMemUnmap");
    ++counts_.unmaps;
  }

  /// Waits for the device and every peer granted access: work on any of them may use the memory.
  void synchronize()
  {
    for (std::size_t i = 0; i < devices_; ++i) {
      detail::scoped_device on(access_[i].location.id);
      detail::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    ++counts_.synchronizes;
  }

  const page_counters& counts() const noexcept { return counts_; }

  void* pin(std::size_t bytes) { return lender_ ? lender_.take(bytes) : pin_host(bytes); }
  void unpin(void* host, std::size_t bytes) noexcept
  {
    if (lender_) lender_.give(host, bytes);
    else unpin_host(host, bytes);
  }
  /// From now on pin() borrows from `lender` and unpin() gives back to it (Note [One pinned budget]). Set it
  /// through mapped_pool::lend_pins_from, which first gives back what is pinned: unpin() hands whatever it is
  /// given to the lender of the moment.
  void lend_pins_from(pin_lender lender) noexcept { lender_ = lender; }
  bool pins_lent() const noexcept { return static_cast<bool>(lender_); }
  void copy_to_host(void* host, std::uintptr_t address, std::size_t bytes)
  {
    lanes().copy(host, reinterpret_cast<const void*>(address), bytes, cudaMemcpyDeviceToHost, static_cast<const unsigned char*>(host));
  }
  void copy_to_device(std::uintptr_t address, const void* host, std::size_t bytes)
  {
    lanes().copy(reinterpret_cast<void*>(address), host, bytes, cudaMemcpyHostToDevice, static_cast<const unsigned char*>(host));
  }
  void finish_copies()
  {
    if (lanes_ != nullptr) lanes_->finish();
  }
  /// What cudaMemGetInfo says is free on the device.
  std::size_t free_bytes() const
  {
    std::size_t free = 0, total = 0;
    detail::scoped_device on(device_);
    detail::cuda_check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return free;
  }

  CUmemAllocationHandleType handle_types() const noexcept { return handle_types_; }

  /// A new POSIX file descriptor for physical allocation `p` (cuMemExportToShareableHandle), owned by the
  /// caller; for pages created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR. Another process imports it with
  /// cuMemImportFromShareableHandle (ipc/). A driver call; std::logic_error where the pages are not exportable.
  int export_fd(page p) const
  {
    if ((handle_types_ & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0)
      throw std::logic_error("driver_pages: pages created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR cannot be exported");
    const auto fn = detail::vmm_driver::get().export_handle;
    if (fn == nullptr) throw std::runtime_error("driver_pages: the driver has no cuMemExportToShareableHandle");
    int fd = -1;
    detail::driver_check(fn(&fd, p, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "cuMemExportToShareableHandle");
    return fd;
  }

  friend constexpr void get_property(const driver_pages&, device_accessible) noexcept {}

private:
  CUmemAllocationProp properties() const noexcept
  {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device_;
    prop.requestedHandleTypes = handle_types_;
    return prop;
  }

  detail::copy_lanes& lanes()
  {
    if (lanes_ == nullptr) lanes_ = std::make_shared<detail::copy_lanes>(device_);
    return *lanes_;
  }

  int device_ = 0;
  std::shared_ptr<detail::copy_lanes> lanes_;
  pin_lender lender_;
  CUmemAllocationHandleType handle_types_ = CU_MEM_HANDLE_TYPE_NONE;
  std::size_t page_size_ = 0;
  std::array<CUmemAccessDesc, max_devices> access_{};  ///< a fixed array: moves cannot throw
  std::size_t devices_ = 0;
  page_counters counts_;
};

static_assert(copying_page_backend<driver_pages>);

} // namespace strata
