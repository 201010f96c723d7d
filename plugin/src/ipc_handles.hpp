#pragma once
// What torch.multiprocessing carries for a shared CUDA tensor, as strata's PyTorch backend writes and reads it,
// and the books kept on both sides. PyTorch-free and CUDA-free: the host tests check all of it.
//
// Note [PyTorch's shareable handles]
// PyTorch 2.11 sends a CUDA tensor to another process as bytes (CUDAAllocator::shareIpcHandle, opened there by
// getIpcDevPtr) plus the tensor's offset in what the bytes map. The bytes are a version (2), a type and a body:
//  - 'c', cudaMalloc'd memory: the cudaIpcMemHandle_t of the allocation (64 bytes).
//  - 'e', page-mapped memory (PyTorch's expandable segments): a header {pid_t pid; size_t segment_size;
//    size_t num_handles} as the C ABI lays it out (24 bytes, the padding after pid zero), then num_handles
//    ints: POSIX file descriptors of the physical allocations, numbered as in the exporting process. The
//    importer takes its own copies with pidfd_getfd and maps allocation i at i * segment_size, from its
//    start: every allocation is segment_size bytes.
// strata's page-mapped pool makes physical allocations of several sizes, so a block may lie across allocations
// that differ in size, which 'e' cannot describe. Such a block is sent as
//  - 's', strata's page-mapped memory: {int32 pid; uint32 zero; uint64 count}, then count uint64 sizes, then
//    count int32 descriptors (numbered as in the exporter, fetched alike).
// Every other block goes out as 'e', which PyTorch's own allocator opens as well as strata's. The exporter
// keeps the descriptors open while the block lives (an importer may fetch them until then: PyTorch keeps the
// block alive until every importer has released it, torch/csrc/CudaIPCTypes.cpp) and closes them when the
// block is freed; the same block shared again gives the same bytes, so an importer maps it once.
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <strata/ipc/fd_passing.hpp>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace strata::plugin {

inline constexpr char shareable_handle_version = 2;

/// The body a shareable handle carries (Note [PyTorch's shareable handles]).
enum class shareable_type : char {
  cuda_malloc = 'c',   ///< cudaIpcMemHandle_t
  pages = 'e',         ///< page-mapped, every allocation one size: PyTorch's expandable segments' format
  strata_pages = 's',  ///< page-mapped, allocations of several sizes: strata's format
};

/// Page-mapped memory as a handle names it: the exporting process and its physical allocations in address
/// order, each one's size and descriptor (numbered in the exporter).
struct shared_pages {
  std::int32_t pid = 0;
  std::vector<std::uint64_t> mapping_bytes;
  std::vector<int> fds;

  std::uint64_t span() const noexcept
  {
    std::uint64_t total = 0;
    for (const std::uint64_t b : mapping_bytes) total += b;
    return total;
  }
  /// Every allocation of one size: PyTorch's 'e' can carry it.
  bool uniform() const noexcept
  {
    for (const std::uint64_t b : mapping_bytes)
      if (b != mapping_bytes.front()) return false;
    return true;
  }
  friend bool operator==(const shared_pages&, const shared_pages&) = default;
};

/// A handle read back: its type and the body that type carries.
struct decoded_handle {
  static constexpr std::size_t cuda_handle_bytes = 64;  // sizeof(cudaIpcMemHandle_t)
  shareable_type type = shareable_type::cuda_malloc;
  std::array<std::byte, cuda_handle_bytes> cuda_handle{};  ///< cuda_malloc
  shared_pages pages;                                      ///< pages, strata_pages
};

namespace detail {
// PyTorch's ShareHeader as the C ABI lays out {pid_t; size_t; size_t} on Linux x86-64 and aarch64.
constexpr std::size_t share_header_bytes = 24;
constexpr std::size_t share_header_pid_at = 0;
constexpr std::size_t share_header_segment_at = 8;
constexpr std::size_t share_header_count_at = 16;

template <class T>
void put_at(std::string& out, std::size_t at, T value)
{
  std::memcpy(out.data() + at, &value, sizeof value);
}
template <class T>
T get_at(std::string_view in, std::size_t at)
{
  T value{};
  std::memcpy(&value, in.data() + at, sizeof value);
  return value;
}

[[noreturn]] inline void bad_handle(const std::string& why)
{
  throw std::invalid_argument("strata: a shareable CUDA handle " + why);
}

inline void check_pages(const shared_pages& p)
{
  if (p.mapping_bytes.empty()) throw std::invalid_argument("strata: sharing pages needs at least one mapping");
  if (p.fds.size() != p.mapping_bytes.size())
    throw std::invalid_argument("strata: " + std::to_string(p.fds.size()) + " descriptors for " + std::to_string(p.mapping_bytes.size()) +
                                " mappings");
  for (const std::uint64_t b : p.mapping_bytes)
    if (b == 0) throw std::invalid_argument("strata: a mapping of 0 bytes cannot be shared");
  if (p.pid <= 0) throw std::invalid_argument("strata: process id " + std::to_string(p.pid));
}
} // namespace detail

/// The handle of a cudaMalloc'd allocation: version, 'c', the 64 bytes of its cudaIpcMemHandle_t.
inline std::string encode_cuda_malloc(std::span<const std::byte, decoded_handle::cuda_handle_bytes> handle)
{
  std::string out(2 + handle.size(), '\0');
  out[0] = shareable_handle_version;
  out[1] = static_cast<char>(shareable_type::cuda_malloc);
  std::memcpy(out.data() + 2, handle.data(), handle.size());
  return out;
}

/// The handle of page-mapped memory: 'e' when every allocation has one size, 's' otherwise. O(mappings).
/// std::invalid_argument for no mappings, a mapping of 0 bytes, descriptors not one per mapping, a bad pid.
inline std::string encode_pages(const shared_pages& p)
{
  detail::check_pages(p);
  const std::size_t n = p.mapping_bytes.size();
  if (p.uniform()) {
    std::string out(2 + detail::share_header_bytes + n * sizeof(std::int32_t), '\0');
    out[0] = shareable_handle_version;
    out[1] = static_cast<char>(shareable_type::pages);
    detail::put_at(out, 2 + detail::share_header_pid_at, p.pid);
    detail::put_at(out, 2 + detail::share_header_segment_at, static_cast<std::uint64_t>(p.mapping_bytes.front()));
    detail::put_at(out, 2 + detail::share_header_count_at, static_cast<std::uint64_t>(n));
    for (std::size_t i = 0; i < n; ++i)
      detail::put_at(out, 2 + detail::share_header_bytes + i * sizeof(std::int32_t), static_cast<std::int32_t>(p.fds[i]));
    return out;
  }
  std::string out(2 + 16 + n * (sizeof(std::uint64_t) + sizeof(std::int32_t)), '\0');
  out[0] = shareable_handle_version;
  out[1] = static_cast<char>(shareable_type::strata_pages);
  detail::put_at(out, 2, p.pid);
  detail::put_at(out, 2 + 8, static_cast<std::uint64_t>(n));
  for (std::size_t i = 0; i < n; ++i) {
    detail::put_at(out, 2 + 16 + i * sizeof(std::uint64_t), static_cast<std::uint64_t>(p.mapping_bytes[i]));
    detail::put_at(out, 2 + 16 + n * sizeof(std::uint64_t) + i * sizeof(std::int32_t), static_cast<std::int32_t>(p.fds[i]));
  }
  return out;
}

/// Reads a handle PyTorch or strata wrote (a bare 64-byte cudaIpcMemHandle_t, from a PyTorch before versioned
/// handles, reads as 'c'). std::invalid_argument naming what is wrong: a later version, an unknown type, a
/// length that does not match what the header announces, a mapping of 0 bytes, a bad pid.
inline decoded_handle decode_handle(std::string_view in)
{
  decoded_handle h;
  if (in.size() == decoded_handle::cuda_handle_bytes) {
    std::memcpy(h.cuda_handle.data(), in.data(), in.size());
    return h;
  }
  if (in.size() < 2) detail::bad_handle("of " + std::to_string(in.size()) + " bytes is too short");
  if (in[0] > shareable_handle_version)
    detail::bad_handle("has version " + std::to_string(static_cast<int>(in[0])) + ", newer than this PyTorch's " +
                       std::to_string(static_cast<int>(shareable_handle_version)));
  const std::string_view body = in.substr(2);
  switch (static_cast<shareable_type>(in[1])) {
  case shareable_type::cuda_malloc:
    if (body.size() != decoded_handle::cuda_handle_bytes)
      detail::bad_handle("of type 'c' carries " + std::to_string(body.size()) + " bytes, not a 64-byte cudaIpcMemHandle_t");
    h.type = shareable_type::cuda_malloc;
    std::memcpy(h.cuda_handle.data(), body.data(), body.size());
    return h;
  case shareable_type::pages: {
    if (body.size() < detail::share_header_bytes) detail::bad_handle("of type 'e' is shorter than its header");
    h.type = shareable_type::pages;
    h.pages.pid = detail::get_at<std::int32_t>(body, detail::share_header_pid_at);
    const auto segment = detail::get_at<std::uint64_t>(body, detail::share_header_segment_at);
    const auto n = detail::get_at<std::uint64_t>(body, detail::share_header_count_at);
    if (n == 0 || n > (body.size() - detail::share_header_bytes) / sizeof(std::int32_t) ||
        body.size() != detail::share_header_bytes + n * sizeof(std::int32_t))
      detail::bad_handle("of type 'e' announces " + std::to_string(n) + " descriptors in " + std::to_string(body.size()) +
                         " bytes (PyTorch 2.11's layout: a 24-byte header, then one 4-byte descriptor each)");
    if (segment == 0) detail::bad_handle("of type 'e' has segments of 0 bytes");
    for (std::uint64_t i = 0; i < n; ++i) {
      h.pages.mapping_bytes.push_back(segment);
      h.pages.fds.push_back(detail::get_at<std::int32_t>(body, detail::share_header_bytes + i * sizeof(std::int32_t)));
    }
    break;
  }
  case shareable_type::strata_pages: {
    if (body.size() < 16) detail::bad_handle("of type 's' is shorter than its header");
    h.type = shareable_type::strata_pages;
    h.pages.pid = detail::get_at<std::int32_t>(body, 0);
    const auto n = detail::get_at<std::uint64_t>(body, 8);
    constexpr std::size_t each = sizeof(std::uint64_t) + sizeof(std::int32_t);
    if (n == 0 || n > (body.size() - 16) / each || body.size() != 16 + n * each)
      detail::bad_handle("of type 's' announces " + std::to_string(n) + " mappings in " + std::to_string(body.size()) + " bytes");
    for (std::uint64_t i = 0; i < n; ++i) {
      h.pages.mapping_bytes.push_back(detail::get_at<std::uint64_t>(body, 16 + i * sizeof(std::uint64_t)));
      h.pages.fds.push_back(detail::get_at<std::int32_t>(body, 16 + n * sizeof(std::uint64_t) + i * sizeof(std::int32_t)));
    }
    break;
  }
  default:
    detail::bad_handle("has type '" + std::string(1, in[1]) + "', which neither PyTorch 2.11 nor strata writes");
  }
  try {
    detail::check_pages(h.pages);
  } catch (const std::invalid_argument& e) {
    detail::bad_handle(std::string("is malformed: ") + e.what());
  }
  return h;
}

/// This process's own copies of descriptors that process `pid` holds (pidfd_open, then pidfd_getfd for each),
/// in the same order. Needs permission to inspect that process as a debugger would (ptrace's
/// PTRACE_MODE_ATTACH_REALCREDS): a process of the same user normally has it, except where Yama's
/// ptrace_scope is 1 and the exporter is not a descendant of this process (a child opening its parent's
/// tensor), or in a sandbox that forbids ptrace. std::system_error naming the cause and the ways out; on any
/// failure nothing stays open. Two system calls plus one per descriptor.
inline std::vector<ipc::unique_fd> descriptors_of(std::int32_t pid, std::span<const int> fds)
{
  const auto fail = [&](int err, const char* call) {
    std::string why = std::string("strata: ") + call + " for process " + std::to_string(pid);
    if (err == EPERM || err == EACCES)
      why += ": this process may not take descriptors from the exporting process (ptrace permission). Where "
             "/proc/sys/kernel/yama/ptrace_scope is 1 only an ancestor may; let the exporter allow it "
             "(prctl(PR_SET_PTRACER, pid or PR_SET_PTRACER_ANY)), or grant CAP_SYS_PTRACE";
    else if (err == ENOSYS)
      why += ": the kernel has no pidfd_open/pidfd_getfd (Linux 5.6 or later shares page-mapped CUDA memory)";
    else if (err == ESRCH)
      why += ": the exporting process is gone";
    else if (err == EBADF)
      why += ": the exporting process no longer holds the descriptor (its block was freed before it was opened)";
    throw std::system_error(err, std::generic_category(), why);
  };
  const long pidfd = ::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0);
  if (pidfd < 0) fail(errno, "pidfd_open");
  const ipc::unique_fd process(static_cast<int>(pidfd));
  std::vector<ipc::unique_fd> out;
  out.reserve(fds.size());
  for (const int fd : fds) {
    const long mine = ::syscall(SYS_pidfd_getfd, process.get(), fd, 0);
    if (mine < 0) fail(errno, "pidfd_getfd");
    out.emplace_back(static_cast<int>(mine));
  }
  return out;
}

