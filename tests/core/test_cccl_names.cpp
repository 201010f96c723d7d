// core/cccl_names.hpp: CCCL's resource references wrap a strata resource.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <type_traits>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/ref.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/cuda_check.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>

TEST_CASE("cuda::mr::resource_ref wraps a strata resource")
{
  strata::host_source host;
  strata::cccl::synchronous_resource_ref<cuda::mr::host_accessible> r{host};
  void* p = strata::cccl::allocate_sync(r, 100, 256);
  REQUIRE(p != nullptr);
  std::memset(p, 1, 100);
  strata::cccl::deallocate_sync(r, p, 100, 256);
}
