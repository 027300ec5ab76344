"""The ``jointlab`` command line: ``jointlab demo [--out PATH]``.

The demo traces the built-in GPT model, checks the joint graph against eager
autograd, writes the self-contained HTML report and prints a short summary.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence


def demo(out: str) -> int:
    """Trace the demo model, compare with eager, write the report.

    Args:
        out: Path of the HTML report.

    Returns:
        A process exit code.
    """
    print("importing torch and jointlab...", flush=True)
    import jointlab as jl
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    model = make_gpt2(n_layer=2, d=64, n_head=4, vocab=256, seq=32)
    inputs = lm_inputs(4, 256, 32)
    print("tracing the demo GPT (2 layers, 64-dim, batch 4 x 32 tokens)...", flush=True)
    t0 = time.perf_counter()
    joint = jl.trace(model, lm_train_fn, inputs)
    dt = time.perf_counter() - t0
    print(f"traced demo GPT in {dt:.2f} s: {joint!r}")
    print("running the graph and eager autograd from the same state...", flush=True)
    comparison = jl.compare(joint, model, inputs)
    worst = max(float(comparison.loss["max_abs_err"].max()),
                float(comparison.grads["max_abs_err"].max()))
    status = "matches" if comparison.ok else "DIFFERS FROM"
    print(f"joint graph {status} eager autograd (max abs diff {worst:.2e})")
    print("writing the report (memory measured by running the graph)...", flush=True)
    path = jl.report(joint, out, model=model, inputs=inputs, comparison=comparison)
    print(f"report written to {path}")
    return 0 if comparison.ok else 1


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
