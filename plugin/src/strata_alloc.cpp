// libstrata_alloc.so: the C entry points of plugin/include/strata_alloc.h over one strata stack per device.
//
// Threads: PyTorch calls from many threads. Each device's stack has its own mutex (the simulated devices
// share one: they share one pretend GPU); building a stack takes the configuration mutex too. Statistics are
// kept under the device's mutex. A caller may hold the device's mutex across several entry points
// (strata_device_lock, which strata's PyTorch backend takes for its own books): they do not lock it again.
// Lifetime: the state is created on first use and never destroyed. PyTorch frees tensors during interpreter
// teardown, after static destructors may have run, and the CUDA runtime may be gone by then: a stack that
// outlived its process costs nothing, a destroyed one would crash the frees that come after it.
#include <strata_alloc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include <strata/default_pool.hpp>
#include <strata/sleep/tag_scope.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/source/device_source.hpp>

#include "alloc_conf.hpp"
#include "device_stack.hpp"

namespace {

using namespace strata;
using namespace strata::plugin;

constexpr int max_devices = 64;

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

thread_local std::string last_error;
std::atomic<void (*)(const char*)> oom_handler{nullptr};

void set_error(const char* where, const std::exception& e) noexcept
{
  try {
    last_error = std::string("strata ") + where + ": " + e.what();
  } catch (...) {
  }
}
void set_error(const char* where, const std::string& what) noexcept
{
  try {
    last_error = *where != '\0' ? std::string("strata ") + where + ": " + what : what;
  } catch (...) {
  }
}

/// PyTorch's names where the meaning is the same (bytes as requested, counts of allocations).
struct device_stats {
  std::size_t allocated = 0, allocated_peak = 0;
  std::size_t reserved_peak = 0;
  std::uint64_t allocations_current = 0, allocations_peak = 0, allocations_total = 0, frees_total = 0;
  std::uint64_t num_ooms = 0, num_alloc_retries = 0;
};

/// CuPy's free passes neither size nor stream: they are remembered at allocation.
struct cupy_block {
  std::size_t size;
  cudaStream_t stream;
};

struct device_slot {
  std::mutex own_mutex;
  std::mutex* mutex = &own_mutex;
  std::atomic<bool> built{false};
  std::unique_ptr<device_stack> stack;
  bool simulated = false;
  void* context = nullptr;          ///< the device's primary context (a real stack's), seen when it was built
  std::size_t cap = SIZE_MAX;       ///< bytes the stack may hold from CUDA, so in use too (limit=, set_memory_fraction)
  std::size_t pool_cap = SIZE_MAX;  ///< the stack's own physical cap, fixed when built (limit=)
  std::size_t device_memory = 0;
  device_stats stats;
  std::unordered_map<void*, cupy_block> cupy;
  int routes = 0;  ///< graph pools being allocated to (a capture may be under way: no event queries then)
  /// The thread holding the slot through strata_device_lock (none: no one). Written only by the thread that
  /// holds own_mutex, so a thread that reads its own id holds the section.
  std::atomic<std::thread::id> section{};
  int section_depth = 0;       ///< nested strata_device_lock calls of the holder
  bool section_world = false;  ///< the holder took the simulated world's lock too
};

struct plugin_state {
  std::mutex config_mutex;
  std::optional<alloc_conf> conf;
  std::atomic<bool> in_use{false};
  std::array<device_slot, max_devices> slots;
  std::mutex world_mutex;  ///< the simulated devices' one lock
  std::unique_ptr<simulated_streams> world;
  std::atomic<bool> atexit_registered{false};
  /// PyTorch's per_process_memory_fraction (strata_apply_torch_conf): each stack starts under it.
  std::optional<double> torch_fraction;
};

/// A device slot's lock for one entry point: none inside a section its thread holds (strata_device_lock),
/// except the simulated world's when its stack was built inside the section.
class slot_lock {
public:
  explicit slot_lock(device_slot& s) : m_(needs_lock(s) ? s.mutex : nullptr)
  {
    if (m_ != nullptr) m_->lock();
  }
  ~slot_lock()
  {
    if (m_ != nullptr) m_->unlock();
  }
  slot_lock(const slot_lock&) = delete;
  slot_lock& operator=(const slot_lock&) = delete;

private:
  static bool needs_lock(const device_slot& s) noexcept
  {
    const std::thread::id holder = s.section.load(std::memory_order_relaxed);
    if (holder == std::thread::id{} || holder != std::this_thread::get_id()) return true;
    return s.mutex != &s.own_mutex && !s.section_world;
  }
  std::mutex* m_;
};

plugin_state& state()
{
  static plugin_state* s = new plugin_state;  // never destroyed: see the file comment
  return *s;
}

/// The configuration; on first need, STRATA_ALLOC_CONF's (a bad string throws, every time: no silent default).
const alloc_conf& conf_locked(plugin_state& st)
{
  if (!st.conf) {
    const char* env = std::getenv("STRATA_ALLOC_CONF");
    st.conf = parse_alloc_conf(env != nullptr ? env : "");
  }
  return *st.conf;
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

void build_simulated(plugin_state& st, device_slot& s, const alloc_conf& c, int device)
{
  if (device >= c.sim_devices)
    throw std::invalid_argument("device " + std::to_string(device) + " does not exist (sim_devices=" + std::to_string(c.sim_devices) + ")");
  if (!st.world) st.world = std::make_unique<simulated_streams>();
  s.device_memory = c.sim_capacity;
  s.cap = s.pool_cap = cap_of(c, c.sim_capacity);
  mapped_pool<simulated_pages>::options opts;
  opts.max_physical = std::min(s.cap, c.sim_capacity);
  s.stack = hold(planning_pool{mapped_pool<simulated_pages>{simulated_pages{c.sim_page, c.sim_capacity}, opts},
                               stream_options<planning_pool>(c), simulated_events{*st.world}},
                 c, device);
  s.mutex = &st.world_mutex;
  s.simulated = true;
}

void build_cuda(device_slot& s, const alloc_conf& c, int device)
{
  require_cuda_device(device);
  s.device_memory = device_total_memory(device);
  s.cap = s.pool_cap = cap_of(c, s.device_memory);
  if (c.stack == stack_kind::default_pool) {
    default_pool_options o;
    o.device = device;
    o.max_physical = s.cap;
    o.peers = peers_for(c, device);
    if (exports_descriptors(device)) o.handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // torch.multiprocessing
    o.stream = stream_options<default_pool>(c);
    if (c.reclaim == alloc_conf::reclaim_mode::never) o.pool.reclaim_slack = SIZE_MAX;
    o.pool.relocate_idle = c.reclaim == alloc_conf::reclaim_mode::relocate_idle;
    o.pool.reclaim_slack_fraction = c.reclaim_slack_fraction;
    o.pool.reclaim_headroom_fraction = c.reclaim_headroom_fraction;
    s.stack = hold(make_default_pool(o), c, device);
  } else {
    strata::detail::scoped_device on(device);
    // The chunks come through a counter: memory_stats' num_device_alloc and num_device_free are its counts.
    using chunk_source = statistics<device_source>;
    using coalescing_stack = stream_ordered<coalescing_pool<chunk_source>>;
    coalescing_pool<chunk_source>::options chunks{};
    chunks.return_free_chunks = c.return_free_chunks;
    chunks.max_reserved = s.cap;
    s.stack = hold(coalescing_stack{coalescing_pool<chunk_source>{chunk_source{device_source{device}}, chunks}, stream_options<coalescing_stack>(c)}, c, device);
  }
  strata::detail::scoped_device on(device);
  s.context = strata::detail::current_context();
}

void flush_all_traces() noexcept;

/// The cap at `fraction` of the device's memory, never above the configured limit; what the stack holds
/// follows it. The slot's lock held (or the slot not yet published).
void apply_fraction(device_slot& s, double fraction) noexcept
{
  const auto wanted = static_cast<std::size_t>(fraction * static_cast<double>(s.device_memory));
  s.cap = std::min(wanted, s.pool_cap);
  s.stack->set_reserved_cap(s.cap);  // the fraction caps what strata holds, as limit= does
}

/// The device's slot with its stack built (first use: from the configuration). Throws what refused it.
device_slot& slot_for(int device)
{
  if (device < 0 || device >= max_devices)
    throw std::invalid_argument("device " + std::to_string(device) + " is out of range [0, " + std::to_string(max_devices) + ")");
  plugin_state& st = state();
  device_slot& s = st.slots[static_cast<std::size_t>(device)];
  if (s.built.load(std::memory_order_acquire)) return s;
  std::lock_guard config_lock(st.config_mutex);
  if (s.built.load(std::memory_order_relaxed)) return s;
  const alloc_conf& c = conf_locked(st);
  if (c.stack == stack_kind::simulated) {
    std::lock_guard world_lock(st.world_mutex);
    build_simulated(st, s, c, device);
  } else {
    build_cuda(s, c, device);
  }
  if (st.torch_fraction) apply_fraction(s, *st.torch_fraction);
  if (!c.record.empty() && !st.atexit_registered.exchange(true)) std::atexit(flush_all_traces);
  st.in_use.store(true, std::memory_order_release);
  s.built.store(true, std::memory_order_release);
  return s;
}

/// Makes the device current for a real stack's call (its events are created on the current device). PyTorch
/// calls from the device it allocates on: then the device's context is already current, which one driver
/// query tells (cudaGetDevice alone costs several times more, and a scoped_device twice that).
struct device_scope {
  std::optional<strata::detail::scoped_device> on;
  device_scope(const device_slot& s, int device)
  {
    if (s.simulated || (s.context != nullptr && strata::detail::current_context() == s.context)) return;
    on.emplace(device);
  }
};

/// Counts an allocation; the reserved peak is the caller's (note_reserved), from whichever read of the
/// stack it makes anyway.
void account_alloc(device_slot& s, std::size_t size) noexcept
{
  device_stats& st = s.stats;
  st.allocated += size;
  st.allocated_peak = std::max(st.allocated_peak, st.allocated);
  ++st.allocations_current;
  st.allocations_peak = std::max(st.allocations_peak, st.allocations_current);
  ++st.allocations_total;
}

void note_reserved(device_slot& s, std::size_t reserved) noexcept { s.stats.reserved_peak = std::max(s.stats.reserved_peak, reserved); }

void account_free(device_slot& s, std::size_t size) noexcept
{
  s.stats.allocated -= std::min(size, s.stats.allocated);
  if (s.stats.allocations_current > 0) --s.stats.allocations_current;
  ++s.stats.frees_total;
}

/// Allocates with the device's lock held. Out of memory: idle memory is released and the request retried
/// once (release_on_oom; not while a pool is being allocated to); failing that, num_ooms counts it and the
/// exception (std::bad_alloc) goes to the caller.
void* allocate_locked(device_slot& s, std::size_t size, cudaStream_t stream)
{
  // Held blocks are given back only outside captures: querying an event during a global-mode capture is
  // illegal (PyTorch's caching allocator skips its event processing then too).
  if (s.routes == 0) s.stack->reap();
  if (size > s.cap - std::min(s.cap, s.stats.allocated)) {
    ++s.stats.num_ooms;
    throw out_of_memory("strata plug-in", size, "limit " + std::to_string(s.cap) + " bytes, " + std::to_string(s.stats.allocated) + " in use");
  }
  void* p = nullptr;
  try {
    p = s.stack->allocate(size, stream);
  } catch (const std::bad_alloc&) {
    // Releasing waits for the device (held blocks' events, then the device), which a capture forbids and may
    // break: while a pool is being allocated to, a capture may be under way, and the request stays refused,
    // as PyTorch's allocator frees nothing that needs a wait while its pools are being allocated to.
    if (!state().conf->release_on_oom || s.routes > 0) {
      ++s.stats.num_ooms;
      throw;
    }
    ++s.stats.num_alloc_retries;
    s.stack->release();
    try {
      p = s.stack->allocate(size, stream);
    } catch (const std::bad_alloc&) {
      ++s.stats.num_ooms;
      throw;
    }
  } catch (const usage_error& e) {
    // The stream layer refuses to let its policy grow under a capture when growing needs a device wait (a
    // reclaim at the cap), nesting the policy's failure: memory is short, and PyTorch's caller expects
    // torch.OutOfMemoryError, not a RuntimeError.
    if (s.routes == 0 || dynamic_cast<const std::nested_exception*>(&e) == nullptr) throw;
    ++s.stats.num_ooms;
    throw out_of_memory("strata plug-in", size, e.what());
  }
  account_alloc(s, size);
  return p;
}

void* allocate(std::size_t size, int device, cudaStream_t stream)
{
  if (size == 0) return nullptr;
  device_slot& s = slot_for(device);
  slot_lock lock(s);
  device_scope on(s, device);
  void* p = allocate_locked(s, size, stream);
  note_reserved(s, s.stack->usage().reserved);
  return p;
}

void free_locked(device_slot& s, void* ptr, std::size_t size, cudaStream_t stream) noexcept
{
  s.stack->deallocate(ptr, size, stream);
  account_free(s, size);
}

/// The device's figures from one read of the stack; the slot's lock held.
void fill_figures(const device_slot& s, const stack_reading& r, strata_device_figures* out) noexcept
{
  *out = strata_device_figures{};
  out->reserved = r.usage.reserved;
  out->in_use = r.usage.in_use;
  out->largest_free = r.usage.largest_free;
  out->chunks = r.usage.chunks;
  out->free_blocks = r.usage.free_blocks;
  out->held_bytes = r.held_bytes;
  out->held_blocks = r.held_blocks;
  out->allocated = s.stats.allocated;
  out->limit = s.cap;
  out->device_memory = s.device_memory;
  out->device_allocs = r.page_creates;
  out->device_frees = r.page_releases;
  out->releasable = r.releasable;
  out->alloc_retries = s.stats.num_alloc_retries;
  out->ooms = s.stats.num_ooms;
}

/// The device's figures as they stand; the slot's lock held.
void fill_figures(device_slot& s, strata_device_figures* out) noexcept { fill_figures(s, s.stack->read(), out); }

/// A built slot, or null (nothing was ever allocated there).
device_slot* built_slot(int device) noexcept
{
  if (device < 0 || device >= max_devices) return nullptr;
  device_slot& s = state().slots[static_cast<std::size_t>(device)];
  return s.built.load(std::memory_order_acquire) ? &s : nullptr;
}

void flush_all_traces() noexcept
{
  for (int d = 0; d < max_devices; ++d)
    if (device_slot* s = built_slot(d)) {
      slot_lock lock(*s);
      (void)s->stack->flush_trace();
    }
}

std::uint64_t pool_key(std::pair<unsigned long long, unsigned long long> id) noexcept
{
  // PyTorch numbers graph pools {n, 0} and user MemPools {0, n} from two counters: keep them apart.
  return id.first != 0 ? id.first : (id.second | (std::uint64_t{1} << 63));
}

std::string stats_json(device_slot* s, const std::string& stack_name)
{
  device_stats st{};
  strata::usage u{};
  std::size_t held = 0;
  stack_calls calls{};
  if (s != nullptr) {
    slot_lock lock(*s);
    st = s->stats;
    u = s->stack->usage();
    held = s->stack->held_bytes();
    calls = s->stack->calls();
  }
  auto field = [](std::string& out, const char* key, auto value) {
    out += '"';
    out += key;
    out += "\":";
    if constexpr (std::is_floating_point_v<decltype(value)>) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.6g", value);
      out += buf;
    } else {
      out += std::to_string(value);
    }
    out += ',';
  };
  std::string out = "{";
  field(out, "allocated_bytes.all.current", st.allocated);
  field(out, "allocated_bytes.all.peak", st.allocated_peak);
  field(out, "active_bytes.all.current", st.allocated + held);
  field(out, "reserved_bytes.all.current", u.reserved);
  field(out, "reserved_bytes.all.peak", std::max(st.reserved_peak, u.reserved));
  field(out, "allocation.all.current", st.allocations_current);
  field(out, "allocation.all.peak", st.allocations_peak);
  field(out, "allocation.all.allocated", st.allocations_total);
  field(out, "allocation.all.freed", st.frees_total);
  field(out, "segment.all.current", u.chunks);
  field(out, "num_alloc_retries", st.num_alloc_retries);
  field(out, "num_ooms", st.num_ooms);
  field(out, "strata.fragmentation", u.fragmentation());
  field(out, "strata.largest_free", u.largest_free);
  field(out, "strata.in_use_bytes", u.in_use);
  field(out, "strata.held_for_other_streams_bytes", held);
  field(out, "strata.limit_bytes", s != nullptr ? s->cap : std::size_t{0});
  // What the stack asked of CUDA so far (counts since the stack was built): a loop whose counts grow per step
  // pays driver calls or waits every step.
  field(out, "strata.calls.events", calls.events);
  field(out, "strata.calls.stream_waits", calls.stream_waits);
  field(out, "strata.calls.host_waits", calls.host_waits);
  field(out, "strata.calls.policy", calls.policy_calls);
  field(out, "strata.calls.relocations", calls.relocations);
  field(out, "strata.calls.page_maps", calls.pages.maps);
  field(out, "strata.calls.page_unmaps", calls.pages.unmaps);
  field(out, "strata.calls.page_creates", calls.pages.creates);
  field(out, "strata.calls.page_releases", calls.pages.releases);
  field(out, "strata.calls.page_access", calls.pages.access_calls);
  field(out, "strata.calls.page_device_waits", calls.pages.synchronizes);
  out += "\"strata.stack\":\"";
  out += stack_name;
  out += "\"}";
  return out;
}

std::size_t copy_out(const std::string& text, char* buf, std::size_t len) noexcept
{
  if (buf != nullptr && len > text.size()) {
    text.copy(buf, text.size());
    buf[text.size()] = '\0';
  }
  return text.size();
}

simulated_streams* world_or_error(const char* where) noexcept
{
  plugin_state& st = state();
  std::lock_guard config_lock(st.config_mutex);
  try {
    if (conf_locked(st).stack != stack_kind::simulated) {
      set_error(where, std::string("only with stack=simulated"));
      return nullptr;
    }
  } catch (const std::exception& e) {
    set_error(where, e);
    return nullptr;
  }
  std::lock_guard world_lock(st.world_mutex);
  if (!st.world) st.world = std::make_unique<simulated_streams>();
  return st.world.get();
}

/// This thread's tags before each strata_tag_begin still open.
thread_local std::vector<tag_id> tag_stack;

/// Calls f on every device's built stack under its lock: 0, or -1 with the (last) failure's message. Stops at
/// the first failure unless `every_device` (a reset goes on to the other devices).
template <class F>
int for_each_built(const char* where, F&& f, bool every_device = false) noexcept
{
  int status = 0;
  for (int d = 0; d < max_devices; ++d) {
    device_slot* s = built_slot(d);
    if (s == nullptr) continue;
    slot_lock lock(*s);
    try {
      device_scope on(*s, d);
      f(*s->stack);
    } catch (const std::exception& e) {
      set_error(where, e);
      status = -1;
      if (!every_device) return status;
    }
  }
  return status;
}

/// The tags of `asked` for which `on_device` holds: a tag pauses and resumes on the devices it lives on.
template <class Pred>
std::vector<tag_id> tags_where(std::span<const tag_id> asked, Pred&& on_device)
{
  std::vector<tag_id> here;
  for (tag_id t : asked)
    if (on_device(t)) here.push_back(t);
  return here;
}

/// True when every tag of `asked` satisfies `on` on some device; otherwise sets the error naming the first
/// that does not (`what`: why it cannot be paused or resumed) and returns false, nothing changed.
template <class Pred>
bool every_tag_somewhere(const char* where, std::span<const tag_id> asked, Pred&& on, const char* what) noexcept
{
  try {
    for (tag_id t : asked) {
      bool found = false;
      for (int d = 0; d < max_devices && !found; ++d) {
        device_slot* s = built_slot(d);
        if (s == nullptr) continue;
        slot_lock lock(*s);
        found = on(*s->stack, t);
      }
      if (!found) {
        set_error(where, std::string("tag ") + std::to_string(t) + " " + what + " on any device");
        return false;
      }
    }
    return true;
  } catch (const std::exception& e) {
    set_error(where, e);
    return false;
  }
}

} // namespace

