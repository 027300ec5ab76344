"""Gradient-accumulation attribution (passes/accumulate.py) against the slow walk it replaced.

The bitset index must place every accumulation add exactly where the original
per-term depth-first walk did: each test traces a model twice, once with
``accumulated_value`` swapped for the reference below (kept verbatim from the
quadratic implementation), and compares every node's annotation.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx as fx
from torch import nn

import jointlab as jl
from jointlab.meta import KEY
from jointlab.passes import accumulate
from tests.fixtures import real, zoo

_PASSTHROUGH = ("add.Tensor", "sub.Tensor", "add_.Tensor")


# -- the reference: the original walk, one depth-first search per term --------------
def _ref_facts(node: fx.Node, sigs: dict[fx.Node, Any]) -> tuple[Any, bool]:
    if node not in sigs:
        v = node.meta.get("val")
        sigs[node] = ((v.shape, v.dtype) if isinstance(v, torch.Tensor) else None,
                      node.op == "call_function" and str(node.target).endswith(_PASSTHROUGH))
    return sigs[node]


def _ref_candidates(twin: fx.Node, like: Any, sigs: dict[fx.Node, Any]) -> dict[fx.Node, fx.Node]:
    want = (like.shape, like.dtype) if isinstance(like, torch.Tensor) else None
    found: dict[fx.Node, fx.Node] = {}
    if want is None:
        return found
    todo = [(a, twin) for a in twin.all_input_nodes if _ref_facts(a, sigs)[0] == want]
    while todo:
        n, reader = todo.pop()
        if n in found:
            continue
        found[n] = reader
        if _ref_facts(n, sigs)[1]:
            todo.extend((a, n) for a in n.all_input_nodes if _ref_facts(a, sigs)[0] == want)
    return found


def _ref_contributions(acc: fx.Node) -> list[fx.Node]:
    out, todo = [], list(acc.all_input_nodes)
    while todo:
        n = todo.pop()
        (todo.extend(n.all_input_nodes) if n.meta.get("is_gradient_acc") else out.append(n))
    return out


def ref_accumulated_value(acc: fx.Node, twins: dict[fx.Node, fx.Node], index: Any = None
                          ) -> tuple[fx.Node | None, list[fx.Node]]:
    """The original implementation (``index`` ignored)."""
    like, sigs = acc.meta.get("val"), {}
    per_term = [_ref_candidates(t, like, sigs)
                for t in (twins.get(c) for c in _ref_contributions(acc)) if t is not None]
    common = set.intersection(*(set(c) for c in per_term)) if per_term else set()
    if not common:
        return None, []
    order = {n: i for i, n in enumerate(acc.graph.nodes)}
    value = max(common, key=order.__getitem__)
    return value, [c[value] for c in per_term]


# -- models -----------------------------------------------------------------------
class Add(nn.Module):
    """A pass-through add in a module of its own."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class Sub(nn.Module):
    """A pass-through sub of ``x`` and ``y``, gated by a projection of ``y``."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x - y) * self.proj(y)


class Block(nn.Module):
    """``h`` reaches ``sub`` twice: directly and through ``mix`` (two possible readers).

    Its gradient sums three terms; the walk reads ``h`` through ``sub`` (so the
    accumulation belongs to ``blk.sub``), the first user of ``h`` is ``mix``.
    """

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.inner, self.other = nn.Linear(d, d), nn.Linear(d, d)
        self.mix, self.sub = Add(), Sub(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x)
        return self.sub(self.mix(h, self.other(x)), h)


class Diamond(nn.Module):
    """The block, then a head."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.blk, self.out = Block(d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blk(x))


def _diamond_fn(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return (model(x) ** 2).mean()


def _cases() -> dict[str, tuple[Any, Any, dict[str, Any]]]:
    out: dict[str, tuple[Any, Any, dict[str, Any]]] = {
        "diamond": (lambda: Diamond(), _diamond_fn, {"x": torch.randn(4, 8)})}
    for name in ("gpt2_small", "shared_submodule", "tiny_lm"):
        f = zoo.get(name)
        out[name] = (f.make_model, f.train_fn, f.make_inputs(zoo.DEFAULT_BATCH_SIZE))
    for name in ("hf_llama", "hf_gpt2", "resnet", "hf_gpt2_checkpoint"):
        f = real.get(name)
        out[name] = (f.make_model, f.train_fn, f.make_inputs(2))
    return out


CASES = _cases()


def _annotations(joint: Any) -> list[tuple[str, dict[str, Any], Any, Any]]:
    return [(n.name, dict(n.meta.get(KEY, {})), n.meta.get("nn_module_stack"),
             n.meta.get("stack_trace")) for n in joint.graph.nodes]


def _trace(case: str, mode: str) -> Any:
    make, fn, inputs = CASES[case]
    torch.manual_seed(0)
    return jl.trace(make(), fn, inputs, mode=mode)


# make_fx on every case; AOT shares the pass, three cases keep it cheap.
RUNS = [(c, "make_fx") for c in sorted(CASES)] + [(c, "aot") for c in ("diamond", "gpt2_small",
                                                                       "hf_llama")]


@pytest.mark.parametrize(("case", "mode"), RUNS)
def test_annotations_match_reference_walk(case, mode, monkeypatch):
    replays = []
    replay = accumulate.CandidateIndex._replay
    monkeypatch.setattr(accumulate.CandidateIndex, "_replay",
                        lambda self, *a: replays.append(a) or replay(self, *a))
    new = _annotations(_trace(case, mode))
    monkeypatch.setattr(accumulate, "accumulated_value", ref_accumulated_value)
    ref = _annotations(_trace(case, mode))
    assert [r[0] for r in new] == [r[0] for r in ref]
    diffs = [(a[0], a[1:], b[1:]) for a, b in zip(new, ref) if a != b]
    assert not diffs, diffs[:3]
    placed = [r for r in new if "grad_acc_of" in r[1]]
    assert placed, "no accumulation was attributed: the comparison would be vacuous"
    if case == "diamond":
        assert replays, "the diamond must exercise the replayed walk (two possible readers)"
