"""The watch table is the truth: the tracer enters exactly its rows, and the docs follow it."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import inspect
import pathlib
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab import errors
from jointlab.facts import KINDS
from jointlab.trace import tracer, watch_table
from jointlab.trace.watch_table import OUTCOMES, WATCHES

README = (pathlib.Path(__file__).parents[1] / "README.md").read_text()


def _trace():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    inputs = {"x": torch.randn(2, 4), "y": torch.randn(2, 4)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return jl.trace(model, lambda m, x, y: F.mse_loss(m(x), y), inputs)


def test_every_row_is_well_formed():
    names = [w.name for w in WATCHES]
    assert len(names) == len(set(names)), "row names must be unique"
    for w in WATCHES:
        assert w.outcome in OUTCOMES, w
        assert w.doc and w.event, w
        assert (w.enter is None) == bool(w.where), f"{w.name}: enter or where, not both"
        assert w.error is None or getattr(errors, w.error.__name__) is w.error, w.name
        # a guard shows in joint.guards (its kinds) or is checked with the inputs (where)
        assert not w.kinds or w.outcome == "guard", w.name
        assert w.outcome != "guard" or w.kinds or w.where, w.name
        # a kernel swap the retarget pass applies names that pass
        assert not w.retargets or (w.outcome, w.where) == (
            "swap", "jointlab.passes.pipeline.retarget"), w.name


def test_the_tracer_enters_every_row_with_a_context_and_nothing_else(monkeypatch):
    entered = []

    def spy(w):
        @contextlib.contextmanager
        def enter(call):
            entered.append(w.name)
            with w.enter(call) as value:
                yield value
        return dataclasses.replace(w, enter=enter)

    monkeypatch.setattr(watch_table, "WATCHES",
                        tuple(spy(w) if w.enter else w for w in WATCHES))
    _trace()
    assert entered == [w.name for w in WATCHES if w.enter is not None]
    # and _trace itself opens no context of its own beside the table's
    tree = ast.parse(inspect.getsource(tracer._trace))
    withs = [ast.unparse(i.context_expr) for n in ast.walk(tree) if isinstance(n, ast.With)
             for i in n.items]
    assert withs == ["watching(WatchCall(model, train_fn, mode))"], withs


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_rows_entered_elsewhere_name_a_function_that_exists():
    for w in WATCHES:
        if w.enter is None:
            assert callable(_resolve(w.where)), f"{w.name}: {w.where} names nothing callable"


def test_readme_shows_the_table_as_generated_and_every_guard_kind_is_a_row():
    block = README.split("<!-- watch-table: generated -->\n", 1)[1].split("<!-- /watch-table")[0]
    assert block == watch_table.markdown(), "README is stale: python -m jointlab.trace.watch_table"
    kinds = {k for w in WATCHES for k in w.kinds}
    assert kinds == set(KINDS) - {"hyperparameter"}  # the legacy kind of old archives
    assert set(_trace().guards["kind"]) <= kinds
