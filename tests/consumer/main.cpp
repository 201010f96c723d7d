// Built by g++ against strata::strata: allocates through a host source and checks what it got.
#include <strata/strata.hpp>

#include <cstdio>
#include <cstring>

int main()
{
  strata::host_source host;
  void* p = host.allocate(1000, 4096);
  if (p == nullptr || !strata::is_aligned(p, 4096)) return 1;
  std::memset(p, 0, 1000);
  host.deallocate(p, 1000, 4096);
  static_assert(strata::cccl::synchronous_resource_with<strata::device_source, cuda::mr::device_accessible>);
  std::puts("consumer: strata works");
  return 0;
}
