"""Compiled stepping cost: ``jl.Stepper(compiled)`` stepped kernel by kernel to the end vs
one run of the compiled module, on the zoo's two-layer GPT (tiny_lm), one CPU thread.
The one-time Inductor compile is excluded; every figure is a ratio within one run.
Also: ``compiled.repro()`` after a compare on the 12-layer demo GPT (a wrong erf lowering)."""

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
    """The stepping rows, and (not with --quick: a 12-layer compile) the repro row."""
    return _step_rows(ctx) + ([] if ctx.quick else repro_rows(ctx))


def _step_rows(ctx):
    import jointlab as jl
    from tests.util import one_thread

    with one_thread():
        model, inputs, compiled, s, compile_s, create_s = _subjects()
        t = interleaved({"compiled": lambda: compiled.run(model, inputs),
                         "stepped": lambda: _step_to_end(s),
                         "created": lambda: jl.Stepper(compiled, model, inputs, seed=0).run()},
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
        row("tiny_lm 2L d32: jl.Stepper(compiled) creation + run to the end / one compiled run",
            t["created"] / t["compiled"], "x", "<= 2", t["created"] / t["compiled"] <= 2,
            detail="as the user pays it: the wrapper is cut into pieces once, at compile"),
        row("tiny_lm 2L d32: first jl.Stepper(compiled) creation", create_s * 1e3, "ms",
            detail="includes importing the stepper modules"),
        row("tiny_lm 2L d32: per-kernel stepping overhead",
            (t["stepped"] - t["compiled"]) / n * 1e6, "us"),
    ]


def repro_rows(ctx):
    """compiled.repro() after a compare on the 12-layer demo GPT with erf lowered x1.001."""
    import tempfile

    import jointlab as jl
    from jointlab import torch_compat
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    aten = torch.ops.aten
    model = make_gpt2(dropout=0.0)  # random ops cannot be cut into a region
    inputs = lm_inputs(2, 1024, 64)
    lowering = torch_compat.torch_module("torch._inductor.lowering", "inject a wrong lowering")
    erf, mul = lowering.lowerings[aten.erf.default], lowering.lowerings[aten.mul.Tensor]
    lowering.lowerings[aten.erf.default] = lambda x: mul(erf(x), 1.001)
    try:
        bad = jl.trace(model, lm_train_fn, inputs).compile("inductor")
        bad.run(model, inputs)
    finally:
        lowering.lowerings[aten.erf.default] = erf
    t0 = time.perf_counter()
    cmp = bad.compare(model, inputs)
    compare_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        r = bad.repro(f"{tmp}/repro.py", model, inputs, comparison=cmp)
        repro_s = time.perf_counter() - t0
    return [row("demo GPT 12L d256: compiled.repro() after a compare", repro_s, "s", "< 30",
                repro_s < 30, detail=f"{cmp.verdict}; region of {len(r.region)} nodes for "
                f"{r.kernel or 'a bisect region'}; the compare itself {compare_s:.0f} s")]
