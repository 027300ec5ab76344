"""Shared test helpers: model snapshots, eager references, recorded node values, trace caches."""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import random
from typing import Any

import pytest
import torch
import torch.fx as fx
from torch import nn

from jointlab.torch_compat import release
from jointlab.torch_compat.distributed import DISTRIBUTED_SINCE


def needs_torch(since: tuple[int, int, int], what: str) -> pytest.MarkDecorator:
    """Skip, saying so, on a torch older than ``since`` (a feature jointlab refuses there)."""
    return pytest.mark.skipif(
        release(torch.__version__) < since,
        reason=f"{what} needs torch {since[0]}.{since[1]} or newer; this is torch "
               f"{torch.__version__}")


#: jl.fake_world and DTensor tracing: refused before torch 2.13 (test_torch_version checks it).
NEEDS_DISTRIBUTED_TORCH = needs_torch(
    DISTRIBUTED_SINCE, "jl.fake_world / DTensor tracing (refused with UnsupportedTorchError)")


def _copy(t: torch.Tensor | None) -> Any:
    return None if t is None else (id(t), t.detach().clone())


def deep_state(model: nn.Module) -> dict[str, Any]:
    """Everything tracing must not change: values, grads, flags, identities, the global RNG.

    Tied and shared tensors and modules are listed under every name
    (``remove_duplicate=False``), so replacing one alias is caught too.
    """
    out: dict[str, Any] = {"rng": torch.get_rng_state().clone()}
    for name, mod in model.named_modules(remove_duplicate=False):
        out[f"{name}#module"] = (id(mod), type(mod), mod.training,
                                 sorted(mod._parameters), sorted(mod._buffers))
        for pname, p in list(mod._parameters.items()) + list(mod._buffers.items()):
            out[f"{name}.{pname}"] = None if p is None else (
                id(p), type(p), p.detach().clone(), p.requires_grad, _copy(p.grad))
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal dtype, shape and values, NaN where NaN is (meta tensors: metadata only)."""
    if a.device.type == "meta" or b.device.type == "meta":  # no data to compare
        return (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if torch.equal(a, b):
        return True
    return a.is_floating_point() and torch.equal(a.isnan(), b.isnan()) and torch.equal(
        a.nan_to_num(), b.nan_to_num())


def assert_same_bits(got: Any, want: Any, what: str) -> None:
    """Assert two nests of tensors (tuples, lists, dicts) are bitwise equal, naming the leaf."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and same_bits(got, want), f"{what} differs"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), f"{what}: keys differ"
        for k in want:
            assert_same_bits(got[k], want[k], f"{what}[{k!r}]")
    elif isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), f"{what}: length"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_bits(g, w, f"{what}[{i}]")
    else:
        assert got == want, f"{what}: {got!r} != {want!r}"


def assert_unchanged(before: dict[str, Any], model: nn.Module) -> None:
    """Assert ``model`` (and the global RNG) equal a :func:`deep_state` snapshot bitwise."""
    after = deep_state(model)
    assert before.keys() == after.keys(), f"entries changed: {before.keys() ^ after.keys()}"
    assert torch.equal(after["rng"], before["rng"]), "the global RNG state changed"
    for key, b in before.items():
        a = after[key]
        if key == "rng" or b is None:
            assert key == "rng" or a is None, f"{key}: was None"
            continue
        if key.endswith("#module"):
            assert a[:2] == b[:2], f"{key}: module replaced"
            assert a[2:] == b[2:], f"{key}: training flag or tensor names changed"
            continue
        assert a[0] == b[0] and a[1] is b[1], f"{key}: object replaced"
        assert same_bits(a[2], b[2]), f"{key}: value changed"
        assert a[3] == b[3], f"{key}: requires_grad changed"
        assert (a[4] is None) == (b[4] is None), f"{key}: grad changed"
        if b[4] is not None:
            assert a[4][0] == b[4][0] and same_bits(a[4][1], b[4][1]), f"{key}: grad changed"


def eager_step(model: nn.Module, train_fn, inputs: dict[str, Any], seed: int):
    """One eager forward+backward; returns (loss, grads by FQN, loss_dict)."""
    torch.manual_seed(seed)
    out = train_fn(model, **inputs)
    loss, loss_dict = (out if isinstance(out, tuple) else (out, {}))
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)
    g = {n: (torch.zeros_like(p) if gr is None else gr) for (n, p), gr in zip(params, grads)}
    return loss.detach(), g, {k: v.detach() if isinstance(v, torch.Tensor) else v
                              for k, v in loss_dict.items()}


