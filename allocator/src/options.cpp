// options.cpp — the options table of options.h, parsed and printed: one parser and one
// printer per kind, and every option's line generated from the table.
#include "options.h"

#include <cctype>
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

// --- one parser per kind: parse(kind tag, text, choices, out) ----------------------------------

template <OptionKind K>
struct Kind {};

bool parse(Kind<OptionKind::kSize>, const std::string& text, const char*, std::size_t* out) {
  return parse_size(text, out);
}

bool parse(Kind<OptionKind::kInt>, const std::string& text, const char*, std::size_t* out) {
  std::string t = trim(text);
  if (t.empty() || t.size() > 15) return false;  // 10^15 events is far past any memory
  for (char c : t) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  *out = static_cast<std::size_t>(std::strtoull(t.c_str(), nullptr, 10));
  return true;
}

bool parse(Kind<OptionKind::kBool>, const std::string& text, const char*, bool* out) {
  std::string t = lower(trim(text));
  if (t == "1" || t == "true" || t == "on" || t == "yes") return *out = true, true;
  if (t == "0" || t == "false" || t == "off" || t == "no") return *out = false, true;
  return false;
}

bool parse(Kind<OptionKind::kFraction>, const std::string& text, const char*, double* out) {
  double v = 0;
  std::string rest;
  if (!parse_number(trim(text), &v, &rest) || !rest.empty() || v < 0 || v > 1) return false;
  *out = v;
  return true;
}

bool parse(Kind<OptionKind::kBudget>, const std::string& text, const char*, Budget* out) {
  std::string t = trim(text);
  double v = 0;
  std::string rest;
  if (!parse_number(t, &v, &rest)) return false;
  if (rest == "%") {
    if (!(v > 0 && v <= 100)) return false;
    *out = Budget{0, v / 100.0};
    return true;
  }
  // A bare number with a decimal point, at most 1, is a fraction; anything else is a size.
  if (rest.empty() && t.find('.') != std::string::npos && v > 0 && v <= 1.0) {
    *out = Budget{0, v};
    return true;
  }
  std::size_t b = 0;
  // Below one 2 MiB segment nothing at all could be allocated; "1" is almost certainly a
  // fraction written without its decimal point.
  if (!parse_size(t, &b) || b < (std::size_t{2} << 20)) return false;
  *out = Budget{b, 0};
  return true;
}

// The position of `word` in `choices` ("a, b, c"), or -1.
int choice_index(const char* choices, const std::string& word) {
  if (word.empty() || word.find(',') != std::string::npos) return -1;
  const std::string list = std::string(", ") + choices + ",";
  const std::size_t at = list.find(", " + word + ",");
  if (at == std::string::npos) return -1;
  int index = 0;  // the commas before it: ", a, b," has one before "b"
  for (std::size_t i = 0; i < at; ++i) index += list[i] == ',';
  return index;
}

// A choice is kept as its word, or as its position in the list (an enum).
bool parse(Kind<OptionKind::kChoice>, const std::string& text, const char* choices,
           std::string* out) {
  const std::string word = lower(trim(text));
  if (choice_index(choices, word) < 0) return false;
  *out = word;
  return true;
}

template <typename Enum>
bool parse(Kind<OptionKind::kChoice>, const std::string& text, const char* choices, Enum* out) {
  const int index = choice_index(choices, lower(trim(text)));
  if (index < 0) return false;
  *out = static_cast<Enum>(index);
  return true;
}

// --- one printer per kind: what parse() reads back to the same value ------------------------

std::string print(Kind<OptionKind::kSize>, const char*, std::size_t v) { return std::to_string(v); }
std::string print(Kind<OptionKind::kInt>, const char*, std::size_t v) { return std::to_string(v); }
std::string print(Kind<OptionKind::kBool>, const char*, bool v) { return v ? "true" : "false"; }

