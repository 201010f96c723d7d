#pragma once
// What stream_ordered knows about CUDA graph captures: the streams it has seen capturing, never asked about
// again outside a call on them (a stream may be destroyed since, and asking about a destroyed stream
// crashes current drivers), and the rule that refuses host waits while one of those captures may go on.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <strata/core/config.hpp>
#include <strata/core/errors.hpp>

namespace strata::detail {

/// The refusal of a call a capture forbids, naming what was asked.
[[noreturn]] inline void refuse_capture(const char* what)
{
  throw usage_error(std::string("stream_ordered: ") + what +
                    " while a stream is being captured into a CUDA graph, and no private pool can serve it (this "
                    "layer's backend cannot query captures, or options::graph_pools is off); the pool is unchanged");
}

/// The captures a stream_ordered has seen and not yet seen end. An entry is made when a call on its stream
/// sees it capturing, and goes only on safe evidence that the capture ended: a later call on the same
/// handle sees it not capturing; the capture's graph is destroyed (forget_capture); or, in explicit mode,
/// the route its capture used ends (forget_route: PyTorch ends routes after cudaStreamEndCapture). A stream
/// destroyed after its capture, with its graph alive, keeps host waits refused until that graph is
/// destroyed: refusing is safe, asking is not. Cost: one capture query per call that asks; the list is as
/// long as the captures going on. A move hands the list over and leaves it empty.
class capture_guard {
public:
  capture_guard() = default;
  capture_guard(capture_guard&& other) noexcept : seen_(std::exchange(other.seen_, {})) {}
  capture_guard& operator=(capture_guard&& other) noexcept
  {
    if (this != &other) seen_ = std::exchange(other.seen_, {});
    return *this;
  }
  capture_guard(const capture_guard&) = delete;
  capture_guard& operator=(const capture_guard&) = delete;
  ~capture_guard() = default;

  /// Whether a stream a call was just made on (so a live one) is being captured. A capturing stream is
  /// remembered; one seen not capturing is forgotten.
  template <class Backend>
  bool captures(Backend& backend, cuda::stream_ref stream)
  {
    return saw(backend, stream, backend.capturing(stream));
  }

  /// Files what the capture query of a stream of the current call answered (`capturing`), as captures() does,
  /// for a caller that asked it together with the stream's id; returns it.
  template <class Backend>
  bool saw(Backend& backend, cuda::stream_ref stream, bool capturing)
  {
    if (capturing) [[unlikely]] note(backend, stream);
    else if (!seen_.empty()) [[unlikely]] forget_stream(stream);
    return capturing;
  }

  /// captures(), with a failed query taken for "capturing".
  template <class Backend>
  bool captures_or_unknown(Backend& backend, cuda::stream_ref stream) noexcept
  {
    try {
      return captures(backend, stream);
    } catch (...) {
      return true;
    }
  }

  /// Remembers a stream of the current call as capturing, with its capture's id (`known_id`, else asked now:
  /// the stream is live, and cudaStreamGetCaptureInfo is legal under capture) and the explicit pool routed to.
  template <class Backend>
  [[gnu::noinline]] void note(Backend& backend, cuda::stream_ref stream, const std::uint64_t* known_id = nullptr,
                              const std::uint64_t* route = nullptr) noexcept
  {
    auto it = std::find_if(seen_.begin(), seen_.end(), [stream](const seen& c) { return c.stream == stream; });
    if (it == seen_.end()) {
      try {
        seen_.push_back({stream});
      } catch (...) {  // not remembered: a host wait then fails in the driver instead of being refused
        return;
      }
      it = std::prev(seen_.end());
      if constexpr (requires { backend.capture_of(stream).id; }) {
        if (known_id == nullptr) {
          try {
            const auto info = backend.capture_of(stream);
            if (info.active) it->id = info.id, it->id_known = true;
          } catch (...) {  // no id: kept until a call on the stream sees it capturing no more
          }
        }
      }
    }
    if (known_id != nullptr) it->id = *known_id, it->id_known = true;  // a new capture on this stream
    if (route != nullptr) it->route = *route, it->routed = true;
  }

  /// Host waits are illegal while a stream captures in global mode (and would hang a graph's dependencies):
  /// refused while a capture this guard has seen may still go on, and while the legacy stream (never
  /// destroyed, so always safe to ask) answers "implicitly captured" (a blocking stream captures).
  template <class Backend>
  void refuse_host_wait(Backend& backend)
  {
    std::erase_if(seen_, [](const seen& c) { return c.stream.get() == cudaStreamLegacy || c.stream.get() == nullptr; });
    if (!seen_.empty()) refuse_capture("a host wait was needed");
    if (captures_or_unknown(backend, cuda::stream_ref{cudaStreamLegacy})) refuse_capture("a host wait was needed");
  }

  /// Runs f with the calling thread's capture mode relaxed while a capture this guard has seen may still go
  /// on. Note [Capture mode relaxed]: in the default (global) mode a "potentially unsafe" call from any
  /// thread (a source's cudaMalloc or cuMemCreate, an event query) invalidates every capture going on, even
  /// when it is made for an uncaptured stream. Relaxed, the call goes through and is not captured, which is
  /// what a pool wants of its growth (its memory belongs to the pool, not to a graph); PyTorch relaxes the
  /// mode the same way. The mode is put back after f, whatever f does.
  template <class Backend, class F>
  [[gnu::always_inline]] decltype(auto) relaxed(Backend& backend, F&& f)
  {
    if constexpr (requires { backend.exchange_capture_mode(2); }) {
      if (!seen_.empty()) [[unlikely]]
        return relaxed_now(backend, std::forward<F>(f));
    }
    return std::forward<F>(f)();
  }

  /// A destroyed graph's capture has ended: its streams are no longer known capturing.
  void forget_capture(std::uint64_t id) noexcept
  {
    std::erase_if(seen_, [id](const seen& c) { return c.id_known && c.id == id; });
  }
  /// The captures routed to explicit pool `pool` have ended.
  void forget_route(std::uint64_t pool) noexcept
  {
    std::erase_if(seen_, [pool](const seen& c) { return c.routed && c.route == pool; });
  }

  /// Whether a capture this guard has seen may still go on.
  bool any() const noexcept { return !seen_.empty(); }

private:
  [[gnu::noinline]] void forget_stream(cuda::stream_ref stream) noexcept
  {
    std::erase_if(seen_, [stream](const seen& c) { return c.stream == stream; });
  }

  /// Out of line, so that the common case (no capture seen) pays no guard object.
  template <class Backend, class F>
  [[gnu::noinline]] decltype(auto) relaxed_now(Backend& backend, F&& f)
  {
    const int previous = backend.exchange_capture_mode(2);  // cudaStreamCaptureModeRelaxed
    struct restore {
      Backend& b;
      int mode;
      ~restore()
      {
        try {
          (void)b.exchange_capture_mode(mode);
        } catch (...) {
        }
      }
    } restore_mode{backend, previous};
    return std::forward<F>(f)();
  }

  struct seen {
    cuda::stream_ref stream;
    std::uint64_t id = 0;     ///< its capture's id, when the backend could tell
    std::uint64_t route = 0;  ///< the explicit pool its capture was routed to
    bool id_known = false;
    bool routed = false;
  };
  std::vector<seen> seen_;
};

} // namespace strata::detail
