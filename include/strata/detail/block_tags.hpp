#pragma once
// Which tag (docs/sleep_wake.md) a block stream_ordered caches belongs to, so that a block is reused only by
// allocations under its own tag and never while that tag sleeps. A policy that tells a block's tag
// (mapped_pool's tag_of and paused) is asked; any other policy's blocks all carry tag 0 and cost nothing.
#include <concepts>

#include <strata/core/tags.hpp>

namespace strata::detail {

/// A policy whose allocations carry the calling thread's tag and whose tags can sleep.
template <class Policy>
concept tagging_policy = requires(const Policy& p, const void* q, tag_id t) {
  { p.tag_of(q) } noexcept -> std::convertible_to<tag_id>;
  { p.paused(t) } noexcept -> std::convertible_to<bool>;
};

/// The tag an allocation through `policy` carries now: the calling thread's (a thread-local read).
template <class Policy>
tag_id allocation_tag(const Policy&) noexcept
{
  if constexpr (tagging_policy<Policy>) return current_tag();
  else return 0;
}

/// The tag of a block `policy` handed out (with tag 0 alone in use, one comparison).
template <class Policy>
tag_id block_tag(const Policy& policy, const void* p) noexcept
{
  if constexpr (tagging_policy<Policy>) return policy.tag_of(p);
  else return 0;
}

/// Whether `tag` sleeps: its blocks have no memory behind them.
template <class Policy>
bool tag_sleeps(const Policy& policy, tag_id tag) noexcept
{
  if constexpr (tagging_policy<Policy>) return policy.paused(tag);
  else return false;
}

} // namespace strata::detail
