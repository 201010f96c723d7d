#pragma once
// Sending bytes and POSIX file descriptors to another process over a Unix-domain socket (SCM_RIGHTS): how
// the shareable handles of CUDA memory pools and of cuMemCreate allocations, which are file descriptors,
// reach the importing process. Host-only; no CUDA.
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace strata::ipc {

/// An owned file descriptor, closed on destruction. Move-only.
class unique_fd {
public:
  unique_fd() noexcept = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& other) noexcept
  {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Gives up ownership: the caller closes it.
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept
  {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

private:
  int fd_ = -1;
};

namespace detail {
[[noreturn]] inline void throw_errno(const char* what)
{
  throw std::system_error(errno, std::generic_category(), std::string("strata::ipc: ") + what);
}

/// What precedes every message: the descriptors travel with it, the payload follows as its own send.
struct message_header {
  std::uint32_t magic = 0x53545246;  // "STRF"
  std::uint32_t fds = 0;
  std::uint64_t bytes = 0;
};

inline void send_all(int socket, const std::byte* data, std::size_t bytes)
{
  while (bytes > 0) {
    const ssize_t sent = ::send(socket, data, bytes, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      throw_errno("send");
    }
    data += sent;
    bytes -= static_cast<std::size_t>(sent);
  }
}

inline void receive_all(int socket, std::byte* data, std::size_t bytes)
{
  while (bytes > 0) {
    const ssize_t got = ::recv(socket, data, bytes, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_errno("recv");
    }
    if (got == 0) throw std::runtime_error("strata::ipc: the peer closed the socket in the middle of a message");
    data += got;
    bytes -= static_cast<std::size_t>(got);
  }
}
} // namespace detail

/// The most descriptors one message carries (the kernel's SCM_MAX_FD is 253).
inline constexpr std::size_t max_fds_per_message = 250;

/// A connected pair of Unix-domain stream sockets (socketpair): one end for each process after fork().
inline std::pair<unique_fd, unique_fd> socket_pair()
{
  int fds[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) detail::throw_errno("socketpair");
  return {unique_fd(fds[0]), unique_fd(fds[1])};
}

/// Sends `payload` and duplicates of `fds` (the receiver gets descriptors of its own for the same open files;
/// the sender's stay open). Works on stream and seqpacket sockets. Blocking; std::system_error on failure,
/// std::invalid_argument for more than max_fds_per_message descriptors.
inline void send_message(int socket, std::span<const std::byte> payload, std::span<const int> fds = {})
{
  if (fds.size() > max_fds_per_message)
    throw std::invalid_argument("strata::ipc::send_message: " + std::to_string(fds.size()) + " descriptors (at most " +
                                std::to_string(max_fds_per_message) + ")");
  detail::message_header header{.fds = static_cast<std::uint32_t>(fds.size()), .bytes = payload.size()};
  iovec io{&header, sizeof header};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  std::vector<std::byte> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t sent = -1;
  do {
    sent = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) detail::throw_errno("sendmsg");
  // The descriptors went with the first byte; the rest of the header and the payload follow as plain data.
  detail::send_all(socket, reinterpret_cast<const std::byte*>(&header) + sent, sizeof header - static_cast<std::size_t>(sent));
  detail::send_all(socket, payload.data(), payload.size());
}

/// One message as received: its payload and the descriptors that came with it (owned here).
struct message {
  std::vector<std::byte> payload;
  std::vector<unique_fd> fds;
};

/// Receives one message sent by send_message. Blocking; std::system_error on a socket error,
/// std::runtime_error when the peer closes the socket or sends something that is not such a message.
inline message receive_message(int socket)
{
  detail::message_header header{};
  iovec io{&header, sizeof header};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  std::vector<std::byte> control(CMSG_SPACE(sizeof(int) * max_fds_per_message));
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t got = -1;
  do {
    got = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
  if (got < 0) detail::throw_errno("recvmsg");
  if (got == 0) throw std::runtime_error("strata::ipc: the peer closed the socket before sending a message");
  message m;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < n; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      m.fds.emplace_back(fd);
    }
  }
  const bool truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
  detail::receive_all(socket, reinterpret_cast<std::byte*>(&header) + got, sizeof header - static_cast<std::size_t>(got));
  if (header.magic != detail::message_header{}.magic)
    throw std::runtime_error("strata::ipc: received bytes that are not a strata message");
  if (truncated || m.fds.size() != header.fds)
    throw std::runtime_error("strata::ipc: expected " + std::to_string(header.fds) + " descriptors, received " +
                             std::to_string(m.fds.size()));
  m.payload.resize(header.bytes);
  detail::receive_all(socket, m.payload.data(), m.payload.size());
  return m;
}

} // namespace strata::ipc
