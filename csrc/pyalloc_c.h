/* pyalloc_c.h — the C interface of libpyalloc.
 *
 * Two groups of functions:
 *
 * 1. The entry points PyTorch's CUDAPluggableAllocator loads (exact signatures), served
 *    by the process-wide engines that pyalloc_install() configured:
 *        void* pyalloc_malloc(size_t size, int device, cudaStream_t stream);
 *        void  pyalloc_free(void* ptr, size_t size, int device, cudaStream_t stream);
 *    plus the optional hooks (reset -> empty cache, memory fraction, record_stream).
 *    pyalloc_malloc throws a C++ exception on failure (PyTorch does not check for NULL,
 *    and turns the exception into a Python error); pyalloc_free never throws, because
 *    PyTorch calls it from destructors.
 *
 * 2. The control API, used by Python through ctypes. It never throws: functions return
 *    0 on success and nonzero on failure, with the reason in pyalloc_last_error() (a
 *    per-thread string, valid until the next call on that thread). Engines are handles,
 *    so tests and the replay tool can run isolated engines beside the installed ones.
 *    Strings returned as char* are owned by the caller: release with pyalloc_string_free.
 */
#ifndef PYALLOC_C_H_
#define PYALLOC_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Everything else in the library is hidden (-fvisibility=hidden). */
#define PYALLOC_API __attribute__((visibility("default")))

typedef struct pyalloc_engine pyalloc_engine;

/* --- 1. PyTorch pluggable allocator entry points ------------------------------------- */
PYALLOC_API void* pyalloc_malloc(size_t size, int device, void* stream);
PYALLOC_API void pyalloc_free(void* ptr, size_t size, int device, void* stream);
PYALLOC_API void pyalloc_empty_cache_hook(void);
/* In a child just forked: gives each installed simulated device memory of the child's own,
   with the parent's contents (Note [The simulated device after fork]). 0 on success. */
PYALLOC_API int pyalloc_after_fork_in_child(void);
/* In the process about to fork: waits for each installed simulated device's streams, so the
   child inherits no work in flight (Note [The simulated device after fork]). */
PYALLOC_API void pyalloc_before_fork(void);
PYALLOC_API void pyalloc_memory_fraction_hook(double fraction, int device);
PYALLOC_API void pyalloc_record_stream_hook(void* ptr, void* stream);

/* --- 2. control API ------------------------------------------------------------------- */
PYALLOC_API const char* pyalloc_last_error(void);
PYALLOC_API void pyalloc_string_free(char* s);
PYALLOC_API const char* pyalloc_version(void);
/* 1 if this build contains the CUDA backend. */
PYALLOC_API int pyalloc_has_cuda_backend(void);
/* Number of CUDA devices; -1 (with the reason in pyalloc_last_error) if none usable. */
PYALLOC_API int pyalloc_cuda_device_count(void);
/* JSON list of every option: name, kind, default, doc. Static storage. */
PYALLOC_API const char* pyalloc_options_table(void);
/* Validates an options string; returns the normalized "key:value,..." or NULL. */
PYALLOC_API char* pyalloc_options_normalize(const char* options);

/* Engines. backend: "cuda" or "host" (the simulated device). */
PYALLOC_API pyalloc_engine* pyalloc_engine_create(const char* backend, int device, const char* options);
/* Fails (and keeps the engine) while it still has allocated blocks. */
PYALLOC_API int pyalloc_engine_destroy(pyalloc_engine* engine);
/* Returns 0, PYALLOC_OOM when nothing could be found or reclaimed (the report is in
 * pyalloc_last_error), or 1 for a bad argument. */
#define PYALLOC_OOM 2
PYALLOC_API int pyalloc_engine_alloc(pyalloc_engine* engine, size_t size, uintptr_t stream, void** out);
/* expected_size: the size passed to alloc, or SIZE_MAX to skip the check. */
PYALLOC_API int pyalloc_engine_free(pyalloc_engine* engine, void* ptr, size_t expected_size);
PYALLOC_API int pyalloc_engine_record_stream(pyalloc_engine* engine, void* ptr, uintptr_t stream);
/* CUDA graph pools (Note [Graph pools] in allocator/src/block.h). From now on the requests
 * that `kind` picks go to pool `pool` (>= 1): 0, those on `stream`; 1, a capture's (on
 * `stream` and on every stream being captured); 2, the calling thread's. end_ stops every
 * route to the pool; release_ says its graphs are gone (its memory joins the cache at the
 * next device-wide synchronization). graph_pool_blocks writes up to `capacity` addresses
 * of the pool's live blocks and returns how many there are. */
PYALLOC_API int pyalloc_engine_route_to_graph_pool(pyalloc_engine* engine, uint64_t pool,
                                                   uintptr_t stream, int kind);
