#pragma once
// Everything libstrata_alloc.so keeps between calls: the configuration, one slot per device (its stack, its
// counts, its lock) and the simulated devices' pretend GPU, in one object with one lock discipline
// (Note [The plug-in's locks]).
#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include <strata_alloc.h>

#include <strata/pinned/pin_lender.hpp>
#include <strata/stream/simulated_streams.hpp>

#include "alloc_conf.hpp"
#include "device_stack.hpp"
#include "slot_statistics.hpp"

namespace strata::plugin {

// Note [The plug-in's locks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch calls from many threads. The state has four kinds of lock:
//   - the backup's (plugin_state::backup_mutex_): taken first by every call that changes a device's sleep/wake
//     backup or where it comes from (pause, resume, reserve and release backup, set and clear the lender), so a
//     lender is switched only while its check that no device holds backup memory still holds;
//   - the configuration's (plugin_state::config_mutex_): the configuration, PyTorch's memory fraction, the
//     backup's lender, and the building of any stack;
//   - each device's (device_slot::mutex): its stack and everything else in its slot. A real device's is the
//     slot's own; the simulated devices share the world's, since they share one pretend GPU;
//   - the world's (plugin_state::world_mutex_): the simulated streams.
// A thread takes them in the order backup, device, configuration, world, and holds one device's lock at a
// time: calls that work on every device take each in turn. A caller may hold a device's lock across several
// entry points (strata_device_lock, which strata's PyTorch backend takes for its own books): those do not
// lock it again (slot_lock), and a stack first built inside such a section takes the configuration's lock
// then, which the order allows; the calls that take the backup's lock are not made inside one. The one
// exception to the order: a simulated device's lock is the world's, so a section on a built simulated device
// already holds the world's lock, and building another simulated stack (slot_for takes the configuration's
// lock, then the world's) or calling strata_sim_* (world()) inside it would take the world's lock a second
// time and deadlock. Such a section therefore makes no call for another device and no strata_sim_* call, as
// strata_device_lock's contract in strata_alloc.h already asks of every section. A slot is
// published (device_slot::built, release) once its stack is built and never changes its stack afterwards, so
// a built slot is found without a lock.
//
// The backup's lender (strata_set_backup_lender) is called under a device's lock and takes its own lock
// inside (strata's pinned host allocator's mutex, torch_host_allocator.cpp). That lock comes last of all: its
// holder never calls into this library, so it never waits for a lock held by a thread that waits for it.
//
// Lifetime: the state is created on first use and never destroyed. PyTorch frees tensors during interpreter
// teardown, after static destructors may have run, and the CUDA runtime may be gone by then: a stack that
// outlived its process costs nothing, a destroyed one would crash the frees that come after it.

/// CuPy's free passes neither size nor stream: they are remembered at allocation.
struct cupy_block {
  std::size_t size;
  cudaStream_t stream;
};

/// One device: its stack, the plug-in's counts and books of it, and its lock. Every member but the lock's
/// own state is read and written under the lock (Note [The plug-in's locks]).
struct device_slot {
  std::mutex own_mutex;
  std::mutex* mutex = &own_mutex;
  std::atomic<bool> built{false};
  std::unique_ptr<device_stack> stack;
  bool simulated = false;
  void* context = nullptr;          ///< the device's primary context (a real stack's), seen when it was built
  std::size_t cap = SIZE_MAX;       ///< bytes the stack may hold from CUDA, so in use too (limit=, set_memory_fraction)
  std::size_t pool_cap = SIZE_MAX;  ///< the stack's own physical cap, fixed when built (limit=)
  /// Bytes held outside strata that count against the cap (strata_set_held_elsewhere, which builds the stack
  /// first): the stack's share of the cap is what they leave.
  std::size_t elsewhere = 0;
  std::size_t device_memory = 0;
  slot_statistics stats;
  std::unordered_map<void*, cupy_block> cupy;
  int routes = 0;  ///< graph pools being allocated to (a capture may be under way: no event queries then)
  /// The thread holding the slot through strata_device_lock (none: no one). Written only by the thread that
  /// holds own_mutex, so a thread that reads its own id holds the section.
  std::atomic<std::thread::id> section{};
  int section_depth = 0;       ///< nested strata_device_lock calls of the holder
  bool section_world = false;  ///< the holder took the simulated world's lock too

