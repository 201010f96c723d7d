// expect: satisf(action of [^a-z_ ]+|y ')resource[<']
// Must not compile: a policy's upstream is a strata::resource (allocate, a noexcept deallocate, equality).
#include <strata/policy/coalescing_pool.hpp>

int main()
{
  strata::coalescing_pool<int> pool{0};
  return pool.allocate(1) == nullptr;
}