extern "C" {

void* strata_malloc(size_t size, int device, cudaStream_t stream)
{
  try {
    return allocate(size, device, stream);
  } catch (const std::exception& e) {
    set_error("malloc", e);
  } catch (...) {
    set_error("malloc", std::string("unknown exception"));
  }
  return nullptr;
}

void strata_set_oom_handler(void (*handler)(const char* message)) { oom_handler.store(handler); }

void strata_report_error(const char* message) { set_error("", std::string(message != nullptr ? message : "")); }

void* strata_malloc_or_throw(size_t size, int device, cudaStream_t stream)
{
  try {
    return allocate(size, device, stream);
  } catch (const std::bad_alloc& e) {
    set_error("malloc", e);
    if (const auto handler = oom_handler.load()) handler(last_error.c_str());  // throws the framework's type
    throw;
  } catch (const std::exception& e) {
    set_error("malloc", e);
    throw std::runtime_error(last_error);
  }
}

void strata_free(void* ptr, size_t size, int device, cudaStream_t stream)
{
  if (ptr == nullptr) return;
  strata_free_observed(ptr, size, device, stream, nullptr);
}

void strata_init(int /*device_count*/)
{
  // Nothing to do: stacks are built per device on first use. Configuration errors surface at the first
  // allocation (and at strata_check_env / strata_configure, which the Python module calls first).
}

void strata_reset(void)
{
  for (int d = 0; d < max_devices; ++d)
    if (built_slot(d) != nullptr) (void)strata_reset_device(d);
}

int strata_reset_device(int device)
{
  device_slot* s = built_slot(device);
  if (s == nullptr) return 0;  // nothing built: nothing held
  slot_lock lock(*s);
  if (s->routes > 0) return 0;  // see strata_alloc.h: a capture may be under way
  try {
    device_scope on(*s, device);
    s->stack->release();
    return 0;
  } catch (const std::exception& e) {
    set_error("reset", e);
    return -1;
  }
}

void strata_record_stream_on(int device, void* ptr, cudaStream_t stream)
{
  if (ptr == nullptr) return;
  device_slot* s = built_slot(device);
  if (s == nullptr) return set_error("record_stream", std::string("device has no stack: the pointer is not strata's"));
  slot_lock lock(*s);
  if (!s->stack->owns(ptr)) return set_error("record_stream", std::string("the pointer is not a strata block of device ") + std::to_string(device));
  try {
    s->stack->record_use(ptr, stream);
  } catch (const std::exception& e) {
    set_error("record_stream", e);
  }
}

void strata_set_memory_fraction(double fraction, int device)
{
  try {
    if (!(fraction > 0.0 && fraction <= 1.0))
      throw std::invalid_argument("fraction " + std::to_string(fraction) + " is not in (0, 1]");
    device_slot& s = slot_for(device);
    slot_lock lock(s);
    const auto wanted = static_cast<std::size_t>(fraction * static_cast<double>(s.device_memory));
    apply_fraction(s, fraction);
    if (wanted > s.pool_cap)
      set_error("set_memory_fraction", "fraction " + std::to_string(fraction) + " is above the configured limit of " +
                                           std::to_string(s.pool_cap) + " bytes, which the stack was built with: capped there");
  } catch (const std::exception& e) {
    set_error("set_memory_fraction", e);
  }
}

void strata_record_stream(void* ptr, cudaStream_t stream)
{
  if (ptr == nullptr) return;
  for (int d = 0; d < max_devices; ++d) {
    device_slot* s = built_slot(d);
    if (s == nullptr) continue;
    slot_lock lock(*s);
    if (!s->stack->owns(ptr)) continue;
    try {
      s->stack->record_use(ptr, stream);
    } catch (const std::exception& e) {
      set_error("record_stream", e);
    }
    return;
  }
  set_error("record_stream", std::string("the pointer is not a strata block"));
}

long strata_share_block(void* ptr, size_t* offset, size_t* mapping_bytes, int* fds, size_t capacity)
{
  if (ptr == nullptr) return 0;
  for (int d = 0; d < max_devices; ++d) {
    device_slot* s = built_slot(d);
    if (s == nullptr) continue;
    slot_lock lock(*s);
    if (!s->stack->owns(ptr)) continue;
    try {
      strata::plugin::shared_block b = s->stack->share(ptr);
      const std::size_t n = b.fds.size();
      if (n == 0 || n > capacity) return static_cast<long>(n);  // too little room: the descriptors close here
      if (offset == nullptr || mapping_bytes == nullptr || fds == nullptr)
        throw std::invalid_argument("null output for " + std::to_string(n) + " mappings");
      *offset = b.offset;
      for (std::size_t i = 0; i < n; ++i) {
        mapping_bytes[i] = b.mapping_bytes[i];
        fds[i] = b.fds[i].release();
      }
      return static_cast<long>(n);
    } catch (const std::exception& e) {
      set_error("share_block", e);
      return -1;
    }
  }
  return 0;
}

void* strata_base_alloc(void* ptr, size_t* size)
{
  // PyTorch shares a CUDA tensor with another process (torch.multiprocessing) as an IPC handle of the base
  // allocation plus the tensor's offset in it: the base must be the allocation CUDA knows (a cudaMalloc'd
  // chunk of the coalescing stack), not the block. The driver's cuMemGetAddressRange says which, for every
  // stack; where it cannot (no driver, not device memory), the block is its own base.
  using get_range_fn = int (*)(unsigned long long* base, std::size_t* bytes, unsigned long long address);
  static const auto get_range = strata::detail::driver_entry_point<get_range_fn>("cuMemGetAddressRange");
  if (ptr == nullptr || get_range == nullptr) return ptr;
  // The driver call needs a current context, which a thread that made no runtime call yet lacks: bind the
  // current device's primary context (unified addressing lets it answer for any device's pointer).
  if (!strata::detail::context_current()) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
      (void)cudaGetLastError();
      return ptr;
    }
  }
  unsigned long long base = 0;
  std::size_t bytes = 0;
  if (get_range(&base, &bytes, reinterpret_cast<unsigned long long>(ptr)) != 0) return ptr;  // CUDA_SUCCESS is 0
  if (size != nullptr) *size = bytes;
  return reinterpret_cast<void*>(base);
}

