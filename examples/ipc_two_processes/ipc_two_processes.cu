// Sharing strata blocks between two processes for each kind of memory strata makes:
// cudaMalloc'd chunks (a coalescing_pool over device_source), a cudaMemPool_t (async_source), page-mapped
// memory (mapped_pool over driver_pages) and the recommended stack (default_pool).
//
// The parent forks before touching CUDA (a child may not use a CUDA context it inherited), then, for each
// device (at most two) and each kind: allocates a block, writes a pattern with a kernel, exports the block and
// sends it over a Unix socket. The child imports it, checks the pattern with a kernel, writes another, closes
// its import and answers "done <mismatches>". Only then does the parent check the child's pattern and free the
// block: the exporter keeps the block alive until the importer says it is done (ipc/block_handle.hpp).
// Prints one PASS or FAIL line per case and a count; exits 0 when all passed, 77 without a GPU.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <strata/default_pool.hpp>
#include <strata/ipc/export_block.hpp>
#include <strata/ipc/imported_block.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/source/async_source.hpp>
#include <strata/source/device_source.hpp>

namespace ipc = strata::ipc;

namespace {

__global__ void fill_kernel(std::uint32_t* p, std::size_t n, std::uint32_t seed)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = seed ^ static_cast<std::uint32_t>(i * 2654435761u);
}

__global__ void count_kernel(const std::uint32_t* p, std::size_t n, std::uint32_t seed, unsigned long long* wrong)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    if (p[i] != (seed ^ static_cast<std::uint32_t>(i * 2654435761u))) atomicAdd(wrong, 1ull);
}

void fill(void* p, std::size_t bytes, std::uint32_t seed)
{
  fill_kernel<<<256, 256>>>(static_cast<std::uint32_t*>(p), bytes / 4, seed);
  strata::detail::cuda_check(cudaDeviceSynchronize(), "fill");
}

