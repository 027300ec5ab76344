"""jointlab benchmarks: every figure is a ratio measured within one run.

Each ``bench/bench_*.py`` module exposes ``rows(ctx) -> list[dict]``; a row
has ``name``, ``value``, ``unit``, ``target`` (text) and ``ok`` (bool or
None). The shared :class:`Context` builds the 12-layer GPT-2-shaped model
once and times ``jl.trace`` on it, so other rows can be stated as a share of
trace time. Usage: ``python bench/run.py [--only NAME] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))


def timeit(fn: Callable[[], Any], repeat: int = 3, warmup: int = 1) -> float:
    """Median wall time of ``fn`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved(fns: dict[str, Callable[[], Any]], repeat: int = 5,
                stat: Callable[[list[float]], Any] = statistics.median,
                clock: Callable[[], float] = time.perf_counter,
                warmup: bool = True) -> dict[str, Any]:
    """Times of several functions, run alternately so noise hits all alike.

    ``stat`` reduces each function's samples: the median by default, ``min``
    for the least load-disturbed sample (``list`` keeps them all). ``clock`` is
    wall time by default; ``time.process_time`` (this process's CPU time) suits
    one-thread work on a shared machine, where other processes' load would
    otherwise count. ``warmup=False`` skips the untimed first call of each, for
    subjects of minutes that earlier rows have warmed.
    """
    for fn in fns.values() if warmup else ():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            gc.collect()
            t0 = clock()
            fn()
            times[k].append(clock() - t0)
    return {k: stat(v) for k, v in times.items()}


class Context:
    """Shared, lazily built benchmark subjects."""

    def __init__(self, quick: bool = False) -> None:
        self.quick = quick

    @functools.cached_property
    def gpt2(self):
        """(model, train_fn, inputs) of the 12-layer, d=256 GPT-2-shaped model."""
        from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

        return make_gpt2(n_layer=12, d=256), lm_train_fn, lm_inputs(2, 1024, 64)

    @functools.cached_property
    def gpt2_joint(self):
        """A make_fx JointGraph of :attr:`gpt2`."""
        import jointlab as jl

        m, fn, inp = self.gpt2
        return jl.trace(m, fn, inp)

    @functools.cached_property
    def gpt2_trace_s(self) -> float:
        """Median ``jl.trace`` time of :attr:`gpt2`, in seconds."""
        import jointlab as jl

        m, fn, inp = self.gpt2
        return timeit(lambda: jl.trace(m, fn, inp), repeat=1 if self.quick else 3)


def narrow_lm(n_layer: int) -> tuple[Any, Callable[..., Any], dict[str, Any]]:
    """(model, train_fn, inputs) of a narrow GPT-2-shaped LM: d=16, seq=8, ~130 nodes a layer.

    The subject of the benchmarks that need many nodes traced quickly (load, tables).
    """
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    model = make_gpt2(n_layer=n_layer, d=16, n_head=2, vocab=32, seq=8)
    return model, lm_train_fn, lm_inputs(1, 32, 8)


def row(name: str, value: float, unit: str, target: str = "", ok: bool | None = None,
        **extra: Any) -> dict[str, Any]:
    """Build one result row."""
    return {"name": name, "value": value, "unit": unit, "target": target, "ok": ok, **extra}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", action="append", help="run only bench_<NAME>.py")
    ap.add_argument("--json", default=str(ROOT / "results.json"))
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    args = ap.parse_args()
    ctx = Context(quick=args.quick)
    rows: list[dict[str, Any]] = []
    for path in sorted(ROOT.glob("bench_*.py")):
        key = path.stem.removeprefix("bench_")
        if args.only and key not in args.only:
            continue
        mod = importlib.import_module(path.stem)
        for r in mod.rows(ctx):
            r.setdefault("group", key)
            rows.append(r)
            mark = {True: "ok", False: "MISS", None: ""}[r["ok"]]
            print(f"{r['group']:<10} {r['name']:<52} {r['value']:>12.4g} {r['unit']:<8} "
                  f"{r['target']:<14} {mark}", flush=True)
    pathlib.Path(args.json).write_text(json.dumps(rows, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
