"""Bad input to the C entry points and to the Python API has a defined outcome.

Every case here ends in an error whose message names the problem (or, for frees PyTorch
makes from destructors, a warning on stderr and a counter), never in a crash or silent
corruption, and the engine's invariants still hold afterwards (STYLE.md item 8).

The control API is called both through ``Engine`` and raw through ctypes. The pluggable
entry point ``pyalloc_free`` runs in a subprocess, because it needs ``pyalloc_install``,
which is one-way per process; ``pyalloc_malloc`` is only called on paths that succeed,
since it reports failure with a C++ exception that ctypes cannot catch.
"""
from __future__ import annotations

import ctypes
import json
import math

import pytest
import torch

from conftest import run_program
from memory_patterns import KiB, MiB, SIZE_MAX, block_at
from pyalloc import Engine, OutOfMemoryError, PyallocError, _lib
from pyalloc.options import build_options


def _invalid_free(engine, ptr, size, fragment):
    """Frees ptr expecting a refusal that mentions `fragment`; checks it changed nothing
    but the counter."""
    before = engine.stats()
    with pytest.raises(PyallocError, match=fragment):
        engine.free(ptr, size)
    after = engine.stats()
    assert after["num_invalid_frees"] == before["num_invalid_frees"] + 1
    for key in ("allocation.all.current", "allocated_bytes.all.current",
                "reserved_bytes.all.current", "active_bytes.all.current"):
        assert after[key] == before[key], key
    engine.check_invariants()


# --- frees -----------------------------------------------------------------------------

def test_free_of_an_unknown_pointer(make_engine):
    engine = make_engine()
    keep = engine.alloc(4 * KiB)
    _invalid_free(engine, 0x1000, None, "not allocated by pyalloc")
    # A pointer just past the engine's only segment is unknown too.
    _invalid_free(engine, keep + 2 * MiB, None, "not allocated by pyalloc")
    engine.free(keep)


def test_double_free(make_engine):
    engine = make_engine()
    p = engine.alloc(4 * KiB)
    keep = engine.alloc(4 * KiB)
    engine.free(p)
    _invalid_free(engine, p, None, "double free")
    _invalid_free(engine, p, 4 * KiB, "double free")
    engine.free(keep)


def test_double_free_after_the_segment_was_released(make_engine):
    engine = make_engine()
    p = engine.alloc(4 * KiB)
    engine.free(p)
    engine.empty_cache()
    _invalid_free(engine, p, None, "not allocated by pyalloc.*already freed")


def test_double_free_of_a_block_merged_with_its_neighbour(make_engine):
    engine = make_engine()
    a, b, keep = engine.alloc(4 * KiB), engine.alloc(4 * KiB), engine.alloc(4 * KiB)
    engine.free(a)
    engine.free(b)  # merges into a's free block
    try:
        _invalid_free(engine, b, None, "double free")
    finally:
        engine.free(keep)


def test_free_of_an_interior_pointer(make_engine):
    engine = make_engine()
    p = engine.alloc(4 * KiB)
    _invalid_free(engine, p + 512, None, "inside a block")
    _invalid_free(engine, p + 1, 4 * KiB, "inside a block")
    engine.free(p)


def test_free_with_the_wrong_size_leaves_the_block_allocated(make_engine):
    engine = make_engine()
    p = engine.alloc(1000)
    ctypes.memset(p, 0x5A, 1000)
    _invalid_free(engine, p, 1024, "allocated with 1000")  # the rounded size is wrong too
    _invalid_free(engine, p, 0, "allocated with 1000")
    assert block_at(engine, p)[1]["state"] == "active_allocated"
    assert ctypes.string_at(p, 1000) == b"\x5a" * 1000
    engine.free(p, 1000)
    assert engine.stats()["allocation.all.current"] == 0


def test_free_of_null(make_engine):
    engine = make_engine()
    with pytest.raises(PyallocError, match="NULL"):
        engine.free(None)
    with pytest.raises(PyallocError, match="NULL"):
        engine.free(0)
    engine.check_invariants()


@pytest.mark.parametrize("bad_size", [-1, 2**64])
def test_free_rejects_a_size_outside_size_t(make_engine, bad_size):
    engine = make_engine()
    p = engine.alloc(4 * KiB)
    try:
        with pytest.raises(ValueError, match="size"):
            engine.free(p, bad_size)
    finally:
        if engine.stats()["allocation.all.current"]:
            engine.free(p)


# --- sizes -----------------------------------------------------------------------------

def test_size_zero_is_a_valid_allocation(make_engine):
    engine = make_engine()
    p, q = engine.alloc(0), engine.alloc(0)
    assert p and q and p != q
    engine.free(p, 0)
    engine.free(q)
    engine.check_invariants()


