#pragma once
// What every single-upstream adaptor shares: the upstream's properties, the CCCL 3.1 names (the stream-first
// ones only when the upstream is stream-ordered), and the optional capabilities the adaptor does not change
// (owns, release, good_size, usage, snapshot), each present exactly when the upstream has it.
// Derived provides upstream() and says `using adaptor_base<...>::allocate;` (and deallocate).
#include <cstddef>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/properties.hpp>

namespace strata::detail {

template <class Derived, class Upstream>
class adaptor_base : public forward_properties<Derived, Upstream>,
                     public sync_names<Derived>,
                     public stream_first_names<Derived, stream_resource<Upstream>> {
public:
  using stream_first_names<Derived, stream_resource<Upstream>>::allocate;
  using stream_first_names<Derived, stream_resource<Upstream>>::deallocate;

  bool owns(const void* p) const noexcept
    requires owning_resource<Upstream>
  {
    return self().upstream().owns(p);
  }
  decltype(auto) release()
    requires releasable_resource<Upstream>
  {
    return self().upstream().release();
  }
  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const
    requires sized_resource<Upstream>
  {
    return self().upstream().good_size(bytes, alignment);
  }
  strata::usage usage() const
    requires usage_reporting_resource<Upstream>
  {
    return self().upstream().usage();
  }
  strata::snapshot snapshot() const
    requires snapshot_resource<Upstream>
  {
    return self().upstream().snapshot();
  }

private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
};

} // namespace strata::detail
