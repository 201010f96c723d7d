// ipc::block_handle: what an exported block looks like on the wire. Round trips for each kind of memory,
// every malformed input refused with a message, and the descriptors checked against the description.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <strata/ipc/block_handle.hpp>

using namespace strata::ipc;

namespace {
block_handle sample(memory_kind kind)
{
  block_handle h;
  h.kind = kind;
  h.device = 1;
  h.bytes = 3'000'000;
  h.offset = 4096;
  for (std::size_t i = 0; i < h.opaque.size(); ++i) h.opaque[i] = static_cast<std::byte>(i * 7);
  if (kind == memory_kind::mapped_pages) h.mapping_bytes = {2 << 20, 2 << 20};
  return h;
}

unique_fd memfd()
{
  unique_fd fd(::memfd_create("strata-test", MFD_CLOEXEC));
  REQUIRE(fd);
  return fd;
}
} // namespace

TEST_CASE("block_handle: every kind survives to_bytes / from_bytes")
{
  for (const memory_kind kind : {memory_kind::cuda_malloc, memory_kind::memory_pool, memory_kind::mapped_pages}) {
    CAPTURE(static_cast<int>(kind));
    const block_handle h = sample(kind);
    const block_handle back = block_handle::from_bytes(h.to_bytes());
    CHECK(back == h);
  }
  CHECK(sample(memory_kind::cuda_malloc).fds_needed() == 0);
  CHECK(sample(memory_kind::memory_pool).fds_needed() == 1);
  CHECK(sample(memory_kind::mapped_pages).fds_needed() == 2);
}

TEST_CASE("block_handle: malformed bytes are refused, naming what is wrong")
{
  const auto bytes = sample(memory_kind::mapped_pages).to_bytes();
  int refused = 0;
  for (std::size_t n = 0; n < bytes.size(); ++n) {  // every truncation
    CAPTURE(n);
    CHECK_THROWS_AS(block_handle::from_bytes(std::span(bytes.data(), n)), std::invalid_argument);
    ++refused;
  }
  CHECK(refused == static_cast<int>(bytes.size()));

  const auto refuses = [](std::vector<std::byte> b, const char* why) {
    CAPTURE(why);
    CHECK_THROWS_WITH_AS(block_handle::from_bytes(b), doctest::Contains(why), std::invalid_argument);
  };
  auto wrong_magic = bytes;
  wrong_magic[0] ^= std::byte{1};
  refuses(wrong_magic, "not a strata block handle");
  auto wrong_version = bytes;
  wrong_version[4] = std::byte{9};
  refuses(wrong_version, "version 9");
  auto wrong_kind = bytes;
  wrong_kind[8] = std::byte{7};
  refuses(wrong_kind, "unknown memory kind 7");
  auto extra = bytes;
  extra.push_back(std::byte{0});
  refuses(extra, "1 bytes too many");

  block_handle outside = sample(memory_kind::mapped_pages);
  outside.offset = (4 << 20) - 100;
  refuses(outside.to_bytes(), "does not lie in its");
  block_handle no_device = sample(memory_kind::cuda_malloc);
  no_device.device = -1;
  refuses(no_device.to_bytes(), "device -1");
  block_handle empty = sample(memory_kind::memory_pool);
  empty.bytes = 0;
  refuses(empty.to_bytes(), "an empty block");
  block_handle stray = sample(memory_kind::cuda_malloc);
  stray.mapping_bytes = {4096};
  refuses(stray.to_bytes(), "not page-mapped");
}

TEST_CASE("send_block / receive_block carry the description and its descriptors")
{
  auto [a, b] = socket_pair();
  exported_block out{sample(memory_kind::mapped_pages), {}};
  out.fds.push_back(memfd());
  out.fds.push_back(memfd());
  send_block(a.get(), out);
  const exported_block in = receive_block(b.get());
  CHECK(in.handle == out.handle);
  REQUIRE(in.fds.size() == 2);
  CHECK(in.fds[0].get() != out.fds[0].get());  // descriptors of the receiver's own
  CHECK(::fcntl(in.fds[1].get(), F_GETFD) >= 0);

  exported_block missing{sample(memory_kind::memory_pool), {}};  // needs one descriptor, has none
  send_block(a.get(), missing);
  CHECK_THROWS_WITH_AS(receive_block(b.get()), doctest::Contains("0 descriptors for a handle that needs 1"), std::invalid_argument);
}
