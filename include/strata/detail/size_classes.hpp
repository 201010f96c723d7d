#pragma once
// The size-class table of size_class_pool, computed at compile time: 256-byte steps up to 2 KiB, then four
// classes per doubling (2.5, 3, 3.5, 4 KiB; 5, 6, 7, 8 KiB; ...) up to the largest class, so a block wastes
// at most 20% of itself above 2 KiB. class_index() is the same mapping as arithmetic (no table walk).
#include <array>
#include <bit>
#include <cstddef>

namespace strata::detail {

inline constexpr std::size_t class_step = 256;           // the step below 2 KiB
inline constexpr std::size_t linear_classes_end = 2048;  // the last linearly spaced class
inline constexpr std::size_t classes_per_doubling = 4;

/// How many classes there are up to and including `largest` (a power of two >= 2 KiB).
constexpr std::size_t class_count(std::size_t largest) noexcept
{
  std::size_t n = linear_classes_end / class_step;
  for (std::size_t s = linear_classes_end; s < largest; s *= 2) n += classes_per_doubling;
  return n;
}

template <std::size_t Largest>
constexpr auto make_class_table() noexcept
{
  std::array<std::size_t, class_count(Largest)> table{};
  std::size_t i = 0;
  for (std::size_t s = class_step; s <= linear_classes_end; s += class_step) table[i++] = s;
  for (std::size_t base = linear_classes_end; base < Largest; base *= 2)
    for (std::size_t k = 1; k <= classes_per_doubling; ++k) table[i++] = base + k * (base / classes_per_doubling);
  return table;
}

/// The smallest class that holds `bytes` (1 <= bytes <= largest class), in O(1).
constexpr std::size_t class_index(std::size_t bytes) noexcept
{
  if (bytes <= linear_classes_end) return (bytes + class_step - 1) / class_step - 1;
  const unsigned e = static_cast<unsigned>(std::bit_width(bytes - 1)) - 1;  // 2^e < bytes <= 2^(e+1)
  const std::size_t base = std::size_t{1} << e;
  const std::size_t step = base / classes_per_doubling;
  const std::size_t k = (bytes - base + step - 1) / step;  // 1..4
  constexpr unsigned linear_exponent = std::bit_width(linear_classes_end) - 1;
  return linear_classes_end / class_step + (e - linear_exponent) * classes_per_doubling + k - 1;
}

} // namespace strata::detail
