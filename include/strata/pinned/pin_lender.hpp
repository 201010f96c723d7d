#pragma once
#include <cstddef>

namespace strata {

// Note [One pinned budget]: a process that pauses tags (sleep/wake) and also keeps pinned memory for offload
// or for PyTorch's pinned tensors would otherwise pin twice: the paused tags' backup in regions of its own,
// kept pinned from one pause to the next, and the pinned pool's chunks beside them, each idle while the other
// is busy. Lending the pool's memory to the page backend makes them one budget: a pause takes its backup
// from the pool's free blocks (pinning only what no free block holds), and a resume gives it back at once,
// where an offload buffer or a pinned tensor reuses it without pinning. Only the pool's release() unpins.
// Locks: take and give run inside the page-mapped pool's pause, resume, reserve_backup, release_backup,
// lend_pins_from and destructor, so under whatever lock guards that pool (a device's lock in the plug-in). A
// lender that locks its own pool takes that lock after the page-mapped pool's, and never calls the page-mapped
// pool while holding it. give is noexcept, and std::mutex::lock can throw (std::system_error): a lender that
// locks in give handles that itself, since an exception escaping give ends the program (std::terminate).

/// A reference to a pool of pinned host memory that a page backend borrows its backup memory from
/// (Note [One pinned budget]): two calls, type-erased, so a backend holds it without knowing the pool's type
/// and the owner can put its own lock around the pool. Empty by default: the backend pins its own.
/// take(bytes) returns host memory page-locked and registered with CUDA (or what the simulated backends
/// stand in for it), at least 4096-aligned, or throws strata::out_of_memory; give(p, bytes) returns it and
/// never throws. The lent memory is only ever touched by copies the backend finishes before it gives the
/// memory back, so the pool needs no event for it.
/// Cost: one indirect call to the pool's allocate or deallocate. Holds a pointer: the pool outlives it.
class pin_lender {
public:
  using take_fn = void* (*)(void* pool, std::size_t bytes);
  using give_fn = void (*)(void* pool, void* p, std::size_t bytes) noexcept;

  pin_lender() = default;
  /// Lends from `pool` directly: its allocate(bytes, 4096) and deallocate(p, bytes, 4096), unsynchronized.
  template <class Pool>
  explicit pin_lender(Pool& pool) noexcept
      : pool_(&pool),
        take_([](void* q, std::size_t bytes) -> void* { return static_cast<Pool*>(q)->allocate(bytes, page_alignment); }),
        give_([](void* q, void* p, std::size_t bytes) noexcept { static_cast<Pool*>(q)->deallocate(p, bytes, page_alignment); })
  {
  }
  /// Lends through the owner's own calls (a pool behind a lock, say).
  pin_lender(void* pool, take_fn take, give_fn give) noexcept : pool_(pool), take_(take), give_(give) {}

  explicit operator bool() const noexcept { return take_ != nullptr; }
  void* take(std::size_t bytes) const { return take_(pool_, bytes); }
  void give(void* p, std::size_t bytes) const noexcept { give_(pool_, p, bytes); }

  static constexpr std::size_t page_alignment = 4096;

private:
  void* pool_ = nullptr;
  take_fn take_ = nullptr;
  give_fn give_ = nullptr;
};

} // namespace strata
