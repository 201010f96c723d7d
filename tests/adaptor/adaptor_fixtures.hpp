#pragma once
// What the adaptor tests share: the pools they wrap, and the limits and workload of their conformance checks.
#include <strata/core/ref.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/host_source.hpp>

#include "support/conformance.hpp"
#include "support/invariants.hpp"
#include "support/spy.hpp"

namespace strata::testing::adaptor_fixtures {
using host_pool = coalescing_pool<host_source>;
using spied_pool = coalescing_pool<ref<spy<host_source>>>;
inline constexpr conformance_limits host_limits{.max_alignment = 1 << 16, .rejects_above = 0, .host_accessible = true};
inline constexpr workload small_workload{.operations = 20'000, .max_live = 300, .max_bytes = 1 << 20, .max_alignment = 1 << 12};
} // namespace strata::testing::adaptor_fixtures
