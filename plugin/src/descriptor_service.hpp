#pragma once
// Handing an exporter's descriptors to an importer that may not take them with pidfd_getfd (ptrace permission:
// Yama's ptrace_scope 1 grants it to ancestors only, so a child opening its parent's tensor is refused). A
// process that shares page-mapped blocks answers on a Unix socket of its own, named after its pid in the
// abstract namespace: an importer of the same user sends the descriptor numbers a handle names and receives
// its own copies (SCM_RIGHTS, ipc/fd_passing.hpp) of those the exporter still lends, i.e. those of blocks it
// shared and has not freed. PyTorch's own allocator knows nothing of it: it opens strata's handles where
// pidfd_getfd is allowed (Note [PyTorch's shareable handles], ipc_handles.hpp).
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <strata/ipc/fd_passing.hpp>

#include "ipc_handles.hpp"

namespace strata::plugin {

namespace detail {
inline sockaddr_un service_address(std::int32_t pid, socklen_t& length)
{
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string name = "strata-descriptors-" + std::to_string(pid);
  std::memcpy(a.sun_path + 1, name.data(), name.size());  // sun_path[0] == 0: the abstract namespace
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

inline std::vector<std::byte> fd_numbers(std::span<const int> fds)
{
  std::vector<std::byte> out(fds.size() * sizeof(std::int32_t));
  for (std::size_t i = 0; i < fds.size(); ++i) {
    const auto v = static_cast<std::int32_t>(fds[i]);
    std::memcpy(out.data() + i * sizeof v, &v, sizeof v);
  }
  return out;
}
} // namespace detail

/// The exporter's side: a thread answering on the process's socket until the service is destroyed.
/// `lend(numbers)` returns duplicates of the descriptors named (they stay the caller's to close), or throws
/// std::invalid_argument naming one it does not lend; it runs on the service's thread. Requests from another
/// user are refused. Cost: one thread, blocked in accept; per request a few system calls and `lend`.
class descriptor_service {
public:
  using lend_fn = std::function<std::vector<ipc::unique_fd>(std::span<const int>)>;

  /// std::system_error when the socket cannot be made (its name is taken: one service per process).
  explicit descriptor_service(lend_fn lend) : lend_(std::move(lend))
  {
    listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!listener_) ipc::detail::throw_errno("socket");
    socklen_t length = 0;
    const sockaddr_un a = detail::service_address(static_cast<std::int32_t>(::getpid()), length);
    if (::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&a), length) != 0) ipc::detail::throw_errno("bind");
    if (::listen(listener_.get(), 16) != 0) ipc::detail::throw_errno("listen");
    int stop[2] = {-1, -1};
    if (::pipe2(stop, O_CLOEXEC) != 0) ipc::detail::throw_errno("pipe2");
    stop_read_.reset(stop[0]);
    stop_write_.reset(stop[1]);
    thread_ = std::thread([this] { serve(); });
  }
  descriptor_service(const descriptor_service&) = delete;
  descriptor_service& operator=(const descriptor_service&) = delete;
  ~descriptor_service()
  {
    const char byte = 0;
    (void)!::write(stop_write_.get(), &byte, 1);
    if (thread_.joinable()) thread_.join();
  }

  /// Requests granted so far, and those refused (another user, a descriptor not lent, a malformed request).
  std::uint64_t answered() const noexcept { return answered_.load(); }
  std::uint64_t refused() const noexcept { return refused_.load(); }

