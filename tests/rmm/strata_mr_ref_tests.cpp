// RMM's parameterized memory-resource tests (allocation, streams, threads, current-resource handling) over
// strata stacks, each as RMM's current device resource where a test makes it so.
#include "strata_stacks.hpp"

#include "mr/cccl_mr_ref_test_allocation.hpp"
#include "mr/cccl_mr_ref_test_basic.hpp"
#include "mr/cccl_mr_ref_test_mt.hpp"

namespace rmm::test {

using strata_rmm_test::CoalescingFixture;
using strata_rmm_test::DefaultPoolFixture;
using strata_rmm_test::LimitStatisticsFixture;

INSTANTIATE_TYPED_TEST_SUITE_P(StrataDefaultPool, CcclMrRefTest, DefaultPoolFixture);
INSTANTIATE_TYPED_TEST_SUITE_P(StrataDefaultPool, CcclMrRefAllocationTest, DefaultPoolFixture);
INSTANTIATE_TYPED_TEST_SUITE_P(StrataDefaultPool, CcclMrRefTestMT, DefaultPoolFixture);

INSTANTIATE_TYPED_TEST_SUITE_P(StrataCoalescing, CcclMrRefTest, CoalescingFixture);
INSTANTIATE_TYPED_TEST_SUITE_P(StrataCoalescing, CcclMrRefAllocationTest, CoalescingFixture);
INSTANTIATE_TYPED_TEST_SUITE_P(StrataCoalescing, CcclMrRefTestMT, CoalescingFixture);

INSTANTIATE_TYPED_TEST_SUITE_P(StrataLimitStatistics, CcclMrRefTest, LimitStatisticsFixture);
INSTANTIATE_TYPED_TEST_SUITE_P(StrataLimitStatistics, CcclMrRefAllocationTest, LimitStatisticsFixture);
INSTANTIATE_TYPED_TEST_SUITE_P(StrataLimitStatistics, CcclMrRefTestMT, LimitStatisticsFixture);

} // namespace rmm::test