class ValueRecorder(fx.Interpreter):
    """A plain ``fx.Interpreter`` that keeps every node's value, by node name, in run order."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.values: dict[str, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        self.values[n.name] = out
        return out


def node_values(joint, model: nn.Module, inputs: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Every node's value in one run of ``joint``, an independent reference for the Stepper.

    Runs with torch's own ``fx.Interpreter`` on a deep copy of ``model`` and of
    ``inputs`` (nothing the caller holds changes, the global RNG included), seeded with
    ``seed``. Keys are node names, in execution order.
    """
    flat = joint.flat_args(copy.deepcopy(model), copy.deepcopy(inputs))
    rec = ValueRecorder(joint.graph_module)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        rec.run(*joint.runtime.prepare(joint, flat))
    return rec.values


@functools.cache
def traced_zoo(name: str, mode: str = "make_fx", batch: int = 4):
    """Trace a zoo fixture once per session; return (fixture, model, inputs, joint).

    The one trace cache for zoo fixtures: treat all four as read-only (trace a fresh
    one for tests that edit the graph or run the model).
    """
    import jointlab as jl
    from tests.fixtures import zoo

    f = zoo.get(name)
    model, inputs = f.make_model(), f.make_inputs(batch)
    return f, model, inputs, jl.trace(model, f.train_fn, inputs, mode=mode)


def traced_fixture(name: str, mode: str):
    """(fixture, inputs, joint) of :func:`traced_zoo` at batch 4. Treat as read-only."""
    f, _, inputs, joint = traced_zoo(name, mode)
    return f, inputs, joint


@functools.cache
def traced_real(name: str, mode: str):
    """Trace a real-model fixture once per mode; return (fixture, model, inputs, joint).

    The model is the traced one; treat all four as read-only (deep-copy the model
    before running anything that updates its buffers).
    """
    import jointlab as jl
    from tests.fixtures import real

    f = real.get(name)
    model, inputs = f.make_model(), f.make_inputs()
    return f, model, inputs, jl.trace(model, f.train_fn, inputs, mode=mode)


def eager_saved_storages(train_fn, model: nn.Module, inputs: dict[str, Any],
                         seed: int = 0) -> dict[int, int]:
    """Storages autograd itself saves for backward in one eager forward: ``{data_ptr: nbytes}``.

    Parameters, buffers and inputs are left out (the step does not allocate them).
    Read through ``torch.autograd.graph.saved_tensors_hooks``, so it is independent of
    jointlab's own saved-for-backward rule.
    """
    known = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    known |= {t.untyped_storage().data_ptr() for t in inputs.values()
              if isinstance(t, torch.Tensor)}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in known:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            train_fn(model, **inputs)
    return seen


#: Environment variable holding the seed of the random fuzz sample (set it to replay one).
FUZZ_SEED_ENV = "JOINTLAB_FUZZ_SEED"


def fuzz_seed() -> int:
    """The random fuzz sample's seed: ``$JOINTLAB_FUZZ_SEED``, else drawn once and exported.

    ``tests/conftest.py`` draws it before pytest-xdist starts its workers, so every
    worker, the header line and the failure notes all name the same seed.
    """
    if FUZZ_SEED_ENV not in os.environ:
        os.environ[FUZZ_SEED_ENV] = str(random.SystemRandom().randrange(2**32))
    return int(os.environ[FUZZ_SEED_ENV])


@contextlib.contextmanager
def one_thread():
    """Run with one intra-op CPU thread, restoring the previous count afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def compare_with_planted_bug(joint, model: nn.Module, inputs: dict[str, Any], monkeypatch):
    """Compile ``joint`` with Inductor and run it while ``monkeypatch``'s planted bug is in place,
    then undo the bug and compare that run with eager, all on one CPU thread.

    Args:
        joint: the traced joint graph.
        model: the model traced.
        inputs: its inputs.
        monkeypatch: pytest's fixture holding the planted bug (undone here, before comparing).

    Returns:
        The compiled graph's ``compare(model, inputs)`` result.
    """
    with one_thread():
        bad = joint.compile("inductor")
        bad.run(model, inputs)
        monkeypatch.undo()
        return bad.compare(model, inputs)
