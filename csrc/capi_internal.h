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
}  // namespace pyalloc::capi
