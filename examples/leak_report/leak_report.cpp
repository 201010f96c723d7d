// Finding leaks: tracking remembers every live allocation with the tag of the phase that made it and prints
// a report on demand; checked turns misuse (here a double free) into a usage_error naming what happened.
#include <cstdio>
#include <iostream>

#include <strata/adaptor/checked.hpp>
#include <strata/adaptor/tracking.hpp>
#include <strata/core/errors.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/host_source.hpp>
#include "../gpu_or_host.hpp"

template <class Source>
int run(Source source)
{
  using pool = strata::coalescing_pool<Source>;
  strata::tracking<pool> tracked{pool{std::move(source)}};
  void* weights = nullptr;
  {
    auto phase = tracked.tag("load");
    weights = tracked.allocate(64 << 20);
  }
  for (int step = 0; step < 3; ++step) {
    auto phase = tracked.tag("step");
    void* scratch = tracked.allocate(8 << 20);
    void* forgotten = tracked.allocate(1 << 20);  // the bug: never freed
    (void)forgotten;
    tracked.deallocate(scratch, 8 << 20);
  }
  std::cout << tracked.report();
  const bool found = tracked.live().size() == 4;
  for (const auto& a : tracked.live()) tracked.deallocate(const_cast<void*>(a.pointer), a.bytes, a.alignment);

  strata::checked<pool> strict{pool{}};
  void* p = strict.allocate(4096);
  strict.deallocate(p, 4096);
  try {
    strict.deallocate(p, 4096);
  } catch (const strata::usage_error& e) {
    std::printf("checked caught: %s\n", e.what());
    return found && weights != nullptr ? 0 : 1;
  }
  return 1;
}

int main()
{
  if (examples::has_gpu()) {
    std::puts("leak_report: on the GPU (device_source)");
    return run(strata::device_source{});
  }
  std::puts("leak_report: no GPU found, on host memory (host_source)");
  return run(strata::host_source{});
}
