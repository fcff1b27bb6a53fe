// capi_internal.h — what the C API's translation units share, and nothing else.
#pragma once

#include <string>

#include "engine.h"

// The opaque handle of pyalloc_c.h is the Engine itself.
struct pyalloc_engine : pyalloc::Engine {
  using Engine::Engine;
};

namespace pyalloc::capi {
// Sets the calling thread's pyalloc_last_error() and returns 1 (the failure status).
int fail(std::string message);
// 0 for an ok status; otherwise sets pyalloc_last_error() to its message and returns its
// code, which is the C API's return value for it (status.h).
int fail(const Status& status);
}  // namespace pyalloc::capi
