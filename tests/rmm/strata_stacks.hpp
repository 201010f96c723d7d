#pragma once
// The strata stacks that RMM's memory-resource tests run against, as RMM resources: each a function building a
// fresh stack on the current device, and each stack's fixture in the shape RMM's typed tests take (a
// device_async_resource_ref `ref` and a cuda_stream `stream`).
#include <cstddef>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <rmm/cuda_stream.hpp>
#include <rmm/resource_ref.hpp>

#include <strata/adaptor/limit.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/default_pool.hpp>
#include <strata/interop/rmm_current.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/stream/stream_ordered.hpp>

#include <gtest/gtest.h>

namespace strata_rmm_test {

using coalescing_stack = strata::stream_ordered<strata::coalescing_pool<strata::device_source>>;
using limit_stats_stack = strata::statistics<strata::limit<coalescing_stack>>;

/// The cap of the limit/statistics stack: well above what RMM's tests hold at once (four threads, a 1 GiB
/// request each), well below an H100's memory, so the cap is a real one the stack checks on every call.
inline constexpr std::size_t limit_bytes = std::size_t{16} << 30;

inline strata::rmm_resource default_pool() { return strata::as_rmm(strata::rmm_resource(strata::make_default_pool())); }
inline strata::rmm_resource coalescing()
{
  return strata::as_rmm(strata::rmm_resource(coalescing_stack(strata::coalescing_pool<strata::device_source>{})));
}
inline strata::rmm_resource limit_stats()
{
  return strata::as_rmm(strata::rmm_resource(
    limit_stats_stack(strata::limit<coalescing_stack>(coalescing_stack(strata::coalescing_pool<strata::device_source>{}), limit_bytes))));
}

template <strata::rmm_resource (*Make)()>
struct fixture : public ::testing::Test {
  strata::rmm_resource mr{Make()};
  rmm::device_async_resource_ref ref{mr};
  rmm::cuda_stream stream{};
};

using DefaultPoolFixture = fixture<&default_pool>;
using CoalescingFixture = fixture<&coalescing>;
using LimitStatisticsFixture = fixture<&limit_stats>;

/// The stack a run is about: STRATA_RMM_STACK names it (default_pool, coalescing, limit_statistics; unset:
/// default_pool). std::invalid_argument for any other name.
inline const char* chosen_name()
{
  const char* name = std::getenv("STRATA_RMM_STACK");
  return name != nullptr && *name != '\0' ? name : "default_pool";
}
inline strata::rmm_resource chosen()
{
  const std::string name = chosen_name();
  if (name == "default_pool") return default_pool();
  if (name == "coalescing") return coalescing();
  if (name == "limit_statistics") return limit_stats();
  throw std::invalid_argument("STRATA_RMM_STACK=" + name + ": not default_pool, coalescing or limit_statistics");
}

/// A default-constructible device resource over a fresh chosen stack: what RMM's adaptor tests take as their
/// upstream where they construct cuda_memory_resource (tests/rmm/CMakeLists.txt substitutes it).
struct chosen_upstream : strata::rmm_resource {
  chosen_upstream() : strata::rmm_resource(chosen()) {}
};

} // namespace strata_rmm_test
