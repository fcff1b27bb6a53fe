// format.h — how the engine writes numbers, addresses and JSON strings in its messages,
// reports and snapshots: one place, so every message reads the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pyalloc {

// 1536 -> "1.50 KiB"
std::string format_bytes(std::size_t bytes);
// 0x7f3a00000000, for messages
std::string format_address(std::uintptr_t address);
// `s` as the inside of a JSON string: quotes and backslashes escaped, newlines as \n.
std::string json_escape(const std::string& s);

}  // namespace pyalloc
