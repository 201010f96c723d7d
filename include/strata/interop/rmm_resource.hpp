#pragma once
// A strata stack in the place RMM keeps for its current device resource (rmm::mr::set_current_device_resource,
// which takes a cuda::mr::any_resource<device_accessible> since RMM 26.06). This header needs CCCL only, never
// RMM's headers: the call that makes a stack current, which does need them, is interop/rmm_current.hpp.
//
// Note [ABI namespace]: cuda::mr::any_resource's layout depends on the CCCL release and the -std flag, and
// librmm is built against one CCCL. rmm_resource lives in an inline namespace named after the CCCL release it
// was compiled with (strata::cccl_3005000::rmm_resource), so two translation units that disagree about CCCL
// cannot pass one between them: the linker reports a missing strata::cccl_<one>::rmm_resource symbol while the
// other object defines strata::cccl_<other>::rmm_resource, naming both releases. rmm_current.hpp adds the
// compile-time half against librmm's own CCCL.
//
// Note [exit]: RMM holds the current resource in a static map until the process ends, and that map is
// destroyed after main returns, when the CUDA driver may already have torn down the context: a driver call
// then can crash inside libcuda instead of failing. A stack held only by rmm_resource is therefore left
// undestroyed when its last owner goes away during process exit (the operating system reclaims the memory),
// and destroyed normally at any other time.
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include <cuda/version>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>

#define STRATA_RMM_CAT_(a, b) a##b
#define STRATA_RMM_CAT(a, b) STRATA_RMM_CAT_(a, b)
/// The inline namespace that carries the CCCL release in every rmm_resource symbol (Note [ABI namespace]).
#define STRATA_RMM_ABI_NAMESPACE STRATA_RMM_CAT(cccl_, CCCL_VERSION)

namespace strata {

/// Says that a stack is safe to call from several threads at once (synchronized<...>, thread_cached<...>, a
/// source): rmm_resource then calls it without a lock of its own.
struct stack_is_thread_safe_t {
  explicit stack_is_thread_safe_t() = default;
};
inline constexpr stack_is_thread_safe_t stack_is_thread_safe{};

/// What rmm_resource takes: a stream-ordered, device-accessible stack. Its frees may throw (checked<...>):
/// rmm_resource's frees stay noexcept, as CCCL and RMM require, and report what they catch on the next
/// allocation (Note [refused frees]).
template <class S>
concept rmm_stack = has_property<S, device_accessible> &&
                    requires(S& s, void* p, std::size_t n, std::size_t a, cuda::stream_ref stream) {
                      { s.allocate(n, a) } -> std::same_as<void*>;
                      s.deallocate(p, n, a);
                      { s.allocate_async(n, a, stream) } -> std::same_as<void*>;
                      s.deallocate_async(p, n, a, stream);
                    };

namespace detail {

/// Set once exit() has begun (Note [exit]); an atexit handler registered when the first rmm_resource is made.
inline std::atomic<bool>& rmm_process_exiting() noexcept
{
  static std::atomic<bool> exiting{false};
  return exiting;
}
inline void rmm_watch_process_exit() noexcept
{
  static const bool registered = [] {
    (void)rmm_process_exiting();  // constructed before the handler is registered, so it outlives the handler
    return std::atexit([] { rmm_process_exiting().store(true, std::memory_order_release); }) == 0;
  }();
  (void)registered;
}

/// What every copy of one rmm_resource shares: the stack, the lock, and the hooks rmm_current.hpp installs.
struct rmm_shared {
  virtual ~rmm_shared() = default;
  virtual void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment) = 0;
  virtual void deallocate(cuda::stream_ref stream, void* p, std::size_t bytes, std::size_t alignment) noexcept = 0;
  virtual void* allocate_sync(std::size_t bytes, std::size_t alignment) = 0;
  virtual void deallocate_sync(void* p, std::size_t bytes, std::size_t alignment) noexcept = 0;
  virtual const std::type_info& type() const noexcept = 0;
  virtual void* stack() noexcept = 0;

  explicit rmm_shared(bool lock) : locks(lock) {}
  std::mutex mutex;
  const bool locks;

