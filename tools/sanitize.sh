#!/usr/bin/env bash
# Builds the engine with AddressSanitizer and UndefinedBehaviorSanitizer at internal check
# level 2 (allocator/src/check.h: the pool's invariants after every operation), and runs
# the stress and state-machine tests against it. Any sanitizer report or failed check
# aborts the test process, so the run fails.
#
#   tools/sanitize.sh [BUILD_DIR] [-- PYTEST_ARGS...]
#
# BUILD_DIR defaults to build/sanitize. Needs cmake and a C++ compiler with the sanitizer
# runtimes (gcc's libasan and libubsan); torch is not needed to build. CI runs it through
# tests/test_sanitize.py.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/sanitize}
[[ $# -gt 0 ]] && shift
[[ ${1:-} == "--" ]] && shift
tests=("$@")
[[ ${#tests[@]} -eq 0 ]] && tests=(tests/test_stress.py tests/test_state_machine.py)

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPYALLOC_SANITIZE=ON -DPYALLOC_CUDA=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
lib="$build/libpyalloc.so"
# grep reads all of nm's output (not -q): under pipefail an early exit would fail nm with
# SIGPIPE, and the check with it.
if ! nm -D "$lib" | grep __asan_init >/dev/null; then
  echo "sanitize.sh: $lib is not instrumented (no __asan_init)" >&2
  exit 1
fi

# The sanitizer runtimes must come first in a Python process that loads the library
# late. Leak checking is off: CPython itself keeps memory until exit.
compiler=${CXX:-c++}
export LD_PRELOAD="$("$compiler" -print-file-name=libasan.so) $("$compiler" -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYALLOC_LIBRARY="$lib"
# Several times slower under the sanitizers: a quarter of the state machines' examples.
export PYALLOC_TEST_EXAMPLES_SCALE=${PYALLOC_TEST_EXAMPLES_SCALE:-0.25}
exec python -m pytest -q -p no:cacheprovider "${tests[@]}"
