#pragma once
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <ostream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <type_traits>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/detail/adaptor_base.hpp>

namespace strata {

/// Writes every allocate and free in the trace format of bench/traces/README.md (CSV `op,id,bytes,stream`),
/// so a program's own workload can be replayed against other stacks, or against simulated_source to plan
/// capacity. Ids number allocations in order; streams are numbered in order of first use, 0 being the
/// synchronous calls and the legacy/per-thread default streams.
/// Models: whatever the upstream models; its properties. Cost: a mutex, a hash-map operation and one
/// formatted line per call. Thread-safe itself. Move-only; move-assignable when the upstream is; a moved-from
/// recorder throws usage_error on allocate (frees pass through unrecorded).
template <resource Upstream>
class recorder : public detail::adaptor_base<recorder<Upstream>, Upstream> {
  using base = detail::adaptor_base<recorder<Upstream>, Upstream>;

public:
  using base::allocate;
  using base::deallocate;

  /// Records to a stream the caller keeps alive.
  recorder(Upstream upstream, std::ostream& out) : upstream_(std::move(upstream)), state_(std::make_unique<state>())
  {
    state_->out = &out;
    write_header();
  }
  /// Records to a file it creates (and flushes when destroyed).
  recorder(Upstream upstream, const std::string& path) : upstream_(std::move(upstream)), state_(std::make_unique<state>())
  {
    state_->file.open(path);
    if (!state_->file) throw std::invalid_argument("recorder: cannot open " + path + " for writing");
    state_->out = &state_->file;
    write_header();
  }
  recorder(recorder&&) noexcept = default;
  recorder& operator=(recorder&&) noexcept(std::is_nothrow_move_assignable_v<Upstream>)
    requires std::is_move_assignable_v<Upstream>
  = default;

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    check_not_moved_from();
    void* p = upstream_.allocate(bytes, alignment);
    try {
      on_allocate(p, bytes, 0);
    } catch (...) {
      upstream_.deallocate(p, bytes, alignment);
      throw;
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    on_free(p, bytes, 0);
    upstream_.deallocate(p, bytes, alignment);
  }
  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires stream_resource<Upstream>
  {
    check_not_moved_from();
    void* p = upstream_.allocate_async(bytes, alignment, stream);
    try {
      on_allocate(p, bytes, handle_of(stream));
    } catch (...) {
      upstream_.deallocate_async(p, bytes, alignment, stream);
      throw;
    }
    return p;
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
    requires stream_resource<Upstream>
  {
    on_free(p, bytes, handle_of(stream));
    upstream_.deallocate_async(p, bytes, alignment, stream);
  }

  /// Lines written (allocations and frees).
  std::size_t events() const
  {
    if (state_ == nullptr) return 0;
    std::lock_guard lock(state_->mutex);
    return state_->events;
  }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }

  friend bool operator==(const recorder& a, const recorder& b) noexcept { return &a == &b; }

private:
  struct state {
    std::ofstream file;
    std::ostream* out = nullptr;
    std::mutex mutex;
    std::unordered_map<const void*, std::uint64_t> ids;
    std::unordered_map<std::uintptr_t, std::uint64_t> streams;
    std::uint64_t next_id = 0;
    std::size_t events = 0;
  };

  void write_header() { *state_->out << "op,id,bytes,stream\n"; }

  /// A moved-from recorder has nowhere to write: it refuses to allocate rather than lose lines silently.
  void check_not_moved_from() const
  {
    if (state_ == nullptr) throw usage_error("recorder: used after being moved from (its trace went with the move)");
  }

  /// 0 for the synchronous calls and the default streams (whose handles need no numbering).
  static std::uintptr_t handle_of(cuda::stream_ref stream) noexcept
  {
    const cudaStream_t s = stream.get();
    return s == cudaStreamLegacy || s == cudaStreamPerThread ? 0 : reinterpret_cast<std::uintptr_t>(s);
  }

  /// The trace's number for a stream handle, in order of first use; called with the mutex held.
  std::uint64_t number_of(std::uintptr_t handle) const
  {
    if (handle == 0) return 0;
    return state_->streams.try_emplace(handle, state_->streams.size() + 1).first->second;
  }

  void on_allocate(void* p, std::size_t bytes, std::uintptr_t stream)
  {
    if (p == nullptr) return;
    std::lock_guard lock(state_->mutex);
    const std::uint64_t id = state_->next_id++;
    state_->ids[p] = id;
    *state_->out << "a," << id << ',' << bytes << ',' << number_of(stream) << '\n';
    ++state_->events;
  }
  void on_free(void* p, std::size_t bytes, std::uintptr_t stream) noexcept
  {
    if (p == nullptr || state_ == nullptr) return;
    std::lock_guard lock(state_->mutex);
    const auto it = state_->ids.find(p);
    if (it == state_->ids.end()) return;  // allocated before recording began
    try {
      *state_->out << "f," << it->second << ',' << bytes << ',' << number_of(stream) << '\n';
    } catch (...) {
    }
    state_->ids.erase(it);
    ++state_->events;
  }

  [[no_unique_address]] Upstream upstream_;
  std::unique_ptr<state> state_;
};

namespace detail::recorder_claims {
using R = recorder<archetype_resource>;
static_assert(resource<R> && !stream_resource<R> && answers_to_cccl31_names<R>);
static_assert(cccl::synchronous_resource_with<R, device_accessible>);
} // namespace detail::recorder_claims

} // namespace strata
