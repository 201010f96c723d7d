#pragma once
// One device's stack behind a small virtual interface, so that the C entry points serve whichever stack the
// configuration names (and, with record=PATH, the same stack under strata's recorder).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <strata_alloc.h>

#include <strata/adaptor/recorder.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/usage.hpp>
#include <strata/default_pool.hpp>
#include <strata/pages/page_backend.hpp>
#include <strata/pinned/pin_lender.hpp>
#include <strata/sleep/tag_scope.hpp>
#include <strata/stream/cuda_events.hpp>
#include <strata/stream/identified_stream.hpp>

#include "ipc_handles.hpp"
#include "recorded_uses.hpp"

namespace strata::plugin {

/// What a stack has asked of CUDA so far, for memory_stats: the calls that cost host time beyond the pool's
/// own bookkeeping. Page calls are zero for a stack without page mapping.
struct stack_calls {
  std::uint64_t events = 0;         ///< events recorded by the stream layer
  std::uint64_t stream_waits = 0;   ///< cudaStreamWaitEvent calls (blocks handed between streams, orderings)
  std::uint64_t host_waits = 0;     ///< the stream layer's host waits (event, stream or device synchronize)
  std::uint64_t policy_calls = 0;   ///< allocations the stream layer could not serve from a stream's own frees
  std::uint64_t relocations = 0;    ///< idle mappings moved to where they were needed
  page_counters pages{};            ///< the page backend's driver calls (maps, unmaps, device waits, ...)
};

/// What the figures of every allocation and free read of the stack: one virtual call for all of it.
struct stack_reading {
  strata::usage usage{};
  std::size_t held_bytes = 0;
  std::size_t held_blocks = 0;
  std::uint64_t page_creates = 0;   ///< physical allocations since built (zero without page mapping)
  std::uint64_t page_releases = 0;
  std::uint64_t page_maps = 0;      ///< mappings made since built, relocations included (zero without page mapping)
  std::uint64_t page_unmaps = 0;
  std::size_t releasable = 0;       ///< idle bytes release() would hand back (free pages, wholly free chunks)
};

/// What the C entry points need of a device's stack. Not thread-safe: the plug-in holds the device's lock.
/// Every call costs what the stack's call costs, plus one virtual call (less a driver call on the legacy stream).
class device_stack {
public:
  virtual ~device_stack() = default;
  /// Throws std::bad_alloc (strata::out_of_memory) when the stack is out of memory, other exceptions on
  /// other failures; the stack is unchanged then.
  virtual void* allocate(std::size_t bytes, cudaStream_t stream) = 0;
  /// Frees on the allocation's stream, unless recorded uses hold the block back until they are done.
  virtual void deallocate(void* p, std::size_t bytes, cudaStream_t stream) noexcept = 0;
  /// p is used on `stream` too (PyTorch's record_stream).
  virtual void record_use(void* p, cudaStream_t stream) = 0;
  /// Whether p was handed out by this stack.
  virtual bool owns(const void* p) const noexcept = 0;
  /// Gives back held blocks whose recorded uses are done (never waits).
  virtual void reap() noexcept = 0;
  /// Waits for every held block and every pending free, then returns idle memory (empty_cache).
  virtual void release() = 0;
  /// Caps the bytes the stack holds from CUDA (set_per_process_memory_fraction): never above the cap it was
  /// built with. Memory held above a lowered cap stays until its blocks are free and go back; no growth lifts
  /// the stack over it.
  virtual void set_reserved_cap(std::size_t bytes) noexcept = 0;
  virtual strata::usage usage() const noexcept = 0;
  virtual std::size_t held_bytes() const noexcept = 0;
  virtual std::size_t held_blocks() const noexcept = 0;
  virtual stack_calls calls() const noexcept = 0;
  virtual stack_reading read() const noexcept = 0;
  virtual std::string snapshot_json() const = 0;
  /// Flushes the trace file, if recording; false on a write error.
  virtual bool flush_trace() noexcept = 0;
  /// PyTorch's graph-pool hooks; throw std::logic_error where the stream layer has no private pools.
  virtual void begin_allocate_to_pool(std::uint64_t pool, std::function<bool(cudaStream_t)> filter) = 0;
  virtual void end_allocate_to_pool(std::uint64_t pool) = 0;
  virtual void release_pool(std::uint64_t pool) = 0;
  /// Page-mapped stacks: the block starting at p as another process maps it (the descriptors are new, owned by
  /// the result); empty for a stack without page mapping. std::invalid_argument where p starts no live block,
  /// std::logic_error where the pages were made unexportable; nothing stays open after a failure. A driver
  /// call per allocation behind the block.
  virtual shared_block share(const void* p) const = 0;
  /// Lets device `peer` reach this stack's memory, held now and taken later (PyTorch's enablePeerAccess): page-
  /// mapped stacks set each mapping's access again (mapped_pool::add_peer); stacks over cudaMalloc'd memory
  /// need nothing beyond cudaDeviceEnablePeerAccess. false where nothing was to be done. A driver call per
  /// mapping the first time; errors as mapped_pool::add_peer.
  virtual bool grant_peer(int peer) = 0;
  /// Sleep and wake by tag (docs/sleep_wake.md): pause first gives back every block held for recorded uses
  /// (waiting for them), as release() does. std::logic_error where the stack's policy has no tags.
  virtual void pause(std::span<const tag_id> tags, bool backup) = 0;
  virtual void resume(std::span<const tag_id> tags) = 0;
  virtual void reserve_backup(std::size_t bytes) = 0;
  virtual std::size_t release_backup() = 0;
  /// Pinned host memory held for backups now (0 without tags).
  virtual std::size_t backup_bytes() const noexcept = 0;
  /// Borrows the backup from `lender` from here on (empty: pins its own; Note [One pinned budget]). The caller
  /// sees that backup_bytes() is 0 and no tag is paused first: memory out goes back to where it came from
  /// (mapped_pool::lend_pins_from refuses otherwise, with strata::usage_error). False, nothing done, where the
  /// stack cannot sleep. O(1).
  virtual bool lend_backup(pin_lender lender) = 0;
  /// Whether this device holds memory or live blocks under `tag`, or has it paused; false without tags.
  virtual bool holds_tag(tag_id tag) const noexcept = 0;
  virtual bool tag_paused(tag_id tag) const noexcept = 0;
  /// The tag's figures (strata_tag_figures' fields); false, all zero, where the stack has no tags.
  virtual bool tag_figures(tag_id tag, strata_tag_figures& out) const noexcept = 0;
};

/// A stream_ordered Stack (optionally under recorder, which writes the trace to a file this holder owns).
template <class Stack, bool Recorded>
class stack_holder final : public device_stack {
  using top_type = std::conditional_t<Recorded, recorder<Stack>, Stack>;
  using backend_type = std::remove_reference_t<decltype(std::declval<Stack&>().backend())>;

public:
  explicit stack_holder(Stack stack)
    requires(!Recorded)
      : top_(std::move(stack)), built_cap_(cap_of(inner()))
  {}
  stack_holder(Stack stack, const std::string& trace_path)
    requires Recorded
      : file_(open(trace_path)), top_(std::move(stack), *file_), built_cap_(cap_of(inner()))
  {}
  ~stack_holder() override
  {
    uses_.destroy(inner().backend());
    if (file_) file_->flush();
  }

