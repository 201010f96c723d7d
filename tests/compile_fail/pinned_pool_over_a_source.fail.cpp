// expect: satisf(action of [^a-z_ ]+|y ')pinning_backend[<']
// Must not compile: pinned_host_pool pins regions through its pinning backend (pin, unpin, its NUMA node); a
// memory source is not one.
#include <strata/pinned/pinned_host_pool.hpp>
#include <strata/source/host_source.hpp>

int main()
{
  strata::pinned_host_pool<strata::host_source> pool;
  return pool.allocate(1) == nullptr;
}
