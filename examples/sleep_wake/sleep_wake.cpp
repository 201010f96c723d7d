// Sleep and wake by tag: a trainer and an inference engine share one device and take turns. The trainer's
// weights live under tag 1, the engine's KV cache under tag 2; each pause gives a tag's device memory back and
// each resume maps it again at the same addresses (docs/sleep_wake.md). On the GPU: default_pool (contents
// checked with cudaMemset / cudaMemcpy); without one: planning_pool on a pretend device.
#include <cstdio>
#include <vector>

#include <strata/default_pool.hpp>
#include <strata/sleep/tag_scope.hpp>
#include <strata/stream/simulated_streams.hpp>
#include "../gpu_or_host.hpp"

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

template <class Pool, class Stream, class Touch, class Intact>
int run(Pool& pool, Stream stream, Touch touch, Intact intact)
{
  constexpr strata::tag_id trainer = 1, engine = 2;
  std::vector<void*> weights, kv_cache;
  {
    strata::tag_scope scope(trainer);
    for (int i = 0; i < 8; ++i) weights.push_back(pool.allocate_async(64 * mib, 256, stream));
  }
  for (void* w : weights) touch(w, 64 * mib);
  {
    strata::tag_scope scope(engine);
    for (int i = 0; i < 4; ++i) kv_cache.push_back(pool.allocate_async(96 * mib, 256, stream));
  }
  auto& policy = pool.policy();
  policy.reserve_backup(8 * 64 * mib);  // pin once, ahead: no switch below pins anything
  for (int round = 0; round < 3; ++round) {
    strata::pause(pool, {trainer});                      // the engine's turn: weights to pinned host memory
    const std::size_t held_engine_turn = policy.physical_bytes();
    strata::resume(pool, {trainer});
    strata::pause(pool, {engine}, /*backup=*/false);     // the trainer's turn: the KV cache is rebuilt later
    std::printf("round %d: device memory held in the engine's turn %zu MiB, in the trainer's %zu MiB; pinned %zu MiB\n", round,
                held_engine_turn / mib, policy.physical_bytes() / mib, policy.backup_bytes() / mib);
    examples::expect(policy.physical_bytes(trainer) > 0 && policy.physical_bytes(engine) == 0, "a paused tag holds no device memory");
    strata::resume(pool, {engine});
  }
  for (void* w : weights) examples::expect(intact(w, 64 * mib), "the trainer's weights come back at the same address, intact");
  examples::expect(policy.backup_bytes() == 8 * 64 * mib, "the backup stays pinned at the size paused");
  for (void* w : weights) pool.deallocate_async(w, 64 * mib, 256, stream);
  for (void* k : kv_cache) pool.deallocate_async(k, 96 * mib, 256, stream);
  return examples::status();
}

} // namespace

int main()
{
  if (examples::has_gpu()) {
    std::puts("sleep_wake: on the GPU (default_pool)");
    strata::default_pool pool = strata::make_default_pool();
    return run(
        pool, cuda::stream_ref{cudaStreamLegacy}, [](void* p, std::size_t n) { examples::touch(p, n, true); },
        [](void* p, std::size_t n) {
          std::vector<unsigned char> host(n);
          examples::check(cudaMemcpy(host.data(), p, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
          for (unsigned char c : host)
            if (c != 0x5a) return false;
          return true;
        });
  }
  std::puts("sleep_wake: no GPU found, on a pretend device of 4 GiB (planning_pool)");
  strata::simulated_streams world;
  strata::planning_pool pool{strata::mapped_pool<strata::simulated_pages>{strata::simulated_pages{2 * mib, std::size_t{4} << 30}}, {},
                             strata::simulated_events{world}};
  auto& device = pool.policy().backend();
  const std::vector<unsigned char> pattern(64, 0x5a);
  return run(
      pool, cuda::stream_ref{cudaStreamLegacy},
      [&](void* p, std::size_t) { device.write(reinterpret_cast<std::uintptr_t>(p), pattern.data(), pattern.size()); },
      [&](void* p, std::size_t) {
        std::vector<unsigned char> got(pattern.size());
        device.read(reinterpret_cast<std::uintptr_t>(p), got.data(), got.size());
        return got == pattern;
      });
}