  void* allocate(std::size_t bytes, cudaStream_t stream) override
  {
    if (const identified_stream* legacy = legacy_if(stream, /*look_up=*/true)) return top_.allocate_async(bytes, default_alignment, *legacy);
    return top_.allocate_async(bytes, default_alignment, cuda::stream_ref{stream});
  }

  void deallocate(void* p, std::size_t bytes, cudaStream_t stream) noexcept override
  {
    if (uses_.hold(inner().backend(), p, bytes, stream)) return;
    free_now(p, bytes, stream);
  }

  void record_use(void* p, cudaStream_t stream) override { uses_.record(p, stream); }
  bool owns(const void* p) const noexcept override { return inner().owns(p); }

  void reap() noexcept override
  {
    uses_.reap(inner().backend(), [this](void* p, std::size_t n, cudaStream_t s) { free_now(p, n, s); });
  }

  void release() override
  {
    uses_.drain(inner().backend(), [this](void* p, std::size_t n, cudaStream_t s) { free_now(p, n, s); });
    inner().release();
  }

  strata::usage usage() const noexcept override { return inner().usage(); }
  std::size_t held_bytes() const noexcept override { return uses_.held_bytes(); }
  std::size_t held_blocks() const noexcept override { return uses_.held_blocks(); }

  void set_reserved_cap(std::size_t bytes) noexcept override
  {
    const std::size_t cap = std::min(bytes, built_cap_);
    if constexpr (requires(Stack& t) { t.policy().set_max_physical(cap); }) inner().policy().set_max_physical(cap);
    else if constexpr (requires(Stack& t) { t.policy().set_max_reserved(cap); }) inner().policy().set_max_reserved(cap);
  }