PYALLOC_API int pyalloc_engine_end_graph_pool_routes(pyalloc_engine* engine, uint64_t pool);
PYALLOC_API int pyalloc_engine_release_graph_pool(pyalloc_engine* engine, uint64_t pool);
PYALLOC_API size_t pyalloc_engine_graph_pool_blocks(pyalloc_engine* engine, uint64_t pool,
                                                    uintptr_t* out, size_t capacity);
PYALLOC_API int pyalloc_engine_empty_cache(pyalloc_engine* engine);
PYALLOC_API int pyalloc_engine_set_budget(pyalloc_engine* engine, uint64_t bytes);
PYALLOC_API int pyalloc_engine_set_memory_fraction(pyalloc_engine* engine, double fraction);
PYALLOC_API char* pyalloc_engine_stats_json(pyalloc_engine* engine);
PYALLOC_API char* pyalloc_engine_snapshot_json(pyalloc_engine* engine);
/* The snapshot taken at the last out-of-memory failure, with an "oom" object (size,
 * rounded, stream, report); "" if there has been none. */
PYALLOC_API char* pyalloc_engine_last_oom_json(pyalloc_engine* engine);
/* The options the engine runs with, normalized ("budget:...,sim_capacity:...,..."). */
PYALLOC_API char* pyalloc_engine_options(pyalloc_engine* engine);
/* 0: every invariant holds; 1: violated (description in pyalloc_last_error). */
PYALLOC_API int pyalloc_engine_check_invariants(pyalloc_engine* engine);
PYALLOC_API int pyalloc_engine_reset_peak_stats(pyalloc_engine* engine);
PYALLOC_API int pyalloc_engine_reset_accumulated_stats(pyalloc_engine* engine);
PYALLOC_API int pyalloc_engine_synchronize(pyalloc_engine* engine);
/* Eviction (allocator/src/evictor.h). The callback runs outside the engine lock with the
 * handles of the storages to evict and returns how many it evicted; their frees re-enter
 * the engine. Once a request, before it chooses victims, the engine calls it with count 0:
 * a registry frees there what nothing uses any more (others return 0). handle 0 marks a
 * block not evictable; cost is what recomputing it costs (any consistent unit, e.g. ns);
 * touch records a use for the staleness term. */
typedef size_t (*pyalloc_evict_fn)(void* context, const uint64_t* handles, size_t count);
PYALLOC_API int pyalloc_engine_set_evict_callback(pyalloc_engine* engine, pyalloc_evict_fn fn,
                                                  void* context);
/* Called outside the engine lock, on the failing thread, after each out-of-memory failure
 * and before the allocation returns it: info_json is an object of the figures and the
 * report (Engine::set_oom_callback in allocator/src/engine.h). NULL: none. */
typedef void (*pyalloc_oom_fn)(void* context, const char* info_json);
PYALLOC_API int pyalloc_engine_set_oom_callback(pyalloc_engine* engine, pyalloc_oom_fn fn,
                                                void* context);
/* The OOM callback of every installed engine, those created later included; may be set
 * before pyalloc_install. */
PYALLOC_API int pyalloc_set_installed_oom_callback(pyalloc_oom_fn fn, void* context);
PYALLOC_API int pyalloc_engine_set_evictable(pyalloc_engine* engine, void* ptr, uint64_t handle,
                                             double cost);
/* As set_evictable, but only the last rung may choose the block, once every other way to
 * serve a request failed (Note [Last-resort victims] in allocator/src/block.h). */
PYALLOC_API int pyalloc_engine_set_last_resort_evictable(pyalloc_engine* engine, void* ptr,
                                                         uint64_t handle, double cost);
PYALLOC_API int pyalloc_engine_touch(pyalloc_engine* engine, void* ptr);
/* Handles of blocks their owner freed while still marked evictable (a storage the registry
 * tracks died), oldest first: takes up to `capacity` into out and returns how many;
 * *overflowed = 1 if some were dropped since the last call. Noted only while an evict
 * callback is set. freed_marked_count changes whenever one is noted (a lock-free read). */
PYALLOC_API size_t pyalloc_engine_take_freed_marked(pyalloc_engine* engine, uint64_t* out,
                                                    size_t capacity, int* overflowed);
PYALLOC_API uint64_t pyalloc_engine_freed_marked_count(pyalloc_engine* engine);
/* Compaction (allocator/src/compactor.h; Note [Relocation] in engine.h). When nothing is
 * left to evict, `movable` writes the addresses of the blocks the registry can move now
 * into out[0..capacity) and returns their count; `relocate` moves the storage at from[i]
 * into the block reserved at to[i] — allocating it with pyalloc_set_thread_placement(to[i])
 * set — and returns how many it moved. Both run outside the engine lock. */
