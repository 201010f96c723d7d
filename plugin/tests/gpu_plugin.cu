// libstrata_alloc.so on a GPU: what PyTorch does to it, with kernels that check every byte they were given.
// Cases: two streams, threads, record_stream (and its control), reset and out of memory, a limit, device 1.
// Each case runs in a child process (the plug-in is configured once per process, and a process that
// initialised CUDA cannot fork a child that uses it). Prints one PASS/FAIL line per check and a total;
// exit 0 when all pass, 1 on any failure, 77 when there is no GPU (a failure under STRATA_REQUIRE_GPU=1).
// Usage: strata_plugin_gpu_tests [stack]   (default, coalescing; every case runs on that stack)
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <strata_alloc.h>

namespace {

int checks = 0, failures = 0;

void check(bool ok, const char* what, const std::string& detail = "")
{
  ++checks;
  if (!ok) ++failures;
  std::printf("%s: %s%s%s (pid %d)\n", ok ? "PASS" : "FAIL", what, detail.empty() ? "" : " — ", detail.c_str(), getpid());
  std::fflush(stdout);
}

#define CUDA_OK(call)                                                                              \
  do {                                                                                             \
    cudaError_t status_ = (call);                                                                  \
    if (status_ != cudaSuccess) {                                                                  \
      check(false, #call, cudaGetErrorString(status_));                                            \
      return;                                                                                      \
    }                                                                                              \
  } while (0)

__global__ void fill(unsigned* p, std::size_t n, unsigned value)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = value;
}

__global__ void count_mismatches(const unsigned* p, std::size_t n, unsigned value, unsigned long long* bad)
{
  unsigned long long local = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) local += p[i] != value;
  if (local) atomicAdd(bad, local);
}

__global__ void spin(long long cycles)
{
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

long long stat(int device, const char* key)
{
  std::string buf(strata_memory_stats_json(device, nullptr, 0) + 1, '\0');
  strata_memory_stats_json(device, buf.data(), buf.size());
  const std::string k = std::string("\"") + key + "\":";
  const std::size_t at = buf.find(k);
  return at == std::string::npos ? -1 : std::atoll(buf.c_str() + at + k.size());
}

std::string stack_conf = "stack=default";

/// Runs `body` in a child process that configures the plug-in with stack_conf + `extra`; returns its exit
/// status (the number of its failures, capped).
int in_child(const std::string& extra, const std::function<void()>& body)
{
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string conf = stack_conf + extra;
    if (strata_configure(conf.c_str()) != 0) {
      check(false, "strata_configure", strata_last_error());
    } else {
      body();
    }
    std::fflush(stdout);
    _exit(failures > 100 ? 100 : failures);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) {
    std::printf("FAIL: a case's process died (signal %d)\n", WTERMSIG(status));
    return 1;
  }
  return WEXITSTATUS(status);
}

/// Random sizes on two streams, each block filled and checked by kernels on its stream, freed on it.
void two_streams()
{
  cudaStream_t s[2];
  CUDA_OK(cudaStreamCreateWithFlags(&s[0], cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s[1], cudaStreamNonBlocking));
  unsigned long long* bad = nullptr;
  CUDA_OK(cudaMallocManaged(&bad, sizeof *bad));
  *bad = 0;
  std::mt19937 rng(7);
  struct live {
    unsigned* p;
    std::size_t words;
    int stream;
    unsigned value;
  };
  std::vector<live> blocks;
  int allocated = 0, failed = 0;
  for (int i = 0; i < 4000; ++i) {
    if (blocks.size() < 64 && (blocks.empty() || rng() % 2 == 0)) {
      const int k = static_cast<int>(rng() % 2);
      const std::size_t words = 1 + rng() % (std::size_t{1} << (rng() % 2 ? 10 : 20));
      auto* p = static_cast<unsigned*>(strata_malloc(words * 4, 0, s[k]));
      if (p == nullptr) {
        ++failed;
        continue;
      }
      ++allocated;
      const unsigned value = static_cast<unsigned>(i) * 2654435761u;
      fill<<<64, 256, 0, s[k]>>>(p, words, value);
      blocks.push_back({p, words, k, value});
    } else {
      const std::size_t j = rng() % blocks.size();
      const live b = blocks[j];
      count_mismatches<<<64, 256, 0, s[b.stream]>>>(b.p, b.words, b.value, bad);
      strata_free(b.p, b.words * 4, 0, s[b.stream]);
      blocks.erase(blocks.begin() + static_cast<long>(j));
    }
  }
  for (const live& b : blocks) {
    count_mismatches<<<64, 256, 0, s[b.stream]>>>(b.p, b.words, b.value, bad);
    strata_free(b.p, b.words * 4, 0, s[b.stream]);
  }
  CUDA_OK(cudaDeviceSynchronize());
  check(failed == 0 && allocated > 1000, "two streams: every allocation served",
        std::to_string(allocated) + " allocated, " + std::to_string(failed) + " failed");
  check(*bad == 0, "two streams: no block overwritten while in use", std::to_string(*bad) + " bad words");
  check(stat(0, "allocated_bytes.all.current") == 0, "two streams: everything freed");
  CUDA_OK(cudaFree(bad));
}

