// options.cpp — parsing and printing of the options table in options.h.
#include "options.h"

#include <cctype>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace pyalloc {
namespace {

std::string trim(const std::string& s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Parses a plain decimal number, rejecting trailing junk, NaN and infinities.
bool parse_number(const std::string& text, double* value, std::string* rest) {
  const char* begin = text.c_str();
  char* end = nullptr;
  double v = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(v)) return false;
  *value = v;
  *rest = trim(std::string(end));
  return true;
}

bool parse_bool(const std::string& text, bool* out) {
  std::string t = lower(trim(text));
  if (t == "1" || t == "true" || t == "on" || t == "yes") return *out = true, true;
  if (t == "0" || t == "false" || t == "off" || t == "no") return *out = false, true;
  return false;
}

bool parse_count(const std::string& text, std::size_t* out) {
  std::string t = trim(text);
  if (t.empty() || t.size() > 15) return false;  // 10^15 events is far past any memory
  for (char c : t) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  *out = static_cast<std::size_t>(std::strtoull(t.c_str(), nullptr, 10));
  return true;
}

bool parse_budget(const std::string& text, std::size_t* bytes, double* fraction) {
  std::string t = trim(text);
  double v = 0;
  std::string rest;
  if (!parse_number(t, &v, &rest)) return false;
  if (rest == "%") {
    if (!(v > 0 && v <= 100)) return false;
    *bytes = 0, *fraction = v / 100.0;
    return true;
  }
  // A bare number with a decimal point, at most 1, is a fraction; anything else is a size.
  if (rest.empty() && t.find('.') != std::string::npos && v > 0 && v <= 1.0) {
    *bytes = 0, *fraction = v;
    return true;
  }
  std::size_t b = 0;
  // Below one 2 MiB segment nothing at all could be allocated; "1" is almost certainly a
  // fraction written without its decimal point.
  if (!parse_size(t, &b) || b < (std::size_t{2} << 20)) return false;
  *bytes = b, *fraction = 0;
  return true;
}

const char* kind_name(OptionKind k) {
  switch (k) {
    case OptionKind::kSize: return "size";
    case OptionKind::kBudget: return "budget";
    case OptionKind::kBool: return "bool";
    case OptionKind::kInt: return "int";
    case OptionKind::kChoice: return "choice";
    case OptionKind::kFraction: return "fraction";
  }
  return "?";
}

// The words a kChoice option accepts, first the default's kind of answer.
const char* choices(const std::string& key) {
  if (key == "evict_strategy") return "dtr, dte, window";
  if (key == "policy") return "none, recompute, swap, hybrid";
  if (key == "remat_cost") return "model, time, bytes";
  return "";
}

bool parse_choice(const std::string& key, const std::string& value, std::string* out) {
  const std::string v = lower(trim(value));
  const std::string list = std::string(", ") + choices(key) + ",";
  if (v.empty() || v.find(',') != std::string::npos ||
      list.find(" " + v + ",") == std::string::npos) {
    return false;
  }
  *out = v;
  return true;
}

const char* accepted_form(OptionKind k) {
  switch (k) {
    case OptionKind::kSize: return "a size such as 4096, 64KiB or 1.5GiB";
    case OptionKind::kBudget:
      return "a size of at least 2MiB such as 8GiB, or a fraction of device memory in (0, 1] "
             "written with a decimal point or a percent sign, such as 1.0, 0.8 or 80%";
    case OptionKind::kBool: return "true or false";
    case OptionKind::kInt: return "a non-negative integer";
    case OptionKind::kChoice: return "one of: ";
    case OptionKind::kFraction: return "a number between 0 and 1, such as 0.9";
  }
  return "?";
}

std::string known_names() {
  std::string out;
#define PYALLOC_NAME(name, kind, def, doc) out += (out.empty() ? "" : ", ") + std::string(#name);
  PYALLOC_OPTIONS(PYALLOC_NAME)
#undef PYALLOC_NAME
  return out;
}

// Applies one key/value pair. Returns "" or an error message.
std::string apply(const std::string& key, const std::string& value, Options* o) {
  bool ok = true;
  bool matched = false;
  OptionKind kind = OptionKind::kInt;
  if (key == "budget") {
    matched = true, kind = OptionKind::kBudget;
    ok = parse_budget(value, &o->budget_bytes, &o->budget_fraction);
  } else if (key == "sim_capacity") {
    matched = true, kind = OptionKind::kSize;
    ok = parse_size(value, &o->sim_capacity) && o->sim_capacity > 0;
  } else if (key == "sim_sync_stream0") {
    matched = true, kind = OptionKind::kBool;
    ok = parse_bool(value, &o->sim_sync_stream0);
  } else if (key == "max_split_size") {
    matched = true, kind = OptionKind::kSize;
    ok = parse_size(value, &o->max_split_size);
    // At or below the 20 MiB segment size, the rule would keep every fresh segment from
    // being split for smaller requests, so each allocation would take a segment of its own.
    // PyTorch refuses such values for the same reason.
    if (ok && o->max_split_size != 0 && o->max_split_size <= (std::size_t{20} << 20)) {
      return "invalid value '" + value + "' for pyalloc option 'max_split_size': it must be 0 "
             "(off) or more than 20 MiB (the large-segment size); smaller values would stop "
             "every segment from being split";
    }
  } else if (key == "stitch") {
    matched = true, kind = OptionKind::kBool;
    ok = parse_bool(value, &o->stitch);
  } else if (key == "stitch_first") {
    matched = true, kind = OptionKind::kBool;
    ok = parse_bool(value, &o->stitch_first);
  } else if (key == "expandable") {
    matched = true, kind = OptionKind::kBool;
    ok = parse_bool(value, &o->expandable);
  } else if (key == "lifetime_classes") {
    matched = true, kind = OptionKind::kBool;
    ok = parse_bool(value, &o->lifetime_classes);
  } else if (key == "evictable_placement") {
    matched = true, kind = OptionKind::kBool;
    ok = parse_bool(value, &o->evictable_placement);
  } else if (key == "compact") {
    matched = true, kind = OptionKind::kBool;
    ok = parse_bool(value, &o->compact);
  } else if (key == "evict_strategy") {
    matched = true, kind = OptionKind::kChoice;
    std::string v = lower(trim(value));
    ok = v == "dtr" || v == "dte" || v == "window";
    if (ok) {
      o->evict_strategy = v == "dtr" ? EvictStrategy::kDtr
                          : v == "dte" ? EvictStrategy::kDte : EvictStrategy::kWindow;
    }
  } else if (key == "evict_threshold") {
    matched = true, kind = OptionKind::kFraction;
    double v = 0;
    std::string rest;
    ok = parse_number(trim(value), &v, &rest) && rest.empty() && v >= 0 && v <= 1;
    if (ok) o->evict_threshold = v;
  } else if (key == "policy") {
    matched = true, kind = OptionKind::kChoice;
    ok = parse_choice(key, value, &o->policy);
  } else if (key == "host_pool") {
    matched = true, kind = OptionKind::kSize;
    ok = parse_size(value, &o->host_pool);
  } else if (key == "prefetch") {
    matched = true, kind = OptionKind::kInt;
    ok = parse_count(value, &o->prefetch);
  } else if (key == "min_evictable") {
    matched = true, kind = OptionKind::kSize;
    ok = parse_size(value, &o->min_evictable);
  } else if (key == "remat_cost") {
    matched = true, kind = OptionKind::kChoice;
    ok = parse_choice(key, value, &o->remat_cost);
  } else if (key == "inplace_update") {
    matched = true, kind = OptionKind::kBool;
    ok = parse_bool(value, &o->inplace_update);
  } else if (key == "trace_capacity") {
    matched = true, kind = OptionKind::kInt;
    ok = parse_count(value, &o->trace_capacity);
  } else if (key == "check_invariants") {
    matched = true, kind = OptionKind::kBool;
    ok = parse_bool(value, &o->check_invariants);
  }
  if (!matched) {
    return "unknown pyalloc option '" + key + "'; known options are: " + known_names();
  }
  if (!ok) {
    return "invalid value '" + value + "' for pyalloc option '" + key + "': expected " +
           accepted_form(kind) + choices(key);
  }
  return "";
}

}  // namespace