private:
  void serve()
  {
    for (;;) {
      pollfd p[2] = {{listener_.get(), POLLIN, 0}, {stop_read_.get(), POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (p[1].revents != 0) return;
      if ((p[0].revents & POLLIN) == 0) continue;
      ipc::unique_fd peer(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!peer) continue;
      answer(peer.get());
    }
  }

  void answer(int peer) noexcept
  {
    try {
      timeval limit{.tv_sec = 10, .tv_usec = 0};  // a client that stalls does not hold the service
      (void)::setsockopt(peer, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
      (void)::setsockopt(peer, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
      ucred who{};
      socklen_t size = sizeof who;
      std::string refusal;
      std::vector<ipc::unique_fd> lent;
      if (::getsockopt(peer, SOL_SOCKET, SO_PEERCRED, &who, &size) != 0 || who.uid != ::getuid()) {
        refusal = "the requesting process belongs to another user";
      } else {
        const ipc::message request = ipc::receive_message(peer);
        if (request.payload.empty() || request.payload.size() % sizeof(std::int32_t) != 0 ||
            request.payload.size() / sizeof(std::int32_t) > ipc::max_fds_per_message) {
          refusal = "a malformed request";
        } else {
          std::vector<int> numbers(request.payload.size() / sizeof(std::int32_t));
          for (std::size_t i = 0; i < numbers.size(); ++i) {
            std::int32_t v = 0;
            std::memcpy(&v, request.payload.data() + i * sizeof v, sizeof v);
            numbers[i] = v;
          }
          try {
            lent = lend_(numbers);
          } catch (const std::exception& e) {
            refusal = e.what();
          }
        }
      }
      std::vector<int> raw;
      for (const ipc::unique_fd& fd : lent) raw.push_back(fd.get());
      (refusal.empty() ? answered_ : refused_) += 1;  // counted before the reply, which the client may be waiting on
      ipc::send_message(peer, std::as_bytes(std::span(refusal.data(), refusal.size())), raw);
    } catch (...) {
      // The client went away or sent something that is not a request: nothing to answer.
    }
  }

  lend_fn lend_;
  ipc::unique_fd listener_;
  ipc::unique_fd stop_read_;
  ipc::unique_fd stop_write_;
  std::atomic<std::uint64_t> answered_{0};
  std::atomic<std::uint64_t> refused_{0};
  std::thread thread_;
};

/// The importer's side: this process's own copies of descriptors process `pid` lends through its service,
/// in the order asked. std::system_error when no service answers there (not a strata process, or another
/// network namespace), std::runtime_error carrying the exporter's refusal. Waits at most 10 s for the answer.
inline std::vector<ipc::unique_fd> descriptors_from_service(std::int32_t pid, std::span<const int> fds)
{
  ipc::unique_fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) ipc::detail::throw_errno("socket");
  timeval limit{.tv_sec = 10, .tv_usec = 0};
  (void)::setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  socklen_t length = 0;
  const sockaddr_un a = detail::service_address(pid, length);
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&a), length) != 0)
    throw std::system_error(errno, std::generic_category(),
                            "strata: process " + std::to_string(pid) + " runs no strata descriptor service");
  ipc::send_message(s.get(), detail::fd_numbers(fds));
  ipc::message reply = ipc::receive_message(s.get());
  if (!reply.payload.empty())
    throw std::runtime_error("strata: process " + std::to_string(pid) + " refused its descriptors: " +
                             std::string(reinterpret_cast<const char*>(reply.payload.data()), reply.payload.size()));
  if (reply.fds.size() != fds.size())
    throw std::runtime_error("strata: process " + std::to_string(pid) + " sent " + std::to_string(reply.fds.size()) +
                             " descriptors for " + std::to_string(fds.size()));
  return std::move(reply.fds);
}

/// What an importer of page-mapped memory does: pidfd_getfd (descriptors_of), and where ptrace permission is
/// lacking, the exporter's service. The error names both causes when neither works.
inline std::vector<ipc::unique_fd> take_descriptors(std::int32_t pid, std::span<const int> fds)
{
  try {
    return descriptors_of(pid, fds);
  } catch (const std::system_error& e) {
    if (e.code().value() != EPERM && e.code().value() != EACCES) throw;
    try {
      return descriptors_from_service(pid, fds);
    } catch (const std::exception& service) {
      throw std::system_error(e.code(), std::string(e.what()) + "; and " + service.what());
    }
  }
}

} // namespace strata::plugin