/// A block used on stream B (record_stream) and freed on A while B's reader is still queued behind a spin:
/// blocks allocated on A right after must not be it, or A's writes would reach B's reader.
/// `record`: false is the control, showing that without record_stream the reuse happens and is detected.
void record_stream_case(bool record)
{
  cudaStream_t a, b;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t written;
  CUDA_OK(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
  unsigned long long* bad = nullptr;
  CUDA_OK(cudaMallocManaged(&bad, sizeof *bad));
  *bad = 0;
  CUDA_OK(cudaDeviceSynchronize());
  constexpr std::size_t words = std::size_t{1} << 18;  // 1 MiB
  auto* p = static_cast<unsigned*>(strata_malloc(words * 4, 0, a));
  if (p == nullptr) return check(false, "record_stream: malloc", strata_last_error());
  fill<<<64, 256, 0, a>>>(p, words, 0xA11CEu);
  CUDA_OK(cudaEventRecord(written, a));
  CUDA_OK(cudaStreamWaitEvent(b, written, 0));
  spin<<<1, 1, 0, b>>>(200'000'000);  // about 0.1 s: B's read is still to come when A reuses memory
  count_mismatches<<<64, 256, 0, b>>>(p, words, 0xA11CEu, bad);
  cudaEvent_t read_done;
  CUDA_OK(cudaEventCreateWithFlags(&read_done, cudaEventDisableTiming));
  CUDA_OK(cudaEventRecord(read_done, b));
  if (record) strata_record_stream(p, b);
  strata_free(p, words * 4, 0, a);
  // Under a tool that serializes launches (compute-sanitizer) B may be done already: then reuse is fine.
  const bool busy_at_free = cudaEventQuery(read_done) == cudaErrorNotReady;
  if (record && busy_at_free)
    check(stat(0, "strata.held_for_other_streams_bytes") == static_cast<long long>(words * 4), "record_stream: the block is held");
  bool reused_early = false;
  std::vector<unsigned*> next;
  for (int i = 0; i < 8; ++i) {
    auto* q = static_cast<unsigned*>(strata_malloc(words * 4, 0, a));
    if (q == nullptr) continue;
    reused_early |= q == p && cudaEventQuery(read_done) == cudaErrorNotReady;
    fill<<<64, 256, 0, a>>>(q, words, 0xBADu);
    next.push_back(q);
  }
  CUDA_OK(cudaDeviceSynchronize());
  (void)cudaGetLastError();  // the queries' cudaErrorNotReady
  if (record) {
    check(!reused_early, "record_stream: the block was not handed out while B used it");
    check(*bad == 0, "record_stream: B's reader saw only its data", std::to_string(*bad) + " overwritten words");
    void* later = strata_malloc(4096, 0, a);  // B is done: any call gives the held block back
    check(stat(0, "strata.held_for_other_streams_bytes") == 0, "record_stream: given back once B finished");
    strata_free(later, 4096, 0, a);
  } else if (busy_at_free && std::getenv("STRATA_TEST_UNDER_SANITIZER") == nullptr) {
    check(reused_early && *bad > 0, "control without record_stream: the test detects an early reuse",
          std::to_string(*bad) + " overwritten words");
  } else {
    // B finished before the free, or compute-sanitizer (tests/device/plugin.sh says so in
    // STRATA_TEST_UNDER_SANITIZER) runs the kernels one at a time, so B's reader is done before A writes.
    std::printf("SKIP: control without record_stream: B's read cannot overlap A's writes here (launches serialized)\n");
  }
  for (unsigned* q : next) strata_free(q, words * 4, 0, a);
  CUDA_OK(cudaDeviceSynchronize());
}

void reset_case()
{
  cudaStream_t a;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  {
    // The base allocation (PyTorch's getBaseAllocation, for IPC): it contains the block.
    void* p = strata_malloc(4096, 0, a);
    void* q = strata_malloc(4096, 0, a);
    std::size_t size = 0;
    auto* base = static_cast<char*>(strata_base_alloc(q, &size));
    check(base != nullptr && base <= static_cast<char*>(q) && static_cast<char*>(q) + 4096 <= base + size,
          "base allocation: contains the block", std::to_string(static_cast<char*>(q) - base) + " bytes in, of " + std::to_string(size));
    strata_free(p, 4096, 0, a);
    strata_free(q, 4096, 0, a);
  }
  std::vector<void*> blocks;
  for (int i = 0; i < 32; ++i) blocks.push_back(strata_malloc(std::size_t{8} << 20, 0, a));
  for (void* p : blocks)
    if (p == nullptr) return check(false, "reset: malloc", strata_last_error());
  const long long before = stat(0, "reserved_bytes.all.current");
  for (void* p : blocks) strata_free(p, std::size_t{8} << 20, 0, a);
  strata_reset();  // torch.cuda.empty_cache()
  const long long after = stat(0, "reserved_bytes.all.current");
  check(before >= (256ll << 20) && after == 0, "reset: empty_cache hands idle memory back",
        std::to_string(before) + " -> " + std::to_string(after) + " bytes reserved");
  void* p = strata_malloc(std::size_t{8} << 20, 0, a);
  check(p != nullptr, "reset: usable afterwards");
  // More than the device has, without a limit: the stack itself runs out (after one release and retry).
  const bool huge_refused = strata_malloc(std::size_t{1} << 45, 0, a) == nullptr;
  check(huge_refused && stat(0, "num_ooms") == 1 && stat(0, "num_alloc_retries") == 1,
        "out of memory: 32 TiB is null, counted, retried once", strata_last_error());
  check(cudaGetLastError() == cudaSuccess, "out of memory: no sticky CUDA error left behind");
  unsigned long long* bad = nullptr;
  CUDA_OK(cudaMallocManaged(&bad, sizeof *bad));
  *bad = 0;
  fill<<<64, 256, 0, a>>>(static_cast<unsigned*>(p), (std::size_t{8} << 20) / 4, 5u);
  count_mismatches<<<64, 256, 0, a>>>(static_cast<unsigned*>(p), (std::size_t{8} << 20) / 4, 5u, bad);
  CUDA_OK(cudaStreamSynchronize(a));
  check(*bad == 0, "out of memory: the process keeps working (a kernel on a live block)");
  strata_free(p, std::size_t{8} << 20, 0, a);
}

void limit_case()
{
  cudaStream_t a;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i)
    if (void* p = strata_malloc(std::size_t{64} << 20, 0, a)) blocks.push_back(p);
  check(blocks.size() == 4, "limit=256MiB: four 64 MiB blocks fit, the fifth does not", std::to_string(blocks.size()) + " fit");
  check(stat(0, "num_ooms") == 12, "limit: every refusal counted", std::to_string(stat(0, "num_ooms")));
  strata_free(blocks.back(), std::size_t{64} << 20, 0, a);
  blocks.pop_back();
  void* p = strata_malloc(std::size_t{64} << 20, 0, a);
  check(p != nullptr, "limit: after a free the process goes on", strata_last_error());
  if (p != nullptr) blocks.push_back(p);
  for (void* q : blocks) strata_free(q, std::size_t{64} << 20, 0, a);
}

