"""A real gloo job (torch's launcher, CPU) beside the fake world, per rank.

Each process of ``tests/real_job/worker.py`` traces the models of
``tests/real_job/models.py`` (``tp``: Colwise/Rowwise tensor parallel; ``uneven``:
SimpleFSDP-style, 3 rows over the ranks; each in both modes) and times ``jl.trace`` against one gloo
eager step of its own; ``jl.gather_ranks`` brings every rank's graph to rank 0.
Beside them, ``jl.trace_ranks`` in ``jl.fake_world`` of the same size: its time
(all rank classes), and per rank its graph's collectives, bytes and predicted peak,
which the real ranks' own figures should equal.
``python bench/bench_real_job.py [NPROC]`` prints the table (default 4 ranks).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from run import row

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _real_job(nproc: int, out: str) -> dict[str, dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(ROOT / "tests" / "real_job" / "worker.py"), out]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(done.stdout[-3000:] + done.stderr[-3000:])
    return {f"{k}_{m}": json.loads(pathlib.Path(out, f"{k}_{m}.json").read_text())
            for k, m in _cases()}


def _cases() -> tuple[tuple[str, str], ...]:
    from tests.real_job.models import CASES

    return CASES


def _fake_world(kind: str, mode: str, nproc: int) -> dict:
    import jointlab as jl
    from jointlab.analysis.distributed import collectives
    from jointlab.analysis.memory.profile import memory_profile
    from tests.real_job.models import inputs, sharded, step

    with jl.fake_world(nproc) as world:
        with world.all_ranks():
            every_rank = sharded(kind, world.mesh)
        t0 = time.perf_counter()
        graphs = jl.trace_ranks(every_rank, step, inputs(), mode=mode)
        seconds = time.perf_counter() - t0
    ranks = []
    for r in range(nproc):
        coll = collectives(graphs[r])
        ranks.append({"collectives": len(coll), "comm_bytes": int(coll.bytes.sum()),
                      "peak_bytes": int(memory_profile(graphs[r]).peak_bytes)})
    return {"trace_ranks_s": seconds, "classes": [list(c) for c in graphs.classes],
            "ranks": ranks}


def measure(nproc: int = 4) -> dict[str, dict]:
    """The real job's and the fake world's figures, by kind."""
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as out:
        real = _real_job(nproc, out)
    return {f"{k}_{m}": {"real": real[f"{k}_{m}"], "fake": _fake_world(k, m, nproc)}
            for k, m in _cases()}


def _print(figures: dict[str, dict]) -> None:
    for kind, f in figures.items():
        real, fake = f["real"], f["fake"]
        print(f"{kind}: real job classes {real['classes']}, fake world classes "
              f"{fake['classes']}; jl.gather_ranks on rank 0 {real['gather_s']:.3f} s; "
              f"fake world jl.trace_ranks {fake['trace_ranks_s']:.2f} s")
        print("  rank  trace s  gloo eager s  trace/eager  collectives  comm B  peak B"
              "  | fake: collectives  comm B  peak B")
        for r, fr in zip(real["ranks"], fake["ranks"]):
            print(f"  {r['rank']:>4}  {r['trace_s']:7.3f}  {r['eager_s']:12.4f}  "
                  f"{r['trace_s'] / r['eager_s']:11.0f}  {r['collectives']:>11}  "
                  f"{r['comm_bytes']:>6}  {r['peak_bytes']:>6}  | {fr['collectives']:>17}  "
                  f"{fr['comm_bytes']:>6}  {fr['peak_bytes']:>6}")


def rows(ctx) -> list[dict]:
    figures = measure(2 if ctx.quick else 4)
    out = []
    for kind, f in figures.items():
        real, fake = f["real"], f["fake"]
        same = all(r[k] == fr[k] for r, fr in zip(real["ranks"], fake["ranks"])
                   for k in ("collectives", "comm_bytes", "peak_bytes"))
        ratio = max(r["trace_s"] / r["eager_s"] for r in real["ranks"])
        out.append(row(f"real job {kind}: slowest rank jl.trace / gloo eager step", ratio, "x",
                       "report"))
        # A real rank's guards hold its own mesh coordinate, so ranks the fake world groups
        # may gather as classes of their own: each real class must lie inside a fake one.
        refines = all(any(set(c) <= set(f) for f in fake["classes"]) for c in real["classes"])
        out.append(row(f"real job {kind}: ranks whose collectives/peak equal the fake world's",
                       float(same), "bool", "1", same and refines))
    return out


if __name__ == "__main__":
    os.chdir(ROOT)
    _print(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 4))
