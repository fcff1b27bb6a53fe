// stats.cpp — resetting and rendering Stats.
#include "stats.h"

#include <cstdio>

namespace pyalloc {

void Stats::reset_peaks() {
#define PYALLOC_RESET_PEAK(name, doc) \
  for (Stat & st : name) st.peak = st.current;
  PYALLOC_ARRAY_STATS(PYALLOC_RESET_PEAK)
#undef PYALLOC_RESET_PEAK
  oversize_allocations.peak = oversize_allocations.current;
  oversize_segments.peak = oversize_segments.current;
  host_pool_used_bytes.peak = host_pool_used_bytes.current;
}

void Stats::reset_accumulated() {
#define PYALLOC_RESET_ACC(name, doc) \
  for (Stat & st : name) st.allocated = st.freed = 0;
  PYALLOC_ARRAY_STATS(PYALLOC_RESET_ACC)
#undef PYALLOC_RESET_ACC
  oversize_allocations.allocated = oversize_allocations.freed = 0;
  oversize_segments.allocated = oversize_segments.freed = 0;
  host_pool_used_bytes.allocated = host_pool_used_bytes.freed = 0;
#define PYALLOC_RESET_COUNTER(name, doc) name = 0;
  PYALLOC_COUNTERS(PYALLOC_RESET_COUNTER)
#undef PYALLOC_RESET_COUNTER
  for (std::int64_t& n : rung) n = 0;
}

std::string stats_json(const Stats& s, const FragmentationFigures& f, const std::string& extra) {
  static const char* kPoolNames[kStatPools] = {"all", "small_pool", "large_pool"};
  std::string out = "{";
  char buf[160];
  auto emit_int = [&](const std::string& key, long long v) {
    std::snprintf(buf, sizeof buf, "%s\"%s\":%lld", out.size() > 1 ? "," : "", key.c_str(), v);
    out += buf;
  };
  auto emit_real = [&](const char* key, double v) {
    std::snprintf(buf, sizeof buf, "%s\"%s\":%.17g", out.size() > 1 ? "," : "", key, v);
    out += buf;
  };
#define PYALLOC_EMIT_ARRAY(name, doc)                                         \
  for (int p = 0; p < kStatPools; ++p) {                                      \
    std::string base = std::string(#name ".") + kPoolNames[p];                \
    emit_int(base + ".current", s.name[p].current);                          \
    emit_int(base + ".peak", s.name[p].peak);                                 \
    emit_int(base + ".allocated", s.name[p].allocated);                       \
    emit_int(base + ".freed", s.name[p].freed);                               \
  }
  PYALLOC_ARRAY_STATS(PYALLOC_EMIT_ARRAY)
#undef PYALLOC_EMIT_ARRAY
  for (const auto& [name, st] : {std::pair<const char*, const Stat&>{"oversize_allocations", s.oversize_allocations},
                                 std::pair<const char*, const Stat&>{"oversize_segments", s.oversize_segments},
                                 std::pair<const char*, const Stat&>{"host_pool_used_bytes", s.host_pool_used_bytes}}) {
    emit_int(std::string(name) + ".current", st.current);
    emit_int(std::string(name) + ".peak", st.peak);
    emit_int(std::string(name) + ".allocated", st.allocated);
    emit_int(std::string(name) + ".freed", st.freed);
  }
#define PYALLOC_EMIT_COUNTER(name, doc) emit_int(#name, s.name);
  PYALLOC_COUNTERS(PYALLOC_EMIT_COUNTER)
#undef PYALLOC_EMIT_COUNTER
#define PYALLOC_EMIT_RUNG(name, doc) emit_int("rung." #name, s.rung[static_cast<int>(Rung::name)]);
  PYALLOC_RUNGS(PYALLOC_EMIT_RUNG)
#undef PYALLOC_EMIT_RUNG
  emit_int("cached_free_bytes", static_cast<long long>(f.cached_free_bytes));
  emit_int("largest_free_block", static_cast<long long>(f.largest_free_block));
  emit_real("utilization", f.utilization);
  emit_real("external_fragmentation", f.external_fragmentation);
  if (!extra.empty()) out += "," + extra;
  return out + "}";
}

}  // namespace pyalloc
