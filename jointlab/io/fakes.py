"""The fake ``meta["val"]`` values of an archived graph: written as specs, rebuilt on load.

Format versions 2 and 3 record every node's value: each tensor's shape, stride,
storage offset, dtype, device and the index of its storage, plus each
storage's size in bytes. :func:`rebuild_vals` rebuilds them directly: one
meta-device storage per index, every tensor a view of its storage wrapped as a
fake tensor of the recorded device. Views therefore share storage exactly as
in the traced graph, and no op runs (fake propagation of a big graph costs
about a quarter of its trace time; this costs a few per cent).

Version 1 archives hold only the placeholders' specs; their values are rebuilt
by fake propagation through the graph, as before. Graphs with symbolic sizes
keep no values in either version (their analysis keys are archived anyway).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from jointlab.errors import PersistError
from jointlab.io.codec import decode_device, decode_dtype
from jointlab.passes.restore import restore_vals
from jointlab.torch_compat import FakeTensorMode, fake_tensor_maker, storage_id


# -- saving -----------------------------------------------------------------------------
def is_static(val: Any) -> bool:
    """True when a node value holds no symbolic size, stride or offset."""
    if isinstance(val, torch.Tensor):
        return not any(isinstance(s, torch.SymInt)
                       for s in (*val.shape, *val.stride(), val.storage_offset()))
    if isinstance(val, (list, tuple)):
        return all(is_static(v) for v in val)
    return not isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool))


def encode_vals(gm: fx.GraphModule) -> tuple[list[Any], list[int]] | None:
    """Every node's value spec and the storage sizes (None for a graph with symbolic sizes).

    Args:
        gm: A traced graph whose nodes carry fake ``meta["val"]``.

    Returns:
        ``(specs in node order, bytes of each storage)``, or None when some value is symbolic.
    """
    storages: dict[int, int] = {}
    sizes: list[int] = []
    specs = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if not is_static(val):
            return None
        specs.append(_spec(val, storages, sizes))
    return specs, sizes


def _spec(val: Any, storages: dict[int, int], sizes: list[int]) -> Any:
    if isinstance(val, torch.Tensor):
        sid = storage_id(val)
        if sid is None:
            return None
        if sid not in storages:
            storages[sid] = len(sizes)
            sizes.append(int(val.untyped_storage().nbytes()))
        return {"tensor": [list(val.shape), list(val.stride()), int(val.storage_offset()),
                           str(val.dtype).removeprefix("torch."), str(val.device),
                           storages[sid]]}
    if isinstance(val, (list, tuple)):
        return {"seq": "tuple" if isinstance(val, tuple) else "list",
                "items": [_spec(v, storages, sizes) for v in val]}
    if val is None or isinstance(val, (bool, int)):
        return {"value": val}
    return None  # a value jointlab does not rebuild (left out of meta, as v1 did)


def placeholder_spec(val: Any) -> Any:
    """Version 1's spec: shape/stride/dtype/device of a static tensor, else None."""
    if not isinstance(val, torch.Tensor) or not is_static(val):
        return None
    return {"shape": list(val.shape), "stride": list(val.stride()),
            "dtype": str(val.dtype).removeprefix("torch."), "device": str(val.device)}


# -- loading ----------------------------------------------------------------------------
def rebuild_vals(gm: fx.GraphModule, doc: dict[str, Any], version: int, dynamic: bool,
                 specs: list[Any]) -> None:
    """Set ``meta["val"]`` on ``gm``'s nodes from the archive (best effort; static only).

    The values are rebuilt here and written by :func:`jointlab.passes.restore.restore_vals`
    (version 1: by torch's fake propagation).

    Args:
        gm: The decoded graph.
        doc: graph.json.
        version: The archive's format version.
        dynamic: Whether the graph has dynamic dims (no values are rebuilt then).
        specs: Each node's recorded value spec (None where there is none), in node order.

    Raises:
        PersistError: A version-2 value spec is malformed.
    """
    nodes = list(gm.graph.nodes)
    if dynamic:
        return
    if version >= 2:
        if doc.get("storages") is not None:
            _build_direct(nodes, specs, doc["storages"])
        return
    placeholder_specs = [s for n, s in zip(nodes, specs) if n.op == "placeholder"]
    if all(s is not None for s in placeholder_specs):
        _propagate(gm, placeholder_specs)


