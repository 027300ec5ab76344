"""jl.trace runs no full garbage collection; CPython's own rule resumes after it.

The reference is CPython's own collector, seen through ``gc.callbacks``: with
low thresholds the trace makes many young collections, enough for several full
ones; under jl.trace none is full, the thresholds are the user's again
afterwards (also when the trace fails), and the next objects the program keeps
bring the full collection that fell due, which frees the trace's cyclic garbage.
"""

from __future__ import annotations

import gc
import json
import pathlib
import subprocess
import sys
import weakref

import pytest
import torch

import jointlab as jl
from jointlab.errors import JointlabError
from tests.fixtures import zoo

LOW = (50, 2, 2)  # a full collection every 2 young ones: several per trace


@pytest.fixture()
def collections_seen():
    """Low thresholds; yields the list of (generation, phase) the collector reports."""
    seen: list[tuple[int, str]] = []

    def cb(phase, info):
        seen.append((info["generation"], phase))

    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.collect()
    gc.enable()
    gc.set_threshold(*LOW)
    gc.callbacks.append(cb)
    try:
        yield seen
    finally:
        gc.callbacks.remove(cb)
        gc.set_threshold(*before)
        if not enabled:
            gc.disable()


def _mlp():
    f = zoo.FIXTURES["mlp"]
    return f.make_model(), f.train_fn, f.make_inputs(4)


def _leaving_a_cycle(train_fn, garbage: list):
    """``train_fn`` that also leaves cyclic garbage behind, weakly referenced in ``garbage``."""
    def step(model, **kw):
        cycle = [torch.nn.Linear(1, 1)]
        cycle.append(cycle)  # cyclic garbage once train_fn returns
        garbage.append(weakref.ref(cycle[0]))
        return train_fn(model, **kw)
    return step


def test_no_full_collection_during_a_trace_then_cpython_resumes(collections_seen):
    model, train_fn, inputs = _mlp()
    garbage = []
    step = _leaving_a_cycle(train_fn, garbage)

    collections_seen.clear()
    jl.trace(model, step, inputs)
    starts = [g for g, phase in collections_seen if phase == "start"]
    assert starts.count(1) >= 3 * LOW[2], starts  # unpaused, several full ones were due
    assert 2 not in starts, starts
    assert gc.get_threshold() == LOW
    # CPython's rule takes over: by its own count a full collection is due, and it runs
    # at a young collection once the survivors grew by a quarter (a fresh process, below,
    # shows it; this test process's heap is as large as the suite made it)
    assert gc.get_count()[2] > LOW[2]
    assert garbage and garbage[0]() is not None  # the trace's cycle waits for that collection


RESUMES = """
import gc, json, weakref, torch, jointlab as jl
from tests.fixtures import zoo
f = zoo.FIXTURES["mlp"]
model, inputs = f.make_model(), f.make_inputs(4)
jl.trace(model, f.train_fn, inputs)  # warm
seen, garbage = [], []
def step(model, **kw):
    cycle = [torch.nn.Linear(1, 1)]
    cycle.append(cycle)
    garbage.append(weakref.ref(cycle[0]))
    return f.train_fn(model, **kw)
gc.collect()
gc.set_threshold(50, 2, 2)
gc.callbacks.append(lambda phase, info: seen.append((phase, info["generation"])))
jl.trace(model, step, inputs)
during = [g for p, g in seen if p == "start"]
kept = [[] for _ in range(len(gc.get_objects()))]  # the program keeps as many again
after = [g for p, g in seen if p == "start"][len(during):]
print(json.dumps({"during": during, "after": after, "freed": garbage[0]() is None}))
"""


def test_after_a_trace_cpython_runs_the_full_collection_and_frees_its_cycles():
    out = subprocess.run([sys.executable, "-c", RESUMES], capture_output=True, text=True,
                         check=True, cwd=pathlib.Path(__file__).parent.parent, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["during"].count(1) >= 3 and 2 not in got["during"], got
    assert 2 in got["after"] and got["freed"], got


def test_thresholds_come_back_when_the_trace_fails(collections_seen):
    model, _, inputs = _mlp()

    def broken(model, **kw):
        gc.set_threshold(1000, 100, 100)  # train_fn's own change is undone too
        raise RuntimeError("boom")

    with pytest.raises((JointlabError, RuntimeError)):
        jl.trace(model, broken, inputs)
    assert gc.get_threshold() == LOW


def test_a_disabled_collector_stays_off(collections_seen):
    model, train_fn, inputs = _mlp()
    gc.disable()
    collections_seen.clear()  # building the model collected (the collector was on)
    jl.trace(model, train_fn, inputs)
    assert not gc.isenabled()
    assert collections_seen == []
    assert gc.get_threshold() == LOW


def test_a_giant_trace_runs_the_held_back_collection_as_it_returns(collections_seen,
                                                                   monkeypatch):
    """At COLLECT_AT_NODES nodes (lowered here to the MLP's size) the trace pays its own walk."""
    from jointlab.runtime import gc_pause

    model, train_fn, inputs = _mlp()
    garbage = []
    step = _leaving_a_cycle(train_fn, garbage)
    monkeypatch.setattr(gc_pause, "COLLECT_AT_NODES", 10)
    collections_seen.clear()
    joint = jl.trace(model, step, inputs)
    starts = [g for g, phase in collections_seen if phase == "start"]
    assert len(joint.graph.nodes) >= 10 and starts.count(1) >= 3 * LOW[2], starts
    assert starts.count(2) == 1 and starts[-1] == 2, starts  # once, after the young ones
    assert garbage and garbage[0]() is None  # the trace's cycle is already freed
    assert gc.get_threshold() == LOW and gc.get_count()[2] == 0
