// check.h — PYALLOC_ASSERT: internal consistency checks, compiled in by level.
//
// A failed assertion is a bug in pyalloc, never bad input: bad input gets an error
// message that names the problem and the fix (docs/design.md, "Errors"). So a failure
// prints where and what, and aborts: memory whose bookkeeping is wrong must not be
// handed out again.
//
// Levels (PYALLOC_ASSERT_LEVEL, a compile definition; CMake option PYALLOC_ASSERT_LEVEL):
//   0  none (the default Release build);
//   1  O(1) checks at state transitions: a block taken is free, a block released is
//      allocated or awaiting, a stat never goes below zero (the Debug build);
//   2  level 1, and the pool's full invariants after every engine operation, as option
//      check_invariants does (the sanitizer build, tools/sanitize.sh).
#pragma once

#include <cstdio>
#include <cstdlib>

#ifndef PYALLOC_ASSERT_LEVEL
#define PYALLOC_ASSERT_LEVEL 0
#endif

namespace pyalloc {

[[noreturn]] inline void assert_failed(const char* file, int line, const char* condition,
                                       const char* what) {
  std::fprintf(stderr, "pyalloc: internal check failed at %s:%d: %s (%s). This is a bug in "
               "pyalloc; please report it with this line.\n", file, line, what, condition);
  std::abort();
}

}  // namespace pyalloc

// PYALLOC_ASSERT(level, condition, what): checks `condition` in builds of at least
// `level`; `what` says, in words, what was expected. The condition is not evaluated in
// builds below `level`, so it may cost what its level allows.
#define PYALLOC_ASSERT(level, condition, what)                                       \
  do {                                                                               \
    if constexpr ((level) <= PYALLOC_ASSERT_LEVEL) {                                 \
      if (!(condition)) ::pyalloc::assert_failed(__FILE__, __LINE__, #condition, what); \
    }                                                                                \
  } while (0)
