#pragma once
// Factories the fuzzer builds its stacks with: each takes the fuzz_world and returns a box by value, so a
// composition is written the way a user writes it, box inside box.
#include <cstddef>
#include <ostream>
#include <streambuf>

#include <strata/adaptor/checked.hpp>
#include <strata/adaptor/fallback.hpp>
#include <strata/adaptor/limit.hpp>
#include <strata/adaptor/per_device.hpp>
#include <strata/adaptor/recorder.hpp>
#include <strata/adaptor/retry_on_oom.hpp>
#include <strata/adaptor/segregator.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/adaptor/synchronized.hpp>
#include <strata/adaptor/thread_cached.hpp>
#include <strata/adaptor/tracking.hpp>
#include <strata/core/ref.hpp>
#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/arena.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/policy/size_class_pool.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>

#include "fuzz/stack_fuzzer.hpp"

namespace strata::testing::stacks {

using up = ref<adversarial_source>;
using arena_t = arena<up>;
using size_class_t = size_class_pool<up>;
using buddy_t = buddy_pool<up>;
using coalescing_t = coalescing_pool<up>;
using mapped_t = mapped_pool<simulated_pages>;

template <class P>
using so = stream_ordered<P, simulated_events>;

inline std::ostream& discarding_stream()
{
  struct null_buffer : std::streambuf {
    int overflow(int c) override { return c; }
  };
  static null_buffer buffer;
  static std::ostream out(&buffer);
  return out;
}

/// A policy over the world's upstream. mapped_pool owns its pages: a pretend device of the same capacity.
template <class P>
P policy(fuzz_world& w)
{
  if constexpr (std::is_same_v<P, mapped_t>)
    return mapped_t(simulated_pages(std::size_t{2} << 20, w.upstream.capacity()), mapped_t::options{.address_space = std::size_t{1} << 36});
  else
    return P(up(w.upstream));
}

/// A box that wraps what `inner` builds.
template <class Box, class Inner>
auto wrap(Inner inner)
{
  return [inner](fuzz_world& w) -> Box {
    using In = decltype(inner(w));
    if constexpr (std::is_same_v<Box, so<In>>) return Box(inner(w), {}, simulated_events(w.streams));
    else if constexpr (std::is_same_v<Box, limit<In>>) return Box(inner(w), w.upstream.capacity() / 2);
    else if constexpr (std::is_same_v<Box, retry_on_oom<In>>)
      return Box(inner(w), [&hooks = w.hooks](std::size_t bytes, int) { return hooks.on_oom(bytes); }, 2);
    else if constexpr (std::is_same_v<Box, recorder<In>>) return Box(inner(w), discarding_stream());
    else return Box(inner(w));
  };
}

template <class P>
auto leaf()
{
  return [](fuzz_world& w) { return policy<P>(w); };
}

/// stream_ordered that never asks whether a stream captures (the fuzzer announces no capture, and so may
/// turn the check off): while one stream has it alone, its calls take the lone owner's short path.
template <class Make>
auto so_unchecked_of(Make m)
{
  return [m](fuzz_world& w) {
    using In = decltype(m(w));
    typename so<In>::options opts{};
    opts.check_capture = false;
    return so<In>(m(w), opts, simulated_events(w.streams));
  };
}
/// stream_ordered keeping the lone owner's recent frees for its next allocations of their shape.
template <class Make>
auto so_recent_of(Make m, bool check_capture)
{
  return [m, check_capture](fuzz_world& w) {
    using In = decltype(m(w));
    typename so<In>::options opts{};
    opts.check_capture = check_capture;
    opts.reuse_recent_frees = true;
    return so<In>(m(w), opts, simulated_events(w.streams));
  };
}
/// fallback / segregator over what two makers build.
template <template <class, class> class Two, class A, class B>
auto pair(A a, B b)
{
  return [a, b](fuzz_world& w) { return Two<decltype(a(w)), decltype(b(w))>(a(w), b(w)); };
}
template <std::size_t N, class A, class B>
auto split_at(A a, B b)
{
  return [a, b](fuzz_world& w) { return segregator<N, decltype(a(w)), decltype(b(w))>(a(w), b(w)); };
}

/// per_device's factory: a coalescing_pool for each pretend device, all over the one upstream.
struct coalescing_per_device {
  adversarial_source* upstream;
  coalescing_t operator()(int) const { return coalescing_t(up(*upstream)); }
};
using per_device_t = per_device<coalescing_t, coalescing_per_device, simulated_devices::backend>;

/// Registers the stack `make` builds under `name`.
template <class Make>
bool add(const char* name, Make make)
{
  fuzz_world* none = nullptr;
  using Stack = decltype(make(*none));
  return register_stack<Stack>(name, make);
}

} // namespace strata::testing::stacks
