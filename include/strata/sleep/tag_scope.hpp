#pragma once
// The scope that gives a thread's allocations a tag (core/tags.hpp says what tags are for).
#include <utility>

#include <strata/core/tags.hpp>

namespace strata {

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
