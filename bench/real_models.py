"""Evidence for the real-model matrix: family x mode x each check, as a markdown table.

Run from the repository root: ``python -m bench.real_models``. Each cell catches
its own exception and prints its class and first line, so one failing check
never hides the others.
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jointlab as jl  # noqa: E402
from tests.fixtures import real  # noqa: E402
from tests.util import eager_step  # noqa: E402

SEED = 1234
COLUMNS = ["trace ok", "run-vs-eager max diff", "compare clean", "stepper == run",
           "memory peak error %", "what_if ok", "save/load ok"]


def _max_diff(f: Any, model: Any, inputs: dict, joint: Any) -> str:
    gm, em, worst = copy.deepcopy(model), copy.deepcopy(model), 0.0
    for k in range(2):
        torch.manual_seed(SEED + k)
        gl, gg, _ = joint.run(gm, inputs)
        el, eg, _ = eager_step(em, f.train_fn, inputs, SEED + k)
        pairs = [(gl, el), *((gg[n], eg[n]) for n in eg),
                 *zip(dict(gm.named_buffers()).values(), dict(em.named_buffers()).values())]
        worst = max([worst, *((a.double() - b.double()).abs().max().item()
                             for a, b in pairs if a.numel())])
    return f"{worst:.3g}"


def _compare(f: Any, model: Any, inputs: dict, joint: Any) -> str:
    c = jl.compare(joint, model, inputs, seed=SEED)
    return "yes" if c.ok and c.first_divergence is None else f"no: {c.first_divergence}"


def _stepper(f: Any, model: Any, inputs: dict, joint: Any) -> str:
    sl, sg, _ = jl.Stepper(joint, model, inputs, seed=SEED, device="cpu").run()
    torch.manual_seed(SEED)
    loss, grads, _ = joint.run(copy.deepcopy(model), inputs)
    same = torch.equal(sl, loss) and all(torch.equal(sg[n], grads[n]) for n in grads)
    return "yes" if same else "no"


def _memory(f: Any, model: Any, inputs: dict, joint: Any) -> str:
    return f"{100 * joint.memory(copy.deepcopy(model), inputs).peak_error:+.2f}"


def _what_if(f: Any, model: Any, inputs: dict, joint: Any) -> str:
    df = joint.memory().what_if(budgets=(0.5,))
    errs = df["error"].dropna().tolist() if "error" in df else []
    return "yes" if not errs else f"no: {errs[0][:80]}"


def _save_load(f: Any, model: Any, inputs: dict, joint: Any) -> str:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "g.jlg")
        joint.save(path)
        loaded = jl.load(path)
    outs = []
    for j in (joint, loaded):
        torch.manual_seed(SEED)
        outs.append(j.run(copy.deepcopy(model), inputs))
    same_run = torch.equal(outs[0][0], outs[1][0]) and all(
        torch.equal(outs[0][1][n], outs[1][1][n]) for n in outs[0][1])
    c0 = jl.compare(joint, model, inputs, seed=SEED)
    c1 = jl.compare(loaded, model, inputs, seed=SEED, train_fn=f.train_fn)
    same_cmp = c0.ok == c1.ok and str(c0.first_divergence) == str(c1.first_divergence)
    return "yes" if same_run and same_cmp else f"no (run {same_run}, compare {same_cmp})"


CHECKS = [_max_diff, _compare, _stepper, _memory, _what_if, _save_load]


def _cell(fn: Any, *args: Any) -> str:
    try:
        return fn(*args)
    except Exception as e:  # report the cell, keep going
        first = (str(e).splitlines() or [""])[0][:100]
        return f"{type(e).__name__}: {first}".replace("|", "/")


def main() -> None:
    """Print the table."""
    print("| family | mode | " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * (len(COLUMNS) + 2))
    for name, f in real.REAL.items():
        for mode in ("make_fx", "aot"):
            model, inputs = f.make_model(), f.make_inputs()
            try:
                joint = jl.trace(model, f.train_fn, inputs, mode=mode)
                row = ["yes", *(_cell(c, f, model, inputs, joint) for c in CHECKS)]
            except Exception as e:
                first = (str(e).splitlines() or [""])[0][:100].replace("|", "/")
                row = [f"{type(e).__name__}: {first}", *["-"] * len(CHECKS)]
            print(f"| {name} | {mode} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