typedef size_t (*pyalloc_movable_fn)(void* context, uintptr_t* out, size_t capacity);
typedef size_t (*pyalloc_relocate_fn)(void* context, const uintptr_t* from, const uintptr_t* to,
                                      size_t count);
PYALLOC_API int pyalloc_engine_set_compact_callbacks(pyalloc_engine* engine,
                                                     pyalloc_movable_fn movable,
                                                     pyalloc_relocate_fn relocate, void* context);
/* What a policy adds to an out-of-memory report (the registry: activations it can no longer
 * recompute). `describe` writes at most `capacity` bytes to `out` and returns how many (0:
 * nothing); it runs outside the engine lock, on the failing thread. NULL removes it. */
typedef size_t (*pyalloc_describe_fn)(void* context, char* out, size_t capacity);
PYALLOC_API int pyalloc_engine_set_oom_describe_callback(pyalloc_engine* engine,
                                                         pyalloc_describe_fn describe,
                                                         void* context);
/* Runs the compaction rung now for a request of `size` bytes on `stream`, as if no block
 * held it (tests and tools); *moved: how many storages moved. */
PYALLOC_API int pyalloc_engine_compact(pyalloc_engine* engine, size_t size, uintptr_t stream,
                                       size_t* moved);
/* The calling thread's next allocation is the compaction destination reserved at ptr
 * (NULL: none). */
PYALLOC_API void pyalloc_set_thread_placement(void* ptr);
/* Tracing (docs/formats.md): record the most recent `capacity` events (0: stop), take
 * them as {"dropped_events":N,"events":[...]}, and tag the calling thread's events. */
PYALLOC_API int pyalloc_engine_trace_start(pyalloc_engine* engine, uint64_t capacity);
PYALLOC_API char* pyalloc_engine_trace_drain(pyalloc_engine* engine);
PYALLOC_API void pyalloc_set_trace_context(uint32_t context);
/* Streams of the engine's device (on the simulated device: worker threads). */
PYALLOC_API int pyalloc_engine_stream_create(pyalloc_engine* engine, uintptr_t* out);
PYALLOC_API int pyalloc_engine_stream_destroy(pyalloc_engine* engine, uintptr_t stream);

/* Swap (allocator/src/swap.h). The host pool is allocated once (pinned on CUDA). swap_out
 * starts copying the first `bytes` of the block at ptr into a new host slot after the work
 * enqueued on `stream` (the compute stream) so far; the block may be freed at once and is
 * reused only after the copy. swap_in starts copying a slot back into the block at ptr;
 * swap_wait makes `stream` wait for that copy (on the simulated device's stream 0 it
 * blocks). A slot stays a valid copy until swap_release. swap_out and swap_in return 0,
 * 1 (bad argument), PYALLOC_HOST_FULL or PYALLOC_COPY_FAILED. */
#define PYALLOC_HOST_FULL 3
#define PYALLOC_COPY_FAILED 4
PYALLOC_API int pyalloc_engine_set_host_pool(pyalloc_engine* engine, uint64_t bytes);
/* The same, allocated at the first swap_out instead of now (a later set_host_pool or
 * defer_host_pool keeps the size given first). */
PYALLOC_API int pyalloc_engine_defer_host_pool(pyalloc_engine* engine, uint64_t bytes);
PYALLOC_API int pyalloc_engine_swap_out(pyalloc_engine* engine, void* ptr, size_t bytes,
                                        uintptr_t stream, uint64_t* slot);
PYALLOC_API int pyalloc_engine_swap_in(pyalloc_engine* engine, uint64_t slot, void* ptr,
                                       uintptr_t stream);
PYALLOC_API int pyalloc_engine_swap_wait(pyalloc_engine* engine, uint64_t slot, uintptr_t stream);
/* 1 when the slot's copies have completed, 0 if not, -1 on a NULL engine. */
PYALLOC_API int pyalloc_engine_swap_ready(pyalloc_engine* engine, uint64_t slot);
PYALLOC_API int pyalloc_engine_swap_release(pyalloc_engine* engine, uint64_t slot);
/* The engine's device-to-host (to_host != 0) or host-to-device copy stream. */
PYALLOC_API int pyalloc_engine_swap_stream(pyalloc_engine* engine, int to_host, uintptr_t* out);
/* budget - allocated bytes: what a new allocation can take without evicting (before
 * fragmentation). */
