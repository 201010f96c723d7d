#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace strata {

/// Every pointer strata hands out is aligned to at least this (what cudaMalloc promises).
inline constexpr std::size_t default_alignment = 256;

// The bit trick rather than std::has_single_bit: without -mpopcnt the latter is a libgcc call on every allocate.
constexpr bool is_power_of_two(std::size_t x) noexcept { return x != 0 && (x & (x - 1)) == 0; }

/// Rounds n up to a multiple of the power of two a. Callers guarantee no overflow (see checked_align_up).
constexpr std::size_t align_up(std::size_t n, std::size_t a) noexcept { return (n + a - 1) & ~(a - 1); }

/// The first address at or after p that is aligned to the power of two a.
inline std::uintptr_t align_address(std::uintptr_t p, std::size_t a) noexcept
{
  return (p + a - 1) & ~static_cast<std::uintptr_t>(a - 1);
}

// Not constexpr: a reinterpret_cast is never a constant expression (clang rejects the declaration).
inline bool is_aligned(const void* p, std::size_t a) noexcept
{
  return (reinterpret_cast<std::uintptr_t>(p) & (a - 1)) == 0;
}

/// The alignment a box really gives: at least default_alignment.
constexpr std::size_t effective_alignment(std::size_t alignment) noexcept
{
  return alignment < default_alignment ? default_alignment : alignment;
}

namespace detail {
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_bad_alignment(std::string_view box, std::size_t alignment, std::size_t largest)
{
  if (!is_power_of_two(alignment))
    throw std::invalid_argument(std::string(box) + ": alignment " + std::to_string(alignment) + " is not a power of two");
  throw std::invalid_argument(std::string(box) + ": alignment " + std::to_string(alignment) + " is larger than the " +
                              std::to_string(largest) + " bytes this box can honour");
}
} // namespace detail

/// Throws std::invalid_argument naming the box unless `alignment` is a power of two no larger than `largest`.
/// The check is inline and the throw out of line: every allocate pays two comparisons.
inline void check_alignment(std::string_view box, std::size_t alignment, std::size_t largest)
{
  if (is_power_of_two(alignment) && alignment <= largest) [[likely]]
    return;
  detail::throw_bad_alignment(box, alignment, largest);
}

/// align_up that reports overflow instead of wrapping: a request near SIZE_MAX must fail cleanly.
constexpr bool checked_align_up(std::size_t n, std::size_t a, std::size_t& out) noexcept
{
  if (n > SIZE_MAX - (a - 1)) return false;
  out = align_up(n, a);
  return true;
}

} // namespace strata