/// Threads at once, as PyTorch's (autograd, data loading): each allocates on its own stream with kernels
/// checking every word; half the blocks are freed by another thread (on their own stream, as PyTorch does).
void threads_case()
{
  constexpr int threads = 4, steps = 1500;
  unsigned long long* bad = nullptr;
  CUDA_OK(cudaMallocManaged(&bad, sizeof *bad));
  *bad = 0;
  CUDA_OK(cudaDeviceSynchronize());
  struct block {
    unsigned* p;
    std::size_t words;
    cudaStream_t stream;
    unsigned value;
  };
  std::mutex handoff_mutex;
  std::vector<block> handoff;  // freed by whichever thread comes next
  std::vector<int> served(threads, 0), refused(threads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      cudaStream_t s;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return;
      std::mt19937 rng(100 + t);
      std::vector<block> live;
      auto release = [&](const block& b) {
        count_mismatches<<<32, 256, 0, b.stream>>>(b.p, b.words, b.value, bad);
        strata_free(b.p, b.words * 4, 0, b.stream);
      };
      for (int i = 0; i < steps; ++i) {
        if (live.size() < 32 && (live.empty() || rng() % 2 == 0)) {
          const std::size_t words = 1 + rng() % (std::size_t{1} << 16);
          auto* p = static_cast<unsigned*>(strata_malloc(words * 4, 0, s));
          if (p == nullptr) {
            ++refused[t];
            continue;
          }
          ++served[t];
          const unsigned value = static_cast<unsigned>(t * 1000003 + i);
          fill<<<32, 256, 0, s>>>(p, words, value);
          live.push_back({p, words, s, value});
        } else {
          const block b = live.back();
          live.pop_back();
          if (rng() % 2 == 0) {
            release(b);
          } else {
            // Another thread frees it later; its stream stays alive until every thread has joined.
            std::lock_guard lock(handoff_mutex);
            handoff.push_back(b);
          }
          std::vector<block> mine;
          {
            std::lock_guard lock(handoff_mutex);
            if (!handoff.empty() && rng() % 2 == 0) {
              mine.push_back(handoff.back());
              handoff.pop_back();
            }
          }
          for (const block& m : mine) release(m);
        }
      }
      for (const block& b : live) release(b);
      cudaStreamSynchronize(s);
    });
  for (auto& th : pool) th.join();
  for (const block& b : handoff) {
    count_mismatches<<<32, 256, 0, b.stream>>>(b.p, b.words, b.value, bad);
    strata_free(b.p, b.words * 4, 0, b.stream);
  }
  CUDA_OK(cudaDeviceSynchronize());
  int total_served = 0, total_refused = 0;
  for (int t = 0; t < threads; ++t) {
    total_served += served[t];
    total_refused += refused[t];
  }
  check(total_refused == 0 && total_served > threads * steps / 4, "threads: every allocation served",
        std::to_string(total_served) + " served, " + std::to_string(total_refused) + " refused");
  check(*bad == 0, "threads: no block overwritten while in use", std::to_string(*bad) + " bad words");
  check(stat(0, "allocated_bytes.all.current") == 0 && stat(0, "allocation.all.current") == 0, "threads: everything freed");
  CUDA_OK(cudaFree(bad));
}