int strata_configure(const char* conf)
{
  plugin_state& st = state();
  try {
    std::lock_guard lock(st.config_mutex);
    if (st.in_use.load())
      throw std::logic_error("refused: the allocator is in use (a stack was built); configure before the first allocation");
    st.conf = parse_alloc_conf(conf != nullptr ? conf : "");
    return 0;
  } catch (const std::exception& e) {
    set_error("configure", e);
    return 1;
  }
}

int strata_apply_torch_conf(const char* text)
{
  plugin_state& st = state();
  try {
    torch_conf_reading r;
    {
      std::lock_guard lock(st.config_mutex);
      r = parse_torch_alloc_conf(text != nullptr ? text : "", conf_locked(st).stack);
      if (r.fraction) st.torch_fraction = r.fraction;
    }
    if (r.fraction)
      for (int d = 0; d < max_devices; ++d)
        if (device_slot* s = built_slot(d)) {
          slot_lock lock(*s);
          apply_fraction(*s, *r.fraction);
        }
    if (r.notes.empty()) return 0;
    std::string joined;
    for (const std::string& n : r.notes) joined += (joined.empty() ? "" : "\n") + n;
    set_error("", joined);
    return 1;
  } catch (const std::exception& e) {
    set_error("", e.what());
    return -1;
  }
}

