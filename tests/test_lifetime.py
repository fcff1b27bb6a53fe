"""Lifetime classes (Note [Lifetime classes] in allocator/src/pool.h; pyalloc/lifetime.py).

* A small request made in a long-lived phase goes only into a segment a long-lived request
  filled from empty, or into an empty one (which it marks); short-lived requests use the
  holes of any segment. A segment changes class only when it is empty.
* Classes place blocks and never refuse memory: with the budget spent, a long-lived
  request takes a hole of a short-lived segment rather than fail.
* The phase is traced, so a replay places blocks as the live run did.
* install() marks the model's construction, every optimizer step and ``pyalloc.long_lived()``
  blocks long-lived, and nothing else; training is bit-identical with the option off.
"""
from __future__ import annotations

import pytest

from conftest import run_program, train
from memory_patterns import KiB, MiB, segment_of
from pyalloc import files
from pyalloc.replay import replay
from pyalloc.trace import record_trace


def short_segment_with_a_hole(engine):
    """A small segment of short-lived blocks: 1 MiB and 512 KiB taken, 512 KiB free."""
    engine.set_long_lived(False)
    return engine.alloc(1 * MiB), engine.alloc(512 * KiB)


@pytest.mark.parametrize("classes", [True, False])
def test_long_lived_blocks_keep_out_of_short_lived_segments(make_engine, classes):
    engine = make_engine(lifetime_classes=classes)
    a, b = short_segment_with_a_hole(engine)
    engine.set_long_lived(True)
    state = engine.alloc(256 * KiB)
    more_state = engine.alloc(256 * KiB)
    short = segment_of(engine, a)
    if classes:
        # Not into the 512 KiB hole beside a and b: a segment of its own, which the next
        # long-lived block shares.
        assert segment_of(engine, state)["address"] != short["address"]
        assert segment_of(engine, more_state)["address"] == segment_of(engine, state)["address"]
        assert segment_of(engine, state)["long_lived"] and not short["long_lived"]
    else:
        # Best fit alone: the hole of the short-lived segment.
        assert segment_of(engine, state)["address"] == short["address"]
        assert segment_of(engine, more_state)["address"] == short["address"]
    for p in (a, b, state, more_state):
        engine.free(p)


def test_short_lived_blocks_use_the_holes_of_long_lived_segments(make_engine):
    engine = make_engine()
    full = [engine.alloc(1 * MiB), engine.alloc(1 * MiB)]   # one short-lived segment, full
    engine.set_long_lived(True)
    state = engine.alloc(256 * KiB)
    engine.set_long_lived(False)
    mapped = engine.stats()["num_device_alloc"]
    activation = engine.alloc(512 * KiB)
    assert engine.stats()["num_device_alloc"] == mapped, "a new segment instead of the hole"
    long_segment = segment_of(engine, state)
    assert segment_of(engine, activation)["address"] == long_segment["address"]

    # The segment keeps its class while anything lives in it, whatever freed what...
    engine.free(state)
    assert segment_of(engine, activation)["long_lived"]
    # ... and changes it only when a request takes it whole, empty.
    engine.free(activation)
    whole = engine.alloc(1 * MiB)
    assert segment_of(engine, whole)["address"] == long_segment["address"]
    assert not segment_of(engine, whole)["long_lived"]
    for p in full + [whole]:
        engine.free(p)


def test_a_long_lived_request_takes_a_short_lived_hole_rather_than_fail(make_engine):
    # The budget holds two small segments, both short-lived and busy; the only room left
    # is the 512 KiB hole of the first.
    engine = make_engine(budget="4MiB")
    a, b = short_segment_with_a_hole(engine)
    c, d = engine.alloc(1 * MiB), engine.alloc(1 * MiB)
    engine.set_long_lived(True)
    state = engine.alloc(512 * KiB)
    assert segment_of(engine, state)["address"] == segment_of(engine, a)["address"]
    assert engine.stats()["num_ooms"] == 0
    for p in (a, b, c, d, state):
        engine.free(p)


