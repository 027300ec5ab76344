"""Cost of ``import jointlab`` on top of ``import torch``, in fresh interpreters.

Each sample starts a new Python with ``-X importtime`` that imports torch,
then jointlab, and reads the cumulative time of each top-level import (so
jointlab's figure is what it adds once torch is loaded); the least
load-disturbed of the samples is kept. Target: jointlab adds at most 0.5 s
(sympy, plotly, pandas and the tracer's heavy torch modules load on first use).
"""

from __future__ import annotations

import re
import subprocess
import sys

_LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| (\S+)$")


def _sample() -> tuple[float, float]:
    """Seconds of ``import torch`` and of ``import jointlab`` after it, in one fresh Python."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torch, jointlab"],
                         check=True, capture_output=True, text=True).stderr
    top = {m[2]: int(m[1]) / 1e6 for m in map(_LINE.match, err.splitlines()) if m}
    return top["torch"], top["jointlab"]


def rows(ctx):
    samples = [_sample() for _ in range(3 if ctx.quick else 7)]
    base = min(t for t, _ in samples)
    extra = min(j for _, j in samples)
    return [
        {"name": "import torch (fresh interpreter)", "value": base, "unit": "s", "target": "",
         "ok": None},
        {"name": "import jointlab on top of import torch", "value": extra, "unit": "s",
         "target": "<= 0.5", "ok": extra <= 0.5},
        {"name": "import jointlab / import torch", "value": extra / base, "unit": "x",
         "target": "", "ok": None},
    ]
