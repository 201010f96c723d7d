// libstrata_alloc.so: the C entry points of plugin/include/strata_alloc.h, each a thin body over the plug-in's
// state (plugin_state.hpp: one slot per device, the lock discipline) run through the one C boundary
// (c_boundary.hpp: Note [The C boundary]). Building stacks from the configuration is stack_builder.cpp's;
// memory_stats' figures are slot_statistics.cpp's.
#include <strata_alloc.h>

#include <cstdlib>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <strata/sleep/tag_scope.hpp>

#include "c_boundary.hpp"
#include "plugin_state.hpp"

namespace {

using namespace strata;
using namespace strata::plugin;

constexpr int max_devices = plugin_state::max_devices;

plugin_state& state() { return plugin_state::get(); }

/// strata_malloc_or_throw's policy: out of memory through the handler installed when it happens.
constexpr raising_oom_t raising_oom{[]() noexcept { return state().oom_handler(); }};

std::uint64_t pool_key(std::pair<unsigned long long, unsigned long long> id) noexcept
{
  // PyTorch numbers graph pools {n, 0} and user MemPools {0, n} from two counters: keep them apart.
  return id.first != 0 ? id.first : (id.second | (std::uint64_t{1} << 63));
}

std::size_t copy_out(const std::string& text, char* buf, std::size_t len) noexcept
{
  if (buf != nullptr && len > text.size()) {
    text.copy(buf, text.size());
    buf[text.size()] = '\0';
  }
  return text.size();
}

/// An allocation of `size` (not 0) on a device, under its lock with the device current: `before(slot)` first
/// (room in the books that will hold the block, so that it is never lost), then the stack's allocation, then
/// `after(slot, block)`, which counts what the stack holds now, or, where the stack refused, `refused(slot)`
/// before the refusal goes on. Every allocating entry point goes through here.
template <class Before, class After, class Refused>
void* allocate_on(std::size_t size, int device, cudaStream_t stream, Before&& before, After&& after, Refused&& refused)
{
  device_slot& s = state().slot_for(device);
  slot_lock lock(s);
  device_scope on(s, device);
  before(s);
  void* p = nullptr;
  try {
    p = s.allocate(size, stream);
  } catch (...) {
    refused(s);
    throw;
  }
  after(s, p);
  return p;
}

constexpr auto nothing_first = [](device_slot&) {};
constexpr auto nothing_on_refusal = [](device_slot&) {};
/// What every allocation counts: the most the stack has held.
constexpr auto note_reserved = [](device_slot& s, void*) { s.stats.note_reserved(s.stack->usage().reserved); };

/// empty_cache on one device, its lock held: the stack's idle memory goes back, unless an allocation to a graph
/// pool is under way there (strata_alloc.h: a capture may be).
void release_idle(device_slot& s, int device)
{
  if (s.routes > 0) return;
  device_scope on(s, device);
  s.release();
}

/// An allocation of `size` on a device, counted; size 0 is null, not an error.
void* allocate(std::size_t size, int device, cudaStream_t stream)
{
  if (size == 0) return nullptr;
  return allocate_on(size, device, stream, nothing_first, note_reserved, nothing_on_refusal);
}

/// The built slot of `device`, or a refusal saying what it means that there is none.
device_slot& built_or_refuse(int device, const std::string& why)
{
  device_slot* s = state().built_slot(device);
  if (s == nullptr) throw refusal(why);
  return *s;
}

/// This thread's tags before each strata_tag_begin still open.
thread_local std::vector<tag_id> tag_stack;

/// The tags of `asked` for which `on_device` holds: a tag pauses and resumes on the devices it lives on.
template <class Pred>
std::vector<tag_id> tags_where(std::span<const tag_id> asked, Pred&& on_device)
{
  std::vector<tag_id> here;
  for (tag_id t : asked)
    if (on_device(t)) here.push_back(t);
  return here;
}

/// Refuses, naming the first tag of `asked` that satisfies `on` on no device (`what`: why it cannot be paused
/// or resumed); nothing changed then.
template <class Pred>
void require_every_tag_somewhere(std::span<const tag_id> asked, Pred&& on, const char* what)
{
  for (tag_id t : asked) {
    const bool found = state().walk_built([&](device_slot& s, int) { return !on(*s.stack, t); });
    if (!found) throw refusal(std::string("tag ") + std::to_string(t) + " " + what + " on any device");
  }
}

/// A call on a simulated stream, under the world's lock: 0, or 1 with the message.
template <class F>
int on_world(const char* where, F&& f) noexcept
{
  return c_entry(where, failing_with<int>{1}, [&] {
    simulated_streams& w = state().world();
    std::lock_guard lock(state().world_mutex());
    f(w);
    return 0;
  });
}

} // namespace

