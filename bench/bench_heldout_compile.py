"""Held-out check of compiled ``compare`` (issue 41): clean compiles and injected Inductor bugs.

For each architecture of ``heldout_models`` (none used in tests/): one clean
``joint.compile().compare(model, inputs)`` (anything but MISMATCH there is
right; MISMATCH is a false alarm) and three injected bugs from ``inject``: a
wrong forward lowering, a wrong backward-only lowering and a wrong
decomposition (each x1.001). Per bug: the verdict (not MISMATCH is a missed
bug), ``first_divergence``, the kernel it names, and whether that kernel holds
the patched op, checked independently of jointlab's naming: for a lowering,
Inductor's provenance (``cppCodeToPost``) of the named kernel must hold the
post-grad node the wrapper scaled; for a decomposition, the named traced node
(or one of the named kernel's traced nodes) must call the patched op.

``python bench/bench_heldout_compile.py [--only NAME]`` prints a markdown
table and writes it to out/bench_heldout.md; ``bench/run.py`` gets the totals
as rows. About 5 minutes on an otherwise idle 2-core machine (32 Inductor compiles,
297 s measured); several times that when other work shares the cores.
"""

from __future__ import annotations

import pathlib
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import heldout_models  # noqa: E402
import inject  # noqa: E402

OUT = ROOT.parent / "out" / "bench_heldout.md"
KINDS = ("clean", "forward lowering", "backward lowering", "decomposition")


@dataclass
class Result:
    """One (architecture, bug kind) cell of the table."""

    arch: str
    kind: str
    op: str = "-"
    verdict: str = "-"
    divergence: str = "-"
    kernel: str = "-"
    right: bool | None = None  # named kernel/op holds the patched op (None: not applicable)
    seconds: float = 0.0
    error: str = ""

    @property
    def outcome(self) -> str:
        """``ok``, ``FALSE ALARM``, ``MISSED``, ``ERROR`` or ``not injected``."""
        if self.error:
            return "ERROR"
        if self.kind == "clean":
            return "FALSE ALARM" if self.verdict == "MISMATCH" else "ok"
        if self.op == "-":
            return "not injected"
        return "ok" if self.verdict == "MISMATCH" else "MISSED"


def _bug(kind: str, targets: set[Any]) -> tuple[Any, Any]:
    """(context manager factory, op) for one bug kind on a graph calling ``targets``."""
    if kind == "forward lowering":
        op = inject.pick(targets, inject.FORWARD_OPS)
        return (lambda: inject.wrong_lowering(op, backward=False)), op
    if kind == "backward lowering":
        op = inject.pick(targets, inject.BACKWARD_OPS)
        return (lambda: inject.wrong_lowering(op, backward=True)), op
    decomp = inject_table()
    op = inject.pick(targets, inject.DECOMPOSED_OPS, decomp)
    return (lambda: inject.wrong_decomposition(op)), op


def inject_table() -> dict[Any, Any]:
    """Inductor's decomposition table (the one ``wrong_decomposition`` patches)."""
    from jointlab import torch_compat
    return torch_compat.torch_module("torch._inductor.decomposition", "read").decompositions


def _holds_patched(compiled: Any, d: Any, injected: Any) -> bool:
    """Whether what ``d`` names holds the patched op (from Inductor's provenance)."""
    prov = compiled.compiled.provenance or {}
    posts = set(prov.get("cppCodeToPost", {}).get(d.kernel, ())) if d.kernel else set()
    if injected.kind != "decomposition":
        if d.kernel:
            return bool(posts & set(injected.scaled))
        pre = {p for s in injected.scaled for p in prov.get("postToPre", {}).get(s, ())}
        return d.node in pre
    nodes = {n.name: n for n in compiled.source.graph.nodes}
    named = {d.node} | {p for post in posts for p in prov.get("postToPre", {}).get(post, ())}
    return any(str(getattr(nodes.get(n), "target", None)) == str(injected.op) for n in named)


