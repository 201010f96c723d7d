// ipc/fd_passing.hpp between two real processes: a memfd crosses a socket to a forked child, which reads what
// the parent wrote, writes an answer and reports back; the parent checks both.
#include <doctest/doctest.h>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include <strata/ipc/fd_passing.hpp>

using namespace strata::ipc;

namespace {

std::span<const std::byte> as_bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }
std::string as_string(const std::vector<std::byte>& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

unique_fd memfd_with(const std::string& content)
{
  unique_fd fd(::memfd_create("strata-test", MFD_CLOEXEC));
  REQUIRE(fd);
  REQUIRE(::ftruncate(fd.get(), 4096) == 0);
  REQUIRE(::pwrite(fd.get(), content.data(), content.size(), 0) == static_cast<ssize_t>(content.size()));
  return fd;
}

std::string read_fd(int fd, std::size_t bytes)
{
  std::string s(bytes, '\0');
  if (::pread(fd, s.data(), bytes, 0) != static_cast<ssize_t>(bytes)) return {};
  return s;
}

/// Runs `child(socket)` in a forked process; returns its exit status (0: every check in it passed).
template <class F>
int in_child(unique_fd socket, unique_fd& parent_end, F child)
{
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    parent_end.reset();
    int status = 99;
    try {
      status = child(socket.get());
    } catch (...) {
      status = 98;
    }
    ::_exit(status);
  }
  socket.reset();
  return pid;
}

int wait_for(int pid)
{
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

} // namespace

TEST_CASE("fd_passing: a memfd crosses to another process, which reads it, writes back and answers")
{
  auto [parent, child_end] = socket_pair();
  const int pid = in_child(std::move(child_end), parent, [](int socket) {
    message m = receive_message(socket);
    if (as_string(m.payload) != "look at the memfd" || m.fds.size() != 1) return 1;
    if (read_fd(m.fds[0].get(), 11) != "hello child") return 2;
    const std::string answer = "hello parent";
    if (::pwrite(m.fds[0].get(), answer.data(), answer.size(), 100) != static_cast<ssize_t>(answer.size())) return 3;
    send_message(socket, as_bytes(std::string("done")));
    return 0;
  });
  unique_fd memfd = memfd_with("hello child");
  const int fds[] = {memfd.get()};
  send_message(parent.get(), as_bytes(std::string("look at the memfd")), fds);
  const message reply = receive_message(parent.get());
  CHECK(as_string(reply.payload) == "done");
  CHECK(reply.fds.empty());
  CHECK(wait_for(pid) == 0);
  std::string answer(12, '\0');
  REQUIRE(::pread(memfd.get(), answer.data(), answer.size(), 100) == 12);
  CHECK(answer == "hello parent");
}

TEST_CASE("fd_passing: several descriptors and a large payload in one message, messages kept apart")
{
  auto [parent, child_end] = socket_pair();
  const int pid = in_child(std::move(child_end), parent, [](int socket) {
    int failures = 0;
    for (int round = 0; round < 3; ++round) {
      message m = receive_message(socket);
      if (m.fds.size() != 5) ++failures;
      for (std::size_t i = 0; i < m.fds.size(); ++i)
        if (read_fd(m.fds[i].get(), 6) != "file " + std::to_string(i)) ++failures;
      if (m.payload.size() != (std::size_t{1} << 20) + round) ++failures;
      for (std::size_t i = 0; i < m.payload.size(); ++i)
        if (m.payload[i] != static_cast<std::byte>((i + round) & 0xff)) {
          ++failures;
          break;
        }
    }
    const message empty = receive_message(socket);
    if (!empty.payload.empty() || !empty.fds.empty()) ++failures;
    return failures;
  });
  std::vector<unique_fd> files;
  std::vector<int> raw;
  for (int i = 0; i < 5; ++i) {
    files.push_back(memfd_with("file " + std::to_string(i)));
    raw.push_back(files.back().get());
  }
  for (int round = 0; round < 3; ++round) {
    std::vector<std::byte> payload((std::size_t{1} << 20) + round);  // larger than the socket buffer
    for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>((i + round) & 0xff);
    send_message(parent.get(), payload, raw);
  }
  send_message(parent.get(), {});
  CHECK(wait_for(pid) == 0);
}

TEST_CASE("fd_passing: errors say what went wrong")
{
  auto [a, b] = socket_pair();
  std::vector<int> too_many(max_fds_per_message + 1, a.get());
  CHECK_THROWS_AS(send_message(a.get(), {}, too_many), std::invalid_argument);
  b.reset();  // the peer is gone
  CHECK_THROWS_WITH(receive_message(a.get()), doctest::Contains("closed the socket"));
  CHECK_THROWS_AS(send_message(a.get(), as_bytes(std::string("x"))), std::system_error);  // EPIPE, no SIGPIPE

  auto [c, d] = socket_pair();
  const char junk[16] = "not a message!!";
  REQUIRE(::send(c.get(), junk, sizeof junk, 0) == sizeof junk);
  CHECK_THROWS_WITH(receive_message(d.get()), doctest::Contains("not a strata message"));

  unique_fd moved(::dup(0));
  const int raw = moved.get();
  unique_fd other(std::move(moved));
  CHECK(other.get() == raw);
  CHECK_FALSE(moved);  // NOLINT(bugprone-use-after-move)
  const int released = other.release();
  CHECK(released == raw);
  ::close(released);
}