/// Device 1's memory while device 0 is current: PyTorch passes the device, strata must use it.
void second_device_case()
{
  CUDA_OK(cudaSetDevice(1));
  cudaStream_t s1;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaSetDevice(0));
  constexpr std::size_t words = 1 << 20;
  auto* p = static_cast<unsigned*>(strata_malloc(words * 4, 1, s1));
  if (p == nullptr) return check(false, "device 1: malloc", strata_last_error());
  cudaPointerAttributes attr{};
  CUDA_OK(cudaPointerGetAttributes(&attr, p));
  check(attr.device == 1, "device 1: the block is on device 1 although device 0 is current", std::to_string(attr.device));
  int current = -1;
  CUDA_OK(cudaGetDevice(&current));
  check(current == 0, "device 1: the current device is left as it was");
  unsigned long long* bad = nullptr;
  CUDA_OK(cudaMallocManaged(&bad, sizeof *bad));
  *bad = 0;
  CUDA_OK(cudaSetDevice(1));
  fill<<<64, 256, 0, s1>>>(p, words, 77u);
  count_mismatches<<<64, 256, 0, s1>>>(p, words, 77u, bad);
  CUDA_OK(cudaStreamSynchronize(s1));
  CUDA_OK(cudaSetDevice(0));
  check(*bad == 0, "device 1: a kernel on device 1 writes and reads it");
  strata_free(p, words * 4, 1, s1);
  check(stat(1, "allocated_bytes.all.current") == 0 && stat(0, "allocated_bytes.all.current") == 0,
        "device 1: counted on device 1 only");
}

