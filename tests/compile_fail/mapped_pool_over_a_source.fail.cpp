// expect: satisf(action of [^a-z_ ]+|y ')page_backend[<']
// Must not compile: mapped_pool maps physical pages into reserved ranges; a memory source cannot.
#include <strata/policy/mapped_pool.hpp>
#include <strata/source/host_source.hpp>

int main()
{
  strata::mapped_pool<strata::host_source> pool;
  return pool.allocate(1) == nullptr;
}
