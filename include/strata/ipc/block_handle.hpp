#pragma once
// What crosses to another process when a block is shared: a small description (bytes) and, for memory whose
// handles are POSIX file descriptors, those descriptors beside it (fd_passing.hpp).
//
// The contract, for every kind of memory:
//  - The exporter keeps the block alive (does not free it, and keeps the pool that made it) until the importer
//    says it is done, i.e. until the importer's imported_block has been destroyed. How "done" travels is the
//    application's business; examples/ipc_two_processes sends a message back over the same socket.
//  - Work on the block is ordered by the application: the exporter finishes (or synchronizes) the writes the
//    importer must see before sending the handle, and the importer synchronizes before saying it is done.
//  - Both processes number devices alike (same CUDA_VISIBLE_DEVICES): `device` is the exporter's ordinal.
//  - The importer may touch exactly [0, bytes) of the imported block; what the handle maps around it (the rest
//    of a cudaMalloc'd chunk, of the mapped pages) belongs to other blocks of the exporter.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <strata/ipc/fd_passing.hpp>

namespace strata::ipc {

/// How the block's memory was made, which decides how it is shared.
enum class memory_kind : std::uint32_t {
  cuda_malloc = 1,   ///< inside a cudaMalloc allocation (device_source, any pool over it): cudaIpcGetMemHandle
  memory_pool = 2,   ///< from a cudaMemPool_t (async_source): the pool's file descriptor + cudaMemPoolExportPointer
  mapped_pages = 3,  ///< page-mapped (mapped_pool over driver_pages): one file descriptor per physical allocation
};

/// The description of an exported block. Serializes to a fixed little format (to_bytes / from_bytes); the
/// descriptors it needs (fds_needed()) travel beside it.
struct block_handle {
  static constexpr std::size_t opaque_bytes = 64;  // cudaIpcMemHandle_t, cudaMemPoolPtrExportData

  memory_kind kind = memory_kind::cuda_malloc;
  int device = -1;            ///< the exporter's device ordinal
  std::uint64_t bytes = 0;    ///< the block's size
  std::uint64_t offset = 0;   ///< where the block starts in what the handle maps (its chunk, its first mapping)
  std::array<std::byte, opaque_bytes> opaque{};  ///< the CUDA handle (cuda_malloc, memory_pool)
  std::vector<std::uint64_t> mapping_bytes;       ///< mapped_pages: each allocation's size, in address order

  /// Descriptors that must come with it: none, the pool's, or one per mapping.
  std::size_t fds_needed() const noexcept
  {
    switch (kind) {
    case memory_kind::memory_pool: return 1;
    case memory_kind::mapped_pages: return mapping_bytes.size();
    default: return 0;
    }
  }

  std::vector<std::byte> to_bytes() const
  {
    std::vector<std::byte> out;
    put(out, magic);
    put(out, version);
    put(out, static_cast<std::uint32_t>(kind));
    put(out, static_cast<std::int32_t>(device));
    put(out, bytes);
    put(out, offset);
    put_bytes(out, opaque.data(), opaque.size());
    put(out, static_cast<std::uint32_t>(mapping_bytes.size()));
    for (const std::uint64_t m : mapping_bytes) put(out, m);
    return out;
  }

  /// std::invalid_argument naming what is wrong for bytes that are not a block_handle this version wrote.
  static block_handle from_bytes(std::span<const std::byte> in)
  {
    block_handle h;
    std::size_t at = 0;
    if (get<std::uint32_t>(in, at) != magic) fail("not a strata block handle");
    if (const auto v = get<std::uint32_t>(in, at); v != version) fail("version " + std::to_string(v) + ", expected " + std::to_string(version));
    const auto kind = get<std::uint32_t>(in, at);
    if (kind < 1 || kind > 3) fail("unknown memory kind " + std::to_string(kind));
    h.kind = static_cast<memory_kind>(kind);
    h.device = get<std::int32_t>(in, at);
    h.bytes = get<std::uint64_t>(in, at);
    h.offset = get<std::uint64_t>(in, at);
    if (in.size() - at < opaque_bytes) fail("truncated");
    std::memcpy(h.opaque.data(), in.data() + at, opaque_bytes);
    at += opaque_bytes;
    const auto mappings = get<std::uint32_t>(in, at);
    if (mappings > (in.size() - at) / sizeof(std::uint64_t)) fail("truncated");
    for (std::uint32_t i = 0; i < mappings; ++i) h.mapping_bytes.push_back(get<std::uint64_t>(in, at));
    if (at != in.size()) fail(std::to_string(in.size() - at) + " bytes too many");
    if (h.device < 0) fail("device " + std::to_string(h.device));
    if (h.bytes == 0) fail("an empty block");
    if (h.kind == memory_kind::mapped_pages) {
      std::uint64_t span = 0;
      for (const std::uint64_t m : h.mapping_bytes) span += m;
      if (h.mapping_bytes.empty() || h.offset >= span || h.bytes > span - h.offset)
        fail("the block [" + std::to_string(h.offset) + ", +" + std::to_string(h.bytes) + ") does not lie in its " +
             std::to_string(span) + " mapped bytes");
    } else if (mappings != 0) {
      fail("mappings given for memory that is not page-mapped");
    }
    return h;
  }

  friend bool operator==(const block_handle&, const block_handle&) = default;

private:
  static constexpr std::uint32_t magic = 0x53544248;  // "STBH"
  static constexpr std::uint32_t version = 1;

  // Grown first, then copied into: inserting a byte range makes g++ 12 warn (-Wstringop-overflow,
  // -Warray-bounds) about a copy whose size it cannot follow.
  static void put_bytes(std::vector<std::byte>& out, const void* from, std::size_t n)
  {
    const std::size_t at = out.size();
    out.resize(at + n);
    if (n != 0) std::memcpy(out.data() + at, from, n);
  }
  template <class T>
  static void put(std::vector<std::byte>& out, T value)
  {
    put_bytes(out, &value, sizeof value);
  }
  template <class T>
  static T get(std::span<const std::byte> in, std::size_t& at)
  {
    if (in.size() - at < sizeof(T)) fail("truncated");
    T value{};
    std::memcpy(&value, in.data() + at, sizeof value);
    at += sizeof value;
    return value;
  }
  [[noreturn]] static void fail(const std::string& why) { throw std::invalid_argument("strata::ipc::block_handle: " + why); }
};

/// An exported block as it leaves or reaches a process: the description and its descriptors (owned: the
/// exporter's copies are closed when this goes; sending duplicates them into the receiver).
struct exported_block {
  block_handle handle;
  std::vector<unique_fd> fds;
};

/// Sends an exported block over a Unix socket (fd_passing.hpp).
inline void send_block(int socket, const exported_block& block)
{
  std::vector<int> raw;
  raw.reserve(block.fds.size());
  for (const unique_fd& fd : block.fds) raw.push_back(fd.get());
  const std::vector<std::byte> bytes = block.handle.to_bytes();
  send_message(socket, bytes, raw);
}

/// Receives what send_block sent; std::invalid_argument when the description is malformed or does not come
/// with the descriptors it needs.
inline exported_block receive_block(int socket)
{
  message m = receive_message(socket);
  exported_block block{block_handle::from_bytes(m.payload), std::move(m.fds)};
  if (block.fds.size() != block.handle.fds_needed())
    throw std::invalid_argument("strata::ipc::receive_block: " + std::to_string(block.fds.size()) +
                                " descriptors for a handle that needs " + std::to_string(block.handle.fds_needed()));
  return block;
}

} // namespace strata::ipc