/// Words of p not holding fill(seed)'s pattern (the current device runs the kernel).
unsigned long long mismatches(const void* p, std::size_t bytes, std::uint32_t seed)
{
  unsigned long long* wrong = nullptr;
  strata::detail::cuda_check(cudaMallocManaged(&wrong, sizeof *wrong), "cudaMallocManaged");
  *wrong = 0;
  count_kernel<<<256, 256>>>(static_cast<const std::uint32_t*>(p), bytes / 4, seed, wrong);
  strata::detail::cuda_check(cudaDeviceSynchronize(), "count");
  const unsigned long long result = *wrong;
  cudaFree(wrong);
  return result;
}

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }
std::string text_of(const std::vector<std::byte>& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

// ---- the child: imports, checks, writes back, closes, answers --------------------------------------------
int child(int socket)
{
  for (;;) {
    ipc::message m = ipc::receive_message(socket);
    const std::string text = text_of(m.payload);
    if (text == "end" || text == "skip") return 0;
    unsigned long long wrong = ~0ull;
    std::string error;
    try {
      ipc::exported_block block{ipc::block_handle::from_bytes(m.payload), std::move(m.fds)};
      const std::uint32_t seed = static_cast<std::uint32_t>(block.handle.bytes);  // the parent's seed
      ipc::imported_block imported = ipc::imported_block::open(std::move(block));
      strata::detail::scoped_device on(imported.device());
      wrong = mismatches(imported.get(), imported.size(), seed);
      fill(imported.get(), imported.size(), seed + 1000);
      imported.close();  // done with it: only now may the exporter free the block
    } catch (const std::exception& e) {
      error = e.what();
    }
    const std::string answer = error.empty() ? "done " + std::to_string(wrong) : "error " + error;
    ipc::send_message(socket, bytes_of(answer));
  }
}

// ---- the parent: one case per kind and device -------------------------------------------------------------
struct tally {
  int passed = 0, failed = 0;
  void report(bool ok, const std::string& what)
  {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    std::fflush(stdout);
    (ok ? passed : failed) += 1;
  }
};

/// Shares [p, p + bytes) (already holding the pattern for seed = bytes) and checks both sides' work.
bool share(int socket, const ipc::exported_block& block, const void* p, std::size_t bytes, std::string& detail)
{
  ipc::send_block(socket, block);
  const std::string answer = text_of(ipc::receive_message(socket).payload);
  if (answer.rfind("done ", 0) != 0) {
    detail = "child: " + answer;
    return false;
  }
  const unsigned long long child_saw = std::stoull(answer.substr(5));
  const unsigned long long parent_sees = mismatches(p, bytes, static_cast<std::uint32_t>(bytes) + 1000);
  detail = "child found " + std::to_string(child_saw) + " wrong words, parent " + std::to_string(parent_sees);
  return child_saw == 0 && parent_sees == 0;
}

template <class Alloc, class Free, class Export>
void run_case(tally& t, int socket, int device, const char* kind, std::size_t bytes, Alloc alloc, Free free_block, Export export_it)
{
  std::string detail;
  bool ok = false;
  try {
    strata::detail::scoped_device on(device);
    void* p = alloc(bytes);
    fill(p, bytes, static_cast<std::uint32_t>(bytes));
    const ipc::exported_block block = export_it(p, bytes);
    detail = "offset " + std::to_string(block.handle.offset) + ", " + std::to_string(block.fds.size()) + " fds; ";
    std::string rest;
    ok = share(socket, block, p, bytes, rest);
    detail += rest;
    free_block(p, bytes);
  } catch (const std::exception& e) {
    detail += e.what();
  }
  t.report(ok, std::string(kind) + " on device " + std::to_string(device) + ": " + detail);
}

int parent(int socket, int devices)
{
  tally t;
  for (int device = 0; device < devices && device < 2; ++device) {
    strata::detail::scoped_device on(device);
    {
      strata::coalescing_pool<strata::device_source> pool{strata::device_source(device)};
      void* first = pool.allocate(1 << 16);  // so the shared block does not start its chunk
      run_case(t, socket, device, "cuda_malloc (coalescing_pool<device_source>)", (3 << 20) + 4096,
               [&](std::size_t n) { return pool.allocate(n); }, [&](void* p, std::size_t n) { pool.deallocate(p, n); },
               [](void* p, std::size_t n) { return ipc::export_cuda_malloc(p, n); });
      pool.deallocate(first, 1 << 16);
    }
    {
      strata::async_source pool({.device = device, .handle_type = cudaMemHandleTypePosixFileDescriptor});
      run_case(t, socket, device, "memory_pool (async_source)", (5 << 20) + 256,
               [&](std::size_t n) { return pool.allocate(n); }, [&](void* p, std::size_t n) { pool.deallocate(p, n); },
               [&](void* p, std::size_t n) { return ipc::export_pool_block(pool, p, n); });
      cudaDeviceSynchronize();
    }
    {
      strata::mapped_pool<strata::driver_pages> pool{
        strata::driver_pages(device, 0, {}, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        {.max_mapping = 8 << 20}};
      void* first = pool.allocate(1 << 20);
      run_case(t, socket, device, "mapped_pages (mapped_pool<driver_pages>)", (19 << 20) + 512,
               [&](std::size_t n) { return pool.allocate(n); }, [&](void* p, std::size_t n) { pool.deallocate(p, n); },
               [&](void* p, std::size_t n) { return ipc::export_mapped_block(pool, p, n); });
      pool.deallocate(first, 1 << 20);
    }
    {
      strata::default_pool pool = strata::make_default_pool(
        {.device = device, .max_fraction = 0.5, .handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR});
      run_case(t, socket, device, "mapped_pages (default_pool)", (7 << 20) + 1024,
               [&](std::size_t n) { return pool.allocate(n); }, [&](void* p, std::size_t n) { pool.deallocate(p, n); },
               [&](void* p, std::size_t n) { return ipc::export_mapped_block(pool.policy(), p, n); });
    }
  }
  ipc::send_message(socket, bytes_of(std::string("end")));
  std::printf("ipc_two_processes: %d passed, %d failed\n", t.passed, t.failed);
  return t.failed == 0 ? 0 : 1;
}

} // namespace

int main()
{
  auto [parent_end, child_end] = ipc::socket_pair();
  std::fflush(stdout);
  const pid_t pid = ::fork();  // before any CUDA call: the child initializes CUDA on its own
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {
    parent_end.reset();
    int status = 1;
    try {
      status = child(child_end.get());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    std::fflush(stdout);
    ::_exit(status);
  }
  child_end.reset();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    ipc::send_message(parent_end.get(), bytes_of(std::string("skip")));
    ::waitpid(pid, nullptr, 0);
    std::printf("ipc_two_processes: no GPU here; this example needs one\n");
    return 77;
  }
  int status = 1;
  try {
    status = parent(parent_end.get(), devices);
  } catch (const std::exception& e) {
    std::printf("FAIL parent: %s\n", e.what());
  }
  parent_end.reset();
  int child_status = 0;
  ::waitpid(pid, &child_status, 0);
  if (!WIFEXITED(child_status) || WEXITSTATUS(child_status) != 0) {
    std::printf("FAIL the child process ended badly (status %d)\n", child_status);
    status = 1;
  }
  return status;
}
