// The shareable CUDA handles strata's PyTorch backend writes and reads for torch.multiprocessing (PyTorch
// 2.11's 'c' and 'e' layouts, strata's 's'), descriptors taken from another process with pidfd_getfd, and the
// books both sides keep: the exporter's descriptors live until its block is freed, the importer maps a handle
// once.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/mapped_pool.hpp>

#include "ipc_handles.hpp"

using namespace strata::plugin;

namespace {
// PyTorch's ShareHeader, laid out by the compiler as PyTorch's build lays it out.
struct torch_share_header {
  pid_t pid;
  std::size_t segment_size;
  std::size_t num_handles;
};

bool fd_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

std::size_t open_fds()
{
  std::size_t n = 0;
  for (int fd = 0; fd < 4096; ++fd) n += fd_open(fd) ? 1 : 0;
  return n;
}

constexpr std::size_t MiB = std::size_t{1} << 20;
using pages_pool = strata::mapped_pool<strata::simulated_pages>;

std::pair<int, int> a_pipe()
{
  int p[2] = {-1, -1};
  REQUIRE(::pipe(p) == 0);
  return {p[0], p[1]};
}
} // namespace

TEST_CASE("ipc_handles: uniform mappings are written in PyTorch's expandable-segment layout, byte for byte")
{
  const shared_pages pages{.pid = 4242, .mapping_bytes = {std::uint64_t{20} << 20, std::uint64_t{20} << 20, std::uint64_t{20} << 20},
                           .fds = {7, 9, 11}};
  const std::string h = encode_pages(pages);
  torch_share_header header{};  // zeroed padding, as PyTorch writes it
  header.pid = 4242;
  header.segment_size = std::size_t{20} << 20;
  header.num_handles = 3;
  std::string expected;
  expected.push_back(2);
  expected.push_back('e');
  expected.append(reinterpret_cast<const char*>(&header), sizeof header);
  for (const int fd : {7, 9, 11}) expected.append(reinterpret_cast<const char*>(&fd), sizeof fd);
  CHECK(sizeof header == 24);
  CHECK(h == expected);
  const decoded_handle back = decode_handle(h);
  CHECK(back.type == shareable_type::pages);
  CHECK(back.pages == pages);
  CHECK(back.pages.span() == (std::uint64_t{60} << 20));
}

TEST_CASE("ipc_handles: mappings of several sizes are written in strata's layout and read back")
{
  const shared_pages pages{.pid = 77, .mapping_bytes = {std::uint64_t{128} << 20, std::uint64_t{8} << 20, std::uint64_t{2} << 20},
                           .fds = {30, 31, 40}};
  const std::string h = encode_pages(pages);
  CHECK(h[0] == 2);
  CHECK(h[1] == 's');
  CHECK(h.size() == 2 + 16 + 3 * 12);
  const decoded_handle back = decode_handle(h);
  CHECK(back.type == shareable_type::strata_pages);
  CHECK(back.pages == pages);
  CHECK(back.pages.span() == (std::uint64_t{138} << 20));
  CHECK(encode_pages(back.pages) == h);  // the same block shared again gives the same bytes
}

TEST_CASE("ipc_handles: cudaMalloc handles, versioned and bare, read back as 'c'")
{
  std::array<std::byte, 64> raw{};
  for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<std::byte>(i * 7 + 1);
  const std::string h = encode_cuda_malloc(raw);
  CHECK(h.size() == 66);
  CHECK(h[0] == 2);
  CHECK(h[1] == 'c');
  CHECK(decode_handle(h).cuda_handle == raw);
  CHECK(decode_handle(h).type == shareable_type::cuda_malloc);
  const std::string bare(reinterpret_cast<const char*>(raw.data()), raw.size());  // PyTorch before versioned handles
  CHECK(decode_handle(bare).cuda_handle == raw);
}

