// expect: satisf(action of [^a-z_ ]+|y ')event_backend[<']
// Must not compile: stream_ordered's second parameter tells streams apart and records events (an
// event_backend); a memory source is not one.
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/host_source.hpp>
#include <strata/stream/stream_ordered.hpp>

int main()
{
  strata::stream_ordered<strata::coalescing_pool<strata::host_source>, strata::host_source> pool;
  return pool.allocate(1) == nullptr;
}