  stack_reading read() const noexcept override
  {
    stack_reading r{.usage = inner().usage(), .held_bytes = uses_.held_bytes(), .held_blocks = uses_.held_blocks()};
    if constexpr (requires { inner().policy().idle_bytes(); }) r.releasable = inner().policy().idle_bytes();
    if constexpr (requires { inner().policy().page_calls(); }) {
      const page_counters& pages = inner().policy().page_calls();
      r.page_creates = pages.creates;
      r.page_releases = pages.releases;
      r.page_maps = pages.maps;
      r.page_unmaps = pages.unmaps;
    } else if constexpr (requires { inner().policy().upstream().snapshot_counts(); }) {
      // Chunks from a counting upstream (the coalescing stack's cudaMalloc calls): every chunk taken is a
      // driver allocation, every one given back a driver free.
      const auto counts = inner().policy().upstream().snapshot_counts();
      r.page_creates = counts.total_blocks;
      r.page_releases = counts.total_blocks - counts.current_blocks;
    }
    return r;
  }

  stack_calls calls() const noexcept override
  {
    const auto& layer = inner().stats();
    stack_calls c{.events = layer.events,
                  .stream_waits = layer.handovers + layer.orderings,
                  .host_waits = layer.host_waits,
                  .policy_calls = layer.misses,
                  .relocations = 0,
                  .pages = {}};
    if constexpr (requires { inner().policy().page_calls(); }) {
      c.pages = inner().policy().page_calls();
      c.relocations = inner().policy().relocations();
    }
    return c;
  }

  shared_block share(const void* p) const override
  {
    using policy_type = std::remove_cvref_t<decltype(inner().policy())>;
    if constexpr (requires(const policy_type& pol, const typename policy_type::backing& b) {
                    pol.backing_of(p);
                    pol.backend().export_fd(b.page);
                  }) {
      const auto& policy = inner().policy();
      return share_of(policy, p, [&](const auto& page) { return policy.backend().export_fd(page); });
    } else {
      return {};
    }
  }

  bool grant_peer(int peer) override
  {
    if constexpr (requires { inner().policy().add_peer(peer); }) return inner().policy().add_peer(peer);
    else return false;
  }

  std::string snapshot_json() const override
  {
    if constexpr (snapshot_resource<std::remove_cvref_t<decltype(inner().policy())>>) return to_json(inner().policy().snapshot());
    else throw std::logic_error("this stack's policy cannot list its blocks (no snapshot())");
  }

  bool flush_trace() noexcept override
  {
    if (!file_) return true;
    file_->flush();
    return static_cast<bool>(*file_);
  }

  void begin_allocate_to_pool(std::uint64_t pool, std::function<bool(cudaStream_t)> filter) override
  {
    if constexpr (requires(Stack& s) { s.begin_allocate_to_pool(pool, filter); }) inner().begin_allocate_to_pool(pool, std::move(filter));
    else no_private_pools();
  }
  void end_allocate_to_pool(std::uint64_t pool) override
  {
    if constexpr (requires(Stack& s) { s.end_allocate_to_pool(pool); }) inner().end_allocate_to_pool(pool);
    else no_private_pools();
  }
  void release_pool(std::uint64_t pool) override
  {
    if constexpr (requires(Stack& s) { s.release_pool(pool); }) inner().release_pool(pool);
    else no_private_pools();
  }

