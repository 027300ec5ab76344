"""Flattening, describing and checking the user's inputs and the model state.

Inputs are a dict whose leaves are tensors or Python constants, nested in
lists, tuples and dicts. Tensor leaves become graph placeholders; constants
are baked into the graph at trace time, so a later call must pass the same
value. Everything here keeps metadata only (shapes, dtypes, devices), never
tensor storage, so a traced graph does not pin its sample inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from jointlab.errors import (
    InputMismatchError,
    InputStructureError,
    InputTypeError,
    MetaDeviceError,
    StateMismatchError,
)
from jointlab.torch_compat import pytree

CONSTANT_TYPES = (int, float, bool, str, type(None))


def key_to_str(key: Any) -> str:
    """Render one pytree key path entry as a dotted-path component."""
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def path_to_str(path: tuple) -> str:
    """Render a pytree key path as ``"batch.aux.0"``."""
    return ".".join(key_to_str(k) for k in path)


@dataclass(frozen=True)
class LeafSpec:
    """Storage-free description of one input leaf."""

    path: str
    is_tensor: bool
    shape: tuple[int, ...] = ()
    dtype: torch.dtype | None = None
    device: torch.device | None = None
    value: Any = None
    #: A tensor input traced with ``requires_grad=True`` (the graph returns its gradient).
    requires_grad: bool = False
    #: The FQN of the parameter or buffer this input is (``inputs={"w": model.weight}``).
    state_alias: str = ""
    #: The earlier input path this one is the same tensor as (inputs requiring grad only).
    input_alias: str = ""

    def describe(self) -> str:
        """Return a short human-readable description."""
        if self.is_tensor:
            return f"tensor{list(self.shape)} {self.dtype} on {self.device}"
        return f"{type(self.value).__name__} {self.value!r}"


@dataclass(frozen=True)
class InputSpec:
    """Structure and leaf descriptions of the inputs seen at trace time."""

    treespec: pytree.TreeSpec
    leaves: tuple[LeafSpec, ...]

    @property
    def tensor_leaves(self) -> tuple[LeafSpec, ...]:
        """Leaves that are graph inputs, in placeholder order."""
        return tuple(leaf for leaf in self.leaves if leaf.is_tensor)


def flatten_inputs(inputs: Any) -> tuple[list[tuple[str, Any]], pytree.TreeSpec]:
    """Flatten ``inputs`` into ``(dotted path, leaf)`` pairs and a treespec.

    Args:
        inputs: The keyword-argument dict passed to ``train_fn``.

    Returns:
        The leaves with their dotted paths, and the pytree spec.

    Raises:
        InputTypeError: ``inputs`` is not a dict, or a leaf has an unsupported type.
    """
    if not isinstance(inputs, dict):
        raise InputTypeError(
            f"inputs must be a dict of keyword arguments for train_fn, got "
            f"{type(inputs).__name__}. Pass e.g. {{'x': x, 'y': y}}."
        )
    pairs, spec = pytree.tree_flatten_with_path(inputs)
    leaves = [(path_to_str(p), v) for p, v in pairs]
    for path, leaf in leaves:
        check_leaf_type(path, leaf)
    return leaves, spec


def check_leaf_type(path: str, leaf: Any) -> None:
    """Reject leaves that cannot become a graph input or a baked-in constant."""
    if isinstance(leaf, nn.Module):
        raise InputTypeError(
            f"input '{path}' is an nn.Module ({type(leaf).__name__}). Modules cannot be "
            "graph inputs: reach them through the model, or capture them in train_fn's "
            "closure."
        )
    if not isinstance(leaf, (torch.Tensor, *CONSTANT_TYPES)):
        raise InputTypeError(
            f"input '{path}' has unsupported type {type(leaf).__module__}."
            f"{type(leaf).__qualname__}. Input leaves must be tensors, int, float, bool, "
            "str or None, nested in dicts, lists or tuples. Convert it, or capture it in "
            "train_fn's closure."
        )


def describe_inputs(leaves: list[tuple[str, Any]], spec: pytree.TreeSpec,
                    aliases: dict[str, tuple[str, str]] | None = None) -> InputSpec:
    """Build an :class:`InputSpec` without keeping any tensor storage alive.

    Args:
        leaves: The flattened ``(path, leaf)`` inputs.
        spec: Their pytree spec.
        aliases: Inputs that are a state tensor or an earlier input
            (:func:`jointlab.input_grads.input_aliases`).

    Returns:
        The description, ``requires_grad`` and aliases included.
    """
    out = []
    aliases = aliases or {}
    for path, leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            kind, target = aliases.get(path, ("", ""))
            out.append(LeafSpec(path, True, tuple(leaf.shape), leaf.dtype, leaf.device,
                                requires_grad=leaf.requires_grad,
                                state_alias=target if kind == "state" else "",
                                input_alias=target if kind == "input" else ""))
        else:
            out.append(LeafSpec(path, False, value=leaf))
    return InputSpec(spec, tuple(out))


def _paths_of(spec: pytree.TreeSpec) -> list[str]:
    dummy = pytree.tree_unflatten([0] * spec.num_leaves, spec)
    return [path_to_str(p) for p, _ in pytree.tree_flatten_with_path(dummy)[0]]


def check_structure(spec: InputSpec, given: pytree.TreeSpec) -> None:
    """Raise :class:`InputStructureError` naming missing or extra input paths."""
    if given == spec.treespec:
        return
    want, got = _paths_of(spec.treespec), _paths_of(given)
    missing = [p for p in want if p not in got]
    extra = [p for p in got if p not in want]
    parts = []
    if missing:
        parts.append(f"missing: {', '.join(missing)}")
    if extra:
        parts.append(f"unexpected: {', '.join(extra)}")
    if not parts:
        parts.append("same leaves, but different container types or key order")
    raise InputStructureError(
        "inputs do not have the structure the graph was traced with ("
        + "; ".join(parts)
        + "). Pass the same keys and nesting as at trace time, or trace again."
    )


def check_leaves(
    spec: InputSpec, leaves: list[tuple[str, Any]], dynamic_dims: dict[str, set[int]]
) -> None:
    """Check each given leaf against the traced one.

    Args:
        spec: The trace-time description.
        leaves: The given ``(path, leaf)`` pairs, same structure as ``spec``.
        dynamic_dims: For dynamic traces, the dims of each path that may vary
            (checked later by the shape guards). Every other dim must match.

    Raises:
        InputTypeError: A leaf changed between tensor and constant, or has a bad type.
        InputMismatchError: requires_grad, a dtype, device, rank, static size or constant
            differs.
    """
    for want, (path, leaf) in zip(spec.leaves, leaves):
        check_leaf_type(path, leaf)
        if want.is_tensor != isinstance(leaf, torch.Tensor):
            raise InputTypeError(
                f"input '{path}' was traced as {want.describe()} but got "
                f"{type(leaf).__name__}. Pass the same kind of value, or trace again."
            )
        if not want.is_tensor:
            if type(leaf) is not type(want.value) or leaf != want.value:
                raise InputMismatchError(
                    f"input '{path}' was baked into the graph as {want.value!r} at trace "
                    f"time but got {leaf!r}. Python constants cannot change after "
                    "tracing: trace again with the new value, or pass it as a tensor."
                )
            continue
        _check_tensor(path, want, leaf, dynamic_dims.get(path, set()))


def _check_tensor(path: str, want: LeafSpec, leaf: torch.Tensor, dyn: set[int]) -> None:
    if leaf.requires_grad != want.requires_grad:
        returns = ("returns its gradient in result.input_grads" if want.requires_grad
                   else "returns no gradient for it")
        raise InputMismatchError(
            f"input '{path}' has requires_grad={leaf.requires_grad}, but the graph was traced "
            f"with requires_grad={want.requires_grad} (it {returns}). Pass it as at trace time "
            f"(x.requires_grad_({want.requires_grad}) on a leaf, .detach() otherwise) or trace "
            "again.")
    if leaf.dtype != want.dtype:
        raise InputMismatchError(
            f"input '{path}' has dtype {leaf.dtype}, but the graph was traced for "
            f"{want.dtype}. Cast it (.to({want.dtype})) or trace again."
        )
    if leaf.device != want.device:
        raise InputMismatchError(
            f"input '{path}' is on {leaf.device}, but the graph was traced for "
            f"{want.device}. Move it (.to('{want.device}')) or trace again on that device."
        )
    if leaf.dim() != len(want.shape):
        raise InputMismatchError(
            f"input '{path}' has rank {leaf.dim()} (shape {list(leaf.shape)}), but the "
            f"graph was traced for rank {len(want.shape)} (shape {list(want.shape)})."
        )
    for d, (w, g) in enumerate(zip(want.shape, leaf.shape)):
        if d in dyn or w == g:
            continue
        hint = (
            "Trace with dynamic=True or dynamic_arg_dims to serve other sizes."
            if not dyn
            else "This dim is static in the trace."
        )
        raise InputMismatchError(
            f"input '{path}' has shape {list(leaf.shape)}, but the graph was traced for "
            f"{list(want.shape)} (dim {d}: expected {w}, got {g}). A static graph can be "
            f"silently wrong on other sizes, so jointlab refuses. {hint}"
        )


@dataclass(frozen=True)
class StateSpec:
    """Names and metadata of the parameters and buffers fed to the graph."""

    fqns: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    devices: tuple[torch.device, ...]
    is_param: tuple[bool, ...]


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Return parameters then buffers, each tensor once (tied weights deduplicated)."""
    state: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=True))
    state.update(model.named_buffers(remove_duplicate=True))
    return state