def test_a_long_lived_request_gets_a_segment_of_its_own_rather_than_borrow(make_engine):
    # Note [Long-lived requests do not borrow] in allocator/src/reclaim.cpp. Under a
    # registry's window strategy (an evict callback: the in-place ladder, where borrow comes
    # before release) with the budget spent: the long-lived small segment is full, a large
    # segment holds an activation and a 2.5 MiB hole, another is wholly free. A momentum
    # buffer borrowed into the hole (best fit) would keep that segment from ever emptying;
    # it gets a small segment of its own where the free one was.
    engine = make_engine(budget="10MiB")
    engine.set_evict_callback(lambda handles: 0)
    engine.set_long_lived(True)
    model = [engine.alloc(1 * MiB), engine.alloc(1 * MiB)]
    engine.set_long_lived(False)
    engine.free(engine.alloc(4 * MiB))
    activation = engine.alloc(1536 * KiB)       # 1.5 MiB of the 4 MiB segment
    engine.free(engine.alloc(4 * MiB))          # a second 4 MiB segment, wholly free
    assert engine.stats()["reserved_bytes.all.current"] == 10 * MiB
    engine.set_long_lived(True)
    state = engine.alloc(256 * KiB)
    engine.set_long_lived(False)
    own = segment_of(engine, state)
    assert own["segment_type"] == "small" and own["long_lived"], own
    assert engine.stats()["num_small_borrows"] == 0
    # The activation's segment empties when it goes, whole for a large request.
    large = segment_of(engine, activation)
    engine.free(activation)
    after = next(s for s in engine.snapshot()["segments"] if s["address"] == large["address"])
    assert after["allocated_size"] == 0, after
    whole = engine.alloc(4 * MiB)
    assert segment_of(engine, whole)["address"] == large["address"]
    for p in model + [state, whole]:
        engine.free(p)
    engine.set_evict_callback(None)


def test_the_phase_is_traced_and_the_replay_places_blocks_as_the_live_run_did(make_engine,
                                                                               tmp_path):
    engine = make_engine()
    path = tmp_path / "lifetime.json.gz"
    with record_trace(path, engine=engine):
        a, b = short_segment_with_a_hole(engine)
        engine.set_long_lived(True)
        state = engine.alloc(256 * KiB)
        engine.set_long_lived(True)   # no change: not traced again
        engine.set_long_lived(False)
        engine.free(a)
        engine.free(b)
    engine.free(state)
    trace = files.load(path)
    action, size = trace["columns"].index("action"), trace["columns"].index("size")
    # The phase when recording began, then each change.
    assert [e[size] for e in trace["events"] if e[action] == "lifetime"] == [0, 1, 0]
    live = trace["final"]["stats"]["num_device_alloc"] - trace["initial"]["stats"]["num_device_alloc"]
    assert live == 2
    assert replay(trace).num_device_alloc == 2
    # Without the classes, the state would have gone into the hole.
    assert replay(trace, {"lifetime_classes": "false"}).num_device_alloc == 1


@pytest.mark.slow
def test_install_marks_model_construction_and_optimizer_steps_long_lived(tmp_path):
    out = run_program("lifetime_phases", "--trace", tmp_path / "step.json.gz")
    assert out.strip().endswith("ok")


@pytest.mark.slow
def test_training_is_bit_identical_with_lifetime_classes_on_and_off():
    on = train("cnn", "2GiB", steps=4)   # the default; shared with test_remat and test_swap
    off = train("cnn", "2GiB", steps=4, lifetime_classes="false")
    assert on["record"] == off["record"] and len(on["record"]) == 5


@pytest.mark.slow
def test_adam_foreach_trains_identically_with_lifetime_classes_on_and_off():
    # foreach: its temporaries are made inside step(), so they are long-lived requests.
    on = train("transformer", "2GiB", steps=3, batch=8, optimizer="adam-foreach")
    off = train("transformer", "2GiB", steps=3, batch=8, optimizer="adam-foreach",
                lifetime_classes="false")
    assert on["record"] == off["record"] and len(on["record"]) == 4
