// trace.cpp — see trace.h.
#include "trace.h"

#include <cinttypes>
#include <cstdio>

namespace pyalloc {
namespace {

thread_local std::uint32_t t_context = 0;

const char* action_name(TraceAction a) {
  switch (a) {
#define PYALLOC_TRACE_NAME(name, text) \
  case TraceAction::name: return text;
    PYALLOC_TRACE_ACTIONS(PYALLOC_TRACE_NAME)
#undef PYALLOC_TRACE_NAME
  }
  return "?";
}

}  // namespace

void TraceRing::set_thread_context(std::uint32_t context) { t_context = context; }

void TraceRing::set_capacity(std::size_t capacity) {
  ring_.assign(capacity, TraceEvent{});
  ring_.shrink_to_fit();
  next_ = count_ = 0;
  dropped_ = 0;
}

void TraceRing::record_slow(TraceAction action, std::uintptr_t address, std::size_t size,
                            std::size_t requested, StreamId stream) {
  auto t = std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now() - start_).count();
  ring_[next_] = TraceEvent{static_cast<std::uint64_t>(t), address, size, requested, stream,
                            t_context, action};
  next_ = next_ + 1 == ring_.size() ? 0 : next_ + 1;
  if (count_ < ring_.size()) ++count_;
  else ++dropped_;
}

std::string TraceRing::drain_json() {
  std::string out;
  out.reserve(64 + count_ * 72);
  char buf[192];
  std::snprintf(buf, sizeof buf, "{\"dropped_events\":%" PRIu64 ",\"events\":[", dropped_);
  out += buf;
  std::size_t first = (next_ + ring_.size() - count_) % (ring_.empty() ? 1 : ring_.size());
  for (std::size_t i = 0; i < count_; ++i) {
    const TraceEvent& e = ring_[(first + i) % ring_.size()];
    std::snprintf(buf, sizeof buf, "%s[%" PRIu64 ",\"%s\",%" PRIuPTR ",%" PRIu64 ",%" PRIu64
                  ",%" PRIuPTR ",%" PRIu32 "]",
                  i ? "," : "", e.t_ns, action_name(e.action), e.address, e.size, e.requested,
                  e.stream, e.context);
    out += buf;
  }
  out += "]}";
  count_ = 0;
  dropped_ = 0;
  return out;
}

}  // namespace pyalloc
