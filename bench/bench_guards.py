"""Cost of the guards: checking them on every run, and recording what the trace read.

``joint.run`` checks every module's ``training`` flag and class, every
parameter's ``requires_grad``, the hooks, every attribute and variable the
trace read and torch's settings before it runs. Target: the check costs at
most 2% of one ``joint.run`` of the 12-layer demo GPT (d=256), measured in the
same run. Recording the reads (jointlab.trace.read_guards: the read recorder
and the code scan) adds at most 10% to ``jl.trace`` of the same model, timed
against a trace with the recorder swapped for a no-op, interleaved. The other
way issue 40 asked to measure, harvesting Dynamo's guards for ``train_fn``
(forward and loss only, eager backend, ``guard_export_fn``), is timed beside
it as a share of the same trace: the reason jointlab records reads itself.
"""

from __future__ import annotations

import contextlib
import time
import warnings

from run import interleaved


def rows(ctx):
    model, _fn, inputs = ctx.gpt2
    joint = ctx.gpt2_joint
    facts = len(joint.assumptions.facts)
    t = interleaved({
        "run": lambda: joint.run(model, inputs),
        "check": lambda: [joint.assumptions.check(model) for _ in range(20)],
    }, repeat=3 if ctx.quick else 7, stat=min)
    check = t["check"] / 20
    ratio = check / t["run"]
    return [
        {"name": f"gpt2-12L d256: guard check ({facts} facts)", "value": check * 1e3,
         "unit": "ms", "target": "", "ok": None},
        {"name": "gpt2-12L d256: guard check / joint.run", "value": ratio * 100, "unit": "%",
         "target": "<= 2", "ok": ratio <= 0.02},
        *trace_rows(ctx),
    ]


def _trace_with_and_without_reads(model, fn, inputs, repeat: int) -> dict:
    import dataclasses

    import jointlab as jl
    from jointlab.trace import read_guards, watch_table

    real = watch_table.WATCHES

    @contextlib.contextmanager
    def nothing(call):
        yield read_guards.Watched(read_guards.ReadRecorder(), {}, call.train_fn)

    without = tuple(dataclasses.replace(w, enter=nothing) if w.name == "python state" else w
                    for w in real)

    def traced(rows):
        def run():
            watch_table.WATCHES = rows
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    jl.trace(model, fn, inputs)
            finally:
                watch_table.WATCHES = real
        return run

    return interleaved({"reads": traced(real), "none": traced(without)}, repeat=repeat,
                       stat=min, clock=time.process_time)


def _dynamo_harvest(model, fn, inputs) -> tuple[float, int]:
    """CPU seconds of one Dynamo guard harvest of ``fn`` (its first call), and the guards."""
    import torch._dynamo as dynamo  # the alternative measured, not used by jointlab

    guards: list = []
    dynamo.reset()
    opt = dynamo.optimize(lambda gm, ex: gm.forward, guard_export_fn=guards.extend)(
        lambda model, **kw: fn(model, **kw))
    t0 = time.process_time()
    opt(model, **inputs)
    took = time.process_time() - t0
    dynamo.reset()
    return took, len(guards)


def trace_rows(ctx):
    """The read recorder's share of ``jl.trace`` on the demo GPT, and Dynamo's harvest's."""
    model, fn, inputs = ctx.gpt2
    t = _trace_with_and_without_reads(model, fn, inputs, 3 if ctx.quick else 5)
    ratio = t["reads"] / t["none"]
    dyn, n = _dynamo_harvest(model, fn, inputs)
    return [{"name": "gpt2-12L d256: jl.trace with read guards / without", "value": ratio,
             "unit": "x", "target": "<= 1.10", "ok": ratio <= 1.10},
            {"name": f"gpt2-12L d256: Dynamo guard harvest ({n} guards) / jl.trace",
             "value": dyn / t["reads"], "unit": "x", "target": "", "ok": None}]