extern "C" {

void* strata_malloc(size_t size, int device, cudaStream_t stream)
{
  return c_entry("malloc", failing_with<void*>{nullptr}, [&] { return allocate(size, device, stream); });
}

void strata_set_oom_handler(void (*handler)(const char* message))
{
  c_entry("set_oom_handler", quietly, [&] { state().set_oom_handler(handler); });
}

void strata_report_error(const char* message) { set_error("", message != nullptr ? message : ""); }

void* strata_malloc_or_throw(size_t size, int device, cudaStream_t stream)
{
  return c_entry("malloc", raising_oom, [&] { return allocate(size, device, stream); });
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
  c_entry("reset", quietly, [] {
    std::exception_ptr last;  // every device is asked; the last failure is the one reported
    state().walk_built([&](device_slot& s, int d) {
      try {
        release_idle(s, d);
      } catch (...) {
        last = std::current_exception();
      }
    });
    if (last) std::rethrow_exception(last);
  });
}

int strata_reset_device(int device)
{
  return c_entry("reset", failing_with<int>{-1}, [&] {
    device_slot* s = state().built_slot(device);
    if (s == nullptr) return 0;  // nothing built: nothing held
    slot_lock lock(*s);
    release_idle(*s, device);
    return 0;
  });
}

void strata_record_stream_on(int device, void* ptr, cudaStream_t stream)
{
  if (ptr == nullptr) return;
  c_entry("record_stream", quietly, [&] {
    device_slot& s = built_or_refuse(device, "device has no stack: the pointer is not strata's");
    slot_lock lock(s);
    if (!s.stack->owns(ptr)) throw refusal("the pointer is not a strata block of device " + std::to_string(device));
    s.stack->record_use(ptr, stream);
  });
}

void strata_set_memory_fraction(double fraction, int device)
{
  c_entry("set_memory_fraction", quietly, [&] {
    if (!(fraction >= 0.0 && fraction <= 1.0))
      throw std::invalid_argument("fraction " + std::to_string(fraction) + " is not in [0, 1]");
    device_slot& s = state().slot_for(device);
    slot_lock lock(s);
    if (s.apply_fraction(fraction))  // applied, capped: a note, not a failure
      set_error("set_memory_fraction", "fraction " + std::to_string(fraction) + " is above the configured limit of " +
                                           std::to_string(s.pool_cap) + " bytes, which the stack was built with: capped there");
  });
}

void strata_record_stream(void* ptr, cudaStream_t stream)
{
  if (ptr == nullptr) return;
  c_entry("record_stream", quietly, [&] {
    if (!state().with_owning_slot(ptr, [&](device_slot& s, int) { s.stack->record_use(ptr, stream); }))
      throw refusal("the pointer is not a strata block");
  });
}

long strata_share_block(void* ptr, size_t* offset, size_t* mapping_bytes, int* fds, size_t capacity)
{
  if (ptr == nullptr) return 0;
  return c_entry("share_block", failing_with<long>{-1}, [&] {
    long n = 0;  // no stack owns ptr: not page-mapped memory of strata's
    state().with_owning_slot(ptr, [&](device_slot& s, int) {
      strata::plugin::shared_block b = s.stack->share(ptr);
      const std::size_t count = b.fds.size();
      n = static_cast<long>(count);
      if (count == 0 || count > capacity) return;  // too little room: the descriptors close here
      if (offset == nullptr || mapping_bytes == nullptr || fds == nullptr)
        throw std::invalid_argument("null output for " + std::to_string(count) + " mappings");
      *offset = b.offset;
      for (std::size_t i = 0; i < count; ++i) {
        mapping_bytes[i] = b.mapping_bytes[i];
        fds[i] = b.fds[i].release();
      }
    });
    return n;
  });
}

int strata_device_prepare(int device)
{
  return c_entry("device_prepare", failing_with<int>{-1}, [&] {
    (void)state().slot_for(device);
    return 0;
  });
}

int strata_grant_peer(int device, int peer)
{
  return c_entry("grant_peer", failing_with<int>{-1}, [&] {
    if (peer < 0 || peer >= max_devices) throw std::invalid_argument("peer device " + std::to_string(peer) + " is out of range");
    if (peer == device) return 0;
    device_slot& s = state().slot_for(device);
    slot_lock lock(s);
    device_scope on(s, device);
    return s.stack->grant_peer(peer) ? 1 : 0;
  });
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
  return c_entry("configure", failing_with<int>{1}, [&] {
    state().configure(conf);
    return 0;
  });
}

int strata_apply_torch_conf(const char* text)
{
  // Its messages are PyTorch's settings' own, unprefixed.
  return c_entry("", failing_with<int>{-1}, [&] {
    const std::vector<std::string> notes = state().apply_torch_conf(text);
    if (notes.empty()) return 0;
    std::string joined;
    for (const std::string& n : notes) joined += (joined.empty() ? "" : "\n") + n;
    set_error("", joined);
    return 1;
  });
}

int strata_check_env(void)
{
  return c_entry("check_env", failing_with<int>{1}, [] {
    const char* env = std::getenv("STRATA_ALLOC_CONF");
    (void)parse_alloc_conf(env != nullptr ? env : "");
    return 0;
  });
}

const char* strata_last_error(void) { return last_error.c_str(); }

int strata_is_in_use(void) { return state().in_use() ? 1 : 0; }

size_t strata_memory_stats_json(int device, char* buf, size_t len)
{
  return c_entry("memory_stats", failing_with<std::size_t>{0}, [&] {
    if (device < 0 || device >= max_devices) throw std::invalid_argument("device " + std::to_string(device) + " is out of range");
    const std::string stack_name = state().stack_name();
    stats_reading r;
    if (device_slot* s = state().built_slot(device)) {
      slot_lock lock(*s);
      r = {.counts = s->stats, .usage = s->stack->usage(), .held_bytes = s->stack->held_bytes(), .limit = s->cap,
           .calls = s->stack->calls()};
    }
    return copy_out(stats_json(r, stack_name), buf, len);
  });
}

void strata_reset_peak_stats(int device)
{
  c_entry("reset_peak_stats", quietly, [&] {
    device_slot* s = state().built_slot(device);
    if (s == nullptr) return;
    slot_lock lock(*s);
    s->stats.reset_peaks(s->stack->usage().reserved);
  });
}

size_t strata_snapshot_json(int device, char* buf, size_t len)
{
  return c_entry("snapshot", failing_with<std::size_t>{0}, [&] {
    device_slot* s = state().built_slot(device);
    if (s == nullptr) return copy_out("{\"box\":\"\",\"segments\":[]}", buf, len);
    slot_lock lock(*s);
    return copy_out(s->stack->snapshot_json(), buf, len);
  });
}

int strata_record_flush(void)
{
  return c_entry("record_flush", failing_with<int>{1}, [] {
    int failed = 0;
    state().flush_traces([&](int d) {
      set_error("record_flush", "writing the trace of device " + std::to_string(d) + " failed");
      failed = 1;
    });
    return failed;
  });
}

int strata_device_figures_get(int device, strata_device_figures* out)
{
  return c_entry("device_figures", failing_with<int>{-1}, [&] {
    if (out == nullptr) throw refusal("null output");
    if (device < 0 || device >= max_devices) throw refusal("device " + std::to_string(device) + " is out of range");
    *out = strata_device_figures{};
    device_slot* s = state().built_slot(device);
    if (s == nullptr) return 1;
    slot_lock lock(*s);
    *out = s->figures();
    return 0;
  });
}

int strata_oom_served(int device)
{
  return c_entry("oom_served", failing_with<int>{-1}, [&] {
    device_slot& s = built_or_refuse(device, "device " + std::to_string(device) + " has no stack");
    slot_lock lock(s);
    if (s.stats.num_ooms == 0) throw refusal("no out of memory is counted to take back");
    --s.stats.num_ooms;
    return 0;
  });
}

int strata_set_held_elsewhere(int device, size_t bytes)
{
  return c_entry("set_held_elsewhere", failing_with<int>{-1}, [&] {
    device_slot& s = state().slot_for(device);
    slot_lock lock(s);
    s.hold_elsewhere(bytes);
    return 0;
  });
}

int strata_device_lock(int device)
{
  return c_entry("device_lock", failing_with<int>{-1}, [&] {
    state().any_slot(device).enter_section();
    return 0;
  });
}

void strata_device_unlock(int device)
{
  c_entry("device_unlock", quietly, [&] {
    device_slot* s = device >= 0 && device < max_devices ? &state().any_slot(device) : nullptr;
    if (s == nullptr || !s->leave_section()) throw refusal("this thread does not hold device " + std::to_string(device) + "'s lock");
  });
}

void* strata_malloc_or_throw_observed(size_t size, int device, cudaStream_t stream, strata_device_figures* out)
{
  return c_entry("malloc", raising_oom, [&]() -> void* {
    if (size == 0) {
      if (out != nullptr) (void)strata_device_figures_get(device, out);
      return nullptr;
    }
    return allocate_on(
        size, device, stream, nothing_first,
        [&](device_slot& s, void* p) {
          if (out == nullptr) return note_reserved(s, p);
          const stack_reading r = s.stack->read();
          s.stats.note_reserved(r.usage.reserved);
          *out = s.figures(r);
        },
        [&](device_slot& s) {
          if (out != nullptr) *out = s.figures();  // what the refusal left: the out-of-memory message quotes it
        });
  });
}

void strata_free_observed(void* ptr, size_t size, int device, cudaStream_t stream, strata_device_figures* out)
{
  if (ptr == nullptr) {
    if (out != nullptr) (void)strata_device_figures_get(device, out);
    return;
  }
  if (out != nullptr) *out = strata_device_figures{};
  c_entry("free", quietly, [&] {
    device_slot& s = built_or_refuse(device, "device " + std::to_string(device) + " has no stack: the pointer is not strata's (leaked, not freed)");
    slot_lock lock(s);
    try {
      device_scope on(s, device);
      s.free(ptr, size, stream);
    } catch (const std::exception& e) {  // the device could not be made current: free anyway
      set_error("free", e.what());
      s.free(ptr, size, stream);
    }
    if (out != nullptr) *out = s.figures();
  });
}

// CuPy: its free passes neither size nor stream, so both are remembered per block.
thread_local cudaStream_t cupy_stream = cudaStreamLegacy;

void strata_tag_begin(unsigned tag)
{
  c_entry("tag_begin", quietly, [&] {
    tag_stack.push_back(strata::detail::thread_tag);  // first, so a failed push leaves the tag as it was
    strata::detail::thread_tag = tag;
  });
}

void strata_tag_end(void)
{
  c_entry("tag_end", quietly, [] {
    if (tag_stack.empty()) throw refusal("no strata_tag_begin to end");
    strata::detail::thread_tag = tag_stack.back();
    tag_stack.pop_back();
  });
}

unsigned strata_current_tag(void) { return strata::current_tag(); }

int strata_pause(const unsigned* tags, size_t n, int backup)
{
  return c_entry("pause", failing_with<int>{-1}, [&] {
    std::lock_guard backup_lock(state().backup_mutex());
    const std::span<const tag_id> asked(tags, n);
    require_every_tag_somewhere(asked, [](const device_stack& s, tag_id t) { return s.holds_tag(t); }, "was never used");
    state().for_each_built([&](device_stack& stack) {
      const auto here = tags_where(asked, [&](tag_id t) { return stack.holds_tag(t); });
      if (!here.empty()) stack.pause(here, backup != 0);
    });
    return 0;
  });
}

int strata_resume(const unsigned* tags, size_t n)
{
  return c_entry("resume", failing_with<int>{-1}, [&] {
    std::lock_guard backup_lock(state().backup_mutex());
    const std::span<const tag_id> asked(tags, n);
    require_every_tag_somewhere(asked, [](const device_stack& s, tag_id t) { return s.tag_paused(t); }, "is not paused");
    state().for_each_built([&](device_stack& stack) {
      const auto here = tags_where(asked, [&](tag_id t) { return stack.tag_paused(t); });
      if (!here.empty()) stack.resume(here);
    });
    return 0;
  });
}

int strata_tag_figures_get(int device, unsigned tag, strata_tag_figures* out)
{
  return c_entry("tag_figures", failing_with<int>{-1}, [&] {
    if (out == nullptr) throw refusal("null output");
    if (tag >= strata::max_tags) throw refusal("tag " + std::to_string(tag) + " is not below " + std::to_string(strata::max_tags));
    if (device < 0 || device >= max_devices) throw refusal("device " + std::to_string(device) + " is out of range");
    *out = strata_tag_figures{};
    device_slot* s = state().built_slot(device);
    if (s == nullptr) return 1;
    slot_lock lock(*s);
    return s->stack->tag_figures(tag, *out) ? 0 : 1;
  });
}

int strata_reserve_backup(int device, size_t bytes)
{
  return c_entry("reserve_backup", failing_with<int>{-1}, [&] {
    std::lock_guard backup_lock(state().backup_mutex());
    device_slot& s = state().slot_for(device);
    slot_lock lock(s);
    device_scope on(s, device);
    s.stack->reserve_backup(bytes);
    return 0;
  });
}

size_t strata_release_backup(void)
{
  std::size_t n = 0;  // what was unpinned, up to a failure
  c_entry("release_backup", quietly, [&] {
    std::lock_guard backup_lock(state().backup_mutex());
    state().for_each_built([&](device_stack& stack) { n += stack.release_backup(); });
  });
  return n;
}

int strata_set_backup_lender(void* ctx, strata_backup_take_fn take, strata_backup_give_fn give)
{
  return c_entry("set_backup_lender", failing_with<int>{-1}, [&] {
    if (take == nullptr || give == nullptr)
      throw refusal("a lender needs both take and give (strata_clear_backup_lender goes back to pinning their own)");
    return state().set_backup_lender(backup_lender{ctx, take, give}) ? 1 : 0;
  });
}

int strata_clear_backup_lender(void)
{
  return c_entry("clear_backup_lender", failing_with<int>{-1}, [] {
    (void)state().set_backup_lender(backup_lender{});
    return 0;
  });
}

void* strata_cupy_malloc(void* /*param*/, size_t size, int device)
{
  return c_entry("cupy_malloc", failing_with<void*>{nullptr}, [&]() -> void* {
    if (size == 0) return nullptr;
    const cudaStream_t stream = cupy_stream;
    return allocate_on(
        size, device, stream,
        [](device_slot& s) { s.cupy.reserve(s.cupy.size() + 1); },  // before allocating: the block must never be lost
        [&](device_slot& s, void* p) {
          note_reserved(s, p);
          s.cupy.emplace(p, cupy_block{size, stream});
        },
        nothing_on_refusal);
  });
}

void strata_cupy_free(void* /*param*/, void* ptr, int device)
{
  if (ptr == nullptr) return;
  c_entry("cupy_free", quietly, [&] {
    device_slot& s = built_or_refuse(device, "device has no stack: the pointer is not strata's");
    slot_lock lock(s);
    const auto it = s.cupy.find(ptr);
    if (it == s.cupy.end()) throw refusal("the pointer was not allocated through strata_cupy_malloc");
    const cupy_block b = it->second;
    s.cupy.erase(it);
    try {
      device_scope on(s, device);
      s.free(ptr, b.size, b.stream);
    } catch (const std::exception& e) {  // the device could not be made current: free anyway
      set_error("cupy_free", e.what());
      s.free(ptr, b.size, b.stream);
    }
  });
}

void strata_cupy_set_stream(cudaStream_t stream) { cupy_stream = stream; }

cudaStream_t strata_sim_stream_create(int device)
{
  cudaStream_t made = nullptr;
  (void)on_world("sim_stream_create", [&](simulated_streams& w) { made = w.create(device).get(); });
  return made;
}

int strata_sim_launch(cudaStream_t stream)
{
  return on_world("sim_launch", [&](simulated_streams& w) { (void)w.launch(cuda::stream_ref{stream}); });
}

int strata_sim_capture(cudaStream_t stream, int begin)
{
  return on_world("sim_capture", [&](simulated_streams& w) {
    if (begin != 0) (void)w.begin_capture(cuda::stream_ref{stream});
    else (void)w.end_capture(cuda::stream_ref{stream});
  });
}

int strata_sim_finish(cudaStream_t stream)
{
  return on_world("sim_finish", [&](simulated_streams& w) { w.finish(cuda::stream_ref{stream}); });
}

void strata_begin_allocate_to_pool(int device, std::pair<unsigned long long, unsigned long long> pool,
                                   std::function<bool(cudaStream_t)> filter)
{
  // Thrown, not swallowed: PyTorch is starting a capture that this allocator could not serve, and a
  // RuntimeError at torch.cuda.graph() is clearer than failed allocations inside it.
  c_entry("begin_allocate_to_pool", raising, [&] {
    device_slot& s = state().slot_for(device);
    slot_lock lock(s);
    device_scope on(s, device);
    s.stack->begin_allocate_to_pool(pool_key(pool), std::move(filter));
    ++s.routes;
  });
}

void strata_end_allocate_to_pool(int device, std::pair<unsigned long long, unsigned long long> pool)
{
  c_entry("end_allocate_to_pool", raising, [&] {
    device_slot& s = state().slot_for(device);
    slot_lock lock(s);
    s.stack->end_allocate_to_pool(pool_key(pool));
    if (s.routes > 0) --s.routes;
  });
}

void strata_release_pool(int device, std::pair<unsigned long long, unsigned long long> pool)
{
  c_entry("release_pool", raising, [&] {
    device_slot& s = state().slot_for(device);
    slot_lock lock(s);
    device_scope on(s, device);
    s.stack->release_pool(pool_key(pool));
  });
}

} // extern "C"
