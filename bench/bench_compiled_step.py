"""Compiled stepping cost: ``jl.Stepper(compiled)`` stepped kernel by kernel to the end vs
one run of the compiled module, on the zoo's two-layer GPT (tiny_lm), one CPU thread.
The one-time Inductor compile is excluded; every figure is a ratio within one run."""

from __future__ import annotations

import time

import torch
from run import interleaved, row


def _subjects():
    import jointlab as jl
    from tests.fixtures import zoo

    f = zoo.FIXTURES["tiny_lm"]
    model, inputs = f.make_model(), f.make_inputs(2)
    compiled = jl.trace(model, f.train_fn, inputs).compile("inductor")
    t0 = time.perf_counter()
    compiled.run(model, inputs)  # compiles
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    stepper = jl.Stepper(compiled, model, inputs, seed=0)
    create_s = time.perf_counter() - t0
    return model, inputs, compiled, stepper, compile_s, create_s


def _step_to_end(stepper) -> None:
    stepper.reset()
    while not stepper.done:
        stepper.step()


def rows(ctx):
    from tests.util import one_thread

    with one_thread():
        model, inputs, compiled, s, compile_s, create_s = _subjects()
        t = interleaved({"compiled": lambda: compiled.run(model, inputs),
                         "stepped": lambda: _step_to_end(s)},
                        repeat=20 if ctx.quick else 50, stat=min)
        torch.manual_seed(0)
        want = compiled.run(model, inputs)
        _step_to_end(s)
        exact = all(torch.equal(s.outputs.grads[k], g) for k, g in want.grads.items())
    ratio = t["stepped"] / t["compiled"]
    n = len(s.kernels)
    return [
        row("tiny_lm 2L d32: step compiled to the end / one compiled run", ratio, "x",
            "<= 2", ratio <= 2, detail=f"{n} kernel calls stepped one by one (reset "
            f"included), compiled run {t['compiled'] * 1e3:.2f} ms, compile "
            f"{compile_s:.0f} s excluded; grads bitwise equal: {exact}"),
        row("tiny_lm 2L d32: jl.Stepper(compiled) creation", create_s * 1e3, "ms",
            detail="parses the generated wrapper into one piece per kernel call"),
        row("tiny_lm 2L d32: per-kernel stepping overhead",
            (t["stepped"] - t["compiled"]) / n * 1e6, "us"),
    ]
