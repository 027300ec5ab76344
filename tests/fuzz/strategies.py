"""Composable hypothesis strategies for fuzz model specs (see tests/fuzz/models.py).

Each block kind is its own strategy; :func:`blocks` nests them in residual
branches, and :func:`model_specs` adds the stem, head, dtype, sizes and the
shape of the inputs. Specs are plain dicts, so shrinking removes blocks,
flattens residuals and lowers sizes one field at a time.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def _block(kind: str, **fields: st.SearchStrategy) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"kind": st.just(kind), "frozen": st.booleans(), **fields})


def linear() -> st.SearchStrategy[dict[str, Any]]:
    """A Linear(d, d), with or without bias."""
    return _block("linear", bias=st.booleans())


def conv1d() -> st.SearchStrategy[dict[str, Any]]:
    """A same-padded Conv1d over the sequence."""
    return _block("conv1d", k=st.sampled_from([1, 3]))


def conv2d() -> st.SearchStrategy[dict[str, Any]]:
    """A same-padded (k, 1) Conv2d over the sequence."""
    return _block("conv2d", k=st.sampled_from([1, 3]))


def norm() -> st.SearchStrategy[dict[str, Any]]:
    """BatchNorm (running stats updated in forward) or LayerNorm."""
    return st.one_of(_block("batchnorm", affine=st.booleans()),
                     _block("layernorm", affine=st.booleans()))


def attention() -> st.SearchStrategy[dict[str, Any]]:
    """SDPA self-attention: plain, causal, or with a boolean mask from the inputs."""
    return _block("attention", heads=st.sampled_from([1, 2]), causal=st.booleans(),
                  masked=st.booleans())


def pointwise() -> st.SearchStrategy[dict[str, Any]]:
    """Activations, dropout, torch.where, in-place ops, reshape/permute and slicing."""
    return st.one_of(
        _block("act", fn=st.sampled_from(["gelu", "silu", "relu"])),
        _block("dropout", p=st.sampled_from([0.1, 0.5])),
        _block("where"),
        _block("inplace", scale=st.sampled_from([0.5, 2.0]), relu=st.booleans()),
        _block("reshape"),
        _block("slice"),
    )


def random_ops() -> st.SearchStrategy[dict[str, Any]]:
    """Random ops beyond dropout: noise injection, stochastic depth, RReLU, a feature shuffle."""
    return st.one_of(
        _block("noise", op=st.sampled_from(["randn_like", "rand_like", "normal", "uniform_",
                                            "exponential_", "bernoulli"])),
        _block("stochastic_depth", p=st.sampled_from([0.2, 0.5])),
        _block("rrelu"),
        _block("shuffle"),
    )


def stateful() -> st.SearchStrategy[dict[str, Any]]:
    """A buffer updated in forward, or the model-wide shared Linear."""
    return st.one_of(_block("ema_buffer"), _block("shared"))


def leaf_blocks() -> st.SearchStrategy[dict[str, Any]]:
    """Any non-nesting block."""
    return st.one_of(linear(), pointwise(), norm(), attention(), conv1d(), conv2d(), stateful(),
                     random_ops())


def blocks(max_leaves: int = 6) -> st.SearchStrategy[dict[str, Any]]:
    """Blocks, possibly nested in residual branches."""
    return st.recursive(
        leaf_blocks(),
        lambda inner: _block("residual", body=st.lists(inner, min_size=1, max_size=2)),
        max_leaves=max_leaves,
    )


def model_specs(dtypes: tuple[str, ...] = ("float32", "float64")
                ) -> st.SearchStrategy[dict[str, Any]]:
    """A full model spec: architecture, dtype, sizes, inputs and batch sizes."""
    return st.fixed_dictionaries({
        "seed": st.integers(0, 2**16),
        "dtype": st.sampled_from(dtypes),
        "d": st.sampled_from([4, 8]),
        "d_in": st.integers(2, 5),
        "d_out": st.integers(1, 3),
        "vocab": st.integers(5, 11),
        "seq": st.integers(2, 5),
        "tokens": st.booleans(),
        "tied": st.booleans(),
        "unused": st.booleans(),
        "alias_first": st.booleans(),
        "nested": st.booleans(),
        "scale": st.sampled_from([0.0, 0.1, 0.5]),
        "blocks": st.lists(blocks(), min_size=1, max_size=4),
        "batch": st.integers(2, 4),
        "batch2": st.integers(2, 6),
        "dynamic": st.booleans(),
    })
