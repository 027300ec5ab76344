"""The public surface: lazy names resolve to functions, and the import stays light."""

from __future__ import annotations

import subprocess
import sys

import jointlab as jl

LAZY = ["Stepper", "compare", "Comparison", "MemoryProfile", "load", "plot_dag",
        "plot_memory", "plot_lifetimes", "explore", "report"]


def test_import_loads_neither_plotly_nor_ipywidgets():
    # sympy (and torch's symbolic shapes, which pull it in) load on first dynamic trace:
    # imported at the top they cost ~1.2 s of every fresh kernel
    heavy = "('plotly', 'ipywidgets', 'anywidget', 'sympy')"
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


def test_trace_stays_the_function_after_its_subpackage_loads():
    code = ("import jointlab as jl, jointlab.trace.aot, jointlab.trace.make_fx, "
            "jointlab.trace.request; from jointlab import tracing; "
            "print(jl.trace is tracing.trace, callable(jl.trace))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


def test_load_resolves_to_the_graph_loader():
    from jointlab.graph import load

    assert jl.load is load and jl.RunResult._fields == ("loss", "grads", "loss_dict")


def test_dir_lists_the_public_api_and_nothing_else():
    names = dir(jl)
    assert set(LAZY) <= set(names)  # tab completion offers the lazy names
    assert set(names) == set(jl.__all__)
    assert not {"graph", "guards", "torch_compat", "annotations", "lazy_getattr"} & set(names)
    assert all(callable(getattr(jl, n)) or n == "errors" for n in names)
