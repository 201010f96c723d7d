#pragma once
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/archetype.hpp>
#include <strata/core/cccl_claims.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/pages/backup_store.hpp>
#include <strata/detail/pages/mapped_core.hpp>
#include <strata/detail/pages/tag_sleep.hpp>
#include <strata/detail/pages/borrowed_pages.hpp>
#include <strata/pages/page_backend.hpp>
#include <strata/sleep/tag_scope.hpp>

namespace strata {

/// A pool over page-mapped memory (CUDA virtual memory management; docs/architecture.md, "Page-mapped
/// memory"). Two large address ranges are reserved, for requests up to `small_limit` and for larger ones,
/// each one TLSF pool whose free blocks merge across page boundaries (detail/address_range.hpp). Physical
/// memory stands only behind pages live blocks touch (detail/pages/page_table.hpp): a run of unmapped pages gets one
/// physical allocation. A mapping no live block touches stays mapped ("idle") and is reused in place; it is
/// given back only when a new mapping would lift the memory held above the budget (detail/pages/reclaim_budget.hpp),
/// first by relocating idle allocations to where they are needed (detail/pages/mapping_relocation.hpp), then by
/// one device wait and unmapping those idle longest. release() gives every idle mapping back.
///
/// Tags (docs/sleep_wake.md): every allocation carries a tag, the calling thread's (`tag_scope`, 0 by default)
/// or the one `allocate_tagged` names. Each tag has address ranges, mappings and idle memory of its own
/// (detail/pages/mapped_core.hpp, one per tag), so `pause(tags)` can copy a tag's live blocks to pinned host memory
/// and give all its physical memory back, and `resume(tags)` map it again at the same addresses: pointers and
/// CUDA graphs stay valid. Pinned memory is kept from one pause to the next (detail/pages/backup_store.hpp), or,
/// where the backend borrows it from a pinned pool (lend_pins_from), given back to that pool at each resume
/// (Note [One pinned budget], pinned/pin_lender.hpp). A tag's idle memory serves only that tag. `max_physical` counts every tag's mapped pages: at the cap a tag gives
/// its own idle memory back first, and when that or the device runs out, the other tags' idle memory.
///
/// Backend: driver_pages (device memory) or simulated_pages (a pretend device, for tests and planning).
/// Models: resource, owning, releasable, sized, usage, snapshot, room-reporting; the backend's properties.
/// Any power-of-two alignment up to 1 GiB. Cost: allocate and free O(1) plus the mappings the block touches
/// (never its pages) and a bounded placement search; a free of a tagged block a lookup per tag in use. A new
/// mapping is three driver calls (mappings made back to back share one access call; one fewer when it reuses
/// an allocation the reclaim before it unmapped), a relocation two. The host waits for the device in a reclaim (once per batch), release() (once for all tags),
/// past `stale_address_limit`, pause (once per call, plus the copies), resume (the copies) and destruction.
/// Unsynchronized. Move-only; ranges are reserved on first use.
template <page_backend Backend>
class mapped_pool : public forward_properties<mapped_pool<Backend>, Backend>, public sync_names<mapped_pool<Backend>> {
  using core = detail::mapped_core<detail::borrowed_pages<Backend>>;

public:
  static constexpr std::size_t max_alignment = core::max_alignment;
  static constexpr std::size_t reclaims_per_busy_window = core::reclaims_per_busy_window;
  using options = typename core::options;
  using backing = typename core::backing;

  mapped_pool() requires std::default_initializable<Backend> : mapped_pool(Backend{}, options{}) {}
  explicit mapped_pool(Backend backend) : mapped_pool(std::move(backend), options{}) {}
  mapped_pool(Backend backend, options opts) : backend_(std::move(backend)), core_(detail::borrowed_pages<Backend>{&backend_}, opts) {}

