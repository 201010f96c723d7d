// Must not compile: it claims librmm was built with CCCL 3.0.1 while it sees RMM's own CCCL. The build's
// output must name both releases (tests/rmm/CMakeLists.txt, test abi_guard_mismatch).
#include <strata/interop/rmm_current.hpp>

int main() { return 0; }
