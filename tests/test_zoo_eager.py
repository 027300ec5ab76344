"""Eager sanity checks for the fixture model zoo (no tracing involved)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from tests.fixtures import zoo

BATCH = 4
NAMES = sorted(zoo.FIXTURES)

# Parameters that require grad but never reach the loss, per fixture.
UNUSED: dict[str, set[str]] = {"unused_param": {"unused.weight", "unused.bias"}}


def _loss(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _assert_tree_equal(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_tree_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_tree_equal(x, y)
    else:
        assert a == b


def _run(fx: zoo.Fixture, model: nn.Module, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return fx.train_fn(model, **fx.make_inputs(BATCH))


def test_registry() -> None:
    assert set(NAMES) == {
        "mlp",
        "cnn_bn",
        "tiny_lm",
        "nested_inputs",
        "unused_param",
        "shared_submodule",
        "gpt2_small",
    }
    for name, fx in zoo.FIXTURES.items():
        assert fx.name == name
        assert zoo.get(name) is fx
    with pytest.raises(KeyError):
        zoo.get("nope")


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_build_and_inputs(name: str) -> None:
    fx = zoo.get(name)
    rng_before = torch.random.get_rng_state()
    m1, m2 = fx.make_model(), fx.make_model()
    assert torch.equal(rng_before, torch.random.get_rng_state()), "build leaked RNG state"
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert s1.keys() == s2.keys()
    for k in s1:
        assert s1[k].dtype == s2[k].dtype
        assert torch.equal(s1[k], s2[k]), k
    _assert_tree_equal(fx.make_inputs(BATCH), fx.make_inputs(BATCH))
    assert m1.training


@pytest.mark.parametrize("name", NAMES)
def test_eager_forward_backward(name: str) -> None:
    fx = zoo.get(name)
    model = fx.make_model()
    out = _run(fx, model)
    loss = _loss(out)
    assert loss.dim() == 0 and loss.dtype == torch.float32
    assert math.isfinite(loss.item())
    if isinstance(out, tuple):
        _, parts = out
        assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in parts.values())
    loss.backward()
    unused = UNUSED.get(name, set())
    for pname, p in model.named_parameters():
        assert p.dtype == torch.float32
        if not p.requires_grad or pname in unused:
            assert p.grad is None, pname
        else:
            assert p.grad is not None, pname
            assert torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", NAMES)
def test_dropout_flag(name: str) -> None:
    fx = zoo.get(name)
    model = fx.make_model()
    with torch.no_grad():
        a = _loss(_run(fx, model, seed=0))
        b = _loss(_run(fx, model, seed=0))
        c = _loss(_run(fx, model, seed=1))
    assert torch.equal(a, b)
    assert (not torch.equal(a, c)) == fx.has_dropout
    assert any(isinstance(m, nn.Dropout) for m in model.modules()) == fx.has_dropout


@pytest.mark.parametrize("name", NAMES)
def test_buffers_updated_flag(name: str) -> None:
    fx = zoo.get(name)
    model = fx.make_model()
    before = {k: v.clone() for k, v in model.named_buffers()}
    with torch.no_grad():
        _run(fx, model)
    changed = any(not torch.equal(before[k], v) for k, v in model.named_buffers())
    assert changed == fx.has_buffers_updated


def test_nested_inputs_structure() -> None:
    inputs = zoo.get("nested_inputs").make_inputs(BATCH)
    assert inputs["scale"] == 0.5 and inputs["mode"] == "sum"
    assert inputs["flag"] is True and inputs["none_leaf"] is None
    assert isinstance(inputs["batch"]["aux"], list) and len(inputs["batch"]["aux"]) == 2
    loss, parts = zoo.get("nested_inputs").train_fn(zoo.get("nested_inputs").make_model(), **inputs)
    assert set(parts) == {"mse", "reg"}
    torch.testing.assert_close(loss, parts["mse"] + 0.5 * parts["reg"])


def test_unused_and_frozen() -> None:
    model = zoo.get("unused_param").make_model()
    assert not model.frozen_scale.requires_grad
    assert model.unused.weight.requires_grad


@pytest.mark.parametrize("name", ["tiny_lm", "gpt2_small"])
def test_tied_embeddings(name: str) -> None:
    model = zoo.get(name).make_model()
    assert model.lm_head.weight is model.wte.weight
    names = {n for n, _ in model.named_parameters()}
    assert "wte.weight" in names and "lm_head.weight" not in names


def test_shared_submodule() -> None:
    model = zoo.get("shared_submodule").make_model()
    assert model.a is model.b
    assert not any(n.startswith("b.") for n, _ in model.named_parameters())


def test_input_shapes() -> None:
    lm = zoo.get("tiny_lm").make_inputs(BATCH)
    assert lm["input_ids"].shape == (BATCH, 8) and lm["input_ids"].dtype == torch.int64
    assert torch.equal(lm["input_ids"][:, 1:], lm["labels"][:, :-1])
    cnn = zoo.get("cnn_bn").make_inputs(BATCH)
    assert cnn["images"].shape == (BATCH, 3, 8, 8) and cnn["labels"].dtype == torch.int64
    mlp = zoo.get("mlp").make_inputs(BATCH)
    assert mlp["x"].shape == (BATCH, 16) and mlp["y"].shape == (BATCH, 4)


def test_meta_mlp() -> None:
    model = zoo.make_meta_mlp()
    ref = zoo.get("mlp").make_model()
    params = dict(model.named_parameters())
    assert params.keys() == dict(ref.named_parameters()).keys()
    assert all(p.is_meta for p in params.values())


def test_make_gpt2_default_shape() -> None:
    with torch.device("meta"):
        model = zoo.make_gpt2()
    assert len(model.h) == 12 and model.wte.weight.shape == (1024, 256)
    assert model.wpe.weight.shape == (64, 256)