  /// Allocates with the lock held. Out of memory: idle memory is released and the request retried once
  /// (release_on_oom, read only then; not while a pool is being allocated to); failing that, num_ooms counts it
  /// and the exception (std::bad_alloc) goes to the caller. O(the stack's allocation), a host wait to retry.
  void* allocate(std::size_t size, cudaStream_t stream);
  /// Frees with the lock held, counting it. O(the stack's free).
  void free(void* ptr, std::size_t size, cudaStream_t stream) noexcept;
  /// The stack's release with the lock held: a host wait for every pending free, then idle memory goes back;
  /// counted as one of num_sync_all_streams' waits (empty_cache, the retry after out of memory).
  void release();
  /// The device's figures from one read of the stack (or the read given); the lock held. O(1).
  strata_device_figures figures() const noexcept;
  strata_device_figures figures(const stack_reading& r) const noexcept;
  /// The cap at `fraction` of the device's memory, never above the configured limit; what the stack holds
  /// follows it. Returns whether the limit capped it. The lock held (or the slot not yet published). O(1).
  bool apply_fraction(double fraction) noexcept;
  /// The cap less what is held elsewhere: what the stack may hold. O(1).
  std::size_t own_cap() const noexcept { return cap - std::min(cap, elsewhere); }
  /// Counts `bytes` held outside strata against the cap, and caps the stack at what they leave. The lock held.
  void hold_elsewhere(std::size_t bytes) noexcept;
  /// strata_device_lock / strata_device_unlock: the section of the calling thread (nested calls count).
  void enter_section();
  bool leave_section() noexcept;  ///< false: the calling thread holds no section here
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

/// The pinned pool the devices' sleep/wake backup is borrowed from (strata_set_backup_lender; Note [One pinned
/// budget]): the caller's two C calls and their context. Empty: each stack pins its own.
struct backup_lender {
  void* ctx = nullptr;
  strata_backup_take_fn take = nullptr;
  strata_backup_give_fn give = nullptr;

  explicit operator bool() const noexcept { return take != nullptr; }
  friend bool operator==(const backup_lender&, const backup_lender&) = default;
};

/// The plug-in's state (Note [The plug-in's locks]). Models: the process-wide allocator behind the C ABI.
/// Cost: finding a built slot is an atomic load; building one takes the configuration's lock and the stack's
/// construction (CUDA calls for a real device).
class plugin_state {
public:
  static constexpr int max_devices = 64;

  /// The one state, created on first use and never destroyed.
  static plugin_state& get();

  /// The device's slot with its stack built (first use: from the configuration). Throws what refused it.
  device_slot& slot_for(int device);
  /// A built slot, or null (nothing was ever allocated there, or the device is out of range).
  device_slot* built_slot(int device) noexcept;
  /// The device's slot, built or not, for strata_device_lock's sections. Throws refusal out of range.
  device_slot& any_slot(int device);

  /// f(slot, device) for every built slot in device order, each under its lock (the device not made current);
  /// where f returns bool, false stops the walk. Returns whether f stopped it. O(devices built). Every walk over
  /// the devices goes through here, so each takes the slots' locks one at a time, in one order.
  template <class F>
  bool walk_built(F&& f)
  {
    for (int d = 0; d < max_devices; ++d) {
      device_slot* s = built_slot(d);
      if (s == nullptr) continue;
      slot_lock lock(*s);
      if constexpr (std::is_void_v<std::invoke_result_t<F&, device_slot&, int>>) f(*s, d);
      else if (!f(*s, d)) return true;
    }
    return false;
  }

