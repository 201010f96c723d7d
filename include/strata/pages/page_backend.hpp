#pragma once
// What mapped_pool needs from a machine that maps physical pages into reserved address ranges: the
// page_backend and copying_page_backend concepts and page_counters, for a backend's author, and lends_pins.
// The first are defined with the pool's machinery (detail/pages/page_backend.hpp), whose parts name them
// below the public layers.
#include <strata/detail/pages/page_backend.hpp>
#include <strata/pinned/pin_lender.hpp>

namespace strata {

/// A copying page backend whose pinned memory may be borrowed from a pinned pool (Note [One pinned budget],
/// pinned/pin_lender.hpp): `lend_pins_from(lender)` and `pins_lent()`.
template <class B>
concept lends_pins = copying_page_backend<B> && requires(B& b, const B& cb, pin_lender lender) {
  { b.lend_pins_from(lender) } noexcept;
  { cb.pins_lent() } noexcept -> std::same_as<bool>;
};

} // namespace strata
