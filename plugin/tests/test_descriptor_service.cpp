// The exporter's descriptor service: an importer that pidfd_getfd refuses asks the exporting process over its
// Unix socket and receives copies of the descriptors of blocks it shared and has not freed; anything else is
// refused, naming what.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "descriptor_service.hpp"

using namespace strata::plugin;
using strata::ipc::unique_fd;

namespace {
/// What the torch backend lends: duplicates of descriptors in its set, under its lock.
struct lender {
  std::mutex m;
  std::set<int> lent;
  std::vector<unique_fd> operator()(std::span<const int> numbers)
  {
    std::lock_guard lock(m);
    std::vector<unique_fd> out;
    for (const int fd : numbers) {
      if (!lent.contains(fd)) throw std::invalid_argument("descriptor " + std::to_string(fd) + " names no block shared and live");
      out.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    }
    return out;
  }
};

std::pair<int, int> a_pipe()
{
  int p[2] = {-1, -1};
  REQUIRE(::pipe(p) == 0);
  return {p[0], p[1]};
}

std::string through(int write_end, int read_end, const std::string& text)
{
  REQUIRE(::write(write_end, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  std::string got(text.size(), '\0');
  REQUIRE(::read(read_end, got.data(), got.size()) == static_cast<ssize_t>(got.size()));
  return got;
}
} // namespace

TEST_CASE("descriptor_service: an importer receives copies of the descriptors the exporter lends, in order")
{
  lender l;
  auto [r1, w1] = a_pipe();
  auto [r2, w2] = a_pipe();
  l.lent = {w1, w2};
  descriptor_service service([&](std::span<const int> n) { return l(n); });
  const int wanted[] = {w2, w1};
  const std::vector<unique_fd> mine = descriptors_from_service(::getpid(), wanted);
  REQUIRE(mine.size() == 2);
  CHECK(mine[0].get() != w2);
  CHECK(through(mine[0].get(), r2, "second") == "second");
  CHECK(through(mine[1].get(), r1, "first") == "first");
  CHECK(service.answered() == 1);
  for (int fd : {r1, w1, r2, w2}) ::close(fd);
}

TEST_CASE("descriptor_service: descriptors not lent are refused, naming them; the service keeps answering")
{
  lender l;
  auto [r, w] = a_pipe();
  l.lent = {w};
  descriptor_service service([&](std::span<const int> n) { return l(n); });
  const int unknown[] = {w, r};
  CHECK_THROWS_WITH_AS(descriptors_from_service(::getpid(), unknown), doctest::Contains("names no block shared and live"),
                       std::runtime_error);
  CHECK(service.refused() == 1);
  {
    std::lock_guard lock(l.m);
    l.lent.clear();  // the block was freed
  }
  const int was_lent[] = {w};
  const std::string named = "descriptor " + std::to_string(w);
  CHECK_THROWS_WITH_AS(descriptors_from_service(::getpid(), was_lent), doctest::Contains(named.c_str()), std::runtime_error);
  {
    std::lock_guard lock(l.m);
    l.lent = {w};
  }
  CHECK(descriptors_from_service(::getpid(), was_lent).size() == 1);
  CHECK(service.answered() == 1);
  CHECK(service.refused() == 2);
  ::close(r);
  ::close(w);
}

TEST_CASE("descriptor_service: a process without a service is named; its pid's socket goes with the service")
{
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  const int any[] = {1};
  CHECK_THROWS_WITH_AS(descriptors_from_service(child, any), doctest::Contains("runs no strata descriptor service"), std::system_error);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  {
    lender l;
    descriptor_service service([&](std::span<const int> n) { return l(n); });
    CHECK_THROWS_AS(descriptor_service([&](std::span<const int> n) { return l(n); }), std::system_error);  // one per process
  }
  // Gone with its service: the name is free again, and nothing answers on it.
  CHECK_THROWS_WITH_AS(descriptors_from_service(::getpid(), any), doctest::Contains("runs no strata descriptor service"), std::system_error);
  lender l;
  descriptor_service again([&](std::span<const int> n) { return l(n); });
  CHECK(again.answered() == 0);
}

TEST_CASE("descriptor_service: another process takes descriptors from its parent, through pidfd_getfd or the service")
{
  lender l;
  auto [r, w] = a_pipe();
  l.lent = {w};
  descriptor_service service([&](std::span<const int> n) { return l(n); });
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // a child opening its parent's descriptor: the case Yama's ptrace_scope 1 refuses to pidfd_getfd
    int status = 1;
    try {
      const int wanted[] = {w};
      const std::vector<unique_fd> viaservice = descriptors_from_service(parent, wanted);
      const std::vector<unique_fd> either = take_descriptors(parent, wanted);
      const char a[] = "s", b[] = "t";
      if (viaservice.size() == 1 && either.size() == 1 && ::write(viaservice[0].get(), a, 1) == 1 && ::write(either[0].get(), b, 1) == 1)
        status = 0;
    } catch (...) {
      status = 2;
    }
    ::_exit(status);
  }
  int status = -1;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  char got[2] = {};
  CHECK(::read(r, got, 2) == 2);
  CHECK(std::string(got, 2) == "st");
  CHECK(service.answered() >= 1);
  ::close(r);
  ::close(w);
}

TEST_CASE("descriptor_service: concurrent importers each get their own copies")
{
  lender l;
  std::vector<std::pair<int, int>> pipes;
  for (int i = 0; i < 8; ++i) {
    pipes.push_back(a_pipe());
    l.lent.insert(pipes.back().second);
  }
  descriptor_service service([&](std::span<const int> n) { return l(n); });
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int k = 0; k < 25; ++k) {
        const int i = static_cast<int>(rng() % pipes.size());
        const int wanted[] = {pipes[static_cast<std::size_t>(i)].second};
        try {
          const auto mine = descriptors_from_service(::getpid(), wanted);
          if (mine.size() == 1 && mine[0].get() != wanted[0]) ++ok;
        } catch (...) {
        }
      }
    });
  for (auto& th : threads) th.join();
  CHECK(ok.load() == 100);
  CHECK(service.answered() == 100);
  for (auto [r, w] : pipes) {
    ::close(r);
    ::close(w);
  }
}