def _build_direct(nodes: list[fx.Node], specs: list[Any], sizes: Any) -> None:
    if not isinstance(sizes, list) or not all(isinstance(b, int) and b >= 0 for b in sizes):
        raise PersistError("malformed storage sizes in graph.json")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    builder = _Builder(mode, sizes)
    try:
        vals = [builder.value(s) for s in specs]
    except PersistError:
        raise
    except (TypeError, ValueError, IndexError, RuntimeError) as exc:
        raise PersistError(f"malformed value spec in graph.json: {exc}") from exc
    restore_vals((node, val) for node, spec, val in zip(nodes, specs, vals) if spec is not None)


class _Builder:
    """Fake tensors from specs; one meta storage per archived storage index.

    Each tensor is a strided view (``as_strided``) of a zero-size meta tensor of
    its dtype set on its storage, wrapped by :func:`fake_tensor_maker` (one per
    device; ``FakeTensor(mode, elem, device)`` made cheaper).
    """

    def __init__(self, mode: Any, sizes: list[int]) -> None:
        self.mode, self.sizes = mode, sizes
        self.storages: dict[int, Any] = {}
        self.bases: dict[tuple[int, str], torch.Tensor] = {}
        self.makers: dict[str, Any] = {}
        self.dtypes: dict[str, torch.dtype] = {}

    def value(self, spec: Any) -> Any:
        if spec is None:
            return None
        if not isinstance(spec, dict) or len(spec) not in (1, 2):
            raise PersistError(f"malformed value spec {str(spec)[:200]}")
        if "tensor" in spec:
            return self.tensor(*spec["tensor"])
        if "seq" in spec and spec["seq"] in ("tuple", "list"):
            items = [self.value(s) for s in spec["items"]]
            return tuple(items) if spec["seq"] == "tuple" else items
        if "value" in spec and (spec["value"] is None or isinstance(spec["value"], int)):
            return spec["value"]
        raise PersistError(f"malformed value spec {str(spec)[:200]}")

    def tensor(self, shape: list[int], stride: list[int], offset: int, dtype: str,
               device: str, index: int) -> torch.Tensor:
        base = self.bases.get((index, dtype))
        if base is None:
            base = self.bases[index, dtype] = self._base(index, dtype)
        if not fits_storage(shape, stride, offset, base.itemsize, self.sizes[index]):
            raise PersistError(f"malformed value spec: a tensor of shape {shape} at offset "
                               f"{offset} does not fit its storage of {self.sizes[index]} bytes")
        make = self.makers.get(device)
        if make is None:
            make = self.makers[device] = fake_tensor_maker(self.mode, decode_device(device))
        return make(base.as_strided(shape, stride, offset))

    def _base(self, index: int, dtype: str) -> torch.Tensor:
        if type(index) is not int or not 0 <= index < len(self.sizes):
            raise PersistError(f"malformed value spec: no storage {index!r}")
        if dtype not in self.dtypes:
            self.dtypes[dtype] = decode_dtype(dtype)
        if index not in self.storages:
            self.storages[index] = torch.empty(
                self.sizes[index], dtype=torch.uint8, device="meta").untyped_storage()
        return torch.empty(0, dtype=self.dtypes[dtype], device="meta").set_(
            self.storages[index], 0, [0], [1])


def fits_storage(shape: list[int], stride: list[int], offset: int, itemsize: int,
                 nbytes: int) -> bool:
    """True when a strided view lies inside a storage of ``nbytes`` bytes."""
    if len(shape) != len(stride) or offset < 0:
        return False
    last, empty = offset, False
    for size, step in zip(shape, stride):  # one loop: a load checks every tensor
        if size < 0:
            return False
        empty = empty or size == 0
        last += (size - 1) * abs(step)
    return empty or (last + 1) * itemsize <= nbytes


def _propagate(gm: fx.GraphModule, specs: list[dict[str, Any]]) -> None:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            fakes = [torch.empty_strided(s["shape"], s["stride"], dtype=decode_dtype(s["dtype"]),
                                         device=decode_device(s["device"])) for s in specs]
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    except Exception as exc:  # pragma: no cover - analysis keys are in the archive anyway
        warnings.warn(f"jointlab.load could not rebuild fake values ({exc}); running works, "
                      "but passes that need meta['val'] will not.", stacklevel=5)
