#pragma once
#include <atomic>
#include <concepts>
#include <cstddef>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/devices.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/usage.hpp>

namespace strata {

/// per_device's default factory: `Stack(device)`, for stacks built from a device number alone (device_source).
/// The recommended stack has its own (default_pool_factory, default_pool.hpp).
template <class Stack>
struct construct_on_device {
  Stack operator()(int device) const
    requires std::constructible_from<Stack, int>
  {
    return Stack(device);
  }
};

/// One stack per device, built on first use from `factory(device)`: what a program that uses several GPUs
/// holds where it would hold one stack for one GPU (what PyTorch's caching allocator keeps per device).
/// - allocate / allocate_async take from the stack of the calling thread's current device;
/// - deallocate / deallocate_async give the block back to the stack of *its* device, whatever device is
///   current. Stacks that can say whether they handed a pointer out (owning_resource: every policy,
///   stream_ordered over one, mapped_pool) are asked, the current device's stack first, so a free costs one or
///   a few owns() lookups and no driver call; otherwise the backend is asked where the pointer lives
///   (cuda_devices: cudaPointerGetAttributes, a driver call on every free). A synchronous free runs with the
///   block's device current (as cudaFree works device-wide, a stack's device-wide waits must name the block's
///   device); a stream-ordered free runs on the caller's stream with the current device left alone (the
///   stream's device is what CUDA checks events and waits against);
/// - for_device(d) builds and returns device d's stack, for callers that are told the device (PyTorch's
///   allocator interface passes it); built(d) returns it only if it exists;
/// - release() and usage() go over the stacks built so far; usage(d) is one device's.
/// A free of a pointer no stack handed out is misuse (undefined, as for any box); here it does nothing.
/// Models: resource; stream_resource when Stack is; owning_resource, releasable_resource,
/// usage_reporting_resource when Stack is; Stack's properties. Alignment: Stack's.
/// Cost: one current-device query (cudaGetDevice: thread-local, no driver call) and an atomic load per
/// allocation on top of the stack's; per free, owns() on up to every built stack (owning stacks) or one
/// cudaPointerGetAttributes, plus a cudaSetDevice pair when a synchronous free comes from another device.
/// Building a stack is thread-safe (std::call_once per device; a factory that throws leaves the slot empty
/// for the next try). The stacks themselves are as thread-safe as they are: routing a free asks other
/// devices' stacks owns(), so share per_device between threads only over stacks whose every call takes a lock
/// (synchronized<...>). Move-only: a move hands every stack over and leaves the source with none (it may
/// only be destroyed or assigned to).
template <resource Stack, class Factory = construct_on_device<Stack>, device_backend Devices = cuda_devices>
  requires std::invocable<const Factory&, int> && std::same_as<std::invoke_result_t<const Factory&, int>, Stack>
class per_device : public forward_properties<per_device<Stack, Factory, Devices>, Stack>,
                   public sync_names<per_device<Stack, Factory, Devices>>,
                   public stream_first_names<per_device<Stack, Factory, Devices>, stream_resource<Stack>> {
  using names = stream_first_names<per_device<Stack, Factory, Devices>, stream_resource<Stack>>;

public:
  using names::allocate;
  using names::deallocate;
  static constexpr std::size_t max_alignment = max_alignment_of<Stack>;

  /// Asks the backend how many devices there are (cudaGetDeviceCount); builds no stack.
  per_device() requires std::default_initializable<Factory> && std::default_initializable<Devices> : per_device(Factory{}, Devices{}) {}
  explicit per_device(Factory factory) requires std::default_initializable<Devices> : per_device(std::move(factory), Devices{}) {}
  per_device(Factory factory, Devices devices)
      : factory_(std::move(factory)), devices_(std::move(devices)), count_(devices_.count()),
        slots_(std::make_unique<slot[]>(static_cast<std::size_t>(count_)))
  {}
  per_device(per_device&& other) noexcept
      : factory_(std::move(other.factory_)), devices_(other.devices_), count_(std::exchange(other.count_, 0)),
        slots_(std::move(other.slots_))
  {}
  per_device& operator=(per_device&& other) noexcept
  {
    if (this != &other) {
      destroy();
      factory_ = std::move(other.factory_);
      devices_ = other.devices_;
      count_ = std::exchange(other.count_, 0);
      slots_ = std::move(other.slots_);
    }
    return *this;
  }
  per_device(const per_device&) = delete;
  per_device& operator=(const per_device&) = delete;
  ~per_device() { destroy(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    return for_device(devices_.current()).allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    const int device = device_of_block(p);
    if (device < 0) return;
    const on_device_for_free on(devices_, device);
    built(device)->deallocate(p, bytes, alignment);
  }

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires stream_resource<Stack>
  {
    return for_device(devices_.current()).allocate_async(bytes, alignment, stream);
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
    requires stream_resource<Stack>
  {
    if (p == nullptr) return;
    const int device = device_of_block(p);
    if (device >= 0) built(device)->deallocate_async(p, bytes, alignment, stream);
  }

  /// Device `device`'s stack, built now if it was not (std::invalid_argument for a device outside [0, devices())).
  Stack& for_device(int device)
  {
    check_device(device);
    slot& s = slots_[static_cast<std::size_t>(device)];
    std::call_once(s.once, [&] { s.stack.store(new Stack(factory_(device)), std::memory_order_release); });
    return *s.stack.load(std::memory_order_acquire);
  }
  /// Device `device`'s stack if it has been built, else nullptr. No CUDA call.
  Stack* built(int device) const noexcept
  {
    if (device < 0 || device >= count_) return nullptr;
    return slots_[static_cast<std::size_t>(device)].stack.load(std::memory_order_acquire);
  }

  int devices() const noexcept { return count_; }
  const Devices& device_backend() const noexcept { return devices_; }

  /// The device whose stack handed p out, or -1 (owning stacks: owns(); otherwise the backend's pointer query).
  int device_of_block(const void* p) const noexcept
  {
    if constexpr (owning_resource<Stack>) {
      const int first = current_or(-1);
      if (const Stack* s = built(first); s != nullptr && s->owns(p)) return first;
      for (int d = 0; d < count_; ++d)
        if (const Stack* s = built(d); d != first && s != nullptr && s->owns(p)) return d;
      return -1;
    } else {
      const int device = devices_.device_of(p);
      return built(device) != nullptr ? device : -1;
    }
  }

  bool owns(const void* p) const noexcept
    requires owning_resource<Stack>
  {
    return device_of_block(p) >= 0;
  }

  /// Every built stack's release(), each with its device current.
  void release()
    requires releasable_resource<Stack>
  {
    for (int d = 0; d < count_; ++d)
      if (Stack* s = built(d)) {
        const on_device on(devices_, d);
        s->release();
      }
  }

  /// The built stacks' usage summed (largest_free: the largest of them: no request spans two devices).
  strata::usage usage() const
    requires usage_reporting_resource<Stack>
  {
    strata::usage total;
    for (int d = 0; d < count_; ++d)
      if (const Stack* s = built(d)) total += s->usage();
    return total;
  }
  /// One device's usage (all zero when its stack was never built).
  strata::usage usage(int device) const
    requires usage_reporting_resource<Stack>
  {
    check_device(device);
    const Stack* s = built(device);
    return s == nullptr ? strata::usage{} : s->usage();
  }

  friend bool operator==(const per_device& a, const per_device& b) noexcept { return &a == &b; }

private:
  struct slot {
    std::once_flag once;
    std::atomic<Stack*> stack{nullptr};
  };

  /// Makes a device current for a scope and restores the caller's (throws where the backend does).
  class on_device {
  public:
    on_device(const Devices& devices, int device) : devices_(devices), previous_(devices.current())
    {
      if (previous_ == device) previous_ = -1;
      else devices_.make_current(device);
    }
    on_device(const on_device&) = delete;
    on_device& operator=(const on_device&) = delete;
    ~on_device()
    {
      if (previous_ >= 0) {
        try {
          devices_.make_current(previous_);
        } catch (...) {  // the runtime is going away: nothing to restore
        }
      }
    }

  private:
    const Devices& devices_;
    int previous_;
  };

  /// The same for a free, which cannot throw: if the device cannot be made current, the free still happens
  /// (on whatever device is current) rather than leaking the block.
  class on_device_for_free {
  public:
    on_device_for_free(const Devices& devices, int device) noexcept : devices_(devices)
    {
      try {
        previous_ = devices.current();
        if (previous_ == device) previous_ = -1;
        else devices_.make_current(device);
      } catch (...) {
        previous_ = -1;
      }
    }
    on_device_for_free(const on_device_for_free&) = delete;
    on_device_for_free& operator=(const on_device_for_free&) = delete;
    ~on_device_for_free()
    {
      if (previous_ < 0) return;
      try {
        devices_.make_current(previous_);
      } catch (...) {
      }
    }

  private:
    const Devices& devices_;
    int previous_ = -1;
  };

  int current_or(int otherwise) const noexcept
  {
    try {
      return devices_.current();
    } catch (...) {
      return otherwise;
    }
  }

  void check_device(int device) const
  {
    if (device < 0 || device >= count_)
      throw std::invalid_argument("per_device: device " + std::to_string(device) + " is not in [0, " +
                                  std::to_string(count_) + ")" + (slots_ ? "" : " (moved from)"));
  }

  /// Each stack goes with its device current: its destructor may wait for or free memory on that device.
  void destroy() noexcept
  {
    for (int d = count_ - 1; d >= 0; --d)
      if (Stack* s = built(d)) {
        const on_device_for_free on(devices_, d);
        delete s;
      }
    slots_.reset();
    count_ = 0;
  }

  [[no_unique_address]] Factory factory_;
  [[no_unique_address]] Devices devices_;
  int count_ = 0;
  std::unique_ptr<slot[]> slots_;
};

namespace detail::per_device_claims {
struct archetype_factory {
  archetype_resource operator()(int) const { return {}; }
};
using P = per_device<archetype_resource, archetype_factory>;
static_assert(resource<P> && !stream_resource<P> && !owning_resource<P> && answers_to_cccl31_names<P>);
static_assert(cccl::synchronous_resource_with<P, device_accessible> && !has_property<P, host_accessible>);
static_assert(!std::is_copy_constructible_v<P> && std::is_nothrow_move_constructible_v<P>);
} // namespace detail::per_device_claims

} // namespace strata