def state_on_meta(model: nn.Module) -> bool:
    """True when the model's parameters or buffers live on the meta device (no data)."""
    return any(t.device.type == "meta" for t in model_state(model).values())


def describe_state(model: nn.Module) -> StateSpec:
    """Describe the model's state in placeholder order."""
    state = model_state(model)
    params = {id(p) for p in model.parameters()}
    vals = list(state.values())
    return StateSpec(
        tuple(state),
        tuple(tuple(v.shape) for v in vals),
        tuple(v.dtype for v in vals),
        tuple(v.device for v in vals),
        tuple(id(v) in params for v in vals),
    )


def check_state(spec: StateSpec, model: nn.Module) -> list[torch.Tensor]:
    """Check the live model against the traced state; return its state tensors.

    Raises:
        StateMismatchError: Names, shapes, dtypes or devices differ from trace time.
        MetaDeviceError: The state lives on the meta device and holds no data.
    """
    state = model_state(model)
    names = tuple(state)
    if names != spec.fqns:
        missing = [n for n in spec.fqns if n not in state]
        extra = [n for n in names if n not in spec.fqns]
        detail = f"missing {missing}, unexpected {extra}" if missing or extra else "order"
        raise StateMismatchError(
            f"the model's parameters and buffers differ from trace time ({detail}). "
            "Was the model edited after tracing? Trace it again."
        )
    tensors = list(state.values())
    for i, (name, t) in enumerate(zip(names, tensors)):
        if t.device.type == "meta":
            raise MetaDeviceError(
                f"'{name}' is on the meta device, so it has no data to run with. "
                "Tracing, tables and memory prediction work on meta models; to run, "
                "materialize real weights (e.g. model.to_empty(device='cpu') and "
                "initialize them)."
            )
        if tuple(t.shape) != spec.shapes[i] or t.dtype != spec.dtypes[i]:
            raise StateMismatchError(
                f"'{name}' is now {list(t.shape)} {t.dtype}; it was traced as "
                f"{list(spec.shapes[i])} {spec.dtypes[i]}. Trace the edited model again."
            )
        if t.device != spec.devices[i]:
            raise StateMismatchError(
                f"'{name}' is on {t.device}; it was traced on {spec.devices[i]}. "
                "Move the model back, or trace it again on the new device."
            )
    return tensors


def tensor_leaves(out: Any) -> list[torch.Tensor]:
    """The tensor leaves of a module's output, in pytree order (both sides use this)."""
    return [v for v in pytree.tree_leaves(out) if isinstance(v, torch.Tensor)]
