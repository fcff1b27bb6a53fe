// host_backend.cpp — see host_backend.h.
#include "host_backend.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>

namespace pyalloc {
namespace {

thread_local std::string t_last_error;

void set_error(const std::string& what) { t_last_error = what; }

std::string errno_text(const char* call) {
  return std::string(call) + " failed: " + std::strerror(errno);
}

// Takes one of the injected failures `failing` counts (test hooks), if any is left.
bool take_injected_failure(std::atomic<unsigned>& failing) {
  unsigned left = failing.load();
  while (left > 0 && !failing.compare_exchange_weak(left, left - 1)) {
  }
  return left > 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Events and streams
// ---------------------------------------------------------------------------------------

// An event counts how many times it was recorded and how many of those points its stream
// has passed. It is complete when every recording so far has been passed, which gives
// CUDA's semantics: a never-recorded event is complete, and re-recording moves the point.
struct HostEvent {
  std::mutex mutex;
  std::condition_variable passed_cv;
  std::uint64_t recorded = 0;  // guarded by mutex
  std::uint64_t passed = 0;    // guarded by mutex

  void wait_for(std::uint64_t target) {
    std::unique_lock<std::mutex> lock(mutex);
    passed_cv.wait(lock, [&] { return passed >= target; });
  }
  void mark_passed(std::uint64_t point) {
    // Notify under the lock: a waiter may destroy the event (synchronize_stream keeps one
    // on its stack) as soon as it can observe `passed`, so the notify must happen first.
    std::lock_guard<std::mutex> lock(mutex);
    passed = std::max(passed, point);
    passed_cv.notify_all();
  }
};

// One worker thread running tasks in submission order. Thread safety: `push` and
// `set_delay` may be called from any thread; tasks run only on the worker.
class HostStream {
 public:
  HostStream() : worker_([this] { run(); }) {}
  ~HostStream() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();  // drains the queue first: destroying a stream completes its work
  }
  void push(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  void set_delay(unsigned us) { delay_us_.store(us); }
  // In a forked child: fork copies only the calling thread, so the worker does not exist
  // here, and its mutex and condition variable hold whatever state it left them in. Both
  // are made anew and a worker of the child's own started; the old thread object names no
  // thread here and is overwritten, not destroyed (destroying a joinable one terminates).
  // The parent drained the stream before the fork (before_fork), so the queue is empty;
  // anything left runs here first, in order. See Note [The simulated device after fork].
  void restart_in_child() {
    new (&mutex_) std::mutex;
    new (&cv_) std::condition_variable;
    std::deque<std::function<void()>> left;
    left.swap(queue_);
    for (auto& task : left) task();
    stopping_ = false;
    new (&worker_) std::thread([this] { run(); });
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      if (unsigned us = delay_us_.load()) {
        std::this_thread::sleep_for(std::chrono::microseconds(us));
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mutex_
  bool stopping_ = false;                    // guarded by mutex_
  std::atomic<unsigned> delay_us_{0};
  std::thread worker_;  // last: starts after the members above exist
};

// ---------------------------------------------------------------------------------------
// Construction and memory
// ---------------------------------------------------------------------------------------

std::unique_ptr<HostBackend> HostBackend::create(std::size_t capacity, std::string* error,
                                                 bool sync_stream0) {
  std::size_t rounded = (capacity + kChunk - 1) / kChunk * kChunk;
  if (rounded == 0 || rounded / kChunk > UINT32_MAX) {
    *error = "simulated device capacity " + std::to_string(capacity) +
             " bytes is out of range: use between 2 MiB and 8 PiB (option sim_capacity)";
    return nullptr;
  }
  int fd = memfd_create("pyalloc-simulated-device", MFD_CLOEXEC);
  if (fd < 0) {
    *error = errno_text("memfd_create") + "; the simulated device needs Linux memfd support";
    return nullptr;
  }
  // The file is sparse: pages cost host memory only once written.
  if (ftruncate(fd, static_cast<off_t>(rounded)) != 0) {
    *error = errno_text("ftruncate of the simulated device");
    close(fd);
    return nullptr;
  }
  return std::unique_ptr<HostBackend>(new HostBackend(fd, rounded, sync_stream0));
}

HostBackend::HostBackend(int fd, std::size_t capacity, bool sync_stream0)
    : fd_(fd), sync_stream0_(sync_stream0), chunk_count_(capacity / kChunk) {
  free_chunks_.reserve(chunk_count_);
  // Highest index at the bottom of the stack, so chunks are handed out in file order.
  for (std::size_t i = chunk_count_; i-- > 0;) free_chunks_.push_back(static_cast<std::uint32_t>(i));
}

HostBackend::~HostBackend() {
  {
    std::lock_guard<std::mutex> lock(stream_mutex_);
    streams_.clear();
  }
  close(fd_);
}

MemInfo HostBackend::mem_info() {
  std::lock_guard<std::mutex> lock(chunk_mutex_);
  return {free_chunks_.size() * kChunk, chunk_count_ * kChunk};
}

std::string HostBackend::last_error() const { return t_last_error; }

std::uintptr_t HostBackend::reserve(std::size_t bytes) {
  // Over-reserve by one chunk and trim, so ranges are chunk-aligned like CUDA's.
  std::size_t span = bytes + kChunk;
  void* p = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    set_error(errno_text("mmap(PROT_NONE) reservation"));
    return 0;
  }
  auto base = reinterpret_cast<std::uintptr_t>(p);
  std::uintptr_t aligned = (base + kChunk - 1) / kChunk * kChunk;
  if (aligned > base) munmap(p, aligned - base);
  std::size_t tail = base + span - (aligned + bytes);
  if (tail) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  return aligned;
}

void HostBackend::unreserve(std::uintptr_t va, std::size_t bytes) {
  munmap(reinterpret_cast<void*>(va), bytes);
}

PhysicalHandle HostBackend::create_physical(std::size_t bytes) {
  std::size_t n = (bytes + kChunk - 1) / kChunk;
  std::lock_guard<std::mutex> lock(chunk_mutex_);
  if (n == 0 || n > free_chunks_.size()) {
    set_error("simulated device out of memory: " + std::to_string(n) + " chunks of 2 MiB asked, " +
              std::to_string(free_chunks_.size()) + " free");
    return {};
  }
  std::vector<std::uint32_t> chunks(free_chunks_.end() - static_cast<std::ptrdiff_t>(n),
                                    free_chunks_.end());
  free_chunks_.resize(free_chunks_.size() - n);
  std::reverse(chunks.begin(), chunks.end());  // ascending, so runs map in one mmap
  std::uintptr_t handle = next_handle_++;
  physical_.emplace(handle, std::move(chunks));
  return {handle, n * kChunk};
}

void HostBackend::release_physical(PhysicalHandle phys) {
  std::vector<std::uint32_t> chunks;
  {
    std::lock_guard<std::mutex> lock(chunk_mutex_);
    auto it = physical_.find(phys.handle);
    if (it == physical_.end()) return;
    chunks = std::move(it->second);
    physical_.erase(it);
  }
  // Give the RAM back to the host: a simulated device that never shrinks would make a
  // laptop swap after one large run.
  for (std::uint32_t c : chunks) {
    fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
              static_cast<off_t>(c) * static_cast<off_t>(kChunk), static_cast<off_t>(kChunk));
  }
  std::lock_guard<std::mutex> lock(chunk_mutex_);
  for (auto it = chunks.rbegin(); it != chunks.rend(); ++it) free_chunks_.push_back(*it);
}

bool HostBackend::map(std::uintptr_t va, PhysicalHandle phys) {
  return map_chunks(va, phys, 0, phys.bytes / kChunk);
}

bool HostBackend::map_part(std::uintptr_t va, PhysicalHandle phys, std::size_t offset,
                           std::size_t bytes) {
  if (offset % kChunk || bytes % kChunk || offset + bytes > phys.bytes) {
    set_error("map_part: offset and size must be whole chunks inside the allocation");
    return false;
  }
  return map_chunks(va, phys, offset / kChunk, bytes / kChunk);
}

bool HostBackend::map_chunks(std::uintptr_t va, PhysicalHandle phys, std::size_t first,
                             std::size_t count) {
  std::vector<std::uint32_t> chunks;
  {
    std::lock_guard<std::mutex> lock(chunk_mutex_);
    auto it = physical_.find(phys.handle);
    if (it == physical_.end()) {
      set_error("map: unknown physical handle");
      return false;
    }
    if (first + count > it->second.size()) {
      set_error("map: chunk range outside the physical allocation");
      return false;
    }
    chunks.assign(it->second.begin() + static_cast<std::ptrdiff_t>(first),
                  it->second.begin() + static_cast<std::ptrdiff_t>(first + count));
  }
  return map_file_chunks(va, chunks);
}

bool HostBackend::map_handles(std::uintptr_t va, const PhysicalHandle* handles,
                              std::size_t count) {
  std::vector<std::uint32_t> chunks;
  {
    std::lock_guard<std::mutex> lock(chunk_mutex_);
    for (std::size_t i = 0; i < count; ++i) {
      auto it = physical_.find(handles[i].handle);
      if (it == physical_.end()) {
        set_error("map: unknown physical handle");
        return false;
      }
      chunks.insert(chunks.end(), it->second.begin(), it->second.end());
    }
  }
  return map_file_chunks(va, chunks);
}

bool HostBackend::map_file_chunks(std::uintptr_t va, const std::vector<std::uint32_t>& chunks) {
  // One mmap per run of consecutive chunks.
  std::size_t i = 0;
  while (i < chunks.size()) {
    std::size_t j = i + 1;
    while (j < chunks.size() && chunks[j] == chunks[j - 1] + 1) ++j;
    void* want = reinterpret_cast<void*>(va + i * kChunk);
    void* got = mmap(want, (j - i) * kChunk, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd_,
                     static_cast<off_t>(chunks[i]) * static_cast<off_t>(kChunk));
    if (got == MAP_FAILED) {
      set_error(errno_text("mmap of simulated device memory"));
      unmap(va, i * kChunk);
      return false;
    }
    i = j;
  }
  return true;
}

// Note [The simulated device after fork]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The simulated device's memory is one memfd mapped MAP_SHARED (so that stitching can show
// the same pages at two addresses, as cuMemMap does). A forked child (a DataLoader worker)
// inherits those mappings shared, not copied, and a copy of the allocator that believes the
// same blocks free as the parent does: the child's new tensors and the parent's landed on
// the same pages, and each read the other's bytes (a worker's batch came back holding
// another worker's; found by tools/user_programs/dataloader_workers.py, under no policy
// too). With plain PyTorch a child gets a copy-on-write copy. So in the child (Python's
// os.register_at_fork, which `install()` sets up: forks that exec at once, as subprocess's,
// pay nothing) the backend copies the chunks in use into a memfd of its own and maps each
// range the old file was mapped at, found in /proc/self/maps by the file's inode, from the
// new one at the same offset. The child then has the parent's contents at fork time and
// memory of its own, as with PyTorch's allocator; the copy costs the bytes in use.
// The streams are the other half: each is a worker thread, and a fork copies only the
// thread that called it. A child whose allocator waited for a copy on a stream (a swap
// under swap or hybrid, a fence before reusing a block another stream used) waited for a
// worker that did not exist, for ever (tools/user_programs/hogwild_share_memory.py, a
// Hogwild worker forked under hybrid). So the parent drains every stream before the fork
// (before_fork, from os.register_at_fork's `before`), no copy is in flight and every event
// is passed; and the child gives each stream a worker of its own and makes the backend's
// mutexes anew (only the child's one thread exists to hold them).
bool HostBackend::after_fork_in_child(std::string* error) {
  new (&chunk_mutex_) std::mutex;
  new (&stream_mutex_) std::mutex;
  for (auto& kv : streams_) kv.second->restart_in_child();
  struct stat old_stat {};
  if (fstat(fd_, &old_stat) != 0) {
    *error = errno_text("fstat of the simulated device");
    return false;
  }
  const int fresh = memfd_create("pyalloc-simulated-device", MFD_CLOEXEC);
  if (fresh < 0 || ftruncate(fresh, static_cast<off_t>(chunk_count_ * kChunk)) != 0) {
    *error = errno_text("a forked child's simulated device");
    if (fresh >= 0) close(fresh);
    return false;
  }
  std::lock_guard<std::mutex> lock(chunk_mutex_);
  std::vector<char> buffer(kChunk);
  for (const auto& [handle, chunks] : physical_) {
    for (std::uint32_t chunk : chunks) {
      const off_t at = static_cast<off_t>(chunk) * static_cast<off_t>(kChunk);
      if (pread(fd_, buffer.data(), kChunk, at) != static_cast<ssize_t>(kChunk) ||
          pwrite(fresh, buffer.data(), kChunk, at) != static_cast<ssize_t>(kChunk)) {
        *error = errno_text("copying the simulated device for a forked child");
        close(fresh);
        return false;
      }
    }
  }
  // Every mapping of the old file, from /proc/self/maps: "start-end perms offset dev inode path".
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (!maps) {
    *error = errno_text("reading /proc/self/maps");
    close(fresh);
    return false;
  }
  struct Range {
    std::uintptr_t start, end;
    off_t offset;
  };
  std::vector<Range> ranges;
  char line[512];
  while (std::fgets(line, sizeof line, maps)) {
    unsigned long start = 0, end = 0, offset = 0, inode = 0;
    char perms[8] = {0}, dev[32] = {0};
    if (std::sscanf(line, "%lx-%lx %7s %lx %31s %lu", &start, &end, perms, &offset, dev, &inode) == 6 &&
        inode == static_cast<unsigned long>(old_stat.st_ino) && perms[3] == 's')
      ranges.push_back({start, end, static_cast<off_t>(offset)});
  }
  std::fclose(maps);
  for (const Range& r : ranges) {
    void* want = reinterpret_cast<void*>(r.start);
    if (mmap(want, r.end - r.start, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fresh,
             r.offset) == MAP_FAILED) {
      *error = errno_text("mapping a forked child's simulated device");
      close(fresh);
      return false;
    }
  }
  close(fd_);
  fd_ = fresh;
  return true;
}

void HostBackend::unmap(std::uintptr_t va, std::size_t bytes) {
  if (bytes == 0) return;
  // Put the range back to PROT_NONE rather than munmap it: the reservation stays ours.
  mmap(reinterpret_cast<void*>(va), bytes, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
}

// ---------------------------------------------------------------------------------------
// Streams and events
// ---------------------------------------------------------------------------------------

StreamId HostBackend::create_stream() {
  auto stream = std::make_unique<HostStream>();
  auto id = reinterpret_cast<StreamId>(stream.get());
  std::lock_guard<std::mutex> lock(stream_mutex_);
  streams_.emplace(id, std::move(stream));
  return id;
}

void HostBackend::destroy_stream(StreamId stream) {
  std::unique_ptr<HostStream> doomed;
  {
    std::lock_guard<std::mutex> lock(stream_mutex_);
    auto it = streams_.find(stream);
    if (it == streams_.end()) return;
    doomed = std::move(it->second);
    streams_.erase(it);
  }
  // ~HostStream drains the queue outside the registry lock.
}

HostStream* HostBackend::find_stream(StreamId stream) {
  std::lock_guard<std::mutex> lock(stream_mutex_);
  auto it = streams_.find(stream);
  return it == streams_.end() ? nullptr : it->second.get();
}

bool HostBackend::enqueue(StreamId stream, std::function<void()> work) {
  if (stream == 0) {
    work();
    return true;
  }
  HostStream* s = find_stream(stream);
  if (!s) {
    set_error("unknown simulated stream " + std::to_string(stream));
    return false;
  }
  s->push(std::move(work));
  return true;
}

bool HostBackend::set_stream_delay_us(StreamId stream, unsigned microseconds) {
  HostStream* s = find_stream(stream);
  if (!s) {
    set_error("unknown simulated stream " + std::to_string(stream) + " (stream 0 has no delay)");
    return false;
  }
  s->set_delay(microseconds);
  return true;
}

EventId HostBackend::create_event() { return reinterpret_cast<EventId>(new HostEvent); }

void HostBackend::destroy_event(EventId event) { delete reinterpret_cast<HostEvent*>(event); }

bool HostBackend::record_event(EventId event, StreamId stream) {
  auto* e = reinterpret_cast<HostEvent*>(event);
  std::uint64_t point;
  {
    std::lock_guard<std::mutex> lock(e->mutex);
    point = ++e->recorded;
  }
  return enqueue(stream, [e, point] { e->mark_passed(point); });
}

bool HostBackend::query_event(EventId event) {
  auto* e = reinterpret_cast<HostEvent*>(event);
  std::lock_guard<std::mutex> lock(e->mutex);
  return e->passed >= e->recorded;
}

void HostBackend::synchronize_event(EventId event) {
  auto* e = reinterpret_cast<HostEvent*>(event);
  std::uint64_t target;
  {
    std::lock_guard<std::mutex> lock(e->mutex);
    target = e->recorded;
  }
  e->wait_for(target);
}

bool HostBackend::stream_wait_event(StreamId stream, EventId event) {
  auto* e = reinterpret_cast<HostEvent*>(event);
  std::uint64_t target;
  {
    std::lock_guard<std::mutex> lock(e->mutex);
    target = e->recorded;
  }
  return enqueue(stream, [e, target] { e->wait_for(target); });
}

void HostBackend::synchronize_stream(StreamId stream) {
  if (stream == 0) return;
  HostEvent marker;
  if (!record_event(reinterpret_cast<EventId>(&marker), stream)) return;
  marker.wait_for(1);
}

void HostBackend::synchronize_device() {
  std::vector<StreamId> ids;
  {
    std::lock_guard<std::mutex> lock(stream_mutex_);
    for (auto& kv : streams_) ids.push_back(kv.first);
  }
  for (StreamId id : ids) synchronize_stream(id);
}

bool HostBackend::memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind,
                               StreamId stream) {
  if (take_injected_failure(failing_copies_)) {
    set_error("memcpy_async of " + std::to_string(bytes) + " bytes failed: injected copy "
              "failure (test hook pyalloc_sim_fail_copies)");
    return false;
  }
  return enqueue(stream, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
}

// ---------------------------------------------------------------------------------------
// Host memory for swapping
// ---------------------------------------------------------------------------------------

void* HostBackend::host_alloc(std::size_t bytes) {
  // Plain anonymous memory: the simulated device's "pinned" memory is ordinary RAM, and
  // it is committed page by page as swaps first touch it.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    set_error(errno_text("mmap of the host pool"));
    return nullptr;
  }
  return p;
}

void HostBackend::host_free(void* ptr, std::size_t bytes) {
  if (ptr) munmap(ptr, bytes);
}

bool HostBackend::host_commit(void* /*base*/, std::size_t offset, std::size_t bytes) {
  if (take_injected_failure(failing_commits_)) {
    set_error("host_commit of " + std::to_string(bytes) + " bytes at offset " +
              std::to_string(offset) + " failed: injected failure (test hook "
              "pyalloc_sim_fail_host_commits)");
    return false;
  }
  return true;
}

}  // namespace pyalloc
