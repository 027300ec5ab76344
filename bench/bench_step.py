"""Stepper cost: creating a Stepper and running it to the end vs joint.run, per-node
stepping vs fx.Interpreter, compare vs eager. Every figure is a ratio within one run."""

from __future__ import annotations

import copy
import time

import torch
import torch.fx as fx
from run import interleaved, row


def _per_node_interpreter(joint, flat) -> tuple[float, float]:
    """Seconds per node of fx.Interpreter.run beyond the GraphModule's own time."""
    gm = joint.graph_module
    n = len(joint.graph.nodes)
    with torch.no_grad():
        t = interleaved({"interp": lambda: fx.Interpreter(gm).run(*flat),
                              "gm": lambda: gm(*flat)}, repeat=20, stat=min)
    return (t["interp"] - t["gm"]) / n, t["gm"]


def _per_node_stepper(joint, model, inputs, gm_time: float) -> float:
    import jointlab as jl

    s = jl.Stepper(joint, model, inputs, device="cpu", seed=0)
    n = len(s.nodes)
    best = float("inf")
    for _ in range(20):
        s.reset()
        t0 = time.perf_counter()
        while not s.done:
            s.step()
        best = min(best, time.perf_counter() - t0)
    return (best - gm_time) / n


def _create_and_run_ratio(quick: bool) -> tuple[float, float, int]:
    """Best time of ``Stepper(...)`` + ``.run()`` over best ``joint.run``, 4-layer d=128 LM.

    Creation is included: a user pays for it on every new stepper.
    """
    import jointlab as jl
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    model, inputs = make_gpt2(n_layer=4, d=128), lm_inputs(8, 1024, 64)
    joint = jl.trace(model, lm_train_fn, inputs)
    t = interleaved({
        "joint": lambda: joint.run(model, inputs),
        "stepper": lambda: jl.Stepper(joint, model, inputs, device="cpu", seed=0).run(),
    }, repeat=7 if quick else 15, stat=min)
    return t["stepper"] / t["joint"], t["joint"], len(joint.graph.nodes)


def _widget_seconds(quick: bool) -> tuple[float, int]:
    """Best time of ``Stepper(...).widget()`` on notebook 03's model, imports warmed up.

    The first widget of a session pays for importing ipywidgets and anywidget;
    that one-off cost is left out, as the target says.
    """
    import torch.nn.functional as F

    import jointlab as jl
    from jointlab.models import lm_inputs, make_gpt2

    def train_fn(model, input_ids, labels):
        return F.cross_entropy(model(input_ids).flatten(0, 1), labels.flatten())

    model = make_gpt2(n_layer=2, d=32, n_head=4, vocab=128, seq=16)
    inputs = lm_inputs(2, vocab=128, seq=16)
    joint = jl.trace(model, train_fn, inputs)
    t = interleaved({"widget": lambda: jl.Stepper(joint, model, inputs, device="cpu",
                                                        seed=0).widget()},
                         repeat=3 if quick else 5, stat=min)
    return t["widget"], len(joint.graph.nodes)


def rows(ctx):
    import jointlab as jl
    from jointlab.models import lm_inputs, make_gpt2

    model, train_fn, inputs = ctx.gpt2
    joint = ctx.gpt2_joint
    ratio, joint_s, n_lm = _create_and_run_ratio(ctx.quick)

    # per-node overhead: a small model, so op time does not drown the overhead
    tiny_m = make_gpt2(n_layer=2, d=32, n_head=2, vocab=64, seq=8)
    tiny_in = lm_inputs(1, 64, 8)
    tiny = jl.trace(tiny_m, train_fn, tiny_in)
    interp, gm_time = _per_node_interpreter(tiny, tiny.flat_args(tiny_m, tiny_in))
    stepped = _per_node_stepper(tiny, tiny_m, tiny_in, gm_time)

    def eager_step():
        m = copy.deepcopy(model)
        loss = train_fn(m, **inputs)
        torch.autograd.grad(loss, [p for p in m.parameters() if p.requires_grad])

    widget_s, n_nb03 = _widget_seconds(ctx.quick)
    t2 = interleaved({"eager": eager_step,
                      "compare": lambda: jl.compare(joint, model, inputs, train_fn=train_fn)},
                     repeat=2 if ctx.quick else 3)
    return [
        row("lm-4L d128 b8 s64: Stepper(...).run() / joint.run", ratio, "x", "<= 1.10",
            ratio <= 1.10, detail=f"creation included; {n_lm} nodes, joint.run "
            f"{joint_s * 1e3:.0f} ms"),
        row("gpt2-2L d32: fx.Interpreter overhead per node", interp * 1e6, "us"),
        row("gpt2-2L d32: Stepper.step() overhead per node", stepped * 1e6, "us"),
        row("gpt2-2L d32: step() overhead / Interpreter overhead", stepped / interp, "x",
            "<= 2", stepped / interp <= 2),
        row("notebook 03 gpt2-2L d32: Stepper(...).widget()", widget_s, "s", "<= 3",
            widget_s <= 3, detail=f"{n_nb03} nodes, imports warmed up; in JupyterLab "
            "tests/test_browser.py prints cell run to DAG drawn"),
        row("gpt2-12L d256: compare / one eager step", t2["compare"] / t2["eager"], "x",
            detail=f"eager step {t2['eager'] * 1e3:.0f} ms"),
    ]