TEST_CASE("ipc_handles: malformed handles are refused, naming what is wrong")
{
  const std::string good = encode_pages({.pid = 5, .mapping_bytes = {std::uint64_t{2} << 20}, .fds = {3}});
  CHECK_THROWS_WITH_AS(decode_handle(std::string(1, '\2')), doctest::Contains("too short"), std::invalid_argument);
  std::string newer = good;
  newer[0] = 3;
  CHECK_THROWS_WITH_AS(decode_handle(newer), doctest::Contains("version 3"), std::invalid_argument);
  std::string unknown = good;
  unknown[1] = 'x';
  CHECK_THROWS_WITH_AS(decode_handle(unknown), doctest::Contains("type 'x'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(decode_handle(good.substr(0, good.size() - 1)), doctest::Contains("announces 1 descriptors"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(decode_handle(good + "abcd"), doctest::Contains("announces 1 descriptors"), std::invalid_argument);
  std::string zero_segment = good;
  std::memset(zero_segment.data() + 2 + 8, 0, 8);
  CHECK_THROWS_WITH_AS(decode_handle(zero_segment), doctest::Contains("0 bytes"), std::invalid_argument);
  std::string huge_count = good;
  const std::uint64_t n = ~std::uint64_t{0} / 2;
  std::memcpy(huge_count.data() + 2 + 16, &n, sizeof n);
  CHECK_THROWS_AS(decode_handle(huge_count), std::invalid_argument);
  const std::string several = encode_pages({.pid = 5, .mapping_bytes = {std::uint64_t{2} << 20, std::uint64_t{4} << 20}, .fds = {3, 4}});
  CHECK_THROWS_WITH_AS(decode_handle(several.substr(0, 20)), doctest::Contains("announces"), std::invalid_argument);
  std::string bad_pid = good;
  std::memset(bad_pid.data() + 2, 0, 4);
  CHECK_THROWS_WITH_AS(decode_handle(bad_pid), doctest::Contains("process id 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(decode_handle(std::string("\2c") + std::string(10, 'a')), doctest::Contains("not a 64-byte"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(encode_pages({.pid = 5, .mapping_bytes = {}, .fds = {}}), doctest::Contains("at least one mapping"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(encode_pages({.pid = 5, .mapping_bytes = {4096}, .fds = {1, 2}}), doctest::Contains("2 descriptors for 1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(encode_pages({.pid = 5, .mapping_bytes = {0}, .fds = {1}}), doctest::Contains("0 bytes"), std::invalid_argument);
}

TEST_CASE("ipc_handles: random page lists survive writing and reading, in whichever layout they need")
{
  std::mt19937_64 rng(40);
  int round_trips = 0, uniform = 0;
  for (int i = 0; i < 500; ++i) {
    shared_pages p;
    p.pid = static_cast<std::int32_t>(1 + rng() % 4000000);
    const std::size_t n = 1 + rng() % 40;
    const bool same = rng() % 2 == 0;
    const std::uint64_t first = (1 + rng() % 64) << 21;
    for (std::size_t k = 0; k < n; ++k) {
      p.mapping_bytes.push_back(same ? first : (1 + rng() % 64) << 21);
      p.fds.push_back(static_cast<int>(rng() % 100000));
    }
    const std::string h = encode_pages(p);
    const decoded_handle back = decode_handle(h);
    REQUIRE(back.pages == p);
    REQUIRE((back.type == shareable_type::pages) == p.uniform());
    uniform += p.uniform() ? 1 : 0;
    ++round_trips;
  }
  CHECK(round_trips == 500);
  CHECK(uniform >= 250);  // every "same" draw, and the single-mapping ones of the others
}

TEST_CASE("ipc_handles: descriptors are taken from another process and name the same open file")
{
  const auto [r, w] = a_pipe();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // the exporter: holds the pipe's write end until its parent has written through it
    ::close(r);
    ::pause();
    ::_exit(0);
  }
  ::close(w);  // only the child's copy is left
  std::vector<strata::ipc::unique_fd> mine;
  try {
    const int wanted[] = {w};
    mine = descriptors_of(child, wanted);
  } catch (const std::system_error& e) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    FAIL("pidfd_getfd from a child: " << e.what());
  }
  REQUIRE(mine.size() == 1);
  const char msg[] = "via the child's descriptor";
  CHECK(::write(mine[0].get(), msg, sizeof msg) == static_cast<ssize_t>(sizeof msg));
  char got[sizeof msg] = {};
  CHECK(::read(r, got, sizeof got) == static_cast<ssize_t>(sizeof msg));
  CHECK(std::string(got) == msg);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(r);

  // A process that is gone, and a descriptor the exporter does not hold: clear errors, nothing left open.
  CHECK_THROWS_WITH_AS(descriptors_of(child, std::vector<int>{0}), doctest::Contains("exporting process is gone"), std::system_error);
  const int unused[] = {1000000};
  CHECK_THROWS_WITH_AS(descriptors_of(::getpid(), unused), doctest::Contains("no longer holds the descriptor"), std::system_error);
}

TEST_CASE("ipc_handles: the exporter's descriptors stay open until its block is freed")
{
  export_ledger ledger;
  auto [r1, w1] = a_pipe();
  auto [r2, w2] = a_pipe();
  export_ledger::entry e{.offset = 4096, .handle = "h1", .fds = {}};
  e.fds.emplace_back(r1);
  e.fds.emplace_back(w1);
  const auto& kept = ledger.insert(0x1000, std::move(e));
  CHECK(kept.handle == "h1");
  CHECK(ledger.find(0x1000)->offset == 4096);
  CHECK(ledger.find(0x2000) == nullptr);
  CHECK(fd_open(r1));
  CHECK(fd_open(w1));

  export_ledger::entry again{.offset = 0, .handle = "h2", .fds = {}};
  again.fds.emplace_back(r2);
  CHECK_THROWS_AS(ledger.insert(0x1000, std::move(again)), std::invalid_argument);
  CHECK(fd_open(r2));  // refused: the caller still owns its descriptors
  CHECK(ledger.size() == 1);
  CHECK(ledger.find(0x1000)->handle == "h1");

  CHECK(ledger.erase(0x1000));
  CHECK_FALSE(fd_open(r1));
  CHECK_FALSE(fd_open(w1));
  CHECK_FALSE(ledger.erase(0x1000));
  CHECK(ledger.empty());
  again.fds.clear();
  CHECK_FALSE(fd_open(r2));
  ::close(w2);
}

TEST_CASE("ipc_handles: the importer maps a handle once while it is in use, and forgets mappings gone")
{
  opened_handles opened;
  auto a = std::make_shared<int>(1);
  opened.insert("a", a);
  CHECK(opened.find("a") == a);
  CHECK(opened.find("b") == nullptr);
  {
    auto gone = std::make_shared<int>(2);
    opened.insert("gone", gone);
  }
  CHECK(opened.find("gone") == nullptr);  // expired: opened anew
  std::vector<std::shared_ptr<int>> live;
  for (int i = 0; i < 200; ++i) {
    auto m = std::make_shared<int>(i);
    if (i % 10 == 0) live.push_back(m);
    opened.insert("h" + std::to_string(i), m);
  }
  // Expired entries are swept as the map grows: it holds the live ones and fewer than twice as many more.
  CHECK(opened.size() < 2 * (live.size() + 1) + 16);
  for (int i = 0; i < 200; i += 10) CHECK(opened.find("h" + std::to_string(i)) != nullptr);
  CHECK(opened.find("a") == a);
}

TEST_CASE("ipc_handles: a page-mapped block is shared as its allocations, in whichever layout their sizes allow")
{
  pages_pool pool{strata::simulated_pages{}, {.reclaim_slack_fraction = 0.0, .max_mapping = 8 * MiB}};
  int exported = 0;
  const auto export_fd = [&](const auto&) {
    ++exported;
    return ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  };
  void* small = pool.allocate(1000);
  void* big = pool.allocate(21 * MiB);  // three mappings of at most 8 MiB: not all of one size
  const auto at = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };

  const shared_block s = share_of(pool, small, export_fd);
  REQUIRE(s.fds.size() == 1);
  CHECK(s.offset == at(small) - pool.backing_of(small).front().address);
  CHECK(s.offset + 1000 <= s.mapping_bytes[0]);
  shared_pages sp{.pid = 9, .mapping_bytes = {s.mapping_bytes.begin(), s.mapping_bytes.end()}, .fds = {s.fds[0].get()}};
  CHECK(encode_pages(sp)[1] == 'e');  // PyTorch's own allocator opens it too

  const shared_block b = share_of(pool, big, export_fd);
  REQUIRE(b.fds.size() == 3);
  std::size_t span = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(fd_open(b.fds[i].get()));
    CHECK(b.mapping_bytes[i] == pool.backing_of(big)[i].bytes);
    span += b.mapping_bytes[i];
  }
  CHECK(b.offset + 21 * MiB <= span);
  shared_pages bp{.pid = 9, .mapping_bytes = {b.mapping_bytes.begin(), b.mapping_bytes.end()}, .fds = {3, 4, 5}};
  CHECK_FALSE(bp.uniform());
  CHECK(encode_pages(bp)[1] == 's');
  CHECK(exported == 4);

  CHECK_THROWS_WITH_AS(share_of(pool, static_cast<char*>(big) + 4096, export_fd), doctest::Contains("does not start a live block"),
                       std::invalid_argument);
  CHECK(exported == 4);
  pool.deallocate(big, 21 * MiB);
  pool.deallocate(small, 1000);
}

