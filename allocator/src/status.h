// status.h — the engine's one error convention.
//
// Every Engine operation that can fail returns a Status: ok, or a code and a message that
// names the problem and the fix. Results come back through out-parameters. Nothing
// throws, and a std::string an Engine method returns is always data (JSON, a report),
// never an error. The C API (csrc/c_api.cpp) hands the message to pyalloc_last_error and
// returns the code, so the codes are the C API's return values (csrc/pyalloc_c.h).
#pragma once

#include <string>
#include <utility>

namespace pyalloc {

class [[nodiscard]] Status {
 public:
  enum Code : int {
    kOk = 0,
    kInvalid = 1,       // a bad argument, pointer or state: nothing changed
    kOutOfMemory = 2,   // no memory could be found or reclaimed (the message is the report)
    kHostPoolFull = 3,  // a swap-out found no room in the host pool
    kCopyFailed = 4,    // the device refused to start a copy: nothing changed
  };

  Status() = default;  // ok
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status invalid(std::string message) { return Status(kInvalid, std::move(message)); }

  bool ok() const { return code_ == kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = kOk;
  std::string message_;
};

}  // namespace pyalloc