  /// f(slot, device) under the lock of the device whose stack owns ptr; false (f not called) where none does.
  /// O(devices built).
  template <class F>
  bool with_owning_slot(const void* ptr, F&& f)
  {
    return walk_built([&](device_slot& s, int d) {
      if (!s.stack->owns(ptr)) return true;
      f(s, d);
      return false;
    });
  }

  /// f(stack) for every device's built stack, each under its lock with the device current; stops at the
  /// first exception, which goes to the caller.
  template <class F>
  void for_each_built(F&& f)
  {
    walk_built([&](device_slot& s, int d) {
      device_scope on(s, d);
      f(*s.stack);
    });
  }

  /// strata_configure: refused (std::logic_error) once a stack was built; a bad string throws, nothing changed.
  void configure(const char* text);
  /// strata_apply_torch_conf: PyTorch's settings applied (its memory fraction caps every device, built or
  /// not); returns the notes on settings without effect under strata. Throws on a refused text.
  std::vector<std::string> apply_torch_conf(const char* text);
  /// The configured stack's name ("" before any configuration was read).
  std::string stack_name();
  /// Whether a failed allocation releases idle memory and tries again (fixed once a stack was built).
  bool release_on_oom() const noexcept { return conf_->release_on_oom; }
  bool in_use() const noexcept { return in_use_.load(); }

  /// What strata_malloc_or_throw calls on out of memory (strata_set_oom_handler); null: none.
  using oom_handler_fn = void (*)(const char* message);
  void set_oom_handler(oom_handler_fn handler) noexcept { oom_handler_.store(handler); }
  oom_handler_fn oom_handler() const noexcept { return oom_handler_.load(); }

  /// Every device's stack, built already or later, borrows its sleep/wake backup from `lender` (empty: pins its
  /// own). Refusal, nothing changed, while a device holds backup memory; none when `lender` is the one set.
  /// Returns whether the configured stacks can sleep (else nothing is lent). Takes the backup's lock: not
  /// inside a device's lock. O(devices built), no CUDA call.
  bool set_backup_lender(const backup_lender& lender);
  /// Held by every call that changes a device's backup (pause, resume, reserve and release backup), first.
  std::mutex& backup_mutex() noexcept { return backup_mutex_; }

  /// The simulated devices' pretend GPU, for the strata_sim_* calls; refusal unless stack=simulated. Use it
  /// under world_mutex().
  simulated_streams& world();
  std::mutex& world_mutex() noexcept { return world_mutex_; }

  /// Writes every device's trace file (record=PATH), calling `failed(device)` for each one that could not be
  /// written. O(devices built) and the writes.
  template <class F>
  void flush_traces(F&& failed)
  {
    walk_built([&](device_slot& s, int d) {
      if (!s.stack->flush_trace()) failed(d);
    });
  }

private:
  plugin_state() = default;
  /// The configuration; on first need, STRATA_ALLOC_CONF's (a bad string throws, every time: no silent
  /// default). The configuration's lock held.
  const alloc_conf& conf_locked();
  simulated_streams& world_locked();
  /// The lender's calls as a stack borrows through them (lender_'s, read under a device's lock while the
  /// backup's lock is held); empty without a lender.
  pin_lender lent_pins() noexcept;

  std::mutex backup_mutex_;
  std::mutex config_mutex_;
  /// Written under the backup's and the configuration's locks; read under either.
  backup_lender lender_;
  std::optional<alloc_conf> conf_;
  /// PyTorch's per_process_memory_fraction (strata_apply_torch_conf): each stack starts under it.
  std::optional<double> torch_fraction_;
  std::atomic<bool> in_use_{false};
  std::atomic<bool> atexit_registered_{false};
  std::atomic<oom_handler_fn> oom_handler_{nullptr};
  std::array<device_slot, max_devices> slots_;
  std::mutex world_mutex_;  ///< the simulated devices' one lock
  std::unique_ptr<simulated_streams> world_;
};

} // namespace strata::plugin