TEST_CASE("ipc_handles: an export that fails part way leaves no descriptor open")
{
  pages_pool pool{strata::simulated_pages{}, {.reclaim_slack_fraction = 0.0, .max_mapping = 4 * MiB}};
  void* p = pool.allocate(15 * MiB);  // four mappings of 4 MiB
  REQUIRE(pool.backing_of(p).size() == 4);
  const std::size_t before = open_fds();
  int made = 0;
  const auto third_fails = [&](const auto&) {
    if (++made == 3) throw std::runtime_error("cuMemExportToShareableHandle refused");
    return ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  };
  CHECK_THROWS_WITH_AS(share_of(pool, p, third_fails), "cuMemExportToShareableHandle refused", std::runtime_error);
  CHECK(made == 3);
  CHECK(open_fds() == before);
  const auto fine = [&](const auto&) { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); };
  {
    const shared_block b = share_of(pool, p, fine);
    CHECK(b.fds.size() == 4);
    CHECK(shared_pages{.pid = 1, .mapping_bytes = {b.mapping_bytes.begin(), b.mapping_bytes.end()}, .fds = {1, 2, 3, 4}}.uniform());
    CHECK(open_fds() == before + 4);
  }
  CHECK(open_fds() == before);
  pool.deallocate(p, 15 * MiB);
}