int strata_check_env(void)
{
  try {
    const char* env = std::getenv("STRATA_ALLOC_CONF");
    (void)parse_alloc_conf(env != nullptr ? env : "");
    return 0;
  } catch (const std::exception& e) {
    set_error("check_env", e);
    return 1;
  }
}

const char* strata_last_error(void) { return last_error.c_str(); }

int strata_is_in_use(void) { return state().in_use.load() ? 1 : 0; }

size_t strata_memory_stats_json(int device, char* buf, size_t len)
{
  try {
    if (device < 0 || device >= max_devices) throw std::invalid_argument("device " + std::to_string(device) + " is out of range");
    std::string stack_name;
    {
      std::lock_guard lock(state().config_mutex);
      if (state().conf) stack_name = name_of(state().conf->stack);
    }
    return copy_out(stats_json(built_slot(device), stack_name), buf, len);
  } catch (const std::exception& e) {
    set_error("memory_stats", e);
    return 0;
  }
}

void strata_reset_peak_stats(int device)
{
  device_slot* s = built_slot(device);
  if (s == nullptr) return;
  slot_lock lock(*s);
  s->stats.allocated_peak = s->stats.allocated;
  s->stats.allocations_peak = s->stats.allocations_current;
  s->stats.reserved_peak = s->stack->usage().reserved;
}