std::string print(Kind<OptionKind::kFraction>, const char*, double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string print(Kind<OptionKind::kBudget>, const char*, const Budget& v) {
  if (v.bytes) return std::to_string(v.bytes);
  // As a percentage: a bare "1" would read back as one byte, not the whole device.
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.15g%%", 100.0 * v.fraction);
  return buf;
}

std::string print(Kind<OptionKind::kChoice>, const char*, const std::string& v) { return v; }

template <typename Enum>
std::string print(Kind<OptionKind::kChoice>, const char* choices, Enum v) {
  std::string list = choices;
  std::size_t begin = 0;
  for (int i = 0; i < static_cast<int>(v); ++i) begin = list.find(", ", begin) + 2;
  return list.substr(begin, list.find(',', begin) - begin);
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
#define PYALLOC_NAME(name, kind, Type, def, choices, doc) \
  out += (out.empty() ? "" : ", ") + std::string(#name);
  PYALLOC_OPTIONS(PYALLOC_NAME)
#undef PYALLOC_NAME
  return out;
}

// Rules a kind cannot express, checked once the value parsed. "" or the error.
std::string check_rule(const std::string& key, const std::string& value, const Options& o) {
  if (key == "sim_capacity" && o.sim_capacity == 0) {
    return "invalid value '" + value + "' for pyalloc option 'sim_capacity': expected " +
           accepted_form(OptionKind::kSize) + ", more than 0";
  }
  // At or below the 20 MiB segment size, the rule would keep every fresh segment from
  // being split for smaller requests, so each allocation would take a segment of its own.
  // PyTorch refuses such values for the same reason.
  if (key == "max_split_size" && o.max_split_size != 0 &&
      o.max_split_size <= (std::size_t{20} << 20)) {
    return "invalid value '" + value + "' for pyalloc option 'max_split_size': it must be 0 "
           "(off) or more than 20 MiB (the large-segment size); smaller values would stop "
           "every segment from being split";
  }
  return "";
}

// Applies one key/value pair. Returns "" or an error message.
std::string apply(const std::string& key, const std::string& value, Options* o) {
#define PYALLOC_APPLY(name, kind, Type, def, choices, doc)                                  \
  if (key == #name) {                                                                       \
    if (!parse(Kind<OptionKind::kind>{}, value, choices, &o->name)) {                      \
      return "invalid value '" + value + "' for pyalloc option '" #name "': expected " +   \
             accepted_form(OptionKind::kind) + choices;                                     \
    }                                                                                        \
    return check_rule(key, value, *o);                                                       \
  }
  PYALLOC_OPTIONS(PYALLOC_APPLY)
#undef PYALLOC_APPLY
  return "unknown pyalloc option '" + key + "'; known options are: " + known_names();
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

const char* strategy_name(EvictStrategy s) {
  Kind<OptionKind::kChoice> choice;
  static const std::string names[] = {print(choice, "dtr, dte, window", EvictStrategy::kDtr),
                                      print(choice, "dtr, dte, window", EvictStrategy::kDte),
                                      print(choice, "dtr, dte, window", EvictStrategy::kWindow)};
  const auto i = static_cast<std::size_t>(s);
  return i < 3 ? names[i].c_str() : "?";
}

Options Options::defaults() {
  Options o;
#define PYALLOC_DEFAULT(name, kind, Type, def, choices, doc) apply(#name, def, &o);
  PYALLOC_OPTIONS(PYALLOC_DEFAULT)
#undef PYALLOC_DEFAULT
  return o;
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
  std::string out;
#define PYALLOC_PRINT(name, kind, Type, def, choices, doc) \
  out += (out.empty() ? "" : ",") + std::string(#name ":") + print(Kind<OptionKind::kind>{}, choices, name);
  PYALLOC_OPTIONS(PYALLOC_PRINT)
#undef PYALLOC_PRINT
  return out;
}

std::string Options::table_json() {
  std::string out = "[";
#define PYALLOC_ROW(name, kind, Type, def, choices, doc)                                       \
  out += std::string(out.size() > 1 ? "," : "") + "{\"name\":\"" #name "\",\"kind\":\"" +     \
         kind_name(OptionKind::kind) + "\",\"default\":\"" + json_escape(def) +               \
         "\",\"choices\":\"" + json_escape(choices) + "\",\"doc\":\"" + json_escape(doc) + "\"}";
  PYALLOC_OPTIONS(PYALLOC_ROW)
#undef PYALLOC_ROW
  return out + "]";
}

std::size_t Options::budget_for(std::size_t device_total_bytes) const {
  if (budget.bytes) return budget.bytes;
  return static_cast<std::size_t>(budget.fraction * static_cast<double>(device_total_bytes));
}

}  // namespace pyalloc
