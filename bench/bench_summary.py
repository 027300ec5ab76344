"""Module summary: ``joint.summary(by="module", model=...)`` after tracing vs torchinfo's summary.

Same model (the 12-layer GPT-2-shaped LM), same process, timed alternately; the
jointlab figure is the *first* call on a freshly traced graph (its caches
cleared each time: what a user waits for), torchinfo's is ``torchinfo.summary``
with the same inputs (it runs one forward pass with hooks). Target: <= 1x.
torchinfo is a dev dependency; without it the row says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from run import ROOT


def rows(ctx):
    from run import interleaved, row

    try:
        import torchinfo
    except ImportError:
        return [row("gpt2-12L: module summary / torchinfo.summary", float("nan"), "x",
                    "<= 1", None, detail="torchinfo is not installed (pip install -e .[dev])")]
    model, _, inputs = ctx.gpt2
    joint = ctx.gpt2_joint
    ids = inputs["input_ids"]

    def ours():
        joint._cache.clear()  # the first call after tracing: nothing cached yet
        joint.summary(by="module", model=model)

    t = interleaved({"ours": ours, "torchinfo": lambda: torchinfo.summary(
        model, input_data=[ids], verbose=0, depth=99)}, repeat=3 if ctx.quick else 7, stat=min,
        clock=time.process_time)
    ratio = t["ours"] / t["torchinfo"]
    fresh = {k: min(_fresh(k) for _ in range(1 if ctx.quick else 3)) for k in ("ours", "torchinfo")}
    fratio = fresh["ours"] / fresh["torchinfo"]
    return [row("gpt2-12L: module summary (first call) / torchinfo.summary", ratio, "x", "<= 1",
                ratio <= 1, detail=f"ours {t['ours']:.3f} s, torchinfo {t['torchinfo']:.3f} s "
                f"CPU, {len(joint.graph.nodes)} nodes"),
            row("gpt2-12L: fresh kernel, module summary / torchinfo (imports included)", fratio,
                "x", "<= 1", fratio <= 1, detail=f"ours {fresh['ours']:.3f} s (pandas import "
                f"included), torchinfo {fresh['torchinfo']:.3f} s, CPU, after the trace")]


def _fresh(which: str) -> float:
    """CPU seconds of the first summary in a fresh Python, its imports included."""
    out = subprocess.run([sys.executable, __file__, which], cwd=ROOT.parent, check=True,
                         capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS":
                                                              "ignore"}).stdout
    return json.loads(out.strip().splitlines()[-1])["cpu_s"]


def _fresh_main(which: str) -> None:
    sys.path.insert(0, str(ROOT.parent))
    import jointlab as jl
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    model, inputs = make_gpt2(n_layer=12, d=256), lm_inputs(2, 1024, 64)
    joint = jl.trace(model, lm_train_fn, inputs) if which == "ours" else None
    t0 = time.process_time()
    if which == "ours":
        joint.summary(by="module", model=model)
    else:
        import torchinfo

        torchinfo.summary(model, input_data=[inputs["input_ids"]], verbose=0, depth=99)
    print(json.dumps({"cpu_s": time.process_time() - t0}))


if __name__ == "__main__":
    _fresh_main(sys.argv[1])