  /// Note [refused frees]: a free the stack refused (checked<...> reporting a foreign pointer or a double
  /// free) cannot leave a noexcept free; it is kept here and thrown by the next allocation, as a usage_error
  /// naming the free. The stack refused it before changing anything, so nothing is lost.
  void refused(const char* what) noexcept
  {
    try {
      std::lock_guard<std::mutex> lock(refused_mutex);
      if (refused_what.empty()) refused_what = what;
    } catch (...) {
      // No room for the text: the flag alone still fails the next allocation.
    }
    has_refused.store(true, std::memory_order_release);
  }
  void throw_if_refused()
  {
    if (!has_refused.load(std::memory_order_acquire)) return;
    std::string what;
    {
      std::lock_guard<std::mutex> lock(refused_mutex);
      what.swap(refused_what);
      has_refused.store(false, std::memory_order_release);
    }
    throw usage_error("rmm_resource: a free through RMM was refused by the stack: " +
                      (what.empty() ? std::string("(no message)") : what));
  }
  std::atomic<bool> has_refused{false};
  std::mutex refused_mutex;
  std::string refused_what;
  /// Rethrows strata's out_of_memory as the caller's own kind (rmm::out_of_memory under rmm_current.hpp).
  std::atomic<void (*)(const out_of_memory&)> translate_out_of_memory{nullptr};
  /// A second opinion on "the process is exiting" (rmm::process_is_exiting under rmm_current.hpp).
  std::atomic<bool (*)() noexcept> exiting{nullptr};
};

template <class Stack>
struct rmm_holder final : rmm_shared {
  template <class S>
  rmm_holder(S&& s, bool lock) : rmm_shared(lock), box(std::forward<S>(s))
  {}

  class guard {
  public:
    explicit guard(rmm_shared& s) : mutex_(s.locks ? &s.mutex : nullptr)
    {
      if (mutex_ != nullptr) mutex_->lock();
    }
    ~guard()
    {
      if (mutex_ != nullptr) mutex_->unlock();
    }
    guard(const guard&) = delete;
    guard& operator=(const guard&) = delete;

  private:
    std::mutex* mutex_;
  };

  template <class F>
  void* allocating(F&& f)
  {
    throw_if_refused();
    try {
      guard g(*this);
      return f();
    } catch (const out_of_memory& e) {
      if (auto* translate = translate_out_of_memory.load(std::memory_order_acquire)) translate(e);
      throw;
    }
  }

  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment) override
  {
    return allocating([&] { return box.allocate_async(bytes, alignment, stream); });
  }
  template <class F>
  void freeing(F&& f) noexcept
  {
    guard g(*this);
    if constexpr (noexcept(f())) {
      f();
    } else {
      try {
        f();
      } catch (const std::exception& e) {
        refused(e.what());
      } catch (...) {
        refused("an exception that is not a std::exception");
      }
    }
  }

  void deallocate(cuda::stream_ref stream, void* p, std::size_t bytes, std::size_t alignment) noexcept override
  {
    freeing([&]() noexcept(noexcept(box.deallocate_async(p, bytes, alignment, stream))) {
      box.deallocate_async(p, bytes, alignment, stream);
    });
  }
  void* allocate_sync(std::size_t bytes, std::size_t alignment) override
  {
    return allocating([&] { return box.allocate(bytes, alignment); });
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t alignment) noexcept override
  {
    freeing([&]() noexcept(noexcept(box.deallocate(p, bytes, alignment))) { box.deallocate(p, bytes, alignment); });
  }
  const std::type_info& type() const noexcept override { return typeid(Stack); }
  void* stack() noexcept override { return &box; }

  Stack box;
};

/// shared_ptr's deleter: destroys the stack except during process exit (Note [exit]).
struct rmm_release {
  void operator()(rmm_shared* s) const noexcept
  {
    const auto probe = s->exiting.load(std::memory_order_acquire);
    if (rmm_process_exiting().load(std::memory_order_acquire) || (probe != nullptr && probe())) return;
    delete s;
  }
};

} // namespace detail

