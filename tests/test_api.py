"""The public surface: lazy names resolve to functions, and the import stays light."""

from __future__ import annotations

import subprocess
import sys

import jointlab as jl

LAZY = ["Stepper", "compare", "Comparison", "MemoryProfile", "load", "plot_dag",
        "plot_memory", "plot_lifetimes", "explore", "report"]


def test_import_loads_neither_plotly_nor_ipywidgets():
    heavy = "('plotly', 'ipywidgets', 'anywidget')"
    code = f"import sys, jointlab; print(any(m.split('.')[0] in {heavy} for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_lazy_names_are_the_api_objects_on_every_access():
    for name in LAZY:
        first = getattr(jl, name)
        second = getattr(jl, name)
        assert first is second
        assert callable(first) and not isinstance(first, type(sys)), name
    assert set(LAZY) <= set(jl.__all__)