/// strata's PyTorch backend holds the device's lock across its own books and its calls (strata_device_lock):
/// on a real stack that lock is the one the entry points take, so inside they must not take it again, while
/// other threads' calls wait. A hang is the failure: the alarm ends the case's process.
void device_lock_case()
{
  constexpr std::size_t MiB = std::size_t{1} << 20;
  alarm(60);
  check(strata_device_lock(0) == 0, "device lock: taken before the stack exists");
  strata_device_figures f{};
  void* p = strata_malloc_or_throw_observed(MiB, 0, nullptr, &f);  // builds the stack inside the section
  check(p != nullptr && f.allocated == MiB, "device lock: an allocation inside fills its figures");
  check(strata_device_figures_get(0, &f) == 0, "device lock: figures read inside");
  check(strata_snapshot_json(0, nullptr, 0) > 0, "device lock: snapshot inside");
  check(strata_device_lock(0) == 0, "device lock: nested");
  strata_reset_peak_stats(0);
  strata_device_unlock(0);
  std::atomic<bool> served{false};
  std::thread other([&served] {
    void* q = strata_malloc(MiB, 0, nullptr);
    strata_free(q, MiB, 0, nullptr);
    served = q != nullptr;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  check(!served.load(), "device lock: another thread's allocation waits for the section");
  strata_free_observed(p, MiB, 0, nullptr, &f);
  check(f.allocated == 0, "device lock: the free inside fills its figures");
  strata_device_unlock(0);
  other.join();
  check(served.load(), "device lock: the other thread's allocation ran after the section");
  alarm(0);
}

} // namespace

int main(int argc, char** argv)
{
  if (argc > 1) stack_conf = std::string("stack=") + argv[1];
  const bool required = std::getenv("STRATA_REQUIRE_GPU") != nullptr && std::strcmp(std::getenv("STRATA_REQUIRE_GPU"), "0") != 0;
  int devices = 0;
  {
    std::fflush(stdout);
    const pid_t pid = fork();  // ask in a child: CUDA initialised here would be unusable in the cases' children
    if (pid == 0) {
      int n = 0;
      if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
      _exit(n > 100 ? 100 : n);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    devices = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  }
  if (devices == 0) {
    std::printf("%s: no GPU\n", required ? "FAIL" : "SKIP");
    return required ? 1 : 77;
  }
  std::printf("plug-in GPU tests, %s, %d device(s)\n", stack_conf.c_str(), devices);
  int failed = 0;
  failed += in_child("", two_streams);
  failed += in_child("", threads_case);
  failed += in_child("", [] { record_stream_case(true); });
  failed += in_child("", [] { record_stream_case(false); });
  failed += in_child("", reset_case);
  failed += in_child(",limit=256MiB", limit_case);
  failed += in_child("", device_lock_case);
  if (devices >= 2) failed += in_child("", second_device_case);
  else std::printf("SKIP: device 1 cases (one GPU)\n");
  std::printf("%s: %d failed check(s) in the plug-in GPU tests (%s)\n", failed == 0 ? "ALL PASSED" : "FAILED", failed,
              stack_conf.c_str());
  return failed == 0 ? 0 : 1;
}
