// format.cpp — see format.h.
#include "format.h"

#include <cinttypes>
#include <cstdio>

namespace pyalloc {

std::string format_bytes(std::size_t bytes) {
  static const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int i = 0;
  while (v >= 1024.0 && i < 4) v /= 1024.0, ++i;
  char buf[64];
  // snprintf rather than iostreams: the library stays free of locale and stream state.
  if (i == 0) std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, kNames[i]);
  return buf;
}

std::string format_address(std::uintptr_t address) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, address);
  return buf;
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

}  // namespace pyalloc
