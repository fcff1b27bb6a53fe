// debug_api.cpp — self-tests and benchmarks that must run in native code to mean anything:
// a multi-threaded stress loop (Python threads would measure the GIL, not the allocator)
// and a malloc/free timing loop through the pluggable entry points. Also the simulated
// device's test doubles (async fills, slow streams).
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "capi_internal.h"
#include "host_backend.h"
#include "pyalloc_c.h"

namespace {

using pyalloc::capi::fail;

pyalloc::HostBackend* host_backend(pyalloc_engine* engine) {
  return engine ? dynamic_cast<pyalloc::HostBackend*>(&engine->backend()) : nullptr;
}

// The pattern a live block holds: a function of its identity, so a block that another
// allocation overlaps, or that is reused while live, reads wrong.
std::uint64_t pattern_word(std::uint64_t tag, std::size_t i) {
  return (tag * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
}

// Regions written and checked: the whole block when small, else 4 KiB at the start,
// the middle and the end (enough to catch overlap without making the test memory-bound).
template <typename F>
void for_each_region(std::size_t size, F f) {
  const std::size_t kWhole = 64 << 10, kPiece = 4096;
  if (size <= kWhole) return f(0, size);
  f(0, kPiece);
  f(size / 2 - kPiece / 2, kPiece);
  f(size - kPiece, kPiece);
}

void write_pattern(void* p, std::size_t size, std::uint64_t tag) {
  for_each_region(size, [&](std::size_t off, std::size_t len) {
    auto* bytes = static_cast<unsigned char*>(p) + off;
    for (std::size_t i = 0; i + 8 <= len; i += 8) {
      std::uint64_t w = pattern_word(tag, off + i);
      std::memcpy(bytes + i, &w, 8);
    }
  });
}

bool check_pattern(const void* p, std::size_t size, std::uint64_t tag) {
  bool ok = true;
  for_each_region(size, [&](std::size_t off, std::size_t len) {
    const auto* bytes = static_cast<const unsigned char*>(p) + off;
    for (std::size_t i = 0; ok && i + 8 <= len; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, bytes + i, 8);
      ok = w == pattern_word(tag, off + i);
    }
  });
  return ok;
}

}  // namespace

extern "C" {

int pyalloc_sim_fill_async(pyalloc_engine* engine, uintptr_t stream, void* ptr, size_t bytes,
                           int value) {
  pyalloc::HostBackend* host = host_backend(engine);
  if (!host) return fail("pyalloc_sim_fill_async needs an engine on the simulated device");
  if (!ptr) return fail("ptr is NULL");
  bool ok = host->enqueue(stream, [ptr, bytes, value] { std::memset(ptr, value, bytes); });
  return ok ? 0 : fail(host->last_error());
}

int pyalloc_sim_set_stream_delay(pyalloc_engine* engine, uintptr_t stream, unsigned delay_us) {
  pyalloc::HostBackend* host = host_backend(engine);
  if (!host) return fail("pyalloc_sim_set_stream_delay needs an engine on the simulated device");
  return host->set_stream_delay_us(stream, delay_us) ? 0 : fail(host->last_error());
}

int pyalloc_sim_fail_copies(pyalloc_engine* engine, unsigned count) {
  pyalloc::HostBackend* host = host_backend(engine);
  if (!host) return fail("pyalloc_sim_fail_copies needs an engine on the simulated device");
  host->fail_next_copies(count);
  return 0;
}

int pyalloc_sim_fail_host_commits(pyalloc_engine* engine, unsigned count) {
  pyalloc::HostBackend* host = host_backend(engine);
  if (!host) return fail("pyalloc_sim_fail_host_commits needs an engine on the simulated device");
  host->fail_next_host_commits(count);
  return 0;
}

int pyalloc_stress(pyalloc_engine* engine, int threads, uint64_t ops, uint64_t seed,
                   size_t max_size, uint64_t check_every) {
  if (!engine) return fail("engine handle is NULL");
  if (threads < 1 || threads > 1024) return fail("threads must be in [1, 1024]");
  if (max_size < 1) return fail("max_size must be at least 1");
  if (!host_backend(engine)) {
    return fail("pyalloc_stress writes and checks patterns from the CPU, so it needs an engine on "
                "the simulated device (backend \"host\")");
  }

  const std::int64_t live_before = engine->live_blocks();
  std::atomic<std::uint64_t> done{0};
  std::atomic<bool> failed{false};
  std::mutex report_mutex;
  std::string report;  // guarded by report_mutex
  auto report_failure = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(report_mutex);
    if (report.empty()) report = what;
    failed = true;
  };

  // A few shared streams, so blocks move between threads' streams and get fenced.
  std::vector<uintptr_t> streams = {0};
  for (int i = 0; i < 3; ++i) streams.push_back(engine->backend().create_stream());

  auto worker = [&](int index) {
    std::mt19937_64 rng(seed * 7919 + static_cast<std::uint64_t>(index));
    struct Live { void* ptr; std::size_t size; std::uint64_t tag; };
    std::vector<Live> live;
    const double log_max = std::log(static_cast<double>(max_size));
    std::uint64_t tag_counter = static_cast<std::uint64_t>(index) << 40;
    const std::size_t target_live = 16 + (rng() % 48);
    while (!failed) {
      std::uint64_t n = done.fetch_add(1);
      if (n >= ops) break;
      std::uint64_t dice = rng() % 100;
      if (live.size() < target_live && dice < 60) {
        auto size = static_cast<std::size_t>(std::exp(std::uniform_real_distribution<double>(0, log_max)(rng)));
        uintptr_t stream = streams[rng() % streams.size()];
        void* p = nullptr;
        if (!engine->malloc(size, stream, &p).ok()) continue;  // out of budget is legal here
        std::uint64_t tag = ++tag_counter;
        write_pattern(p, size, tag);
        live.push_back({p, size, tag});
        if (rng() % 16 == 0) (void)engine->record_stream(p, streams[rng() % streams.size()]);
      } else if (!live.empty()) {
        std::size_t i = rng() % live.size();
        Live l = live[i];
        live[i] = live.back();
        live.pop_back();
        if (!check_pattern(l.ptr, l.size, l.tag)) {
          report_failure("pattern of a live block was overwritten (block of " +
                         std::to_string(l.size) + " bytes)");
          break;
        }
        const pyalloc::Status freed = engine->free(l.ptr, l.size);
        if (!freed.ok()) report_failure("free failed: " + freed.message());
      }
      if (dice == 99 && rng() % 64 == 0) engine->empty_cache();
      // The lifetime phase is the engine's: any thread may flip it under the others' feet.
      if (dice == 98 && rng() % 4 == 0) engine->set_long_lived(rng() % 2 == 0);
      if (check_every && n % check_every == 0) {
        std::string violation = engine->check_invariants();
        if (!violation.empty()) report_failure("invariant violated: " + violation);
      }
    }
    for (const Live& l : live) {
      if (!check_pattern(l.ptr, l.size, l.tag)) report_failure("pattern overwritten at exit");
      (void)engine->free(l.ptr, l.size);
    }
  };

  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker, i);
  for (std::thread& t : pool) t.join();
  engine->backend().synchronize_device();
  engine->empty_cache();  // completes record_stream waits, so every block is free again
  std::string violation = engine->check_invariants();
  if (!violation.empty()) report_failure("invariant violated at the end: " + violation);
  if (engine->live_blocks() != live_before) {
    report_failure(std::to_string(engine->live_blocks() - live_before) +
                   " blocks still live after the stress loop freed all of its own");
  }
  for (std::size_t i = 1; i < streams.size(); ++i) engine->backend().destroy_stream(streams[i]);
  return failed ? fail(report) : 0;
}