bool parse_size(const std::string& text, std::size_t* bytes) {
  double v = 0;
  std::string unit;
  if (!parse_number(trim(text), &v, &unit) || v < 0) return false;
  struct Unit { const char* name; double scale; };
  static const Unit kUnits[] = {
      {"", 1},  {"b", 1},
      {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
      {"k", 1024.0},   {"m", 1048576.0},   {"g", 1073741824.0},   {"t", 1099511627776.0},
      {"kb", 1e3},     {"mb", 1e6},        {"gb", 1e9},           {"tb", 1e12},
  };
  std::string u = lower(unit);
  for (const Unit& candidate : kUnits) {
    if (u != candidate.name) continue;
    double b = std::floor(v * candidate.scale);
    // 2^63 is far beyond any device; rejecting it keeps the cast below defined.
    if (!(b < 9.2e18)) return false;
    *bytes = static_cast<std::size_t>(b);
    return true;
  }
  return false;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) >= 0x20) {
      out += c;   // other control characters are dropped
    }
  }
  return out;
}

std::string format_bytes(std::size_t bytes) {
  static const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int i = 0;
  while (v >= 1024.0 && i < 4) v /= 1024.0, ++i;
  char buf[64];
  if (i == 0) std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, kNames[i]);
  return buf;
}

