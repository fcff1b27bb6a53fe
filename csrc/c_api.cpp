// c_api.cpp — the extern "C" surface of libpyalloc (see pyalloc_c.h): argument checks,
// error translation, and routing to engines. No allocator logic lives here.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "capi_internal.h"
#include "host_backend.h"
#include "pyalloc_c.h"
#ifdef PYALLOC_WITH_CUDA
#include "cuda_backend.h"
#endif

using pyalloc::Engine;
using pyalloc::Status;
using pyalloc::StreamId;

namespace {
thread_local std::string t_error;
}  // namespace

int pyalloc::capi::fail(std::string message) {
  t_error = std::move(message);
  return 1;
}

int pyalloc::capi::fail(const pyalloc::Status& status) {
  if (status.ok()) return 0;
  t_error = status.message();
  return status.code();
}

namespace {
using pyalloc::capi::fail;

char* to_c_string(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

std::unique_ptr<pyalloc::Backend> make_backend(const std::string& kind, int device,
                                               const pyalloc::Options& options,
                                               std::string* error) {
  if (kind == "host") {
    if (device != 0) {
      *error = "the simulated device has one device, 0; got device " + std::to_string(device);
      return nullptr;
    }
    return pyalloc::HostBackend::create(options.sim_capacity, error, options.sim_sync_stream0);
  }
  if (kind == "cuda") {
#ifdef PYALLOC_WITH_CUDA
    return pyalloc::make_cuda_backend(device, error);
#else
    *error = "this build of pyalloc has no CUDA backend (no CUDA toolkit was found when it was "
             "compiled); reinstall with the CUDA toolkit present, or use the simulated device";
    return nullptr;
#endif
  }
  *error = "unknown backend '" + kind + "': expected \"cuda\" or \"host\"";
  return nullptr;
}

pyalloc_engine* create_engine(const std::string& kind, int device, const char* options_text) {
  if (device < 0) {
    fail("device index " + std::to_string(device) + " is negative");
    return nullptr;
  }
  pyalloc::Options options = pyalloc::Options::defaults();
  std::string err = pyalloc::Options::parse(options_text ? options_text : "", &options);
  if (!err.empty()) {
    fail(err);
    return nullptr;
  }
  std::unique_ptr<pyalloc::Backend> backend = make_backend(kind, device, options, &err);
  if (!backend) {
    fail(err);
    return nullptr;
  }
  return new pyalloc_engine(std::move(backend), options);
}

// --- the installed (process-wide) engines ------------------------------------------------
// Engines are created on first use and never destroyed: PyTorch may free tensors during
// interpreter shutdown, after any destructor of ours would have run.
constexpr int kMaxDevices = 64;
std::mutex g_install_mutex;                  // guards the two strings below and creation
std::string g_backend, g_options;            // empty backend: not installed
std::array<std::atomic<pyalloc_engine*>, kMaxDevices> g_engines{};
std::atomic<bool> g_installed{false};
bool g_long_lived = false;                   // guarded by g_install_mutex; pyalloc_set_long_lived
pyalloc_oom_fn g_oom_fn = nullptr;           // guarded by g_install_mutex; every installed
void* g_oom_context = nullptr;               // engine's OOM callback

pyalloc_engine* installed_engine(int device) {
  if (device < 0 || device >= kMaxDevices) {
    fail("device index " + std::to_string(device) + " is out of range [0, " +
         std::to_string(kMaxDevices) + ")");
    return nullptr;
  }
  if (pyalloc_engine* e = g_engines[device].load(std::memory_order_acquire)) return e;
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (g_backend.empty()) {
    fail("pyalloc is not installed: call pyalloc.install() first");
    return nullptr;
  }
  if (pyalloc_engine* e = g_engines[device].load(std::memory_order_acquire)) return e;
  pyalloc_engine* e = create_engine(g_backend, device, g_options.c_str());
  if (e) {
    e->set_long_lived(g_long_lived);
    e->set_oom_callback(g_oom_fn, g_oom_context);
    g_engines[device].store(e, std::memory_order_release);
  }
  return e;
}

// Frees from destructors must not throw; a bad free is reported on stderr a bounded
// number of times (and counted in num_invalid_frees) so a buggy loop cannot flood it.
void report_bad_free(const std::string& message) {
  static std::atomic<int> reported{0};
  int n = reported.fetch_add(1);
  if (n < 10) std::fprintf(stderr, "pyalloc: warning: %s\n", message.c_str());
  if (n == 10) std::fprintf(stderr, "pyalloc: warning: further invalid frees are not shown\n");
}

}  // namespace

namespace pyalloc {
// Thrown through PyTorch when an allocation cannot be served; PyTorch turns it into a
// Python RuntimeError carrying the report.
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};
}  // namespace pyalloc

