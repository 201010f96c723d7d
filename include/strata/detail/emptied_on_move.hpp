#pragma once
// A member a pool's defaulted moves can carry: a T whose move hands its contents over and leaves a
// default-constructed T behind, so a moved-from pool holds nothing and can be used again. O(1) for the
// containers and plain structs it wraps; never allocates when T's default constructor does not.
#include <type_traits>
#include <utility>

namespace strata::detail {

template <class T>
class emptied_on_move : public T {
  static_assert(std::is_nothrow_default_constructible_v<T> && std::is_nothrow_move_constructible_v<T> &&
                std::is_nothrow_move_assignable_v<T>);

public:
  using T::T;
  emptied_on_move() = default;
  emptied_on_move(T value) noexcept : T(std::move(value)) {}
  emptied_on_move(emptied_on_move&& other) noexcept : T(std::move(static_cast<T&>(other))) { static_cast<T&>(other) = T{}; }
  emptied_on_move& operator=(emptied_on_move&& other) noexcept
  {
    if (this != &other) {
      static_cast<T&>(*this) = std::move(static_cast<T&>(other));
      static_cast<T&>(other) = T{};
    }
    return *this;
  }
  emptied_on_move(const emptied_on_move&) = delete;
  emptied_on_move& operator=(const emptied_on_move&) = delete;
  ~emptied_on_move() = default;
};

} // namespace strata::detail
