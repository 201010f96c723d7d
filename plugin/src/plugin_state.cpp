// The plug-in's state: slots, configuration, locks (plugin_state.hpp).
#include "plugin_state.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

#include "c_boundary.hpp"
#include "stack_builder.hpp"

namespace strata::plugin {

namespace {

void flush_all_traces() noexcept
{
  plugin_state::get().flush_traces([](int) {});
}

/// pin_lender's take over the C lender: null (it could not lend) is out of memory, so the pause fails with the
/// tag still running; memory off the promised alignment goes straight back.
void* take_from(void* lender, std::size_t bytes)
{
  const auto& l = *static_cast<const backup_lender*>(lender);
  void* p = l.take(l.ctx, bytes);
  if (p == nullptr) throw out_of_memory("the backup's lender (strata_set_backup_lender)", bytes, "it lent nothing");
  if (reinterpret_cast<std::uintptr_t>(p) % pin_lender::page_alignment != 0) {
    l.give(l.ctx, p, bytes);
    throw std::logic_error("the backup's lender (strata_set_backup_lender) lent memory that is not 4096-aligned");
  }
  return p;
}

void give_to(void* lender, void* p, std::size_t bytes) noexcept
{
  const auto& l = *static_cast<const backup_lender*>(lender);
  l.give(l.ctx, p, bytes);
}

/// Whether stacks of this kind sleep and wake by tag (page-mapped), so have a backup to borrow.
bool sleeps(stack_kind k) noexcept { return k == stack_kind::default_pool || k == stack_kind::simulated; }

} // namespace

void* device_slot::allocate(std::size_t size, cudaStream_t stream)
{
  // Held blocks are given back only outside captures: querying an event during a global-mode capture is
  // illegal (PyTorch's caching allocator skips its event processing then too).
  if (routes == 0) stack->reap();
  if (size > own_cap() - std::min(own_cap(), stats.allocated)) {
    ++stats.num_ooms;
    throw out_of_memory("strata plug-in", size, "limit " + std::to_string(cap) + " bytes, " + std::to_string(stats.allocated) + " in use" +
                                                    (elsewhere != 0 ? ", " + std::to_string(elsewhere) + " held elsewhere" : std::string()));
  }
  void* p = nullptr;
  try {
    p = stack->allocate(size, stream);
  } catch (const std::bad_alloc&) {
    // Releasing waits for the device (held blocks' events, then the device), which a capture forbids and may
    // break: while a pool is being allocated to, a capture may be under way, and the request stays refused,
    // as PyTorch's allocator frees nothing that needs a wait while its pools are being allocated to.
    if (routes > 0 || !plugin_state::get().release_on_oom()) {
      ++stats.num_ooms;
      throw;
    }
    ++stats.num_alloc_retries;
    release();
    try {
      p = stack->allocate(size, stream);
    } catch (const std::bad_alloc&) {
      ++stats.num_ooms;
      throw;
    }
  } catch (const usage_error& e) {
    // The stream layer refuses to let its policy grow under a capture when growing needs a device wait (a
    // reclaim at the cap), nesting the policy's failure: memory is short, and PyTorch's caller expects
    // torch.OutOfMemoryError, not a RuntimeError.
    if (routes == 0 || dynamic_cast<const std::nested_exception*>(&e) == nullptr) throw;
    ++stats.num_ooms;
    throw out_of_memory("strata plug-in", size, e.what());
  }
  stats.on_allocate(size);
  return p;
}

void device_slot::free(void* ptr, std::size_t size, cudaStream_t stream) noexcept
{
  stack->deallocate(ptr, size, stream);
  stats.on_free(size);
}

void device_slot::release()
{
  stack->release();
  ++stats.syncs_all_streams;
}

strata_device_figures device_slot::figures(const stack_reading& r) const noexcept
{
  return device_figures_of(r, stats, cap, device_memory);
}

strata_device_figures device_slot::figures() const noexcept { return figures(stack->read()); }

bool device_slot::apply_fraction(double fraction) noexcept
{
  // Rounded to the nearest byte, as PyTorch's allowed maximum is: a fraction computed as bytes / total gives
  // back exactly those bytes.
  const auto wanted = static_cast<std::size_t>(std::llround(fraction * static_cast<double>(device_memory)));
  cap = std::min(wanted, pool_cap);
  stack->set_reserved_cap(own_cap());  // the fraction caps what strata holds, as limit= does
  return wanted > pool_cap;
}

void device_slot::hold_elsewhere(std::size_t bytes) noexcept
{
  elsewhere = bytes;
  if (stack != nullptr) stack->set_reserved_cap(own_cap());
}

void device_slot::enter_section()
{
  const std::thread::id me = std::this_thread::get_id();
  if (section.load(std::memory_order_relaxed) == me) {
    ++section_depth;
    return;
  }
  // The slot's own mutex: a real stack's lock, and never replaced, so sections exclude each other even across
  // the stack's build. A simulated stack's lock is the world's: taken too once built (a stack built inside the
  // section takes it per call, as outside).
  own_mutex.lock();
  section_world = built.load(std::memory_order_acquire) && mutex != &own_mutex;
  if (section_world) mutex->lock();
  section_depth = 1;
  section.store(me, std::memory_order_relaxed);
}

bool device_slot::leave_section() noexcept
{
  if (section.load(std::memory_order_relaxed) != std::this_thread::get_id()) return false;
  if (--section_depth > 0) return true;
  section.store(std::thread::id{}, std::memory_order_relaxed);
  if (section_world) mutex->unlock();
  section_world = false;
  own_mutex.unlock();
  return true;
}

plugin_state& plugin_state::get()
{
  static plugin_state* s = new plugin_state;  // never destroyed: Note [The plug-in's locks]
  return *s;
}

const alloc_conf& plugin_state::conf_locked()
{
  if (!conf_) {
    const char* env = std::getenv("STRATA_ALLOC_CONF");
    conf_ = parse_alloc_conf(env != nullptr ? env : "");
  }
  return *conf_;
}

simulated_streams& plugin_state::world_locked()
{
  if (!world_) world_ = std::make_unique<simulated_streams>();
  return *world_;
}

device_slot& plugin_state::any_slot(int device)
{
  if (device < 0 || device >= max_devices)
    throw refusal("device " + std::to_string(device) + " is out of range [0, " + std::to_string(max_devices) + ")");
  return slots_[static_cast<std::size_t>(device)];
}

device_slot* plugin_state::built_slot(int device) noexcept
{
  if (device < 0 || device >= max_devices) return nullptr;
  device_slot& s = slots_[static_cast<std::size_t>(device)];
  return s.built.load(std::memory_order_acquire) ? &s : nullptr;
}

device_slot& plugin_state::slot_for(int device)
{
  if (device < 0 || device >= max_devices)
    throw std::invalid_argument("device " + std::to_string(device) + " is out of range [0, " + std::to_string(max_devices) + ")");
  device_slot& s = slots_[static_cast<std::size_t>(device)];
  if (s.built.load(std::memory_order_acquire)) return s;
  std::lock_guard config_lock(config_mutex_);
  if (s.built.load(std::memory_order_relaxed)) return s;
  const alloc_conf& c = conf_locked();
  built_stack b;
  if (c.stack == stack_kind::simulated) {
    std::lock_guard world_lock(world_mutex_);
    b = build_stack(c, device, &world_locked());
    s.mutex = &world_mutex_;
  } else {
    b = build_stack(c, device, nullptr);
  }
  if (lender_) (void)b.stack->lend_backup(lent_pins());
  s.stack = std::move(b.stack);
  s.simulated = b.simulated;
  s.context = b.context;
  s.cap = s.pool_cap = b.cap;
  s.device_memory = b.device_memory;
  if (torch_fraction_) s.apply_fraction(*torch_fraction_);
  if (!c.record.empty() && !atexit_registered_.exchange(true)) std::atexit(flush_all_traces);
  in_use_.store(true, std::memory_order_release);
  s.built.store(true, std::memory_order_release);
  return s;
}

void plugin_state::configure(const char* text)
{
  std::lock_guard lock(config_mutex_);
  if (in_use_.load())
    throw std::logic_error("refused: the allocator is in use (a stack was built); configure before the first allocation");
  conf_ = parse_alloc_conf(text != nullptr ? text : "");
}

pin_lender plugin_state::lent_pins() noexcept
{
  return lender_ ? pin_lender(&lender_, &take_from, &give_to) : pin_lender{};
}

bool plugin_state::set_backup_lender(const backup_lender& lender)
{
  std::lock_guard backup_lock(backup_mutex_);  // no backup taken or given until every device switched
  bool can_sleep = false;
  {
    std::lock_guard config_lock(config_mutex_);
    can_sleep = sleeps(conf_locked().stack);
  }
  if (lender == lender_) return can_sleep;
  // A stack's backup memory goes back to where it came from: switching with some out would hand the old
  // lender's memory to the new one (or unpin memory the stack never pinned).
  walk_built([](device_slot& s, int d) {
    if (const std::size_t out = s.stack->backup_bytes(); out != 0)
      throw refusal("device " + std::to_string(d) + " holds " + std::to_string(out) +
                    " bytes of sleep/wake backup (a tag paused with its backup, or memory pinned ahead by "
                    "strata_reserve_backup): resume the paused tags or call strata_release_backup() first");
    for (tag_id t = 0; t < max_tags; ++t)
      if (s.stack->tag_paused(t))
        throw refusal("device " + std::to_string(d) + " has tag " + std::to_string(t) + " paused: resume it first");
  });
  {
    std::lock_guard config_lock(config_mutex_);  // stacks built from here on borrow from the new lender
    lender_ = lender;
  }
  walk_built([this](device_slot& s, int) { (void)s.stack->lend_backup(lent_pins()); });
  return can_sleep;
}

std::vector<std::string> plugin_state::apply_torch_conf(const char* text)
{
  torch_conf_reading r;
  {
    std::lock_guard lock(config_mutex_);
    r = parse_torch_alloc_conf(text != nullptr ? text : "", conf_locked().stack);
    if (r.fraction) torch_fraction_ = r.fraction;
  }
  if (r.fraction) walk_built([&](device_slot& s, int) { s.apply_fraction(*r.fraction); });
  return std::move(r.notes);
}

std::string plugin_state::stack_name()
{
  std::lock_guard lock(config_mutex_);
  return conf_ ? std::string(name_of(conf_->stack)) : std::string();
}

simulated_streams& plugin_state::world()
{
  std::lock_guard config_lock(config_mutex_);
  if (conf_locked().stack != stack_kind::simulated) throw refusal("only with stack=simulated");
  std::lock_guard world_lock(world_mutex_);
  return world_locked();
}

} // namespace strata::plugin
