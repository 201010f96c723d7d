#pragma once
// Pretend devices for per_device on machines without a GPU (or with one): a number of devices, a current
// device per host thread, and memory that knows its device, so routing by the current device on allocation
// and by the pointer on free is tested in CI, including frees made while another device is current.
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/devices.hpp>
#include <strata/core/properties.hpp>
#include <strata/source/host_source.hpp>

namespace strata {

/// The world: `count` devices, each host thread's current device (0 until changed, as in CUDA), and the
/// address ranges handed out on each device (what cudaPointerGetAttributes looks up). Counts the pointer
/// queries so tests can see which frees paid for one. Thread-safe (one mutex); held by pointer by its handles,
/// so it must outlive them.
class simulated_devices {
public:
  explicit simulated_devices(int count) : count_(count)
  {
    if (count < 1) throw std::invalid_argument("simulated_devices: " + std::to_string(count) + " devices (at least 1)");
  }
  simulated_devices(const simulated_devices&) = delete;
  simulated_devices& operator=(const simulated_devices&) = delete;

  int count() const noexcept { return count_; }

  int current() const
  {
    std::scoped_lock lock(mutex_);
    const auto it = current_.find(std::this_thread::get_id());
    return it == current_.end() ? 0 : it->second;
  }
  /// Like cudaSetDevice: a device outside [0, count) is an error and changes nothing.
  void make_current(int device)
  {
    check(device, "make_current");
    std::scoped_lock lock(mutex_);
    current_[std::this_thread::get_id()] = device;
  }

  /// The device of the range p lies in, or -1.
  int device_of(const void* p) const noexcept
  {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::scoped_lock lock(mutex_);
    ++pointer_queries_;
    auto it = ranges_.upper_bound(a);
    if (it == ranges_.begin()) return -1;
    --it;
    return a < it->second.end ? it->second.device : -1;
  }

  /// device_of calls so far.
  std::uint64_t pointer_queries() const
  {
    std::scoped_lock lock(mutex_);
    return pointer_queries_;
  }

  /// Records [p, p + bytes) as memory of `device`. Strong guarantee.
  void claim(int device, const void* p, std::size_t bytes)
  {
    check(device, "claim");
    std::scoped_lock lock(mutex_);
    ranges_.emplace(reinterpret_cast<std::uintptr_t>(p), range{reinterpret_cast<std::uintptr_t>(p) + bytes, device});
  }
  void unclaim(const void* p) noexcept
  {
    std::scoped_lock lock(mutex_);
    ranges_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  std::size_t claimed_ranges() const
  {
    std::scoped_lock lock(mutex_);
    return ranges_.size();
  }

  /// The device_backend over this world.
  class backend {
  public:
    explicit backend(simulated_devices& world) noexcept : world_(&world) {}
    int count() const noexcept { return world_->count(); }
    int current() const { return world_->current(); }
    void make_current(int device) const { world_->make_current(device); }
    int device_of(const void* p) const noexcept { return world_->device_of(p); }
    simulated_devices& world() const noexcept { return *world_; }
    friend bool operator==(const backend& a, const backend& b) noexcept { return a.world_ == b.world_; }

  private:
    simulated_devices* world_;
  };

private:
  struct range {
    std::uintptr_t end;
    int device;
  };
  void check(int device, const char* call) const
  {
    if (device < 0 || device >= count_)
      throw std::invalid_argument("simulated_devices::" + std::string(call) + ": device " + std::to_string(device) +
                                  " is not in [0, " + std::to_string(count_) + ")");
  }

  int count_;
  mutable std::mutex mutex_;
  std::map<std::thread::id, int> current_;
  std::map<std::uintptr_t, range> ranges_;
  mutable std::uint64_t pointer_queries_ = 0;
};

static_assert(device_backend<simulated_devices::backend>);

/// Host memory that is "on" one simulated device: each allocation is claimed in the world, so the world's
/// device_of finds it (and every block a pool carves from it), as cudaPointerGetAttributes finds cudaMalloc'd
/// memory. Models: resource, host_accessible (it is host memory, so tests may write it). Any power-of-two
/// alignment. Equal when of the same world and device. Cost: operator new plus one map insertion under the
/// world's mutex. Thread-safe.
class simulated_device_memory : public sync_names<simulated_device_memory> {
public:
  static constexpr std::size_t max_alignment = host_source::max_alignment;

  simulated_device_memory(simulated_devices& world, int device) : world_(&world), device_(device)
  {
    if (device < 0 || device >= world.count())
      throw std::invalid_argument("simulated_device_memory: device " + std::to_string(device) + " is not in [0, " +
                                  std::to_string(world.count()) + ")");
  }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    void* p = host_source{}.allocate(bytes, alignment);
    if (p == nullptr) return p;
    try {
      world_->claim(device_, p, bytes);
    } catch (...) {
      host_source{}.deallocate(p, bytes, alignment);
      throw;
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (p == nullptr) return;
    world_->unclaim(p);
    host_source{}.deallocate(p, bytes, alignment);
  }

  int device() const noexcept { return device_; }

  friend bool operator==(const simulated_device_memory& a, const simulated_device_memory& b) noexcept
  {
    return a.world_ == b.world_ && a.device_ == b.device_;
  }
  friend constexpr void get_property(const simulated_device_memory&, host_accessible) noexcept {}

private:
  simulated_devices* world_;
  int device_;
};

static_assert(resource<simulated_device_memory> && answers_to_cccl31_names<simulated_device_memory>);

} // namespace strata
