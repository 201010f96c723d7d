/* strata's allocator plug-in for PyTorch (torch.cuda.memory.CUDAPluggableAllocator) and CuPy
 * (cupy.cuda.memory.CFunctionAllocator): libstrata_alloc.so. One strata stack per device, built on first use
 * from the configuration (STRATA_ALLOC_CONF or strata_configure). Every function is safe to call from any
 * thread. A failing call returns null / nonzero / does nothing and leaves its message in strata_last_error();
 * no exception escapes except from strata_malloc_or_throw(_observed) and the graph-pool hooks (see there).
 * docs/pytorch.md has the whole story. */
#ifndef STRATA_ALLOC_H
#define STRATA_ALLOC_H

#include <stddef.h>

#include <cuda_runtime_api.h>

/* The library is built with hidden visibility: only these entry points are exported. */
#if defined(__GNUC__)
#define STRATA_ALLOC_API __attribute__((visibility("default")))
#else
#define STRATA_ALLOC_API
#endif

#ifdef __cplusplus
#include <functional>
#include <utility>
extern "C" {
#endif

/* ---- PyTorch: CUDAPluggableAllocator(path, "strata_malloc", "strata_free") ---------------------------- */

/* size bytes on `device` (PyTorch's device argument, not the current device), ordered on `stream`. Returns
 * null on failure (out of memory after one release-and-retry, or any other error; strata_last_error says
 * which). PyTorch 2.11 checks null only where its own caching allocator calls a plugged allocator (a
 * torch.cuda.MemPool: it then raises torch.OutOfMemoryError); as the process-wide allocator
 * (change_current_allocator) a null becomes a tensor without memory, so use strata_malloc_or_throw there.
 * size 0: null, not an error. */
STRATA_ALLOC_API void* strata_malloc(size_t size, int device, cudaStream_t stream);
/* The same, but a failure throws a C++ exception carrying the message: on out of memory, whatever the handler
 * installed by strata_set_oom_handler throws (libstrata_torch_hooks.so's: c10::OutOfMemoryError, which Python
 * sees as torch.OutOfMemoryError), else std::bad_alloc; other failures std::runtime_error (a RuntimeError).
 * The process keeps working. For change_current_allocator only (a C caller must use strata_malloc). */
STRATA_ALLOC_API void* strata_malloc_or_throw(size_t size, int device, cudaStream_t stream);
/* What strata_malloc_or_throw calls on out of memory, with the message, before throwing std::bad_alloc
 * itself: a function that throws the framework's own type (libstrata_torch_hooks.so installs one throwing
 * c10::OutOfMemoryError, which Python sees as torch.OutOfMemoryError). Null restores the default. */
STRATA_ALLOC_API void strata_set_oom_handler(void (*handler)(const char* message));
/* Sets this thread's strata_last_error() (for companion libraries such as libstrata_torch_hooks.so). */
STRATA_ALLOC_API void strata_report_error(const char* message);
/* Frees on the allocation's stream (PyTorch passes it back); blocks recorded on other streams wait for them. */
STRATA_ALLOC_API void strata_free(void* ptr, size_t size, int device, cudaStream_t stream);

/* Optional hooks, the names for the allocator object's set_*_fn (PyTorch 2.11 signatures). */
STRATA_ALLOC_API void strata_init(int device_count);                             /* set_init_fn: void(int) */
STRATA_ALLOC_API void strata_reset(void);                                        /* set_reset_fn (empty_cache): release every device (see strata_reset_device) */
STRATA_ALLOC_API void strata_set_memory_fraction(double fraction, int device);   /* set_memory_fraction_fn: void(double, int) */
STRATA_ALLOC_API void strata_record_stream(void* ptr, cudaStream_t stream);      /* set_record_stream_fn: void(void*, cudaStream_t) */
STRATA_ALLOC_API void* strata_base_alloc(void* ptr, size_t* size);               /* set_base_alloc_fn: void*(void*, size_t*) */

/* ---- Sharing a block with another process (torch.multiprocessing) -------------------------------------- */
/* Page-mapped stacks (stack=default): the physical allocations behind the live block starting at ptr, in
 * address order: each one's size into mapping_bytes[i] and a new POSIX file descriptor for it into fds[i]
 * (cuMemExportToShareableHandle; the caller owns and closes them), and ptr's offset in the first into *offset.
 * Returns how many allocations there are; where that is more than `capacity` nothing is exported (call again
 * with room for them). 0: ptr is not page-mapped memory of a strata stack (a cudaMalloc'd stack's block is
 * shared with cudaIpcGetMemHandle). -1 with strata_last_error(): ptr lies in a stack's memory but starts no
 * live block, or the driver refused. A driver call per allocation. */
STRATA_ALLOC_API long strata_share_block(void* ptr, size_t* offset, size_t* mapping_bytes, int* fds, size_t capacity);
/* Device `peer` may reach the memory of `device`'s stack from now on, what it holds and what it takes later
 * (PyTorch's enablePeerAccess(peer, device), after cudaDeviceEnablePeerAccess): a page-mapped stack sets each
 * mapping's access again, a cudaMalloc'd stack needs nothing more. Builds the device's stack if it has none.
 * 1: granted now; 0: nothing to do (granted before, the same device, or a cudaMalloc'd stack); -1 with
 * strata_last_error(): a bad device, no peer path between the two, or the driver refused (nothing granted). */
STRATA_ALLOC_API int strata_grant_peer(int device, int peer);
/* Builds the device's stack now, as its first allocation would (the configuration and PyTorch's fraction
 * apply): what asking the device's cap before any tensor needs. 0 (also when built before), or -1 with
 * strata_last_error(): a bad device, or the stack cannot be built there. */
STRATA_ALLOC_API int strata_device_prepare(int device);

/* ---- Configuration ------------------------------------------------------------------------------------ */
STRATA_ALLOC_API int strata_configure(const char* conf);   /* 0 ok; nonzero: bad string, or refused once a stack was built */
STRATA_ALLOC_API int strata_check_env(void);               /* parses STRATA_ALLOC_CONF now: 0 ok / nonzero + message */
/* PyTorch's allocator settings (PYTORCH_CUDA_ALLOC_CONF's text) applied to strata: per_process_memory_fraction
 * caps every device's stack as set_memory_fraction does. 0: applied; 1: applied, with settings that have no
 * effect under strata described in strata_last_error() (one a line); -1: refused (nothing applied), the reason
 * in strata_last_error(). */
STRATA_ALLOC_API int strata_apply_torch_conf(const char* text);
STRATA_ALLOC_API const char* strata_last_error(void);      /* this thread's last failure ("" if none); valid until its next call */
STRATA_ALLOC_API int strata_is_in_use(void);               /* 1 once any stack was built */

/* ---- Monitoring (JSON into buf; returns the length without the NUL; writes only if len > that) ---------- */
STRATA_ALLOC_API size_t strata_memory_stats_json(int device, char* buf, size_t len);
STRATA_ALLOC_API void strata_reset_peak_stats(int device);
STRATA_ALLOC_API size_t strata_snapshot_json(int device, char* buf, size_t len);
STRATA_ALLOC_API int strata_record_flush(void);            /* flushes every device's trace (record=PATH): 0 ok */

/* One device's figures as numbers (for the torch backend's statistics, no JSON to parse). */
typedef struct strata_device_figures {
  size_t reserved;                   /* bytes held from CUDA */
  size_t in_use;                     /* bytes of blocks not free in the stack (held ones included) */
  size_t largest_free;               /* the largest request served without new memory from CUDA */
  size_t chunks;                     /* chunks or mappings held from CUDA */
  size_t free_blocks;                /* free ranges inside the reserved memory */
  size_t held_bytes;                 /* freed blocks waiting for other streams' recorded work */
  size_t held_blocks;
  size_t allocated;                  /* the plug-in's live bytes, as requested */
  size_t limit;                      /* bytes strata may hold, so in use too (limit=, set_memory_fraction); SIZE_MAX: none */
  size_t device_memory;              /* the device's total memory (sim_capacity for stack=simulated) */
  unsigned long long device_allocs;  /* physical allocations from the driver so far (page-mapped stacks; 0 otherwise) */
  unsigned long long device_frees;   /* physical releases to the driver so far (page-mapped stacks; 0 otherwise) */
  unsigned long long alloc_retries;  /* allocations retried after releasing idle memory (memory_stats' num_alloc_retries) */
  unsigned long long ooms;           /* allocations refused as out of memory (memory_stats' num_ooms) */
  size_t releasable;                 /* idle bytes empty_cache would hand back (wholly free pages or chunks) */
  unsigned long long page_maps;      /* physical allocations mapped into address ranges so far, relocations included (page-mapped stacks; 0 otherwise) */
  unsigned long long page_unmaps;    /* mappings unmapped so far, stale ranges included (page-mapped stacks; 0 otherwise) */
  unsigned long long syncs_all_streams; /* releases that first waited for every pending free: empty_cache and the retry after out of memory (memory_stats' num_sync_all_streams) */
} strata_device_figures;
/* 0: `out` filled; 1: the device has no stack yet (all zeros); -1: bad device or null out (message set). */
STRATA_ALLOC_API int strata_device_figures_get(int device, strata_device_figures* out);
/* A request refused as out of memory was served after all (PyTorch's use_on_oom pools): the caller saw no
 * failure, so num_ooms stops counting it. 0: done; -1: bad device or nothing counted to take back. */
STRATA_ALLOC_API int strata_oom_served(int device);
/* strata_malloc_or_throw and strata_free that also fill `out` (when not null) with the device's figures as the
 * call left them, under the same lock: strata's PyTorch backend keeps memory_stats' figures from these, with no
 * second call per allocation or free. A refused allocation fills `out` before its exception leaves. */
STRATA_ALLOC_API void* strata_malloc_or_throw_observed(size_t size, int device, cudaStream_t stream, strata_device_figures* out);
STRATA_ALLOC_API void strata_free_observed(void* ptr, size_t size, int device, cudaStream_t stream, strata_device_figures* out);
/* The device's lock, held by the calling thread across several calls (strata's PyTorch backend keeps its own
 * books of the device under it, so one lock covers both): entry points this thread calls for that device
 * meanwhile do not lock again; call no others inside, and none that works on every device (strata_reset,
 * strata_record_stream, strata_record_flush, the tag and backup calls): they would lock devices in another
 * order, or the simulated devices' shared lock twice. Pairs nest; other threads' calls for the device wait.
 * 0, or -1 for a device out of range (message set). Unlock with the same device on the same thread. */
STRATA_ALLOC_API int strata_device_lock(int device);
STRATA_ALLOC_API void strata_device_unlock(int device);
/* One device's calls that may be made inside its strata_device_lock section:
 * - strata_record_stream_on: record_stream for a block of `device` (message set if it is not that device's);
 * - strata_reset_device: empty_cache of that device alone. While an allocation to a private pool is under way
 *   on it (strata_begin_allocate_to_pool: a capture may be running, where a host wait is illegal) it releases
 *   nothing and reports nothing, as PyTorch's allocator does; otherwise as strata_reset for the device.
 *   0, or -1 with the message set. */
STRATA_ALLOC_API void strata_record_stream_on(int device, void* ptr, cudaStream_t stream);
STRATA_ALLOC_API int strata_reset_device(int device);
/* Bytes the process holds outside strata on `device` that count against its cap (limit=, the memory
 * fraction): a MemPool's own allocator's segments. The stack then grows no further than the cap less these
 * (memory it already holds above that stays until its blocks are freed and given back), and a request past
 * that is refused as out of memory by the stack itself, after its idle memory went back where a wait is
 * allowed. The cap reported (strata_device_figures.limit) stays the whole cap. Builds the device's stack, as
 * strata_device_prepare does; may be called inside the device's strata_device_lock section. 0, or -1 with the
 * message set (a bad device, or a stack that cannot be built there). */
STRATA_ALLOC_API int strata_set_held_elsewhere(int device, size_t bytes);

/* ---- Sleep and wake by tag (docs/sleep_wake.md; page-mapped stacks: default_pool, simulated) ------------ */
/* This thread's allocations carry `tag` until the matching strata_tag_end (they nest; 0 is the default). */
STRATA_ALLOC_API void strata_tag_begin(unsigned tag);
STRATA_ALLOC_API void strata_tag_end(void);
STRATA_ALLOC_API unsigned strata_current_tag(void);
/* On every device that holds one of the tags: blocks held for recorded uses and the stream layer's cached
 * blocks go back, then each tag's live blocks are copied to pinned host memory (backup != 0; otherwise
 * dropped) and its device memory is given back, addresses kept. 0 ok; -1 with strata_last_error(): a tag no
 * device holds, nothing changed; or a device's failure, which stops there (earlier devices stay paused). */
STRATA_ALLOC_API int strata_pause(const unsigned* tags, size_t n, int backup);
/* On every device where one of the tags is paused: maps it again at the same addresses and copies its backup
 * back. -1 with the message on failure: a tag paused nowhere, nothing changed; out of memory names the tag,
 * the bytes needed and free (the tag stays paused and may be resumed later). */
STRATA_ALLOC_API int strata_resume(const unsigned* tags, size_t n);
/* Pins `bytes` ahead on `device`'s stack, so a pause up to that size pins nothing: 0 ok, -1 + message. */
STRATA_ALLOC_API int strata_reserve_backup(int device, size_t bytes);
/* Unpins the backup memory no paused tag holds, on every device; returns the bytes unpinned. */
STRATA_ALLOC_API size_t strata_release_backup(void);
/* Where the sleep/wake backup comes from (Note [One pinned budget], include/strata/pinned/pin_lender.hpp): a
 * process that pauses tags and also keeps a pinned pool (PyTorch's pinned tensors, offload buffers) pins once
 * when the pool lends the backup. take(ctx, bytes) returns pinned host memory registered with CUDA, at least
 * 4096-aligned, or null when it cannot (the pause then fails as out of memory, the tag still running, nothing
 * lost); give(ctx, p, bytes) takes it back. Neither may throw or call back into this library: both run under a
 * device's lock, on the thread that pauses or resumes. A pause takes its backup from the lender and a resume
 * gives it back at once; strata_reserve_backup takes ahead from it too (given back at the next resume or
 * strata_release_backup). */
typedef void* (*strata_backup_take_fn)(void* ctx, size_t bytes);
typedef void (*strata_backup_give_fn)(void* ctx, void* p, size_t bytes);
/* Every device's page-mapped stack, those built already and those built later, borrows its backup from the
 * lender. 1: lent; 0: the stacks cannot sleep (stack=coalescing), so nothing is lent, not an error; -1 with
 * strata_last_error(): refused, nothing changed: a null take or give, or a device holds backup memory (a tag
 * paused with its backup, or memory pinned ahead by strata_reserve_backup: resume the tags or call
 * strata_release_backup() first). Setting the lender already set is 1 (or 0) at once. */
STRATA_ALLOC_API int strata_set_backup_lender(void* ctx, strata_backup_take_fn take, strata_backup_give_fn give);
/* Back to pinning their own: 0, or -1 with the message (refused as above while backup memory is out). Once it
 * returns 0 no stack calls the old lender again. */
STRATA_ALLOC_API int strata_clear_backup_lender(void);
/* One tag's figures on one device. */
typedef struct strata_tag_figures {
  size_t physical;      /* bytes of device memory mapped for the tag (0 while paused) */
  size_t in_use;        /* bytes of its live blocks in the pool (0 while paused) */
  size_t paused_bytes;  /* bytes of its blocks asleep, waiting for resume (0 while running) */
  int paused;           /* 1 while paused */
} strata_tag_figures;
/* 0: `out` filled; 1: the device has no stack yet or its stack has no tags (all zeros); -1: bad device, tag of
 * 1024 or more, or null out (message set). */
STRATA_ALLOC_API int strata_tag_figures_get(int device, unsigned tag, strata_tag_figures* out);

/* ---- CuPy: CFunctionAllocator(0, strata_cupy_malloc, strata_cupy_free, owner) -------------------------- */
STRATA_ALLOC_API void* strata_cupy_malloc(void* param, size_t size, int device);  /* null on failure, as CuPy expects */
STRATA_ALLOC_API void strata_cupy_free(void* param, void* ptr, int device);
STRATA_ALLOC_API void strata_cupy_set_stream(cudaStream_t stream);  /* this thread's stream for CuPy's calls (default: legacy) */

/* ---- stack=simulated only: pretend streams for host tests (no GPU) ------------------------------------- */
STRATA_ALLOC_API cudaStream_t strata_sim_stream_create(int device);  /* null (+ message) unless the stack is simulated */
STRATA_ALLOC_API int strata_sim_launch(cudaStream_t stream);          /* enqueue one piece of pretend work: 0 ok */
STRATA_ALLOC_API int strata_sim_finish(cudaStream_t stream);          /* complete the stream's work so far: 0 ok */
STRATA_ALLOC_API int strata_sim_capture(cudaStream_t stream, int begin);  /* begin (1) or end (0) a capture: 0 ok */

#ifdef __cplusplus
} /* extern "C" */

/* PyTorch's graph-pool hooks take C++ types (c10::cuda::MempoolId_t is std::pair<unsigned long long,
 * unsigned long long>); C linkage, C++ signature, exactly as PyTorch 2.11 casts the pointer it is given.
 * A failure (e.g. a stream layer without private pools) throws std::runtime_error into PyTorch, which
 * raises it as a RuntimeError where the capture starts. */
extern "C" STRATA_ALLOC_API void strata_begin_allocate_to_pool(int device, std::pair<unsigned long long, unsigned long long> pool,
                                              std::function<bool(cudaStream_t)> filter);
extern "C" STRATA_ALLOC_API void strata_end_allocate_to_pool(int device, std::pair<unsigned long long, unsigned long long> pool);
extern "C" STRATA_ALLOC_API void strata_release_pool(int device, std::pair<unsigned long long, unsigned long long> pool);
#endif

#endif /* STRATA_ALLOC_H */
