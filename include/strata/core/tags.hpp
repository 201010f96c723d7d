#pragma once
// Tags name groups of allocations that sleep and wake together (mapped_pool::pause / resume): a trainer's
// weights and optimizer state under one tag, an inference engine's KV cache under another. Allocations carry
// the calling thread's tag unless a call names one (strata::tag_scope sets it).
#include <cstdint>

namespace strata {

/// A tag: a small integer naming a group of allocations; 0, the default, is every untagged allocation.
using tag_id = std::uint32_t;

/// The most distinct tags a pool serves (tags 0 to max_tags - 1): each costs two reserved address ranges.
inline constexpr tag_id max_tags = 1024;

namespace detail {
inline thread_local tag_id thread_tag = 0;
} // namespace detail

/// The tag the calling thread's allocations carry now (0 outside any tag_scope).
inline tag_id current_tag() noexcept { return detail::thread_tag; }

} // namespace strata
