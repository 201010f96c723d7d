// From the configuration to one device's stack (stack_builder.hpp).
#include "stack_builder.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <strata/adaptor/statistics.hpp>
#include <strata/default_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>

namespace strata::plugin {

namespace {

/// stream_ordered's options for every stack. PyTorch's side streams (a data loader's copy stream with
/// record_stream) mostly reuse their own frees, yet their presence made every free of the main stream record
/// an event (bench/torch_loop_sim.cpp: 0.98 per free): past owner_cover_window main-stream frees (default
/// 4096) that no other stream needed, frees carry no event, and the next stream to need them waits for the
/// device once. PyTorch announces its captures (begin_allocate_to_pool, which also makes every earlier free
/// safe), and events stay on while a capture may be under way; streams are asked about capture only then
/// (check_capture=false), not at every call.
template <class Stack>
typename Stack::options stream_options(const alloc_conf& c)
{
  typename Stack::options o;
  o.owner_cover_window = c.owner_cover_window;
  o.check_capture = c.check_capture;
  return o;
}

void require_cuda_device(int device)
{
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string("no CUDA device (cudaGetDeviceCount: ") +
                             (status != cudaSuccess ? cudaGetErrorString(status) : "0 devices") +
                             "); stack=simulated runs without one");
  }
  if (device >= count)
    throw std::invalid_argument("device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " CUDA devices)");
}

std::size_t device_total_memory(int device)
{
  std::size_t free_bytes = 0, total_bytes = 0;
  strata::detail::scoped_device on(device);
  strata::detail::cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return total_bytes;
}

std::vector<int> peers_for(const alloc_conf& c, int device)
{
  std::vector<int> peers;
  if (c.peers == alloc_conf::peer_mode::list) {
    for (int p : c.peer_list)
      if (p != device) peers.push_back(p);
  } else if (c.peers == alloc_conf::peer_mode::all) {
    int count = 0;
    strata::detail::cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    for (int p = 0; p < count; ++p) {
      int can = 0;
      if (p != device && cudaDeviceCanAccessPeer(&can, p, device) == cudaSuccess && can) peers.push_back(p);
    }
    (void)cudaGetLastError();
  }
  return peers;
}

/// Whether the device's physical allocations can be exported as POSIX file descriptors, which is how another
/// process maps a page-mapped block (torch.multiprocessing; ipc_handles.hpp). Asked, not assumed: cuMemCreate
/// refuses a handle type the device lacks, and the pages must still be made there.
bool exports_descriptors(int device)
{
  using get_fn = CUresult (*)(CUdevice*, int);
  using attribute_fn = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  static const auto get = strata::detail::driver_entry_point<get_fn>("cuDeviceGet");
  static const auto attribute = strata::detail::driver_entry_point<attribute_fn>("cuDeviceGetAttribute");
  if (get == nullptr || attribute == nullptr) return false;
  CUdevice dev = 0;
  int supported = 0;
  return get(&dev, device) == CUDA_SUCCESS &&
         attribute(&supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev) == CUDA_SUCCESS && supported != 0;
}

std::string trace_path(const alloc_conf& c, int device)
{
  return device == 0 ? c.record : c.record + "." + std::to_string(device);
}

template <class Stack>
std::unique_ptr<device_stack> hold(Stack stack, const alloc_conf& c, int device)
{
  if (c.record.empty()) return std::make_unique<stack_holder<Stack, false>>(std::move(stack));
  return std::make_unique<stack_holder<Stack, true>>(std::move(stack), trace_path(c, device));
}

std::size_t cap_of(const alloc_conf& c, std::size_t device_memory)
{
  if (c.limit_bytes) return *c.limit_bytes;
  if (c.limit_fraction) return static_cast<std::size_t>(*c.limit_fraction * static_cast<double>(device_memory));
  return SIZE_MAX;
}

built_stack build_simulated(const alloc_conf& c, int device, simulated_streams& world)
{
  if (device >= c.sim_devices)
    throw std::invalid_argument("device " + std::to_string(device) + " does not exist (sim_devices=" + std::to_string(c.sim_devices) + ")");
  built_stack b;
  b.device_memory = c.sim_capacity;
  b.cap = cap_of(c, c.sim_capacity);
  mapped_pool<simulated_pages>::options opts;
  opts.max_physical = std::min(b.cap, c.sim_capacity);
  b.stack = hold(planning_pool{mapped_pool<simulated_pages>{simulated_pages{c.sim_page, c.sim_capacity}, opts},
                               stream_options<planning_pool>(c), simulated_events{world}},
                 c, device);
  b.simulated = true;
  return b;
}

built_stack build_cuda(const alloc_conf& c, int device)
{
  require_cuda_device(device);
  built_stack b;
  b.device_memory = device_total_memory(device);
  b.cap = cap_of(c, b.device_memory);
  if (c.stack == stack_kind::default_pool) {
    default_pool_options o;
    o.device = device;
    o.max_physical = b.cap;
    o.peers = peers_for(c, device);
    if (exports_descriptors(device)) o.handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // torch.multiprocessing
    o.stream = stream_options<default_pool>(c);
    if (c.reclaim == alloc_conf::reclaim_mode::never) o.pool.reclaim_slack = SIZE_MAX;
    o.pool.relocate_idle = c.reclaim == alloc_conf::reclaim_mode::relocate_idle;
    o.pool.reclaim_slack_fraction = c.reclaim_slack_fraction;
    o.pool.reclaim_headroom_fraction = c.reclaim_headroom_fraction;
    b.stack = hold(make_default_pool(o), c, device);
  } else {
    strata::detail::scoped_device on(device);
    // The chunks come through a counter: memory_stats' num_device_alloc and num_device_free are its counts.
    using chunk_source = statistics<device_source>;
    using coalescing_stack = stream_ordered<coalescing_pool<chunk_source>>;
    coalescing_pool<chunk_source>::options chunks{};
    chunks.return_free_chunks = c.return_free_chunks;
    chunks.max_reserved = b.cap;
    b.stack = hold(coalescing_stack{coalescing_pool<chunk_source>{chunk_source{device_source{device}}, chunks}, stream_options<coalescing_stack>(c)}, c, device);
  }
  strata::detail::scoped_device on(device);
  b.context = strata::detail::current_context();
  return b;
}

} // namespace

built_stack build_stack(const alloc_conf& c, int device, simulated_streams* world)
{
  if (c.stack != stack_kind::simulated) return build_cuda(c, device);
  if (world == nullptr) throw std::logic_error("stack=simulated: no simulated devices to build on");
  return build_simulated(c, device, *world);
}

} // namespace strata::plugin
