#include "fuzz/stack_fuzzer.hpp"

namespace strata::testing {
std::vector<fuzz_target>& fuzz_targets()
{
  static std::vector<fuzz_target> targets;
  return targets;
}
} // namespace strata::testing
