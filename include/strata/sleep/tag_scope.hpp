#pragma once
// The tag the calling thread's allocations carry (core/tag_id.hpp says what tags are for), unless a call
// names one.
#include <utility>

#include <strata/core/tag_id.hpp>

namespace strata {

namespace detail {
inline thread_local tag_id thread_tag = 0;
} // namespace detail

/// The tag the calling thread's allocations carry now (0 outside any tag_scope).
inline tag_id current_tag() noexcept { return detail::thread_tag; }

/// Gives the calling thread's allocations `tag` while it lives, then the tag before it (scopes nest). Costs
/// two thread-local writes; no lock. Not movable: it belongs to the thread and the scope that made it.
class tag_scope {
public:
  explicit tag_scope(tag_id tag) noexcept : previous_(std::exchange(detail::thread_tag, tag)) {}
  ~tag_scope() { detail::thread_tag = previous_; }
  tag_scope(const tag_scope&) = delete;
  tag_scope& operator=(const tag_scope&) = delete;

private:
  tag_id previous_;
};

} // namespace strata
