#pragma once
// Where C++ meets C: every entry point of strata_alloc.h runs its body through one function here, which turns an
// exception into the entry point's failure value (or the one exception its contract allows) and the message of
// strata_last_error(). See Note [The C boundary].
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace strata::plugin {

// Note [The C boundary]
// ~~~~~~~~~~~~~~~~~~~~~
// No exception may leave a C entry point (a C caller, or CuPy's ctypes, cannot catch it; through extern "C" it
// would terminate the process), except where the header promises one: strata_malloc_or_throw(_observed), whose
// caller is PyTorch's C++, and the graph-pool hooks, which PyTorch calls as C++ functions. So each entry point's
// body may throw, and c_entry runs it under one policy:
//   - failing_with{value}: the failure value (null, -1, 1, 0 bytes) is returned;
//   - quietly: a void entry point just returns;
//   - raising: std::runtime_error carrying the message (PyTorch raises it as a RuntimeError);
//   - raising_oom: as raising, except that out of memory (std::bad_alloc) goes to the handler installed by
//     strata_set_oom_handler (which throws the framework's own type), else is rethrown as it came.
// In every case the message is set first: "strata <where>: <what>", or <what> alone where `where` is empty.
// A body that refuses without an exception of its own throws refusal, whose text becomes the message the same
// way; a body that sets a message and still succeeds (a note, such as a capped fraction) calls set_error.

/// This thread's last failure (strata_last_error()).
inline thread_local std::string last_error;

/// Sets this thread's message; never throws (a message that cannot be built leaves the old one).
inline void set_error(const char* where, const char* what) noexcept
{
  try {
    last_error = *where != '\0' ? std::string("strata ") + where + ": " + what : std::string(what);
  } catch (...) {
  }
}
inline void set_error(const char* where, const std::string& what) noexcept { set_error(where, what.c_str()); }

/// A refusal by the entry point itself (bad argument, nothing to act on): the message is its text.
struct refusal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class R>
struct failing_with {
  R value;
};
struct quietly_t {};
inline constexpr quietly_t quietly{};
struct raising_t {};
inline constexpr raising_t raising{};
struct raising_oom_t {
  using handler_fn = void (*)(const char* message);
  handler_fn (*handler)() noexcept;  ///< the installed handler (or null), looked up only on out of memory
};

/// Runs `body` as one C entry point named `where` under `policy` (Note [The C boundary]). Costs what the body
/// costs: the try block is free on the path that throws nothing; a failure builds its message.
template <class Policy, class Body>
auto c_entry(const char* where, Policy policy, Body&& body) noexcept(!std::is_same_v<Policy, raising_t> &&
                                                                     !std::is_same_v<Policy, raising_oom_t>)
    -> std::invoke_result_t<Body>
{
  using result = std::invoke_result_t<Body>;
  const auto failed = [&](const char* what) -> result {
    set_error(where, what);
    if constexpr (std::is_same_v<Policy, raising_t> || std::is_same_v<Policy, raising_oom_t>) {
      throw std::runtime_error(last_error);
    } else if constexpr (std::is_same_v<Policy, quietly_t>) {
      return;
    } else {
      return static_cast<result>(policy.value);
    }
  };
  try {
    return std::forward<Body>(body)();
  } catch (const std::bad_alloc& e) {
    if constexpr (std::is_same_v<Policy, raising_oom_t>) {
      set_error(where, e.what());
      if (const auto handler = policy.handler(); handler != nullptr) handler(last_error.c_str());  // throws the framework's type
      throw;
    } else {
      return failed(e.what());
    }
  } catch (const std::exception& e) {
    return failed(e.what());
  } catch (...) {
    return failed("unknown exception");
  }
}

} // namespace strata::plugin
