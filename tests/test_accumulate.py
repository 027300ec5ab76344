"""Gradient-accumulation attribution (passes/accumulate.py) against two references.

1. Autograd itself (``test_accumulations_match_autograd``): the traced forward
   ops are rerun eagerly with autograd recording, and the edges of autograd's
   own graph say which values receive more than one gradient contribution, and
   how many. Every value must get exactly that many accumulation adds.
2. A slow walk (``test_annotations_match_reference_walk``): the bitset index
   must place every accumulation add exactly where a plain per-term depth-first
   walk of the same rule does. Each test traces a model twice, once with
   ``accumulated_value`` swapped for the walk below, and compares every
   node's annotation.
"""

from __future__ import annotations

from collections import Counter
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


# -- the reference walk: one depth-first search per term, plain sets ---------------
def _ref_sig(node: Any) -> Any:
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return (v.shape, v.dtype) if isinstance(v, torch.Tensor) else None


def _ref_hands_on(node: fx.Node, slot: int) -> bool:
    """Whether the backward of ``node`` hands its gradient to ``args[slot]`` as is."""
    target = str(node.target)
    if node.op != "call_function" or not target.endswith(_PASSTHROUGH):
        return False
    if slot == 1 and (target.endswith("sub.Tensor") or node.kwargs.get("alpha", 1) != 1):
        return False
    return slot in (0, 1) and slot < len(node.args) and _ref_sig(node.args[slot]) is not None \
        and _ref_sig(node.args[slot]) == _ref_sig(node)


def _ref_reached(twin: fx.Node, want: Any) -> set[fx.Node]:
    """Every node the gradient ``twin`` sends (shaped ``want``) reaches."""
    todo = [a for i, a in enumerate(twin.args) if isinstance(a, fx.Node)
            and _ref_sig(a) == want and not _ref_hands_on(twin, i)]
    todo += [a for a in twin.all_input_nodes if a not in twin.args and _ref_sig(a) == want]
    found: set[fx.Node] = set()
    while todo:
        n = todo.pop()
        if n in found:
            continue
        found.add(n)
        todo.extend(n.args[i] for i in (0, 1) if _ref_hands_on(n, i)
                    and _ref_sig(n.args[i]) == want)
    return found


def _ref_count_reads(user: fx.Node, value: fx.Node) -> int:
    flat: list[Any] = []
    fx.node.map_arg((user.args, user.kwargs), lambda n: flat.append(n) or n)
    return sum(a is value for a in flat)


def _ref_reads(value: fx.Node, reached: set[fx.Node], twins: set[fx.Node]) -> list[fx.Node]:
    """Each read of ``value`` a term can travel: a pass-through slot of a reached
    node, any other slot of a twin (kwargs and nested reads count as other slots)."""
    out = []
    for user in value.users:
        slots = [i for i, a in enumerate(user.args) if a is value]
        slots += [-1] * (_ref_count_reads(user, value) - len(slots))
        out += [user for i in slots
                if (user in reached if _ref_hands_on(user, i) else user in twins)]
    return out


def _ref_contributions(acc: fx.Node) -> tuple[list[fx.Node], list[fx.Node]]:
    out, inner, todo = [], [], list(acc.all_input_nodes)
    while todo:
        n = todo.pop()
        if n.meta.get("is_gradient_acc"):
            inner.append(n)
            todo.extend(n.all_input_nodes)
        else:
            out.append(n)
    return out, inner