def _one(arch: str, kind: str, make: Any) -> Result:
    import jointlab as jl
    from tests.util import one_thread

    res = Result(arch, kind)
    t0 = time.perf_counter()
    try:
        model, inputs, step = make()
        with one_thread():
            joint = jl.trace(model, step, inputs)
            targets = {n.target for n in joint.graph.nodes if n.op == "call_function"}
            if kind == "clean":
                compiled, injected = joint.compile("inductor"), None
                compiled.run(model, inputs)
            else:
                patch, op = _bug(kind, targets)
                if op is None:
                    return res
                res.op = str(op).removeprefix("aten.").removesuffix(".default")
                with patch() as injected:
                    compiled = joint.compile("inductor")
                    compiled.run(model, inputs)
                if injected.kind != "decomposition" and not injected.scaled:
                    res.op += " (no node scaled)"
            c = compiled.compare(model, inputs)
        res.verdict, d = c.verdict, c.first_divergence
        if d is not None:
            res.divergence = f"{d.node} [{d.what}, {d.module or '(root)'}, {d.phase}]"
            res.kernel = d.kernel or "-"
            if injected is not None:
                res.right = _holds_patched(compiled, d, injected)
    except Exception as e:  # a crash is a result of the suite, not its end
        res.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        traceback.print_exc()
    res.seconds = time.perf_counter() - t0
    return res


def run(only: list[str] | None = None, log: str | None = None) -> list[Result]:
    """Every (architecture, kind) of the suite, printed (and logged) as it finishes."""
    import dataclasses
    import json
    out = []
    for arch, make in heldout_models.MODELS.items():
        if only and not any(o in arch for o in only):
            continue
        for kind in KINDS:
            r = _one(arch, kind, make)
            print(f"{arch} | {kind} | {r.outcome} | {r.verdict} | {r.kernel} | {r.right} | "
                  f"{r.seconds:.0f}s {r.error}", flush=True)
            out.append(r)
            if log:
                with open(log, "a") as f:
                    f.write(json.dumps(dataclasses.asdict(r)) + "\n")
    return out


def _cell(v: Any) -> str:
    return str(v).replace("|", "\\|")


def table(results: list[Result]) -> str:
    """The markdown table and its totals line."""
    head = ("| architecture | bug | patched op | outcome | verdict | first_divergence | "
            "named kernel | holds patched op | time |\n|" + "---|" * 9)
    lines = [head]
    for r in results:
        right = {None: "-", True: "yes", False: "NO"}[r.right]
        lines.append("| " + " | ".join(_cell(x) for x in (
            r.arch, r.kind, r.op, r.outcome + (f": {r.error}" if r.error else ""), r.verdict,
            r.divergence, r.kernel, right, f"{r.seconds:.0f} s")) + " |")
    return "\n".join(lines) + "\n\n" + summary(results) + "\n"


def summary(results: list[Result]) -> str:
    """One line: false alarms, missed bugs, errors, named kernels right."""
    bugs = [r for r in results if r.kind != "clean" and r.op != "-"]
    named = [r for r in bugs if r.right is not None]
    return (f"{len({r.arch for r in results})} architectures; false alarms "
            f"{sum(r.outcome == 'FALSE ALARM' for r in results)} of "
            f"{sum(r.kind == 'clean' for r in results)} clean compiles; missed bugs "
            f"{sum(r.outcome == 'MISSED' for r in bugs)} of {len(bugs)}; errors "
            f"{sum(bool(r.error) for r in results)}; named kernel/op holds the patched op "
            f"{sum(bool(r.right) for r in named)} of {len(named)} named; total "
            f"{sum(r.seconds for r in results):.0f} s")


def rows(ctx: Any) -> list[dict[str, Any]]:
    """bench/run.py rows: the suite's totals (the table goes to out/bench_heldout.md)."""
    from run import row

    results = run()
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(table(results))
    bugs = [r for r in results if r.kind != "clean" and r.op != "-"]
    alarms = sum(r.outcome == "FALSE ALARM" for r in results)
    missed = sum(r.outcome == "MISSED" for r in bugs)
    wrong = sum(r.right is False for r in bugs)
    return [row("held-out compiles: false alarms", alarms, "count", "0", alarms == 0),
            row("held-out injected bugs: missed", missed, "count", "0", missed == 0),
            row("held-out injected bugs: named kernel without the op", wrong, "count", "0",
                wrong == 0, detail=summary(results))]


def main() -> int:
    import argparse
    import json
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", action="append", help="architectures whose name contains this")
    ap.add_argument("--log", help="also append each result to this JSON-lines file")
    ap.add_argument("--from-log", nargs="+", help="build the table from logs, run nothing")
    args = ap.parse_args()
    if args.from_log:
        results = [Result(**json.loads(line)) for path in args.from_log
                   for line in pathlib.Path(path).read_text().splitlines() if line.strip()]
    else:
        results = run(args.only, args.log)
    text = table(results)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    torch.manual_seed(0)
    raise SystemExit(main())