@pytest.mark.parametrize("size", [64 * MiB + 1, 1 << 40, 1 << 62, (1 << 62) + 1, SIZE_MAX])
def test_size_beyond_the_budget_is_an_out_of_memory_error(make_engine, size):
    engine = make_engine(budget="64MiB")
    with pytest.raises(OutOfMemoryError, match="exceeds the budget") as info:
        engine.alloc(size)
    assert isinstance(info.value, torch.OutOfMemoryError)
    assert "out of memory" in str(info.value) and str(size) in str(info.value)
    stats = engine.stats()
    assert stats["num_ooms"] == 1 and stats["reserved_bytes.all.current"] == 0
    engine.check_invariants()
    engine.free(engine.alloc(1 * MiB))  # still serves requests


@pytest.mark.parametrize("size", [-1, -(1 << 70), 1 << 64, 1.5, 4096.0, "4096", None, True,
                                  b"\x10"])
def test_size_that_is_not_a_size_t_is_a_value_error(make_engine, size):
    engine = make_engine()
    with pytest.raises(ValueError, match="size must be an int"):
        engine.alloc(size)
    assert engine.stats()["allocation.all.allocated"] == 0
    engine.check_invariants()


def test_reserved_stream_handle_is_refused(make_engine):
    engine = make_engine()
    with pytest.raises(PyallocError, match="reserved"):
        engine.alloc(16, stream=SIZE_MAX)
    p = engine.alloc(16)
    with pytest.raises(PyallocError, match="reserved"):
        engine.record_stream(p, SIZE_MAX)
    engine.free(p)


def test_record_stream_of_an_unknown_or_freed_pointer(make_engine):
    engine = make_engine()
    s = engine.create_stream()
    with pytest.raises(PyallocError, match="not allocated by pyalloc"):
        engine.record_stream(0x1000, s)
    p = engine.alloc(4 * KiB)
    keep = engine.alloc(4 * KiB)
    engine.free(p)
    with pytest.raises(PyallocError, match="already freed"):
        engine.record_stream(p, s)
    engine.check_invariants()
    engine.free(keep)


def test_simulated_stream_calls_with_bad_arguments(make_engine):
    engine = make_engine()
    p = engine.alloc(4 * KiB)
    with pytest.raises(PyallocError, match="unknown simulated stream"):
        engine.fill_async(12345, p, 4 * KiB, 1)
    with pytest.raises(PyallocError, match="NULL"):
        engine.fill_async(engine.create_stream(), None, 16, 1)
    engine.free(p)


# --- budgets and options ---------------------------------------------------------------

