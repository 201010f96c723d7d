// expect: the primary must have
// Must not compile: fallback routes frees by the primary's owns(), and host_source cannot say what it owns.
#include <strata/adaptor/fallback.hpp>
#include <strata/source/host_source.hpp>

int main()
{
  strata::fallback<strata::host_source, strata::host_source> tiers{strata::host_source{}, strata::host_source{}};
  return tiers.allocate(1) == nullptr;
}