  // Every tag's pool lends the backend this pool owns: after a move they are pointed at the new owner's. The
  // moved-from pool keeps its (emptied) backend and stays usable.
  mapped_pool(mapped_pool&& other) noexcept
      : backend_(std::move(other.backend_)), core_(std::move(other.core_)), tags_(std::exchange(other.tags_, {})),
        backup_(std::move(other.backup_)), peak_(std::exchange(other.peak_, 0))
  {
    lend();
  }
  mapped_pool& operator=(mapped_pool&& other) noexcept
  {
    if (this == &other) return *this;
    drop_backup();
    tags_.clear();  // each tag's pool gives its memory back to this pool's backend
    core_ = std::move(other.core_);
    tags_ = std::exchange(other.tags_, {});
    backup_ = std::move(other.backup_);
    peak_ = std::exchange(other.peak_, 0);
    backend_ = std::move(other.backend_);
    lend();
    return *this;
  }
  mapped_pool(const mapped_pool&) = delete;
  mapped_pool& operator=(const mapped_pool&) = delete;
  ~mapped_pool() { drop_backup(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment) { return allocate_tagged(current_tag(), bytes, alignment); }

  /// An allocation carrying `tag` whatever the thread's tag_scope says. std::invalid_argument for a tag of
  /// max_tags or more; strata::usage_error while the tag is paused.
  void* allocate_tagged(tag_id tag, std::size_t bytes, std::size_t alignment = default_alignment)
  {
    if (tag == 0 && tags_.empty()) [[likely]] return core_.allocate(bytes, alignment);
    core& c = tag_core(tag, "allocate into");
    void* p = nullptr;
    try {
      share_cap(c);
      p = c.allocate(bytes, alignment);  // at the cap it gives its own idle memory back first
    } catch (const out_of_memory&) {
      if (!release_idle_except(c)) throw;
      share_cap(c);
      p = c.allocate(bytes, alignment);  // other tags' idle memory went back to the device: once more
    }
    peak_ = std::max(peak_, physical_bytes());
    return p;
  }

  /// A block of a paused tag freed while it sleeps is dropped from its backup: resume does not bring it back.
  void deallocate(void* p, std::size_t, std::size_t = default_alignment) noexcept
  {
    if (core_.take_back(p) || p == nullptr || tags_.empty()) [[likely]] return;
    for (std::size_t t = 0; t < tags_.size(); ++t) {
      if (tags_[t].sleep != nullptr && tags_[t].sleep->forget(p)) return;
      if (tags_[t].pool != nullptr && tags_[t].pool->take_back(p)) return;
    }
  }

  /// What a request consumes: rounded up to 256 bytes (SIZE_MAX for a size no pool can serve).
  std::size_t good_size(std::size_t bytes, std::size_t alignment = default_alignment) const noexcept { return core_.good_size(bytes, alignment); }

  /// Whether the request would land, under the calling thread's tag, on pages already mapped.
  bool has_room_for(std::size_t bytes, std::size_t alignment = default_alignment) const noexcept
  {
    const core* c = find(current_tag());
    return c != nullptr && !paused(current_tag()) ? c->has_room_for(bytes, alignment) : bytes == 0;
  }

  /// True when p is the start of a live block this pool handed out (a paused tag's blocks included).
  bool owns(const void* p) const noexcept
  {
    if (core_.owns(p)) return true;
    for (const auto& e : tags_)
      if ((e.pool != nullptr && e.pool->owns(p)) || (e.sleep != nullptr && e.sleep->holds(p))) return true;
    return false;
  }

  /// Waits for the device once (when some tag holds idle memory), then unmaps and releases every tag's idle
  /// mappings and the ranges relocations left; returns the bytes given back.
  std::size_t release()
  {
    if (tags_.empty()) [[likely]] return core_.release();
    return release_idle([](const core&) { return true; });
  }

  strata::usage usage() const noexcept
  {
    strata::usage u = core_.usage();
    for_each_tag_pool([&](const core& c) { u += c.usage(); });
    return u;
  }

  /// Each address range of every tag up to the end of its page table, with its blocks.
  strata::snapshot snapshot() const
  {
    strata::snapshot s = core_.snapshot();
    for_each_tag_pool([&](const core& c) {
      for (auto& seg : c.snapshot().segments) s.segments.push_back(std::move(seg));
    });
    return s;
  }

  std::size_t page_size() const noexcept { return core_.page_size(); }
  /// Physical memory held now (every tag), and the most ever held.
  std::size_t physical_bytes() const noexcept { return sum(&core::physical_bytes); }
  std::size_t peak_physical_bytes() const noexcept { return std::max(peak_, core_.peak_physical_bytes()); }
  /// Physical memory mapped behind no live block (reused in place by its tag, or reclaimed).
  std::size_t idle_bytes() const noexcept { return sum(&core::idle_bytes); }
  /// The pages live blocks touch now, and at most (the latter summed over tags: each tag's own peak).
  std::size_t live_page_bytes() const noexcept { return sum(&core::live_page_bytes); }
  std::size_t peak_live_page_bytes() const noexcept { return sum(&core::peak_live_page_bytes); }
  std::size_t mappings() const noexcept { return sum(&core::mappings); }
  /// Idle physical allocations moved to where new blocks needed memory (instead of waiting to give them back).
  std::uint64_t relocations() const noexcept { return sum(&core::relocations); }
  /// Whether untagged allocations relocate idle memory before the pool waits to reclaim it (relocate_idle, or
  /// a persistent reclaim rate seen since the last release(); options::persistent_reclaim_window).
  bool relocating() const noexcept { return core_.relocating(); }
  /// Address space left mapped by relocations and not yet unmapped (aliases of memory held: no physical cost).
  std::size_t stale_bytes() const noexcept { return sum(&core::stale_bytes); }
  /// Per-page entries of the page tables written so far.
  std::uint64_t page_state_updates() const noexcept { return sum(&core::page_state_updates); }
  /// Driver calls made so far (creates, maps, unmaps, device waits...), every tag's.
  const page_counters& page_calls() const noexcept { return backend_.counts(); }
  void reset_peak() noexcept
  {
    core_.reset_peak();
    for (auto& e : tags_)
      if (e.pool != nullptr) e.pool->reset_peak();
    peak_ = physical_bytes();
  }

  /// The physical allocations behind the live block starting at p, in address order (ipc/). Empty for a
  /// pointer that does not start a live block. O(mappings of the block); allocates the result.
  std::vector<backing> backing_of(const void* p) const
  {
    if (core_.owns(p)) return core_.backing_of(p);
    for (const auto& e : tags_)
      if (e.pool != nullptr && e.pool->owns(p)) return e.pool->backing_of(p);
    return {};
  }

  /// Lets device `peer` reach this pool's memory: everything mapped now and everything mapped later (PyTorch's
  /// enablePeerAccess asks this before a kernel on one device reads another's memory; a cudaMalloc'd pointer
  /// needs only cudaDeviceEnablePeerAccess, page-mapped memory needs each mapping's access set). false, with
  /// nothing done, for the pool's own device or a peer granted already. For a backend that keeps a peer list
  /// (driver_pages, simulated_pages). Errors as the backend's add_peer and set_access: a failure takes the peer
  /// off the list again and rethrows (mappings granted before it stay reachable from the peer, which changes
  /// nothing for the pool). A backend call per mapping; no device wait.
  bool add_peer(int peer)
    requires requires(Backend& b) {
      { b.add_peer(peer) } -> std::same_as<bool>;
      b.remove_peer(peer);
    }
  {
    if (!backend_.add_peer(peer)) return false;
    try {
      core_.reapply_access();
      for (auto& e : tags_)
        if (e.pool != nullptr) e.pool->reapply_access();
    } catch (...) {
      backend_.remove_peer(peer);
      throw;
    }
    return true;
  }

  // ---- Tags: sleep and wake (docs/sleep_wake.md).

  /// Physical memory, live bytes and whether it sleeps, per tag (0 and false for a tag never used).
  std::size_t physical_bytes(tag_id tag) const noexcept { return find(tag) != nullptr ? find(tag)->physical_bytes() : 0; }
  std::size_t in_use(tag_id tag) const noexcept { return find(tag) != nullptr ? find(tag)->usage().in_use : 0; }
  bool paused(tag_id tag) const noexcept { return tag < tags_.size() && tags_[tag].sleep != nullptr; }
  /// The tag whose address ranges hold p, paused or not (0 for an address of none): one range check per tag
  /// in use, none while tag 0 alone is. stream_ordered asks it to reuse a block only under its own tag.
  tag_id tag_of(const void* p) const noexcept
  {
    if (tags_.empty() || core_.in_ranges(p)) [[likely]] return 0;
    for (std::size_t t = 1; t < tags_.size(); ++t)
      if (tags_[t].pool != nullptr && tags_[t].pool->in_ranges(p)) return static_cast<tag_id>(t);
    return 0;
  }
  /// Bytes of a paused tag's blocks (what its backup holds, or held before a pause without one).
  std::size_t paused_bytes(tag_id tag) const noexcept { return paused(tag) ? tags_[tag].sleep->bytes() : 0; }

  /// Puts each tag to sleep: waits for the device once (the work queued on the tags' blocks, on any stream,
  /// finishes first: which streams use a live block is not known here), then, tag by tag, copies its live
  /// blocks to pinned host memory (`backup`; without it their contents are dropped) and waits for the copies,
  /// then unmaps and releases all its physical memory with no further wait (nothing but the copies touched it
  /// since the wait); addresses stay reserved. While a
  /// tag sleeps, allocating into it is a usage_error and freeing one of its blocks drops it from the backup.
  /// strata::usage_error, before anything changes, for a tag never used or already paused; std::invalid_argument
  /// for a tag of max_tags or more. A failure while copying leaves that tag running (its backup room kept for
  /// later); one while giving its memory back leaves it paused, what is still held going at the next release().
  void pause(std::span<const tag_id> tags, bool backup = true) requires copying_page_backend<Backend>
  {
    for (tag_id t : tags) (void)running_core(t, "pause");
    refuse_repeats(tags, "pause");
    if (tags.empty()) return;
    backend_.synchronize();
    for (tag_id t : tags) pause_one(t, backup);
  }
  void pause(std::initializer_list<tag_id> tags, bool backup = true) requires copying_page_backend<Backend>
  {
    pause(std::span<const tag_id>(tags.begin(), tags.size()), backup);
  }

  /// Wakes each tag, in order: creates and maps physical memory at its blocks' addresses (access for the
  /// device and the backend's peers), copies the backup back and waits for the copies. A tag that does not
  /// fit even after other tags' idle memory went back: strata::out_of_memory naming the tag, the bytes needed
  /// and free, with the tag still paused and its backup kept (resume may be tried again). strata::usage_error,
  /// before anything changes, for a tag that is not paused.
  void resume(std::span<const tag_id> tags) requires copying_page_backend<Backend>
  {
    for (tag_id t : tags)
      if (!paused(t)) throw usage_error("mapped_pool: resume of tag " + std::to_string(t) + ", which is not paused");
    refuse_repeats(tags, "resume");
    for (tag_id t : tags) resume_one(t);
  }
  void resume(std::initializer_list<tag_id> tags) requires copying_page_backend<Backend>
  {
    resume(std::span<const tag_id>(tags.begin(), tags.size()));
  }

  /// Pins host memory ahead, so that a pause of up to `bytes` pins nothing (pinning is the slow part). Where
  /// pins are lent (lend_pins_from), it takes the memory from the lender's pool ahead, and the next resume gives
  /// it back there.
  void reserve_backup(std::size_t bytes) requires copying_page_backend<Backend> { backup_.reserve(backend_, bytes); }
  /// Unpins the backup memory no paused tag holds, or gives it back to the lender; returns the bytes.
  std::size_t release_backup() noexcept requires copying_page_backend<Backend> { return backup_.release(backend_); }

  /// Makes the backend borrow its backup memory from `lender` from now on (Note [One pinned budget],
  /// pinned/pin_lender.hpp), or pin its own again for an empty one. The backup memory held now (what
  /// reserve_backup pinned ahead, or an earlier pause left) goes first back where it came from, unpinned or
  /// given to the previous lender, so no lender is ever given memory it did not lend. strata::usage_error,
  /// before anything changes, while any tag is paused: its backup must go back where it came from at its
  /// resume. Cost: release_backup().
  void lend_pins_from(pin_lender lender) requires lends_pins<Backend>
  {
    std::string asleep;
    for (std::size_t t = 0; t < tags_.size(); ++t)
      if (tags_[t].sleep != nullptr) asleep += (asleep.empty() ? "" : ", ") + std::to_string(t);
    if (!asleep.empty())
      throw usage_error("mapped_pool: lend_pins_from while tags are paused (" + asleep + "); resume them first");
    (void)backup_.release(backend_);
    backend_.lend_pins_from(lender);
  }
  /// Pinned host memory held for backups now.
  std::size_t backup_bytes() const noexcept { return backup_.pinned_bytes(); }

  Backend& backend() noexcept { return backend_; }
  const Backend& backend() const noexcept { return backend_; }
  const options& settings() const noexcept { return core_.settings(); }
  /// Moves max_physical, which every tag's pool counts together (mapped_core::set_max_physical). O(tags), no
  /// CUDA call.
  void set_max_physical(std::size_t bytes) noexcept
  {
    core_.set_max_physical(bytes);
    for (auto& t : tags_)
      if (t.pool != nullptr) t.pool->set_max_physical(bytes);
  }

  friend bool operator==(const mapped_pool& a, const mapped_pool& b) noexcept { return &a == &b; }

private:
  /// A tag other than 0 gets its pool on first use; tag 0's is core_. `sleep` is set while the tag is paused.
  struct tag_entry {
    std::unique_ptr<core> pool;
    std::unique_ptr<detail::sleeping_tag> sleep;
  };

  void drop_backup() noexcept
  {
    if constexpr (copying_page_backend<Backend>) backup_.drop(backend_);
  }

  void lend() noexcept
  {
    core_.backend().lend(&backend_);
    for (auto& e : tags_)
      if (e.pool != nullptr) e.pool->backend().lend(&backend_);
  }

  const core* find(tag_id tag) const noexcept
  {
    if (tag == 0) return &core_;
    return tag < tags_.size() ? tags_[tag].pool.get() : nullptr;
  }

  template <class F>
  void for_each_tag_pool(F&& f) const
  {
    for (const auto& e : tags_)
      if (e.pool != nullptr) f(*e.pool);
  }

  template <class T>
  T sum(T (core::*figure)() const noexcept) const noexcept
  {
    T n = (core_.*figure)();
    for_each_tag_pool([&](const core& c) { n += (c.*figure)(); });
    return n;
  }

  /// The pool of a tag that is running, made on first use. `what` names the call for the error.
  core& tag_core(tag_id tag, const char* what)
  {
    if (tag >= max_tags)
      throw std::invalid_argument("mapped_pool: tag " + std::to_string(tag) + " is not below max_tags (" + std::to_string(max_tags) + ")");
    if (tags_.size() <= tag) tags_.resize(tag + 1);
    if (tags_[tag].sleep != nullptr)
      throw usage_error(std::string("mapped_pool: ") + what + " tag " + std::to_string(tag) + ", which is paused");
    if (tag == 0) return core_;
    if (tags_[tag].pool == nullptr) tags_[tag].pool = std::make_unique<core>(detail::borrowed_pages<Backend>{&backend_}, core_.settings());
    return *tags_[tag].pool;
  }

  core& running_core(tag_id tag, const char* what)
  {
    if (tag >= max_tags)
      throw std::invalid_argument("mapped_pool: tag " + std::to_string(tag) + " is not below max_tags (" + std::to_string(max_tags) + ")");
    if (tag != 0 && (tag >= tags_.size() || tags_[tag].pool == nullptr))
      throw usage_error(std::string("mapped_pool: ") + what + " of tag " + std::to_string(tag) + ", which was never used");
    if (paused(tag)) throw usage_error(std::string("mapped_pool: ") + what + " of tag " + std::to_string(tag) + ", which is already paused");
    return tag == 0 ? core_ : *tags_[tag].pool;
  }

  static void refuse_repeats(std::span<const tag_id> tags, const char* what)
  {
    for (std::size_t i = 0; i < tags.size(); ++i)
      for (std::size_t j = i + 1; j < tags.size(); ++j)
        if (tags[i] == tags[j]) throw usage_error(std::string("mapped_pool: ") + what + " names tag " + std::to_string(tags[i]) + " twice");
  }

  /// Tells a tag's pool what the other tags hold, so that its cap counts every tag's mapped pages.
  void share_cap(core& c) noexcept
  {
    if (settings().max_physical != SIZE_MAX) c.share_cap(physical_bytes() - c.physical_bytes());
  }

  /// Whether `bytes` more would lift all tags together over max_physical.
  bool over_cap(std::size_t bytes) const noexcept
  {
    return settings().max_physical != SIZE_MAX && physical_bytes() + bytes > settings().max_physical;
  }

  /// Gives back every other tag's idle memory; whether there was any.
  bool release_idle_except(const core& keep)
  {
    return release_idle([&keep](const core& c) { return &c != &keep; }) > 0;
  }

  /// A tag's pool whose device waits the caller's last wait covers, until this goes.
  struct covered_waits {
    explicit covered_waits(core& c) noexcept : pool(c) { pool.backend().cover_waits(true); }
    ~covered_waits() { pool.backend().cover_waits(false); }
    covered_waits(const covered_waits&) = delete;
    covered_waits& operator=(const covered_waits&) = delete;
    core& pool;
  };

  /// Gives back the idle memory of the tags' pools `which` accepts, after one device wait for all of them
  /// (none when none holds any); returns the bytes given back.
  template <class Which>
  std::size_t release_idle(Which which)
  {
    bool any = which(core_) && core_.holds_idle();
    for (const auto& e : tags_) any = any || (e.pool != nullptr && which(*e.pool) && e.pool->holds_idle());
    if (!any) return 0;
    backend_.synchronize();
    std::size_t n = 0;
    const auto give_back = [&](core& c) {
      if (!which(c) || !c.holds_idle()) return;
      covered_waits covered(c);
      n += c.release();
    };
    give_back(core_);
    for (auto& e : tags_)
      if (e.pool != nullptr) give_back(*e.pool);
    return n;
  }

  void pause_one(tag_id tag, bool backup)
  {
    core& c = running_core(tag, "pause");
    if (tags_.size() <= tag) tags_.resize(tag + 1);
    tags_[tag].sleep = detail::copy_out(c, backend_, backup_, backup);
    for (const auto& b : tags_[tag].sleep->blocks) (void)c.take_back(reinterpret_cast<void*>(b.first));
    covered_waits covered(c);  // pause's wait, and the copies' since: nothing else was queued on this memory
    (void)c.release();
  }

  void resume_one(tag_id tag)
  {
    core& c = tag == 0 ? core_ : *tags_[tag].pool;
    std::vector<std::size_t> offsets;
    const std::size_t need = detail::pages_touched(tags_[tag].sleep->waking(offsets), page_size()) * page_size();  // freed asleep: not coming back
    if (over_cap(need) && (!release_idle_except(c) || over_cap(need)))
      detail::throw_no_room(tag, need, settings().max_physical - std::min(settings().max_physical, physical_bytes()), "the pool's cap");
    share_cap(c);
    detail::copy_in(c, backend_, backup_, *tags_[tag].sleep, tag, [&] {
      (void)release_idle_except(c);
      share_cap(c);
    });
    backup_.give(tags_[tag].sleep->backup);
    tags_[tag].sleep.reset();
    if constexpr (lends_pins<Backend>)
      if (backend_.pins_lent()) (void)backup_.release(backend_);  // Note [One pinned budget]: back to the pool at once
    peak_ = std::max(peak_, physical_bytes());
  }

  Backend backend_;  // first: every tag's pool gives its memory back to it when the pool goes
  core core_;        // tag 0
  std::vector<tag_entry> tags_;
  detail::backup_store backup_;
  std::size_t peak_ = 0;  // the most held at once, seen after tagged allocations and resumes
};

namespace detail::mapped_pool_claims {
using P = mapped_pool<archetype_pages>;
static_assert(page_backend<archetype_pages> && copying_page_backend<archetype_pages>);
static_assert(resource<P> && owning_resource<P> && releasable_resource<P> && sized_resource<P> && usage_reporting_resource<P>);
static_assert(snapshot_resource<P> && room_reporting_resource<P> && !stream_resource<P>);
static_assert(cccl::synchronous_resource_with<P, device_accessible> && !has_property<P, host_accessible>);  // the backend's
static_assert(!std::is_copy_constructible_v<P> && std::is_nothrow_move_constructible_v<P> && std::is_nothrow_move_assignable_v<P>);
} // namespace detail::mapped_pool_claims

} // namespace strata