size_t strata_snapshot_json(int device, char* buf, size_t len)
{
  try {
    device_slot* s = built_slot(device);
    if (s == nullptr) return copy_out("{\"box\":\"\",\"segments\":[]}", buf, len);
    slot_lock lock(*s);
    return copy_out(s->stack->snapshot_json(), buf, len);
  } catch (const std::exception& e) {
    set_error("snapshot", e);
    return 0;
  }
}

int strata_record_flush(void)
{
  int failed = 0;
  for (int d = 0; d < max_devices; ++d)
    if (device_slot* s = built_slot(d)) {
      slot_lock lock(*s);
      if (!s->stack->flush_trace()) {
        set_error("record_flush", "writing the trace of device " + std::to_string(d) + " failed");
        failed = 1;
      }
    }
  return failed;
}

int strata_device_figures_get(int device, strata_device_figures* out)
{
  if (out == nullptr || device < 0 || device >= max_devices) {
    set_error("device_figures", out == nullptr ? std::string("null output") : "device " + std::to_string(device) + " is out of range");
    return -1;
  }
  *out = strata_device_figures{};
  device_slot* s = built_slot(device);
  if (s == nullptr) return 1;
  slot_lock lock(*s);
  fill_figures(*s, out);
  return 0;
}

int strata_oom_served(int device)
{
  device_slot* s = built_slot(device);
  if (s == nullptr) {
    set_error("oom_served", "device " + std::to_string(device) + " has no stack");
    return -1;
  }
  slot_lock lock(*s);
  if (s->stats.num_ooms == 0) {
    set_error("oom_served", std::string("no out of memory is counted to take back"));
    return -1;
  }
  --s->stats.num_ooms;
  return 0;
}