@pytest.mark.parametrize("budget, expected", [
    ("8GiB", 8 << 30), ("0.5", 32 * MiB), ("50%", 32 * MiB), ("100%", 64 * MiB),
    ("1.0", 64 * MiB), ("48MiB", 48 * MiB), (" 48 MiB ", 48 * MiB), ("3.5 MiB", 7 * MiB // 2),
    (0.25, 16 * MiB), (48 * MiB, 48 * MiB),
])
def test_budget_strings_that_parse(budget, expected):
    with Engine("host", budget=budget, sim_capacity="64MiB") as engine:
        assert engine.stats()["budget_bytes"] == expected


@pytest.mark.parametrize("budget, message", [
    ("0", "invalid value '0' for pyalloc option 'budget'"),
    ("-1", "invalid value '-1' for pyalloc option 'budget'"),
    ("abc", "invalid value 'abc' for pyalloc option 'budget'"),
    ("150%", "invalid value '150%' for pyalloc option 'budget'"),
    ("0%", "invalid value '0%'"),
    ("nan", "invalid value 'nan'"),
    ("inf", "invalid value 'inf'"),
    ("8 parsecs", "invalid value '8 parsecs'"),
    ("99999999TiB", "invalid value '99999999TiB'"),
    ("budget8GiB", "invalid value 'budget8GiB'"),
    ("1", "invalid value '1'"),          # one byte: surely a fraction missing its ".0"
    ("1MiB", "invalid value '1MiB'"),    # less than one 2 MiB segment
    (0, "budget must be positive"),
    (-1, "budget must be positive"),
    (1.5, r"must be in \(0, 1\]"),
    (0.0, r"must be in \(0, 1\]"),
    ("8GiB,max_split_size:1", "',' and ':' are not allowed"),
])
def test_budget_values_that_do_not_parse(budget, message):
    with pytest.raises(ValueError, match=message) as info:
        Engine("host", budget=budget)
    if isinstance(budget, str) and "invalid value" in message:
        # The message says what would have been accepted.
        assert "a size of at least 2MiB such as 8GiB, or a fraction of device memory" in str(info.value)


def test_bool_budget_is_a_type_error():
    with pytest.raises(TypeError, match="not bool"):
        Engine("host", budget=True)


def test_unknown_option_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown pyalloc option 'max_split'") as info:
        Engine("host", max_split="1GiB")
    for name in ("budget", "sim_capacity", "max_split_size", "check_invariants"):
        assert name in str(info.value)


@pytest.mark.parametrize("option, value, accepted", [
    ("max_split_size", "-1", "a size such as"),
    ("max_split_size", "lots", "a size such as"),
    ("sim_capacity", "0", "a size such as"),
    ("check_invariants", "maybe", "true or false"),
])
def test_bad_option_value_names_the_option_and_the_accepted_form(option, value, accepted):
    with pytest.raises(ValueError, match=f"invalid value '{value}' for pyalloc option "
                                         f"'{option}': expected {accepted}"):
        Engine("host", **{option: value})


@pytest.mark.parametrize("text, message", [
    (b"foo:1", "unknown pyalloc option 'foo'; known options are: budget, sim_capacity"),
    (b"budget8GiB", "malformed pyalloc option 'budget8GiB': expected key:value pairs"),
    (b"budget:8GiB,oops", "malformed pyalloc option 'oops'"),
    (b"budget:abc", "invalid value 'abc' for pyalloc option 'budget'"),
    (b"sim_capacity:1", None),  # valid: rounds up to one 2 MiB chunk
])
def test_options_through_the_c_api(text, message):
    lib = _lib.lib()
    handle = lib.pyalloc_engine_create(b"host", 0, text)
    if message is None:
        assert handle, _lib.last_error()
        assert lib.pyalloc_engine_destroy(handle) == 0
        return
    assert not handle
    assert message in _lib.last_error()
    assert lib.pyalloc_options_normalize(text) is None
    assert message in _lib.last_error()


def test_malformed_pyalloc_conf_is_a_value_error():
    with pytest.raises(ValueError, match="malformed PYALLOC_CONF entry 'budget8GiB'"):
        build_options(environ={"PYALLOC_CONF": "budget8GiB"})


@pytest.mark.parametrize("backend, device, message", [
    (b"gpu", 0, "unknown backend 'gpu'"),
    (b"host", 1, "one device, 0; got device 1"),
    (b"host", -1, "device index -1 is negative"),
    (None, 0, "backend is NULL"),
])
def test_bad_backend_or_device(backend, device, message):
    lib = _lib.lib()
    assert not lib.pyalloc_engine_create(backend, device, b"")
    assert message in _lib.last_error()


def test_set_budget_and_memory_fraction_reject_bad_values(make_engine):
    engine = make_engine(sim_capacity="64MiB", budget="32MiB")
    with pytest.raises(ValueError, match=r"budget must be in \[1, 2\*\*64 - 1\), got 0"):
        engine.set_budget(0)
    for fraction in (0.0, -0.1, 1.5, math.nan, math.inf):
        with pytest.raises(PyallocError, match=r"memory fraction .* out of range: expected a "
                                               r"value in \(0, 1\]"):
            engine.set_memory_fraction(fraction)
    assert engine.stats()["budget_bytes"] == 32 * MiB  # unchanged by the refusals
    engine.check_invariants()


def test_set_budget_rejects_a_negative_value(make_engine):
    engine = make_engine(budget="32MiB")
    try:
        with pytest.raises((ValueError, PyallocError)):
            engine.set_budget(-1)
    finally:
        assert engine.stats()["budget_bytes"] == 32 * MiB


# --- engine handles --------------------------------------------------------------------

def test_null_engine_handle_through_the_c_api():
    lib = _lib.lib()
    out = ctypes.c_void_p()
    size_out = ctypes.c_size_t()
    calls = {
        "alloc": lambda: lib.pyalloc_engine_alloc(None, 16, 0, ctypes.byref(out)),
        "free": lambda: lib.pyalloc_engine_free(None, 0x1000, SIZE_MAX),
        "record_stream": lambda: lib.pyalloc_engine_record_stream(None, 0x1000, 0),
        "empty_cache": lambda: lib.pyalloc_engine_empty_cache(None),
        "set_budget": lambda: lib.pyalloc_engine_set_budget(None, 1 << 20),
        "set_memory_fraction": lambda: lib.pyalloc_engine_set_memory_fraction(None, 0.5),
        "check_invariants": lambda: lib.pyalloc_engine_check_invariants(None),
        "reset_peak_stats": lambda: lib.pyalloc_engine_reset_peak_stats(None),
        "reset_accumulated_stats": lambda: lib.pyalloc_engine_reset_accumulated_stats(None),
        "synchronize": lambda: lib.pyalloc_engine_synchronize(None),
        "stream_create": lambda: lib.pyalloc_engine_stream_create(None, ctypes.byref(size_out)),
        "stream_destroy": lambda: lib.pyalloc_engine_stream_destroy(None, 1),
        "destroy": lambda: lib.pyalloc_engine_destroy(None),
        "stress": lambda: lib.pyalloc_stress(None, 1, 10, 0, 4096, 0),
    }
    for name, call in calls.items():
        assert call() != 0, name
        assert "NULL" in _lib.last_error(), (name, _lib.last_error())
    assert out.value is None
    for name in ("pyalloc_engine_stats_json", "pyalloc_engine_snapshot_json"):
        assert getattr(lib, name)(None) is None
        assert "NULL" in _lib.last_error()
    for call in (lambda: lib.pyalloc_sim_fill_async(None, 0, 0x1000, 16, 0),
                 lambda: lib.pyalloc_sim_set_stream_delay(None, 0, 10)):
        assert call() != 0
        assert "simulated device" in _lib.last_error()


def test_null_out_pointers_through_the_c_api(make_engine):
    engine = make_engine()
    lib = _lib.lib()
    assert lib.pyalloc_engine_alloc(engine.handle, 16, 0, None) == 1
    assert "out is NULL" in _lib.last_error()
    assert lib.pyalloc_engine_stream_create(engine.handle, None) == 1
    assert "out is NULL" in _lib.last_error()
    assert lib.pyalloc_engine_free(engine.handle, None, SIZE_MAX) == 1
    assert "free of NULL" in _lib.last_error()
    assert engine.stats()["allocation.all.allocated"] == 0
    engine.check_invariants()


def test_destroying_an_engine_with_live_blocks_fails_and_keeps_it(make_engine):
    engine = make_engine()
    p = engine.alloc(4 * KiB)
    ctypes.memset(p, 0x42, 4 * KiB)
    with pytest.raises(PyallocError, match="1 live blocks; free them first"):
        engine.close()
    # The engine is intact: the block is readable and can be freed, then close works.
    engine.check_invariants()
    assert ctypes.string_at(p, 4 * KiB) == b"\x42" * (4 * KiB)
    engine.free(p)
    engine.close()
    with pytest.raises(PyallocError, match="closed"):
        engine.alloc(16)
    engine.close()  # closing twice is harmless


def test_close_after_freeing_everything_with_a_pending_record_stream(make_engine):
    engine = make_engine()
    s = engine.create_stream()
    p = engine.alloc(4 * KiB)
    engine.record_stream(p, s)
    engine.fill_async(s, p, 4 * KiB, 0)
    engine.free(p)
    engine.synchronize()
    engine.close()


def test_stress_with_bad_arguments(make_engine):
    engine = make_engine()
    for args, message in [((0, 10, 0, 4096, 0), r"threads must be in \[1, 1024\]"),
                          ((1025, 10, 0, 4096, 0), r"threads must be in \[1, 1024\]"),
                          ((1, 10, 0, 0, 0), "max_size must be at least 1")]:
        with pytest.raises(PyallocError, match=message):
            engine.stress(*args)
    engine.check_invariants()


# --- the pluggable entry points --------------------------------------------------------

def test_pluggable_free_survives_bad_pointers_and_counts_them(tmp_path):
    err_file = tmp_path / "stderr.txt"
    out = run_program("pluggable_free_bad_pointers", "--stderr", err_file)

    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"invalid": 4, "allocated_then": 2, "q_intact": True,
                      "allocated_after": 0, "invalid_after": 4}
    warnings = [line for line in err_file.read_text().splitlines()
                if line.startswith("pyalloc: warning:")]
    assert len(warnings) == 6, warnings
    text = "\n".join(warnings)
    for fragment in ("0x1000 was not allocated by pyalloc", "double free",
                     "allocated with 1000", "inside a block",
                     "device 7, where pyalloc has no engine",
                     "device -1, where pyalloc has no engine"):
        assert fragment in text, fragment


def test_pluggable_free_stops_repeating_its_warning(tmp_path):
    err_file = tmp_path / "stderr.txt"
    run_program("pluggable_free_warning_limit", "--stderr", err_file)

    lines = err_file.read_text().splitlines()
    assert len([l for l in lines if "was not allocated by pyalloc" in l]) == 10
    assert any("further invalid frees are not shown" in l for l in lines)
