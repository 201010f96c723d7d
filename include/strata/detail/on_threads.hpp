#pragma once
// Work shared among a few host threads: the pinning paths fault pages in and register them in slices.
#include <thread>
#include <vector>

namespace strata::detail {

/// Runs `work` on the calling thread and on `threads - 1` more, and waits for them all. `work` takes its pieces
/// from a counter shared by every thread, so a thread that cannot be started leaves its share to the others.
/// Cost: a thread start per extra thread, and a join.
template <class Work>
void run_on_threads(unsigned threads, Work& work)
{
  std::vector<std::thread> pool;
  try {
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  } catch (...) {  // fewer threads: the others do the rest
  }
  work();
  for (auto& t : pool) t.join();
}

} // namespace strata::detail