int strata_device_lock(int device)
{
  if (device < 0 || device >= max_devices) {
    set_error("device_lock", "device " + std::to_string(device) + " is out of range [0, " + std::to_string(max_devices) + ")");
    return -1;
  }
  device_slot& s = state().slots[static_cast<std::size_t>(device)];
  const std::thread::id me = std::this_thread::get_id();
  if (s.section.load(std::memory_order_relaxed) == me) {
    ++s.section_depth;
    return 0;
  }
  // The slot's own mutex: a real stack's lock, and never replaced, so sections exclude each other even across
  // the stack's build. A simulated stack's lock is the world's: taken too once built (a stack built inside the
  // section takes it per call, as outside).
  s.own_mutex.lock();
  s.section_world = s.built.load(std::memory_order_acquire) && s.mutex != &s.own_mutex;
  if (s.section_world) s.mutex->lock();
  s.section_depth = 1;
  s.section.store(me, std::memory_order_relaxed);
  return 0;
}

void strata_device_unlock(int device)
{
  device_slot* s = device >= 0 && device < max_devices ? &state().slots[static_cast<std::size_t>(device)] : nullptr;
  if (s == nullptr || s->section.load(std::memory_order_relaxed) != std::this_thread::get_id())
    return set_error("device_unlock", "this thread does not hold device " + std::to_string(device) + "'s lock");
  if (--s->section_depth > 0) return;
  s->section.store(std::thread::id{}, std::memory_order_relaxed);
  if (s->section_world) s->mutex->unlock();
  s->section_world = false;
  s->own_mutex.unlock();
}