PYALLOC_API int pyalloc_engine_unallocated(pyalloc_engine* engine, uint64_t* out);
/* Allocated bytes now and at their peak (a cheap read for per-op probes). */
PYALLOC_API int pyalloc_engine_allocated(pyalloc_engine* engine, uint64_t* current, uint64_t* peak);
/* Nanoseconds callers have spent blocked on other streams' work (0 for a NULL engine). */
PYALLOC_API uint64_t pyalloc_engine_blocked_ns(pyalloc_engine* engine);
/* 0: allocations on the calling thread never evict (they fail instead, without counting
 * as an OOM); a prefetch uses it so that it cannot push out what is needed sooner. */
PYALLOC_API void pyalloc_set_thread_may_evict(int may_evict);
/* While nonzero on the calling thread, an allocation that cannot be served fails quietly
 * (not counted as an OOM, no report, no OOM callback): for allocations whose failure the
 * caller handles. Returns the previous value. */
PYALLOC_API int pyalloc_set_thread_tentative(int tentative);
/* 1: allocations on the calling thread come from the persistent region (INPLACE_UPDATE:
 * segments of their own for parameters, gradients and optimizer state); 0: as usual. */
PYALLOC_API void pyalloc_set_thread_persistent(int persistent);
/* While nonzero on the calling thread, its allocations are storages a registry can evict:
 * with option evictable_placement, small ones go to small segments of their own (Note
 * [Evictable placement] in allocator/src/pool.h). Returns the previous value. */
PYALLOC_API int pyalloc_set_thread_evictable(int evictable);
/* 1: the engine's requests from now on are expected to live long (the model's
 * construction, optimizer steps); 0: short-lived (forward, backward). Small blocks are
 * placed by it (option lifetime_classes). pyalloc_set_long_lived sets it for every
 * installed engine, and for those created later. */
PYALLOC_API int pyalloc_engine_set_long_lived(pyalloc_engine* engine, int long_lived);
PYALLOC_API void pyalloc_set_long_lived(int long_lived);

/* The process-wide engines behind group 1. Configure once; engines are created per
 * device on first use. Fails if already installed with a different backend. */
PYALLOC_API int pyalloc_install(const char* backend, const char* options);
PYALLOC_API int pyalloc_is_installed(void);
/* The installed engine of `device`, created on first use; NULL if not installed. */
PYALLOC_API pyalloc_engine* pyalloc_installed_engine(int device);

/* --- 3. self-tests and benchmarks (debug_api.cpp) ------------------------------------- */
/* Simulated device only: enqueue a fill of `bytes` bytes at ptr with `value` on
 * `stream`, and make the stream's tasks sleep `delay_us` first (a slow copy engine). */
PYALLOC_API int pyalloc_sim_fill_async(pyalloc_engine* engine, uintptr_t stream, void* ptr, size_t bytes,
                           int value);
PYALLOC_API int pyalloc_sim_set_stream_delay(pyalloc_engine* engine, uintptr_t stream, unsigned delay_us);
/* Simulated device only: the next `count` async copies fail to start (fault injection). */
PYALLOC_API int pyalloc_sim_fail_copies(pyalloc_engine* engine, unsigned count);
/* The next `count` times a host pool made at first use grows, the growth fails. */
PYALLOC_API int pyalloc_sim_fail_host_commits(pyalloc_engine* engine, unsigned count);
/* Multi-threaded randomized stress: `threads` threads doing `ops` operations in total,
 * sizes log-uniform in [1, max_size], every block pattern-checked before it is freed,
 * the lifetime phase flipped now and then from any thread, invariants checked every
 * `check_every` operations (0: only at the end).
 * Returns 0 when clean; a report of the first failure otherwise. */
PYALLOC_API int pyalloc_stress(pyalloc_engine* engine, int threads, uint64_t ops, uint64_t seed,
                   size_t max_size, uint64_t check_every);
/* Times malloc/free pairs through pyalloc_malloc/pyalloc_free (the installed engine of
 * `device`). sizes: n_sizes request sizes replayed cyclically; `live` blocks are kept
 * alive in a ring so frees interleave with mallocs as in training. ns per pair in *out. */
PYALLOC_API int pyalloc_bench_pairs(int device, uintptr_t stream, const size_t* sizes, size_t n_sizes,
                        size_t live, uint64_t pairs, double* ns_per_pair);

/* Times a recorded sequence through pyalloc_malloc/pyalloc_free: ops[i] > 0 allocates
 * ops[i] bytes into slots[i]; ops[i] == 0 frees slots[i]. Run `repeats` times after one
 * warm-up pass; ns per operation in *ns_per_op. Every slot must be freed by the end. */
PYALLOC_API int pyalloc_bench_sequence(int device, uintptr_t stream, const int64_t* ops,
                                       const uint32_t* slots, size_t count, uint32_t n_slots,
                                       int repeats, double* ns_per_op);

#ifdef __cplusplus
}
#endif

#endif /* PYALLOC_C_H_ */
