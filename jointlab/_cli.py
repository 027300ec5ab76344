"""The ``jointlab`` command line: ``jointlab demo [--out PATH]``.

The demo traces the built-in GPT model, checks the joint graph against eager
autograd, writes the self-contained HTML report and prints a short summary.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence


def _check_against_eager(joint, model, inputs) -> float:
    """Max abs difference of loss and gradients between the graph and eager."""
    import copy

    import torch

    from .models import lm_train_fn

    ref = copy.deepcopy(model)
    torch.manual_seed(0)
    loss, grads, _ = joint.run(copy.deepcopy(model), inputs)
    torch.manual_seed(0)
    eloss = lm_train_fn(ref, **inputs)
    eloss.backward()
    worst = float((loss - eloss.detach()).abs())
    for name, p in ref.named_parameters():
        if name in grads:
            worst = max(worst, float((grads[name] - p.grad).abs().max()))
    return worst


def demo(out: str) -> int:
    """Trace the demo model, compare with eager, write the report.

    Args:
        out: Path of the HTML report.

    Returns:
        A process exit code.
    """
    import jointlab as jl

    from .models import lm_inputs, lm_train_fn, make_gpt2

    model = make_gpt2(n_layer=2, d=64, n_head=4, vocab=256, seq=32)
    inputs = lm_inputs(4, 256, 32)
    t0 = time.perf_counter()
    joint = jl.trace(model, lm_train_fn, inputs)
    dt = time.perf_counter() - t0
    print(f"traced demo GPT in {dt:.2f} s: {joint!r}")
    worst = _check_against_eager(joint, model, inputs)
    status = "matches" if worst < 1e-4 else "DIFFERS FROM"
    print(f"joint graph {status} eager autograd (max abs diff {worst:.2e})")
    try:
        from ._report import report
    except ImportError:
        report = None
    if report is not None:
        path = report(joint, out, model=model, inputs=inputs)
        print(f"report written to {path}")
    return 0 if worst < 1e-4 else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``jointlab`` console script.

    Args:
        argv: Arguments (default: ``sys.argv[1:]``).

    Returns:
        The process exit code.
    """
    parser = argparse.ArgumentParser(prog="jointlab", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_demo = sub.add_parser("demo", help="trace the built-in model and write the HTML report")
    p_demo.add_argument("--out", default="jointlab-demo.html", help="report path")
    args = parser.parse_args(argv)
    if args.cmd == "demo":
        return demo(args.out)
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