void* strata_malloc_or_throw_observed(size_t size, int device, cudaStream_t stream, strata_device_figures* out)
{
  try {
    if (size == 0) {
      if (out != nullptr) (void)strata_device_figures_get(device, out);
      return nullptr;
    }
    device_slot& s = slot_for(device);
    slot_lock lock(s);
    device_scope on(s, device);
    try {
      void* p = allocate_locked(s, size, stream);
      if (out == nullptr) {
        note_reserved(s, s.stack->usage().reserved);
        return p;
      }
      const stack_reading r = s.stack->read();
      note_reserved(s, r.usage.reserved);
      fill_figures(s, r, out);
      return p;
    } catch (...) {
      if (out != nullptr) fill_figures(s, out);  // what the refusal left: the out-of-memory message quotes it
      throw;
    }
  } catch (const std::bad_alloc& e) {
    set_error("malloc", e);
    if (const auto handler = oom_handler.load()) handler(last_error.c_str());
    throw;
  } catch (const std::exception& e) {
    set_error("malloc", e);
    throw std::runtime_error(last_error);
  }
}

void strata_free_observed(void* ptr, size_t size, int device, cudaStream_t stream, strata_device_figures* out)
{
  if (ptr == nullptr) {
    if (out != nullptr) (void)strata_device_figures_get(device, out);
    return;
  }
  device_slot* s = built_slot(device);
  if (s == nullptr) {
    set_error("free", "device " + std::to_string(device) + " has no stack: the pointer is not strata's (leaked, not freed)");
    if (out != nullptr) *out = strata_device_figures{};
    return;
  }
  slot_lock lock(*s);
  try {
    device_scope on(*s, device);
    free_locked(*s, ptr, size, stream);
  } catch (const std::exception& e) {  // the device could not be made current: free anyway
    set_error("free", e);
    free_locked(*s, ptr, size, stream);
  }
  if (out != nullptr) fill_figures(*s, out);
}

// CuPy: its free passes neither size nor stream, so both are remembered per block.
thread_local cudaStream_t cupy_stream = cudaStreamLegacy;

void strata_tag_begin(unsigned tag)
{
  try {
    tag_stack.push_back(strata::detail::thread_tag);  // first, so a failed push leaves the tag as it was
    strata::detail::thread_tag = tag;
  } catch (const std::exception& e) {
    set_error("tag_begin", e);
  }
}

void strata_tag_end(void)
{
  if (tag_stack.empty()) return set_error("tag_end", std::string("no strata_tag_begin to end"));
  strata::detail::thread_tag = tag_stack.back();
  tag_stack.pop_back();
}

unsigned strata_current_tag(void) { return strata::current_tag(); }

int strata_pause(const unsigned* tags, size_t n, int backup)
{
  const std::span<const tag_id> asked(tags, n);
  if (!every_tag_somewhere("pause", asked, [](const device_stack& s, tag_id t) { return s.holds_tag(t); }, "was never used"))
    return -1;
  return for_each_built("pause", [&](device_stack& stack) {
    const auto here = tags_where(asked, [&](tag_id t) { return stack.holds_tag(t); });
    if (!here.empty()) stack.pause(here, backup != 0);
  });
}

int strata_resume(const unsigned* tags, size_t n)
{
  const std::span<const tag_id> asked(tags, n);
  if (!every_tag_somewhere("resume", asked, [](const device_stack& s, tag_id t) { return s.tag_paused(t); }, "is not paused"))
    return -1;
  return for_each_built("resume", [&](device_stack& stack) {
    const auto here = tags_where(asked, [&](tag_id t) { return stack.tag_paused(t); });
    if (!here.empty()) stack.resume(here);
  });
}

int strata_tag_figures_get(int device, unsigned tag, strata_tag_figures* out)
{
  if (out == nullptr || device < 0 || device >= max_devices || tag >= strata::max_tags) {
    set_error("tag_figures", out == nullptr ? std::string("null output")
                             : tag >= strata::max_tags ? "tag " + std::to_string(tag) + " is not below " + std::to_string(strata::max_tags)
                                                       : "device " + std::to_string(device) + " is out of range");
    return -1;
  }
  *out = strata_tag_figures{};
  device_slot* s = built_slot(device);
  if (s == nullptr) return 1;
  slot_lock lock(*s);
  return s->stack->tag_figures(tag, *out) ? 0 : 1;
}

