// dispatch.h — turning the per-op path on: registering the fallback, and the thread-local key.
#pragma once

#include <string>

namespace pyalloc::registry {

// Registers the boxed fallback on the registry's dispatch key, once per process. "" or an
// error naming the library that holds the key already (See Note [The registry's dispatch
// key] in dispatch.cpp).
std::string register_fallback();

// Includes (or not) the registry's key in the calling thread's dispatch key set; returns
// whether it was included before.
bool set_thread_enabled(bool on);

}  // namespace pyalloc::registry