int pyalloc_bench_pairs(int device, uintptr_t stream, const size_t* sizes, size_t n_sizes,
                        size_t live, uint64_t pairs, double* ns_per_pair) {
  if (!sizes || n_sizes == 0) return fail("sizes is empty");
  if (live == 0) return fail("live must be at least 1");
  if (!ns_per_pair) return fail("ns_per_pair is NULL");
  std::vector<void*> ring(live, nullptr);
  std::vector<std::size_t> ring_size(live, 0);
  void* s = reinterpret_cast<void*>(stream);
  try {
    auto run = [&](std::uint64_t count) {
      for (std::uint64_t i = 0; i < count; ++i) {
        std::size_t slot = i % live;
        if (ring[slot]) pyalloc_free(ring[slot], ring_size[slot], device, s);
        ring[slot] = nullptr;
        std::size_t size = sizes[i % n_sizes];
        ring[slot] = pyalloc_malloc(size, device, s);
        ring_size[slot] = size;
      }
    };
    run(pairs / 10 + live);  // warm the cache: steady state is what training sees
    auto start = std::chrono::steady_clock::now();
    run(pairs);
    auto stop = std::chrono::steady_clock::now();
    *ns_per_pair = std::chrono::duration<double, std::nano>(stop - start).count() /
                   static_cast<double>(pairs);
  } catch (const std::exception& e) {
    for (std::size_t i = 0; i < live; ++i) {
      if (ring[i]) pyalloc_free(ring[i], ring_size[i], device, s);
    }
    return fail(std::string("benchmark allocation failed: ") + e.what());
  }
  for (std::size_t i = 0; i < live; ++i) {
    if (ring[i]) pyalloc_free(ring[i], ring_size[i], device, s);
  }
  return 0;
}

int pyalloc_bench_sequence(int device, uintptr_t stream, const int64_t* ops,
                           const uint32_t* slots, size_t count, uint32_t n_slots, int repeats,
                           double* ns_per_op) {
  if (!ops || !slots || count == 0) return fail("the sequence is empty");
  if (!ns_per_op || repeats < 1) return fail("repeats must be at least 1");
  std::vector<void*> live(n_slots, nullptr);
  std::vector<std::size_t> sizes(n_slots, 0);
  void* s = reinterpret_cast<void*>(stream);
  for (size_t i = 0; i < count; ++i) {
    if (slots[i] >= n_slots) return fail("slot " + std::to_string(slots[i]) + " out of range");
  }
  auto release_all = [&] {
    for (std::uint32_t k = 0; k < n_slots; ++k) {
      if (live[k]) pyalloc_free(live[k], sizes[k], device, s);
      live[k] = nullptr;
    }
  };
  auto run = [&] {
    for (size_t i = 0; i < count; ++i) {
      std::uint32_t k = slots[i];
      if (ops[i] > 0) {
        if (live[k]) pyalloc_free(live[k], sizes[k], device, s);  // tolerate reuse of a slot
        live[k] = pyalloc_malloc(static_cast<std::size_t>(ops[i]), device, s);
        sizes[k] = static_cast<std::size_t>(ops[i]);
      } else if (live[k]) {
        pyalloc_free(live[k], sizes[k], device, s);
        live[k] = nullptr;
      }
    }
  };
  try {
    run();  // warm-up: the cache reaches its steady state
    release_all();
    auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; ++r) {
      run();
      release_all();
    }
    auto stop = std::chrono::steady_clock::now();
    *ns_per_op = std::chrono::duration<double, std::nano>(stop - start).count() /
                 (static_cast<double>(count) * repeats);
  } catch (const std::exception& e) {
    release_all();
    return fail(std::string("benchmark allocation failed: ") + e.what());
  }
  return 0;
}

}  // extern "C"