extern "C" {

// --- 1. PyTorch pluggable allocator entry points ------------------------------------------

void* pyalloc_malloc(size_t size, int device, void* stream) {
  pyalloc_engine* e = installed_engine(device);
  if (!e) throw std::runtime_error("pyalloc: " + t_error);
  if (reinterpret_cast<StreamId>(stream) == pyalloc::kAnyStream) {
    throw std::invalid_argument("pyalloc: stream handle ~0 is reserved");
  }
  void* p = nullptr;
  const Status status = e->malloc(size, reinterpret_cast<StreamId>(stream), &p);
  if (!status.ok()) throw pyalloc::OutOfMemory(status.message());
  return p;
}

void pyalloc_free(void* ptr, size_t size, int device, void* /*stream*/) {
  // The stream PyTorch passes is the allocation stream, which the block already records.
  if (!ptr) return;
  pyalloc_engine* e = device >= 0 && device < kMaxDevices
                          ? g_engines[device].load(std::memory_order_acquire)
                          : nullptr;
  if (!e) {
    report_bad_free("free of a pointer on device " + std::to_string(device) +
                    ", where pyalloc has no engine; the pointer was not freed");
    return;
  }
  const Status status = e->free(ptr, size);
  if (!status.ok()) report_bad_free(status.message());
}

void pyalloc_empty_cache_hook(void) {
  for (auto& slot : g_engines) {
    if (pyalloc_engine* e = slot.load(std::memory_order_acquire)) e->empty_cache();
  }
}

void pyalloc_before_fork(void) {
  for (auto& slot : g_engines)
    if (pyalloc_engine* e = slot.load(std::memory_order_acquire)) e->backend().before_fork();
}

int pyalloc_after_fork_in_child(void) {
  for (auto& slot : g_engines) {
    pyalloc_engine* e = slot.load(std::memory_order_acquire);
    std::string error;
    if (e && !e->backend().after_fork_in_child(&error)) return fail(error);
  }
  return 0;
}

void pyalloc_memory_fraction_hook(double fraction, int device) {
  pyalloc_engine* e = installed_engine(device);
  if (!e) throw std::invalid_argument("pyalloc: " + t_error);
  const Status status = e->set_memory_fraction(fraction);
  if (!status.ok()) throw std::invalid_argument("pyalloc: " + status.message());
}

void pyalloc_record_stream_hook(void* ptr, void* stream) {
  // The hook carries no device: the block belongs to whichever engine knows it.
  std::string first_error;
  for (auto& slot : g_engines) {
    pyalloc_engine* e = slot.load(std::memory_order_acquire);
    if (!e) continue;
    const Status status = e->record_stream(ptr, reinterpret_cast<StreamId>(stream));
    if (status.ok()) return;
    if (first_error.empty()) first_error = status.message();
  }
  throw std::invalid_argument("pyalloc: " + (first_error.empty() ? "record_stream before install"
                                                                 : first_error));
}

// --- 2. control API ----------------------------------------------------------------------

const char* pyalloc_last_error(void) { return t_error.c_str(); }
void pyalloc_string_free(char* s) { std::free(s); }
const char* pyalloc_version(void) { return PYALLOC_VERSION; }

int pyalloc_has_cuda_backend(void) {
#ifdef PYALLOC_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

int pyalloc_cuda_device_count(void) {
#ifdef PYALLOC_WITH_CUDA
  std::string err;
  int n = pyalloc::cuda_device_count(&err);
  if (n < 0) fail(err);
  return n;
#else
  fail("this build of pyalloc has no CUDA backend");
  return -1;
#endif
}

const char* pyalloc_options_table(void) {
  static const std::string table = pyalloc::Options::table_json();
  return table.c_str();
}

char* pyalloc_options_normalize(const char* options) {
  pyalloc::Options o = pyalloc::Options::defaults();
  std::string err = pyalloc::Options::parse(options ? options : "", &o);
  if (!err.empty()) {
    fail(err);
    return nullptr;
  }
  return to_c_string(o.to_string());
}

pyalloc_engine* pyalloc_engine_create(const char* backend, int device, const char* options) {
  if (!backend) {
    fail("backend is NULL: expected \"cuda\" or \"host\"");
    return nullptr;
  }
  return create_engine(backend, device, options);
}

#define PYALLOC_CHECK_ENGINE(e) \
  if (!(e)) return fail("engine handle is NULL")

int pyalloc_engine_destroy(pyalloc_engine* engine) {
  PYALLOC_CHECK_ENGINE(engine);
  for (auto& slot : g_engines) {
    if (slot.load() == engine) return fail("the installed engine cannot be destroyed");
  }
  if (std::int64_t live = engine->live_blocks()) {
    return fail("engine still has " + std::to_string(live) + " live blocks; free them first");
  }
  delete engine;
  return 0;
}

int pyalloc_engine_alloc(pyalloc_engine* engine, size_t size, uintptr_t stream, void** out) {
  PYALLOC_CHECK_ENGINE(engine);
  if (!out) return fail("out is NULL");
  *out = nullptr;
  if (stream == pyalloc::kAnyStream) {
    return fail("stream " + std::to_string(stream) + " is reserved by pyalloc; pass a real stream");
  }
  return fail(engine->malloc(size, stream, out));
}

int pyalloc_engine_free(pyalloc_engine* engine, void* ptr, size_t expected_size) {
  PYALLOC_CHECK_ENGINE(engine);
  if (!ptr) return fail("free of NULL: there is nothing to free");
  return fail(engine->free(ptr, expected_size));
}

int pyalloc_engine_record_stream(pyalloc_engine* engine, void* ptr, uintptr_t stream) {
  PYALLOC_CHECK_ENGINE(engine);
  return fail(engine->record_stream(ptr, stream));
}

int pyalloc_engine_route_to_graph_pool(pyalloc_engine* engine, uint64_t pool, uintptr_t stream,
                                       int kind) {
  PYALLOC_CHECK_ENGINE(engine);
  return fail(engine->route_to_graph_pool(pool, stream, static_cast<Engine::RouteKind>(kind)));
}

int pyalloc_engine_end_graph_pool_routes(pyalloc_engine* engine, uint64_t pool) {
  PYALLOC_CHECK_ENGINE(engine);
  engine->end_graph_pool_routes(pool);
  return 0;
}

int pyalloc_engine_release_graph_pool(pyalloc_engine* engine, uint64_t pool) {
  PYALLOC_CHECK_ENGINE(engine);
  engine->release_graph_pool(pool);
  return 0;
}

size_t pyalloc_engine_graph_pool_blocks(pyalloc_engine* engine, uint64_t pool, uintptr_t* out,
                                        size_t capacity) {
  if (!engine || (!out && capacity)) {
    fail("engine and out must not be NULL");
    return 0;
  }
  const std::vector<std::uintptr_t> blocks = engine->graph_pool_blocks(pool);
  std::copy(blocks.begin(), blocks.begin() + std::min(capacity, blocks.size()), out);
  return blocks.size();
}

int pyalloc_engine_empty_cache(pyalloc_engine* engine) {
  PYALLOC_CHECK_ENGINE(engine);
  engine->empty_cache();
  return 0;
}

int pyalloc_engine_set_budget(pyalloc_engine* engine, uint64_t bytes) {
  PYALLOC_CHECK_ENGINE(engine);
  return fail(engine->set_budget(bytes));
}

int pyalloc_engine_set_memory_fraction(pyalloc_engine* engine, double fraction) {
  PYALLOC_CHECK_ENGINE(engine);
  return fail(engine->set_memory_fraction(fraction));
}

char* pyalloc_engine_stats_json(pyalloc_engine* engine) {
  if (!engine) return fail("engine handle is NULL"), nullptr;
  return to_c_string(engine->stats_json());
}

char* pyalloc_engine_snapshot_json(pyalloc_engine* engine) {
  if (!engine) return fail("engine handle is NULL"), nullptr;
  return to_c_string(engine->snapshot_json());
}

char* pyalloc_engine_last_oom_json(pyalloc_engine* engine) {
  if (!engine) return fail("engine handle is NULL"), nullptr;
  return to_c_string(engine->last_oom_json());
}

char* pyalloc_engine_options(pyalloc_engine* engine) {
  if (!engine) return fail("engine handle is NULL"), nullptr;
  return to_c_string(engine->options().to_string());
}

int pyalloc_engine_check_invariants(pyalloc_engine* engine) {
  PYALLOC_CHECK_ENGINE(engine);
  std::string violation = engine->check_invariants();
  return violation.empty() ? 0 : fail(violation);
}

int pyalloc_engine_reset_peak_stats(pyalloc_engine* engine) {
  PYALLOC_CHECK_ENGINE(engine);
  engine->reset_peak_stats();
  return 0;
}

int pyalloc_engine_reset_accumulated_stats(pyalloc_engine* engine) {
  PYALLOC_CHECK_ENGINE(engine);
  engine->reset_accumulated_stats();
  return 0;
}

int pyalloc_engine_synchronize(pyalloc_engine* engine) {
  PYALLOC_CHECK_ENGINE(engine);
  engine->backend().synchronize_device();
  return 0;
}

int pyalloc_engine_set_evict_callback(pyalloc_engine* engine, pyalloc_evict_fn fn,
                                      void* context) {
  PYALLOC_CHECK_ENGINE(engine);
  engine->set_evict_callback(fn, context);
  return 0;
}

int pyalloc_engine_set_oom_callback(pyalloc_engine* engine, pyalloc_oom_fn fn, void* context) {
  PYALLOC_CHECK_ENGINE(engine);
  engine->set_oom_callback(fn, context);
  return 0;
}

int pyalloc_engine_set_evictable(pyalloc_engine* engine, void* ptr, uint64_t handle, double cost) {
  PYALLOC_CHECK_ENGINE(engine);
  return fail(engine->set_evictable(ptr, handle, cost));
}

int pyalloc_engine_set_last_resort_evictable(pyalloc_engine* engine, void* ptr, uint64_t handle,
                                             double cost) {
  PYALLOC_CHECK_ENGINE(engine);
  return fail(engine->set_evictable(ptr, handle, cost, /*last_resort=*/true));
}

int pyalloc_engine_set_compact_callbacks(pyalloc_engine* engine, pyalloc_movable_fn movable,
                                         pyalloc_relocate_fn relocate, void* context) {
  PYALLOC_CHECK_ENGINE(engine);
  if (!movable != !relocate) return fail("set_compact_callbacks: give both callbacks, or neither");
  engine->set_compact_callbacks(movable, relocate, context);
  return 0;
}

int pyalloc_engine_set_oom_describe_callback(pyalloc_engine* engine, pyalloc_describe_fn describe,
                                             void* context) {
  PYALLOC_CHECK_ENGINE(engine);
  engine->set_oom_describe_callback(describe, context);
  return 0;
}

int pyalloc_engine_compact(pyalloc_engine* engine, size_t size, uintptr_t stream, size_t* moved) {
  PYALLOC_CHECK_ENGINE(engine);
  if (!moved) return fail("moved is NULL");
  *moved = 0;
  if (stream == pyalloc::kAnyStream) {
    return fail("stream " + std::to_string(stream) + " is reserved by pyalloc; pass a real stream");
  }
  if (size == 0 || size > pyalloc::kMaxRequest) {
    return fail("compact: size must be in [1, 2**62], got " + std::to_string(size));
  }
  *moved = engine->compact(size, stream);
  return 0;
}

void pyalloc_set_thread_placement(void* ptr) {
  Engine::set_thread_placement(reinterpret_cast<std::uintptr_t>(ptr));
}

size_t pyalloc_engine_take_freed_marked(pyalloc_engine* engine, uint64_t* out, size_t capacity,
                                        int* overflowed) {
  if (!engine || (!out && capacity) || !overflowed) {
    fail("engine, out and overflowed must not be NULL");
    return 0;
  }
  bool over = false;
  const size_t n = engine->take_freed_marked(out, capacity, &over);
  *overflowed = over ? 1 : 0;
  return n;
}

uint64_t pyalloc_engine_freed_marked_count(pyalloc_engine* engine) {
  return engine ? engine->freed_marked_count() : 0;
}

int pyalloc_engine_touch(pyalloc_engine* engine, void* ptr) {
  PYALLOC_CHECK_ENGINE(engine);
  return fail(engine->touch(ptr));
}

int pyalloc_engine_trace_start(pyalloc_engine* engine, uint64_t capacity) {
  PYALLOC_CHECK_ENGINE(engine);
  if (capacity > (uint64_t{1} << 32)) {
    return fail("trace capacity " + std::to_string(capacity) + " is too large: at most 2^32 events "
                "(each takes 48 bytes)");
  }
  engine->set_trace_capacity(capacity);
  return 0;
}

char* pyalloc_engine_trace_drain(pyalloc_engine* engine) {
  if (!engine) return fail("engine handle is NULL"), nullptr;
  return to_c_string(engine->drain_trace_json());
}

void pyalloc_set_trace_context(uint32_t context) { pyalloc::TraceRing::set_thread_context(context); }

// --- swap (allocator/src/swap.h) ---

int pyalloc_engine_set_host_pool(pyalloc_engine* engine, uint64_t bytes) {
  PYALLOC_CHECK_ENGINE(engine);
  return fail(engine->set_host_pool(bytes));
}

int pyalloc_engine_defer_host_pool(pyalloc_engine* engine, uint64_t bytes) {
  PYALLOC_CHECK_ENGINE(engine);
  return fail(engine->set_host_pool(bytes, /*at_first_use=*/true));
}

int pyalloc_engine_swap_out(pyalloc_engine* engine, void* ptr, size_t bytes, uintptr_t stream,
                            uint64_t* slot) {
  PYALLOC_CHECK_ENGINE(engine);
  if (!slot) return fail("slot is NULL");
  return fail(engine->swap_out(ptr, bytes, stream, slot));
}

int pyalloc_engine_swap_in(pyalloc_engine* engine, uint64_t slot, void* ptr, uintptr_t stream) {
  PYALLOC_CHECK_ENGINE(engine);
  return fail(engine->swap_in(slot, ptr, stream));
}

int pyalloc_engine_swap_wait(pyalloc_engine* engine, uint64_t slot, uintptr_t stream) {
  PYALLOC_CHECK_ENGINE(engine);
  return fail(engine->swap_wait(slot, stream));
}

int pyalloc_engine_swap_ready(pyalloc_engine* engine, uint64_t slot) {
  if (!engine) return fail("engine handle is NULL"), -1;
  return engine->swap_ready(slot) ? 1 : 0;
}

int pyalloc_engine_swap_release(pyalloc_engine* engine, uint64_t slot) {
  PYALLOC_CHECK_ENGINE(engine);
  return fail(engine->swap_release(slot));
}

int pyalloc_engine_swap_stream(pyalloc_engine* engine, int to_host, uintptr_t* out) {
  PYALLOC_CHECK_ENGINE(engine);
  if (!out) return fail("out is NULL");
  *out = engine->swap_stream(to_host != 0);
  return *out ? 0 : fail("could not create the swap copy streams: " + engine->backend().last_error());
}

int pyalloc_engine_unallocated(pyalloc_engine* engine, uint64_t* out) {
  PYALLOC_CHECK_ENGINE(engine);
  if (!out) return fail("out is NULL");
  *out = engine->unallocated_bytes();
  return 0;
}

int pyalloc_engine_allocated(pyalloc_engine* engine, uint64_t* current, uint64_t* peak) {
  PYALLOC_CHECK_ENGINE(engine);
  if (!current || !peak) return fail("current and peak must not be NULL");
  std::size_t c = 0, p = 0;
  engine->allocated_bytes(&c, &p);
  *current = c;
  *peak = p;
  return 0;
}

uint64_t pyalloc_engine_blocked_ns(pyalloc_engine* engine) {
  return engine ? engine->blocked_ns() : 0;
}

void pyalloc_set_thread_may_evict(int may_evict) { Engine::set_thread_may_evict(may_evict != 0); }

int pyalloc_set_thread_tentative(int tentative) {
  return Engine::set_thread_tentative(tentative != 0) ? 1 : 0;
}

int pyalloc_set_thread_evictable(int evictable) {
  return Engine::set_thread_evictable(evictable != 0) ? 1 : 0;
}

void pyalloc_set_thread_persistent(int persistent) {
  Engine::set_thread_persistent(persistent != 0);
}

int pyalloc_engine_set_long_lived(pyalloc_engine* engine, int long_lived) {
  PYALLOC_CHECK_ENGINE(engine);
  engine->set_long_lived(long_lived != 0);
  return 0;
}

void pyalloc_set_long_lived(int long_lived) {
  // Under the install lock, so that an engine being created now gets the new phase.
  std::lock_guard<std::mutex> lock(g_install_mutex);
  g_long_lived = long_lived != 0;
  for (auto& slot : g_engines) {
    if (pyalloc_engine* e = slot.load(std::memory_order_acquire)) e->set_long_lived(g_long_lived);
  }
}

int pyalloc_engine_stream_create(pyalloc_engine* engine, uintptr_t* out) {
  PYALLOC_CHECK_ENGINE(engine);
  if (!out) return fail("out is NULL");
  *out = engine->backend().create_stream();
  return *out ? 0 : fail(engine->backend().last_error());
}

int pyalloc_engine_stream_destroy(pyalloc_engine* engine, uintptr_t stream) {
  PYALLOC_CHECK_ENGINE(engine);
  engine->backend().destroy_stream(stream);
  return 0;
}

int pyalloc_install(const char* backend, const char* options) {
  if (!backend) return fail("backend is NULL: expected \"cuda\" or \"host\"");
  std::string kind = backend;
  if (kind != "cuda" && kind != "host") {
    return fail("unknown backend '" + kind + "': expected \"cuda\" or \"host\"");
  }
  pyalloc::Options parsed = pyalloc::Options::defaults();
  std::string err = pyalloc::Options::parse(options ? options : "", &parsed);
  if (!err.empty()) return fail(err);
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (!g_backend.empty()) {
    return fail("pyalloc is already installed in this process (backend " + g_backend +
                "); it can be installed once, before the first tensor is allocated");
  }
  // Create device 0's engine now, so a missing driver or a bad capacity fails the install
  // itself instead of the first tensor allocation, and nothing is left half-installed.
  pyalloc_engine* first = create_engine(kind, 0, options);
  if (!first) return 1;
  first->set_oom_callback(g_oom_fn, g_oom_context);
  g_engines[0].store(first, std::memory_order_release);
  g_backend = kind;
  g_options = options ? options : "";
  g_installed.store(true);
  return 0;
}

int pyalloc_is_installed(void) { return g_installed.load() ? 1 : 0; }

pyalloc_engine* pyalloc_installed_engine(int device) { return installed_engine(device); }

int pyalloc_set_installed_oom_callback(pyalloc_oom_fn fn, void* context) {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  g_oom_fn = fn;
  g_oom_context = context;
  for (auto& slot : g_engines)
    if (pyalloc_engine* e = slot.load(std::memory_order_acquire)) e->set_oom_callback(fn, context);
  return 0;
}

}  // extern "C"