def ref_accumulated_value(acc: fx.Node, twins: dict[fx.Node, fx.Node], index: Any = None
                          ) -> tuple[fx.Node | None, list[fx.Node]]:
    """The latest node every term reaches, with two reads carrying terms (plus one per
    inner accumulation already placed on it); ``index`` ignored."""
    want = _ref_sig(acc)
    found, inner = _ref_contributions(acc)
    terms = [t for t in (twins.get(c) for c in found) if t is not None]
    if want is None or not terms:
        return None, []
    per_term = [_ref_reached(t, want) for t in terms]
    common, reached = set.intersection(*per_term), set.union(*per_term)
    order = {n: i for i, n in enumerate(acc.graph.nodes)}
    placed = Counter(a.meta[KEY].get("grad_acc_of") for a in set(inner))
    for value in sorted(common, key=order.__getitem__, reverse=True):
        reads = _ref_reads(value, reached, set(terms))
        if len(reads) >= 2 + placed[value.name]:
            return value, sorted(set(reads), key=order.__getitem__)
    return None, []


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
    """``h`` reaches ``sub`` twice: directly and through ``mix``.

    Its gradient sums three terms, read by ``blk.mix``, ``blk.sub`` (its second,
    negated slot) and ``blk.sub.proj``: the accumulation belongs to ``blk``.
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
RUNS = [(c, "make_fx") for c in sorted(CASES)] + [
    (c, "aot") for c in ("diamond", "gpt2_small", "hf_llama")]


@pytest.mark.parametrize(("case", "mode"), RUNS)
def test_annotations_match_reference_walk(case, mode, monkeypatch):
    new = _annotations(_trace(case, mode))
    monkeypatch.setattr(accumulate, "accumulated_value", ref_accumulated_value)
    ref = _annotations(_trace(case, mode))
    assert [r[0] for r in new] == [r[0] for r in ref]
    diffs = [(a[0], a[1:], b[1:]) for a, b in zip(new, ref) if a != b]
    assert not diffs, diffs[:3]
    placed = [r for r in new if "grad_acc_of" in r[1]]
    assert placed, "no accumulation was attributed: the comparison would be vacuous"


# -- the independent reference: autograd's own graph ------------------------------
def _loss_ancestors(joint: Any) -> list[fx.Node]:
    """The nodes the loss is computed from (the loss last), in graph order."""
    loss = joint.outputs_and_tangents()[0][0]
    seen, todo = {loss}, [loss]
    while todo:
        for a in todo.pop().all_input_nodes:
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return [n for n in joint.graph.nodes if n in seen]


def _rerun_forward(joint: Any, model: nn.Module, inputs: dict[str, Any]
                   ) -> tuple[torch.Tensor, dict[fx.Node, Any]]:
    """The loss and, per forward node, its autograd slot, recomputed eagerly.

    Each placeholder gets a leaf of its own (a parameter's requires grad), so
    autograd builds the graph the traced forward ops imply, one Function per op.
    A node's slot is ``(grad_fn, output_nr)`` (a leaf: its id), read when the
    node runs (an in-place op later moves the tensor to a Function of its own).
    """
    env: dict[fx.Node, Any] = {}
    slots: dict[fx.Node, Any] = {}
    flat = joint.flat_args(model, inputs)
    args = dict(zip(joint.placeholders, joint.runtime.prepare(joint, flat)))
    for node in _loss_ancestors(joint):
        if node.op == "placeholder":
            leaf = args[node].detach().clone()
            env[node] = leaf.requires_grad_(node.meta[KEY]["phase"] == "param"
                                            and leaf.is_floating_point())
        else:
            env[node] = node.target(*fx.node.map_arg(node.args, env.__getitem__),
                                    **fx.node.map_arg(node.kwargs, env.__getitem__))
        value = env[node]
        if isinstance(value, torch.Tensor) and value.requires_grad:
            slots[node] = ((value.grad_fn, value.output_nr) if value.grad_fn is not None
                           else id(value))
    return env[joint.outputs_and_tangents()[0][0]], slots


def autograd_reads(joint: Any, model: nn.Module, inputs: dict[str, Any]
                   ) -> dict[str, list[fx.Node]]:
    """The forward nodes whose gradient reaches each value more than once, per autograd.

    Walks autograd's own graph (``next_functions``, from the loss): every edge into
    a ``(Function, output)`` or a leaf's ``AccumulateGrad`` is one gradient
    contribution to that value, sent by the op whose Function the edge leaves.

    Returns:
        For each value (by node name) with two or more contributions, the node
        sending each one (``k`` contributions are summed by ``k - 1`` adds).
    """
    loss, slots = _rerun_forward(joint, model, inputs)
    owner: dict[Any, fx.Node] = {}
    sender: dict[Any, fx.Node] = {}
    for node, key in slots.items():
        assert key not in owner, f"{node.name} and {owner[key].name} share one autograd slot"
        owner[key] = node
        if isinstance(key, tuple):
            sender.setdefault(key[0], node)
    reads: dict[Any, list[fx.Node]] = {}
    seen, todo = {loss.grad_fn}, [loss.grad_fn]
    while todo:
        here = todo.pop()
        for fn, slot in here.next_functions:
            if fn is None:
                continue
            key = id(fn.variable) if hasattr(fn, "variable") else (fn, slot)
            reads.setdefault(key, []).append(sender[here])
            if fn not in seen:
                seen.add(fn)
                todo.append(fn)
    return {owner[k].name: r for k, r in reads.items() if len(r) > 1}


def _deepest_common(paths: list[str]) -> str:
    """The deepest module path holding every path (``""``: the root)."""
    parts = [p.split(".") if p else [] for p in paths]
    prefix = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        prefix.append(level[0])
    return ".".join(prefix)


def placed_accumulations(joint: Any) -> Counter:
    """How many accumulation adds jointlab attributed to each forward value."""
    return Counter(n.meta[KEY].get("grad_acc_of") for n in joint.graph.nodes
                   if n.meta.get("is_gradient_acc"))


class SubOfSum(nn.Module):
    """``sub(h + y, h)``: ``h`` is read directly and through a pass-through add."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.c(torch.sub(h + self.b(x), h))


class MulOfSum(SubOfSum):
    """``(h + y) * h``: both terms come from one consumer (the mul)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.c((h + self.b(x)) * h)


class SelfOps(SubOfSum):
    """``h + h`` and ``g - g``: one pass-through op reads the value twice."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        g = self.b(h + h)
        return self.c(torch.sub(g, g) + g)


class ThreeUses(SubOfSum):
    """One value read by three consumers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.c(torch.tanh(h) + self.b(h) * torch.sigmoid(h))


class Residual(nn.Module):
    """A residual stream of four blocks (``x = x + f(x)``)."""

    def __init__(self, d: int = 8, depth: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(d, d), nn.Tanh())
                                    for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for blk in self.blocks:
            x = x + blk(x)
        return x


class Tied(nn.Module):
    """An embedding whose weight is also the output projection; a skip around ``mid``.

    AOT gives each alias of the tied weight a placeholder of its own (its runtime
    sums them), so only make_fx sums the weight's two terms in the graph.
    """

    def __init__(self, vocab: int = 12, d: int = 8) -> None:
        super().__init__()
        self.emb, self.mid = nn.Embedding(vocab, d), nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.emb(ids)
        return self.head(torch.tanh(self.mid(e)) + e)


def _square_mean(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return (model(x) ** 2).mean()


def _ids_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).logsumexp(-1).mean()


def _autograd_cases() -> dict[str, tuple[Any, Any, dict[str, Any]]]:
    x = {"x": torch.randn(4, 8)}
    out: dict[str, tuple[Any, Any, dict[str, Any]]] = {
        name: (cls, _square_mean, x) for name, cls in (
            ("sub_of_sum", SubOfSum), ("mul_of_sum", MulOfSum), ("self_ops", SelfOps),
            ("three_uses", ThreeUses), ("residual", Residual), ("diamond", Diamond))}
    out["tied"] = (Tied, _ids_loss, {"ids": torch.randint(0, 12, (4, 5))})
    # resnet: in-place relu_ after batch norm; hf_gpt2_checkpoint: recomputed regions.
    for name in ("hf_gpt2", "hf_llama", "resnet", "hf_gpt2_checkpoint"):
        f = real.get(name)
        out[name] = (f.make_model, f.train_fn, f.make_inputs(2))
    return out


AUTOGRAD_CASES = _autograd_cases()


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
@pytest.mark.parametrize("case", sorted(AUTOGRAD_CASES))
def test_accumulations_match_autograd(case, mode):
    make, fn, inputs = AUTOGRAD_CASES[case]
    torch.manual_seed(0)
    model = make()
    joint = jl.trace(model, fn, inputs, mode=mode)
    reads = autograd_reads(joint, model, inputs)
    assert reads, "autograd sums nothing here: the comparison would be vacuous"
    assert placed_accumulations(joint) == Counter({v: len(r) - 1 for v, r in reads.items()})
    nodes = {n.name: n for n in joint.graph.nodes}
    for acc in (n for n in joint.graph.nodes if n.meta.get("is_gradient_acc")):
        value = nodes[acc.meta[KEY]["grad_acc_of"]]
        if value.meta[KEY]["phase"] == "param":  # the module owning it (tied: one owner)
            assert acc.meta[KEY]["module"] == value.meta[KEY]["module"], acc.name
        else:  # the deepest module holding every op autograd says sends it a term
            senders = {s.meta[KEY]["module"] for s in reads[value.name]}
            assert acc.meta[KEY]["module"] == _deepest_common(sorted(senders)), (
                acc.name, value.name, senders)


class SubOfTwo(SubOfSum):
    """``c(a(x) - b(x))``: a sub of two unrelated values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.a(x) - self.b(x))


def test_sub_hands_on_its_gradient_to_its_first_input_only():
    # Autograd's SubBackward gives its first input the incoming gradient itself and
    # its second the negation (a backward node of its own, whose twin is the sub).
    torch.manual_seed(0)
    model, x = SubOfTwo(), torch.randn(4, 8)
    joint = jl.trace(model, _square_mean, {"x": x})
    sub = next(n for n in joint.graph.nodes if str(n.target) == "aten.sub.Tensor")
    neg = [n for n in joint.graph.nodes if n.meta[KEY].get("fwd_twin") == sub.name]
    assert [str(n.target) for n in neg] == ["aten.neg.default"]
    reader = next(iter(sub.users))  # the head's addmm: its term is the sub output's gradient
    index = accumulate.CandidateIndex(joint.graph)
    want = (x.shape, x.dtype)

    def reached(twin: fx.Node) -> set[str]:
        bits = index.candidates(twin, want)
        return {n.name for i, n in enumerate(index.nodes) if (bits >> i) & 1}

    assert reached(reader) == {sub.name, sub.args[0].name}
    assert reached(sub) == {sub.args[1].name}
