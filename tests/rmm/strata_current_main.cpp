// The main of every RMM test program run over strata: the stack STRATA_RMM_STACK names becomes RMM's current
// device resource before each test (a test that resets the current resource leaves strata's for the next), so
// RMM's tests that allocate through get_current_device_resource_ref() allocate from strata. It stays current
// at exit, when RMM's map destroys it (Note [exit] in interop/rmm_resource.hpp).
#include "strata_stacks.hpp"

#include <cstdio>
#include <optional>

namespace {

/// GoogleTest never destroys its listeners: this one lets go of its share when the tests end, so that RMM's
/// map holds the last one and destroys it during exit, as in a program that makes a stack current and exits.
class make_strata_current : public ::testing::EmptyTestEventListener {
public:
  explicit make_strata_current(strata::rmm_resource r) : r_(std::move(r)) {}
  void OnTestStart(const ::testing::TestInfo&) override
  {
    if (r_) strata::make_current_rmm(*r_);
  }
  void OnTestProgramEnd(const ::testing::UnitTest&) override
  {
    if (r_) strata::make_current_rmm(*r_);
    r_.reset();
  }

private:
  std::optional<strata::rmm_resource> r_;
};

} // namespace

int main(int argc, char** argv)
{
  ::testing::InitGoogleTest(&argc, argv);
  if (GTEST_FLAG_GET(list_tests)) return RUN_ALL_TESTS();  // lists, needs no GPU
  strata::rmm_resource r = strata_rmm_test::chosen();
  std::printf("strata: RMM's current device resource is strata's %s stack\n", strata_rmm_test::chosen_name());
  ::testing::UnitTest::GetInstance()->listeners().Append(new make_strata_current(r));
  strata::make_current_rmm(r);
  const int failed = RUN_ALL_TESTS();
  std::printf("strata: the stack stays current until exit (%ld shares, RMM's included)\n", r.use_count());
  return failed;
}