Options Options::defaults() {
  Options o;
#define PYALLOC_DEFAULT(name, kind, def, doc) apply(#name, def, &o);
  PYALLOC_OPTIONS(PYALLOC_DEFAULT)
#undef PYALLOC_DEFAULT
  return o;
}

const char* strategy_name(EvictStrategy s) {
  switch (s) {
    case EvictStrategy::kDtr: return "dtr";
    case EvictStrategy::kDte: return "dte";
    case EvictStrategy::kWindow: return "window";
  }
  return "?";
}

std::string format_address(std::uintptr_t address) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, address);
  return buf;
}

std::string Options::parse(const std::string& text, Options* out) {
  Options o = *out;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    std::string item = trim(text.substr(begin, end - begin));
    begin = end + 1;
    if (item.empty()) continue;
    std::size_t colon = item.find(':');
    if (colon == std::string::npos) {
      return "malformed pyalloc option '" + item + "': expected key:value pairs separated by "
             "commas, e.g. \"budget:8GiB,max_split_size:256MiB\"";
    }
    std::string err = apply(lower(trim(item.substr(0, colon))), trim(item.substr(colon + 1)), &o);
    if (!err.empty()) return err;
  }
  *out = o;
  return "";
}

std::string Options::to_string() const {
  // snprintf rather than iostreams: the library stays free of locale and stream state.
  char buf[512];
  if (budget_bytes) std::snprintf(buf, sizeof buf, "budget:%zu", budget_bytes);
  // As a percentage: a bare "1" would read back as one byte, not the whole device.
  else std::snprintf(buf, sizeof buf, "budget:%.15g%%", 100.0 * budget_fraction);
  std::string out = buf;
  std::snprintf(buf, sizeof buf,
                ",sim_capacity:%zu,sim_sync_stream0:%s,max_split_size:%zu,stitch:%s,"
                "stitch_first:%s,expandable:%s,lifetime_classes:%s,evictable_placement:%s,compact:%s,"
                "evict_strategy:%s,"
                "evict_threshold:%.17g,trace_capacity:%zu,check_invariants:%s",
                sim_capacity, sim_sync_stream0 ? "true" : "false", max_split_size,
                stitch ? "true" : "false", stitch_first ? "true" : "false",
                expandable ? "true" : "false",
                lifetime_classes ? "true" : "false", evictable_placement ? "true" : "false",
                compact ? "true" : "false",
                strategy_name(evict_strategy), evict_threshold,
                trace_capacity,
                check_invariants ? "true" : "false");
  out += buf;
  std::snprintf(buf, sizeof buf,
                ",policy:%s,host_pool:%zu,prefetch:%zu,min_evictable:%zu,remat_cost:%s,"
                "inplace_update:%s",
                policy.c_str(), host_pool, prefetch, min_evictable, remat_cost.c_str(),
                inplace_update ? "true" : "false");
  return out + buf;
}

std::string Options::table_json() {
  std::string out = "[";
#define PYALLOC_ROW(name, kind, def, doc)                                                  \
  out += std::string(out.size() > 1 ? "," : "") + "{\"name\":\"" #name "\",\"kind\":\"" + \
         kind_name(OptionKind::kind) + "\",\"default\":\"" + json_escape(def) +           \
         "\",\"doc\":\"" + json_escape(doc) + "\"}";
  PYALLOC_OPTIONS(PYALLOC_ROW)
#undef PYALLOC_ROW
  return out + "]";
}

std::size_t Options::budget_for(std::size_t device_total_bytes) const {
  if (budget_bytes) return budget_bytes;
  return static_cast<std::size_t>(budget_fraction * static_cast<double>(device_total_bytes));
}

}  // namespace pyalloc