  void pause(std::span<const tag_id> tags, bool backup) override
  {
    if constexpr (sleeps) {
      uses_.drain(inner().backend(), [this](void* p, std::size_t n, cudaStream_t s) { free_now(p, n, s); });
      strata::pause(inner(), tags, backup);
    } else {
      no_tags();
    }
  }
  void resume(std::span<const tag_id> tags) override
  {
    if constexpr (sleeps) strata::resume(inner(), tags);
    else no_tags();
  }
  void reserve_backup(std::size_t bytes) override
  {
    if constexpr (sleeps) inner().policy().reserve_backup(bytes);
    else no_tags();
  }
  std::size_t release_backup() override
  {
    if constexpr (sleeps) return inner().policy().release_backup();
    else return 0;
  }
  std::size_t backup_bytes() const noexcept override
  {
    if constexpr (sleeps) return inner().policy().backup_bytes();
    else return 0;
  }
  bool lend_backup(pin_lender lender) override
  {
    if constexpr (borrows) {
      inner().policy().lend_pins_from(lender);
      return true;
    } else {
      return false;
    }
  }
  bool holds_tag(tag_id tag) const noexcept override
  {
    if constexpr (sleeps) {
      const auto& p = inner().policy();
      return p.paused(tag) || p.in_use(tag) > 0 || p.physical_bytes(tag) > 0;
    } else {
      return false;
    }
  }
  bool tag_paused(tag_id tag) const noexcept override
  {
    if constexpr (sleeps) return inner().policy().paused(tag);
    else return false;
  }
  bool tag_figures(tag_id tag, strata_tag_figures& out) const noexcept override
  {
    out = strata_tag_figures{};
    if constexpr (sleeps) {
      const auto& p = inner().policy();
      out = {p.physical_bytes(tag), p.in_use(tag), p.paused_bytes(tag), p.paused(tag) ? 1 : 0};
      return true;
    } else {
      return false;
    }
  }

  Stack& inner() noexcept
  {
    if constexpr (Recorded) return top_.upstream();
    else return top_;
  }
  const Stack& inner() const noexcept
  {
    if constexpr (Recorded) return top_.upstream();
    else return top_;
  }

private:
  static std::unique_ptr<std::ofstream> open(const std::string& path)
  {
    auto f = std::make_unique<std::ofstream>(path);
    if (!*f) throw std::invalid_argument("record=" + path + ": cannot open the trace file for writing");
    return f;
  }

  /// The cap on bytes held from CUDA the stack was built with (SIZE_MAX: none, or none it can move).
  static std::size_t cap_of(const Stack& stack) noexcept
  {
    if constexpr (requires { stack.policy().settings().max_physical; }) return stack.policy().settings().max_physical;
    else if constexpr (requires { stack.policy().max_reserved(); }) return stack.policy().max_reserved();
    else return SIZE_MAX;
  }

  static constexpr bool sleeps = requires(Stack& s, std::span<const tag_id> t) { strata::pause(s, t, true); };
  /// Whether the stack sleeps over a page backend (its policy's) that can borrow the backup.
  static constexpr bool borrows = [] {
    if constexpr (sleeps) return lends_pins<std::remove_cvref_t<decltype(std::declval<Stack&>().policy().backend())>>;
    else return false;
  }();

  [[noreturn]] static void no_tags()
  {
    throw std::logic_error("sleep and wake by tag need a page-mapped stack (stack=default_pool or stack=simulated)");
  }

  [[noreturn]] static void no_private_pools()
  {
    throw std::logic_error("CUDA graph pools: this build's stream_ordered has no private pools "
                           "(begin_allocate_to_pool); capture allocations before capture instead");
  }

  void free_now(void* p, std::size_t bytes, cudaStream_t stream) noexcept
  {
    if (const identified_stream* legacy = legacy_if(stream, /*look_up=*/false)) return top_.deallocate_async(p, bytes, default_alignment, *legacy);
    top_.deallocate_async(p, bytes, default_alignment, cuda::stream_ref{stream});
  }

  /// Streams are CUDA's, and the top of the stack takes them with their ids (the recorder takes handles only).
  static constexpr bool identifies_streams = !Recorded && std::is_same_v<backend_type, cuda_events>;

  /// The legacy default stream (PyTorch's main stream, handle 0) with its id, when `stream` is it: looked up
  /// once, by the first allocation on it (the legacy stream's id is the device's: allocations always run with
  /// the device current, a free may not when making it current failed), then stream_ordered tells it apart
  /// with no driver call (one per allocate and per free otherwise). Null for other streams.
  const identified_stream* legacy_if(cudaStream_t stream, bool look_up) noexcept
  {
    if constexpr (identifies_streams) {
      if (explicit_stream(cuda::stream_ref{stream}).get() != cudaStreamLegacy) return nullptr;
      if (!legacy_) {
        if (!look_up) return nullptr;
        try {
          legacy_ = identify(cuda::stream_ref{cudaStreamLegacy});
        } catch (...) {
          return nullptr;  // the handle's own path reports the failure
        }
      }
      return &*legacy_;
    } else {
      return nullptr;
    }
  }

  std::unique_ptr<std::ofstream> file_;  // before top_: the recorder writes to it until it is destroyed
  top_type top_;
  recorded_uses<backend_type> uses_;
  std::optional<identified_stream> legacy_;
  std::size_t built_cap_;
};

} // namespace strata::plugin