inline namespace STRATA_RMM_ABI_NAMESPACE {

/// Any stream-ordered, device-accessible strata stack as a CCCL memory resource that RMM can hold: what
/// rmm::mr::set_current_device_resource, rmm::device_buffer and rmm::device_uvector take. Copies share the
/// stack (shared ownership, as CCCL's any_resource and RMM's per-device map copy and move it); the stack is
/// destroyed with the last copy (except during process exit: Note [exit]). Equal when they share one stack.
/// RMM calls its current resource from any thread, so every call takes a lock shared by all copies, unless the
/// stack was handed over with stack_is_thread_safe. Out of memory is strata::out_of_memory (rmm::out_of_memory
/// once rmm_current.hpp installed it). Misuse (a foreign pointer, a double free) is undefined with a plain stack,
/// as with any strata box; under checked<...> the stack refuses it and the next allocation throws usage_error
/// saying what it was (Note [refused frees]). Not move-only, never empty: a moved-from rmm_resource still
/// shares the stack.
/// Models: stream_resource and cccl::stream_resource_with<device_accessible> under every CCCL generation
/// (CCCL 3.0's allocate_async and 3.1's stream-first allocate(stream, bytes, alignment), allocate_sync);
/// device_accessible. Cost: one virtual call, an atomic load and a std::mutex lock and unlock, then the
/// stack's; copying is an atomic reference count. Thread-safe.
class rmm_resource : public sync_names<rmm_resource>, public stream_first_names<rmm_resource> {
public:
  using stream_first_names<rmm_resource>::allocate;
  using stream_first_names<rmm_resource>::deallocate;

  /// Takes a stack (moved in; held on the heap). Calls on it are serialized by a lock.
  template <class Stack>
    requires(!std::same_as<std::remove_cvref_t<Stack>, rmm_resource>) && rmm_stack<std::remove_cvref_t<Stack>>
  explicit rmm_resource(Stack&& stack) : rmm_resource(std::forward<Stack>(stack), true)
  {}
  /// Takes a stack that is safe to call from several threads at once; no lock of its own.
  template <class Stack>
    requires(!std::same_as<std::remove_cvref_t<Stack>, rmm_resource>) && rmm_stack<std::remove_cvref_t<Stack>>
  rmm_resource(Stack&& stack, stack_is_thread_safe_t) : rmm_resource(std::forward<Stack>(stack), false)
  {}

  rmm_resource(const rmm_resource&) = default;
  rmm_resource& operator=(const rmm_resource&) = default;
  /// A move copies: CCCL and RMM may use a moved-from resource's copy again, so none is ever left empty.
  rmm_resource(rmm_resource&& other) noexcept : shared_(other.shared_) {}
  rmm_resource& operator=(rmm_resource&& other) noexcept
  {
    shared_ = other.shared_;
    return *this;
  }
  ~rmm_resource() = default;

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
  {
    return shared_->allocate(stream, bytes, alignment);
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
  {
    shared_->deallocate(stream, p, bytes, alignment);
  }
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    return shared_->allocate_sync(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    shared_->deallocate_sync(p, bytes, alignment);
  }

  /// Runs f(stack) with the lock held (its usage(), release(), statistics...). std::invalid_argument when the
  /// stack is not a Stack (type() says what it is).
  template <class Stack, class F>
  decltype(auto) with_stack(F&& f) const
  {
    if (shared_->type() != typeid(Stack))
      throw std::invalid_argument(std::string("rmm_resource::with_stack: the stack is a ") + shared_->type().name() +
                                  ", not a " + typeid(Stack).name());
    std::unique_lock<std::mutex> lock(shared_->mutex, std::defer_lock);
    if (shared_->locks) lock.lock();
    return std::forward<F>(f)(*static_cast<Stack*>(shared_->stack()));
  }
  /// The stack's type.
  const std::type_info& type() const noexcept { return shared_->type(); }
  /// How many rmm_resource copies (RMM's included) share the stack.
  long use_count() const noexcept { return shared_.use_count(); }

  /// From now on, strata::out_of_memory leaves this resource (and every copy) as whatever `translate` throws;
  /// `translate` must throw. rmm_current.hpp installs RMM's.
  void translate_out_of_memory(void (*translate)(const out_of_memory&)) const noexcept
  {
    shared_->translate_out_of_memory.store(translate, std::memory_order_release);
  }
  /// Adds a test for "the process is exiting" to the one this header keeps (Note [exit]).
  void also_exiting_when(bool (*probe)() noexcept) const noexcept { shared_->exiting.store(probe, std::memory_order_release); }

  friend bool operator==(const rmm_resource& a, const rmm_resource& b) noexcept { return a.shared_ == b.shared_; }
  friend constexpr void get_property(const rmm_resource&, device_accessible) noexcept {}

private:
  template <class Stack>
  rmm_resource(Stack&& stack, bool lock)
  {
    detail::rmm_watch_process_exit();
    using S = std::remove_cvref_t<Stack>;
    shared_ = std::shared_ptr<detail::rmm_shared>(new detail::rmm_holder<S>(std::forward<Stack>(stack), lock),
                                                  detail::rmm_release{});
  }

  std::shared_ptr<detail::rmm_shared> shared_;
};

static_assert(stream_resource<rmm_resource> && std::copyable<rmm_resource>);
static_assert(cccl::stream_resource_with<rmm_resource, device_accessible>);
static_assert(cccl::synchronous_resource_with<rmm_resource, device_accessible>);
static_assert(!has_property<rmm_resource, host_accessible>);

} // namespace STRATA_RMM_ABI_NAMESPACE

} // namespace strata