/// A live block as another process maps it: the physical allocations behind it in address order (each one's
/// size and a new POSIX descriptor for it, owned here) and the block's offset in the first.
struct shared_block {
  std::size_t offset = 0;
  std::vector<std::size_t> mapping_bytes;
  std::vector<ipc::unique_fd> fds;
};

/// The block starting at p of a page-mapped pool (mapped_pool: backing_of), each allocation's descriptor made
/// by export_fd(page). std::invalid_argument where p starts no live block; what export_fd throws otherwise, with
/// the descriptors made before it closed. O(allocations behind the block) plus an export each.
template <class Pool, class Export>
shared_block share_of(const Pool& pool, const void* p, Export&& export_fd)
{
  const auto backing = pool.backing_of(p);
  if (backing.empty()) throw std::invalid_argument("the pointer does not start a live block of this device's pool");
  shared_block out;
  out.offset = reinterpret_cast<std::uintptr_t>(p) - backing.front().address;
  out.mapping_bytes.reserve(backing.size());
  out.fds.reserve(backing.size());
  for (const auto& b : backing) {
    out.fds.emplace_back(export_fd(b.page));
    out.mapping_bytes.push_back(b.bytes);
  }
  return out;
}

/// The exporter's books: for each block shared and not yet freed, the handle sent and the descriptors it
/// names, which stay open until the block is freed (Note [PyTorch's shareable handles]). Not thread-safe: the
/// backend guards it. O(1) per call; erase closes the block's descriptors.
class export_ledger {
public:
  struct entry {
    std::ptrdiff_t offset = 0;  ///< the block's start in what the handle maps
    std::string handle;
    std::vector<ipc::unique_fd> fds;
  };