int strata_reserve_backup(int device, size_t bytes)
{
  try {
    device_slot& s = slot_for(device);
    slot_lock lock(s);
    device_scope on(s, device);
    s.stack->reserve_backup(bytes);
    return 0;
  } catch (const std::exception& e) {
    set_error("reserve_backup", e);
    return -1;
  }
}

size_t strata_release_backup(void)
{
  std::size_t n = 0;
  (void)for_each_built("release_backup", [&](device_stack& stack) { n += stack.release_backup(); });
  return n;
}

void* strata_cupy_malloc(void* /*param*/, size_t size, int device)
{
  try {
    if (size == 0) return nullptr;
    device_slot& s = slot_for(device);
    slot_lock lock(s);
    device_scope on(s, device);
    const cudaStream_t stream = cupy_stream;
    s.cupy.reserve(s.cupy.size() + 1);  // before allocating: the block must never be lost
    void* p = allocate_locked(s, size, stream);
    note_reserved(s, s.stack->usage().reserved);
    s.cupy.emplace(p, cupy_block{size, stream});
    return p;
  } catch (const std::exception& e) {
    set_error("cupy_malloc", e);
    return nullptr;
  }
}

void strata_cupy_free(void* /*param*/, void* ptr, int device)
{
  if (ptr == nullptr) return;
  device_slot* s = built_slot(device);
  if (s == nullptr) return set_error("cupy_free", std::string("device has no stack: the pointer is not strata's"));
  slot_lock lock(*s);
  const auto it = s->cupy.find(ptr);
  if (it == s->cupy.end()) return set_error("cupy_free", std::string("the pointer was not allocated through strata_cupy_malloc"));
  const cupy_block b = it->second;
  s->cupy.erase(it);
  try {
    device_scope on(*s, device);
    free_locked(*s, ptr, b.size, b.stream);
  } catch (const std::exception& e) {
    set_error("cupy_free", e);
    free_locked(*s, ptr, b.size, b.stream);
  }
}

void strata_cupy_set_stream(cudaStream_t stream) { cupy_stream = stream; }


cudaStream_t strata_sim_stream_create(int device)
{
  simulated_streams* w = world_or_error("sim_stream_create");
  if (w == nullptr) return nullptr;
  std::lock_guard lock(state().world_mutex);
  try {
    return w->create(device).get();
  } catch (const std::exception& e) {
    set_error("sim_stream_create", e);
    return nullptr;
  }
}

int strata_sim_launch(cudaStream_t stream)
{
  simulated_streams* w = world_or_error("sim_launch");
  if (w == nullptr) return 1;
  std::lock_guard lock(state().world_mutex);
  try {
    (void)w->launch(cuda::stream_ref{stream});
    return 0;
  } catch (const std::exception& e) {
    set_error("sim_launch", e);
    return 1;
  }
}

int strata_sim_capture(cudaStream_t stream, int begin)
{
  simulated_streams* w = world_or_error("sim_capture");
  if (w == nullptr) return 1;
  std::lock_guard lock(state().world_mutex);
  try {
    if (begin != 0) (void)w->begin_capture(cuda::stream_ref{stream});
    else (void)w->end_capture(cuda::stream_ref{stream});
    return 0;
  } catch (const std::exception& e) {
    set_error("sim_capture", e);
    return 1;
  }
}

int strata_sim_finish(cudaStream_t stream)
{
  simulated_streams* w = world_or_error("sim_finish");
  if (w == nullptr) return 1;
  std::lock_guard lock(state().world_mutex);
  try {
    w->finish(cuda::stream_ref{stream});
    return 0;
  } catch (const std::exception& e) {
    set_error("sim_finish", e);
    return 1;
  }
}

void strata_begin_allocate_to_pool(int device, std::pair<unsigned long long, unsigned long long> pool,
                                   std::function<bool(cudaStream_t)> filter)
{
  // Thrown, not swallowed: PyTorch is starting a capture that this allocator could not serve, and a
  // RuntimeError at torch.cuda.graph() is clearer than failed allocations inside it.
  try {
    device_slot& s = slot_for(device);
    slot_lock lock(s);
    device_scope on(s, device);
    s.stack->begin_allocate_to_pool(pool_key(pool), std::move(filter));
    ++s.routes;
  } catch (const std::exception& e) {
    set_error("begin_allocate_to_pool", e);
    throw std::runtime_error(last_error);
  }
}

void strata_end_allocate_to_pool(int device, std::pair<unsigned long long, unsigned long long> pool)
{
  try {
    device_slot& s = slot_for(device);
    slot_lock lock(s);
    s.stack->end_allocate_to_pool(pool_key(pool));
    if (s.routes > 0) --s.routes;
  } catch (const std::exception& e) {
    set_error("end_allocate_to_pool", e);
    throw std::runtime_error(last_error);
  }
}

void strata_release_pool(int device, std::pair<unsigned long long, unsigned long long> pool)
{
  try {
    device_slot& s = slot_for(device);
    slot_lock lock(s);
    device_scope on(s, device);
    s.stack->release_pool(pool_key(pool));
  } catch (const std::exception& e) {
    set_error("release_pool", e);
    throw std::runtime_error(last_error);
  }
}

} // extern "C"