  /// The entry of a block shared before, or null.
  const entry* find(std::uintptr_t block) const noexcept
  {
    const auto it = entries_.find(block);
    return it == entries_.end() ? nullptr : &it->second;
  }
  /// Records a block's export; std::invalid_argument if the block has one already (the ledger is unchanged
  /// and `e` keeps its descriptors); std::bad_alloc leaves both unchanged too.
  const entry& insert(std::uintptr_t block, entry&& e)
  {
    if (entries_.contains(block)) throw std::invalid_argument("strata: the block is shared already");
    return entries_.emplace(block, std::move(e)).first->second;
  }
  /// The block was freed: its descriptors are closed. False when it was never shared.
  bool erase(std::uintptr_t block) noexcept
  {
    const auto it = entries_.find(block);
    if (it == entries_.end()) return false;
    entries_.erase(it);
    return true;
  }
  std::size_t size() const noexcept { return entries_.size(); }
  bool empty() const noexcept { return entries_.empty(); }
  /// Whether `fd` is a descriptor of a block shared and not freed: one the exporter may lend. O(descriptors).
  bool holds(int fd) const noexcept
  {
    for (const auto& [block, e] : entries_)
      for (const ipc::unique_fd& mine : e.fds)
        if (mine.get() == fd) return true;
    return false;
  }

private:
  std::unordered_map<std::uintptr_t, entry> entries_;
};

/// The importer's books: each handle opened and still mapped by some tensor, so a handle opened twice maps
/// once (CUDA refuses to open a cudaIpcMemHandle_t twice in one context; a second mapping of pages would
/// only waste address space). Entries whose mappings are gone are dropped as new ones come. Not thread-safe:
/// the backend guards it. find O(1); insert O(entries) when the map has doubled since the last sweep.
class opened_handles {
public:
  std::shared_ptr<void> find(const std::string& handle) const
  {
    const auto it = open_.find(handle);
    return it == open_.end() ? nullptr : it->second.lock();
  }
  void insert(const std::string& handle, const std::shared_ptr<void>& mapping)
  {
    if (open_.size() >= sweep_at_) {
      std::erase_if(open_, [](const auto& kv) { return kv.second.expired(); });
      sweep_at_ = std::max<std::size_t>(min_sweep, 2 * open_.size());
    }
    open_.insert_or_assign(handle, mapping);
  }
  std::size_t size() const noexcept { return open_.size(); }

private:
  static constexpr std::size_t min_sweep = 16;
  std::unordered_map<std::string, std::weak_ptr<void>> open_;
  std::size_t sweep_at_ = min_sweep;
};

} // namespace strata::plugin
