"""Save a joint graph as data, and read one back, never as pickled objects.

:func:`save` takes any :class:`jointlab.core.TracedGraph`; :func:`read`
returns :class:`jointlab.core.GraphParts`, which :func:`jointlab.load`
(in :mod:`jointlab.graph`) turns into a JointGraph. Neither imports the
graph class or a tracer: the AOT runtime plan is :class:`jointlab.runtime.AotRuntime`.

The archive is a zip file:

- ``format.json``: the format name and version.
- ``graph.json``: one record per node (op, name, target by qualified name,
  args/kwargs as tagged JSON with node references by name) and the JSON-safe
  part of its meta, ``meta["jointlab"]`` included (:mod:`jointlab.io.node_records`).
- ``layout.json``: mode, state and input specs (the input treespec through
  ``torch.utils._pytree.treespec_dumps``), parameter names, loss_dict keys,
  dynamic dims and the shape guards as sympy expression trees
  (:mod:`jointlab.io.layout_record`).
- ``constants.pt``: tensors held by ``get_attr`` nodes, written with
  ``torch.save`` and read with ``torch.load(weights_only=True)``.

Loading resolves targets only against :mod:`jointlab.io.codec`'s allow-list and
never evaluates code from the file. The fake ``meta["val"]`` values are
rebuilt from their recorded specs (:mod:`jointlab.io.fakes`); the decoded meta
and values are put on the nodes by :mod:`jointlab.passes.restore`. The graph module
generates its Python code when first run or read (:mod:`jointlab.io.deferred`).

Version 2 added every node's value spec with its storage, and stores each
meta value that repeats across nodes (stack traces, module stacks) once in
``graph.json``'s ``shared`` list, referenced from a node's ``shared_meta``.
Version 3 stores ``meta["jointlab"]`` as rows of values with their keys once
in ``jl_keys`` (:mod:`jointlab.io.node_records`). Version 4 is version 3 whose
input leaves may say ``requires_grad`` and which model tensor or earlier input
they are (``state_alias`` / ``input_alias``): the graph then also returns input
gradients, an output layout a version-3 reader would misread, so only such a
graph is written as version 4 and every other as version 3. Version 5 adds
``world`` to ``layout.json`` for a graph with functional collectives or DTensor
state (:class:`jointlab.runtime.saved_world.SavedWorld`: world size, the ranks
of each process group it names, its DTensor inputs' placements); such a graph
loads with a :class:`~jointlab.runtime.saved_world.WorldRuntime`, viewable
anywhere and run only inside a world of that size. Versions 1 to 4 are still read.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import zipfile
from typing import Any

import torch
import torch.fx as fx

from jointlab.core import GraphParts, TracedGraph
from jointlab.errors import PersistError
from jointlab.io.codec import (
    DOTTED,
    SharedValues,
    decode_callable,
    decode_shared,
    encode_target,
)
from jointlab.io.deferred import DeferredGraphModule
from jointlab.io.fakes import encode_vals, rebuild_vals
from jointlab.io.layout_record import decode_layout, encode_layout
from jointlab.io.node_records import (
    KeyTuples,
    decode_args,
    decode_keys,
    decode_meta,
    encode_args,
    encode_node_meta,
)
from jointlab.passes.analyze import require_analyzed
from jointlab.passes.restore import ARCHIVE_VERSION_KEY as ARCHIVE_VERSION_KEY  # jl.load reads it
from jointlab.passes.restore import mark_archive_version, restore_meta
from jointlab.runtime.gc_pause import collector_paused

FORMAT = "jointlab.joint-graph"
VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
#: Archives older than this carry analysis keys computed by an older rule
#: (``saved_for_backward`` per node, not per storage): the loader recomputes them.
CURRENT_ANALYSIS_SINCE = 2
MEMBERS = {"format.json", "graph.json", "layout.json", "constants.pt"}
NODE_OPS = ("placeholder", "call_function", "get_attr", "output")


def save(joint: TracedGraph, path: str) -> None:
    """Write ``joint`` to ``path`` as a pickle-free zip archive.

    Args:
        joint: A traced JointGraph.
        path: Destination file (conventionally ``*.jlg``).

    Everything is encoded first and written to a temporary file in the same
    folder, which replaces ``path`` only once complete: a failed save leaves no
    partial archive, and an existing ``path`` as it was.

    A graph with collectives (one rank of a distributed job) is saved with its
    world (:class:`~jointlab.runtime.saved_world.SavedWorld`), so save it inside
    that world; loaded, it can be viewed anywhere and runs only in a world of
    that size.

    Raises:
        PersistError: The graph holds a target or value that cannot be stored safely,
            or has collectives and no process group is initialised.
        StaleAnalysisError: The graph was edited since its analysis (``joint.recompute()``).
    """
    _write_atomically(os.fspath(path), _members(joint))


def archive_bytes(joint: TracedGraph) -> bytes:
    """The archive :func:`save` writes, as bytes (to send to another rank; :func:`read` reads it).

    Raises:
        PersistError: As :func:`save`.
        StaleAnalysisError: As :func:`save`.
    """
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in _members(joint).items():
            zf.writestr(name, data)
    return buf.getvalue()


def _members(joint: TracedGraph) -> dict[str, str | bytes]:
    """Each archive member's content, everything encoded (nothing written yet)."""
    require_analyzed(joint.graph_module)
    graph_doc, constants = _encode_graph(joint.graph_module)
    layout = encode_layout(joint)
    # The lowest version whose reader reads it right.
    version = 5 if "world" in layout else 4 if _input_grad_layout(joint) else 3
    members = {"format.json": json.dumps({"format": FORMAT, "version": version}),
               "graph.json": json.dumps(graph_doc),
               "layout.json": json.dumps(layout)}
    if constants:
        members["constants.pt"] = _constants_bytes(constants)
    return members


def _input_grad_layout(joint: TracedGraph) -> bool:
    """True when an input requires grad or aliases a tensor: version 4's layout."""
    return any(leaf.requires_grad or leaf.state_alias or leaf.input_alias
               for leaf in joint.input_spec.leaves)


def _constants_bytes(constants: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    try:
        torch.save(constants, buf)
    except Exception as exc:  # find the value torch could not write, for the message
        for name, value in constants.items():
            try:
                torch.save(value, io.BytesIO())
            except Exception:
                raise PersistError(
                    f"the graph constant '{name}' (a {type(value).__name__}) cannot be saved: "
                    f"{type(exc).__name__}: {exc}. Nothing was written.") from exc
        raise PersistError(f"the graph's constants cannot be saved: {exc}") from exc
    return buf.getvalue()


def _write_atomically(path: str, members: dict[str, str | bytes]) -> None:
    """Write the archive to a temporary file beside ``path``, then rename it over ``path``."""
    folder, base = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{base}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f, \
                zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name, data in members.items():
                zf.writestr(name, data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a saved graph is not
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read(path: str | bytes) -> GraphParts:
    """Read the parts of a graph written by :func:`save` (:func:`jointlab.load` builds it).

    Args:
        path: The archive, or its bytes (:func:`archive_bytes`).

    Returns:
        The graph module (node meta as archived, fake values rebuilt where
        static) and its layout; the AOT runtime plan included.

    Raises:
        PersistError: The file is not a jointlab archive, or holds anything
            outside the allow-lists (it is rejected before any code could run).
    """
    with collector_paused():  # a load makes ~100 objects a node and frees none of them
        return _read(path)


def _read(path: str | bytes) -> GraphParts:
    if isinstance(path, (bytes, bytearray)):
        path = io.BytesIO(path)  # type: ignore[assignment]
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise PersistError(f"{path!r} is not a jointlab graph archive (not a zip file). "
                           "jointlab never unpickles files; save with joint.save().") from exc
    with zf:
        names = set(zf.namelist())
        if not names <= MEMBERS or not {"format.json", "graph.json", "layout.json"} <= names:
            raise PersistError(f"{path!r} has unexpected members {sorted(names - MEMBERS)} "
                               f"or lacks required ones; expected {sorted(MEMBERS)}.")
        fmt = _json(zf, "format.json")
        if not (isinstance(fmt, dict) and set(fmt) == {"format", "version"}
                and fmt["format"] == FORMAT and fmt["version"] in READABLE_VERSIONS):
            raise PersistError(f"{path!r} is not a {FORMAT} archive of a version this "
                               f"jointlab reads {READABLE_VERSIONS}: {fmt!r}")
        constants = _load_constants(zf) if "constants.pt" in names else {}
        doc = _json(zf, "graph.json")
        gm, specs = _decode_graph(doc, constants, fmt["version"])
        parts = decode_layout(_json(zf, "layout.json"), gm)
    rebuild_vals(gm, doc, fmt["version"], bool(parts.dynamic_dims), specs)
    mark_archive_version(gm, fmt["version"])
    return parts


def _json(zf: zipfile.ZipFile, name: str) -> Any:
    try:
        return json.loads(zf.read(name).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PersistError(f"{name} in the archive is not valid JSON: {exc}") from exc


def _load_constants(zf: zipfile.ZipFile) -> dict[str, torch.Tensor]:
    try:
        data = torch.load(io.BytesIO(zf.read("constants.pt")), weights_only=True)
    except Exception as exc:  # the weights-only unpickler refuses any other object
        raise PersistError("constants.pt holds something other than plain tensors; refusing "
                           f"to load it (the file may have been crafted to run code): {exc}"
                           ) from exc
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in data.items()):
        raise PersistError("constants.pt must map names to tensors")
    return data


# -- the graph ----------------------------------------------------------------------
def _encode_graph(gm: fx.GraphModule) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    nodes, constants = [], {}
    shared, keys = SharedValues(), KeyTuples()
    vals = encode_vals(gm)
    specs = vals[0] if vals is not None else [None] * len(gm.graph.nodes)
    for node, spec in zip(gm.graph.nodes, specs):
        where = f"node '{node.name}' ({node.format_node()})"
        if node.op == "get_attr":
            constants[node.target] = _constant(gm, node)
        args, kwargs = encode_args(node, where)
        nodes.append({"op": node.op, "name": node.name, "target": encode_target(node),
                      "args": args, "kwargs": kwargs,
                      **encode_node_meta(node, shared, keys, where), "val": spec})
    storages = vals[1] if vals is not None else None
    return {"nodes": nodes, "shared": shared.values, "jl_keys": keys.values,
            "storages": storages}, constants


def _constant(gm: fx.GraphModule, node: fx.Node) -> torch.Tensor:
    obj = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, torch.Tensor):
        raise PersistError(f"get_attr node '{node.name}' reads a {type(obj).__name__}; only "
                           "tensor constants can be saved.")
    if type(obj) not in (torch.Tensor, torch.nn.Parameter):
        raise PersistError(
            f"get_attr node '{node.name}' reads the constant '{node.target}', a "
            f"{type(obj).__name__}, not a plain tensor: a value captured while tracing "
            "(check the BakedConstantWarning of jl.trace), which has no data to save. "
            "Nothing was written.")
    return obj.detach().clone() if not isinstance(obj, torch.nn.Parameter) else obj.data.clone()


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or DOTTED.fullmatch(name) is None:
        raise PersistError(f"invalid {what} {name!r} in the archive: names must be "
                           "Python identifiers (the file may have been tampered with)")
    return name


def _decode_graph(doc: Any, constants: dict[str, torch.Tensor],
                  version: int) -> tuple[fx.GraphModule, list[Any]]:
    """The archived graph and each node's value spec (None where it has none), in node order.

    Node meta is restored by :func:`jointlab.passes.restore.restore_meta`.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise PersistError("graph.json must hold a list of nodes")
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    metas: list[dict[str, Any]] = []
    specs: list[Any] = []

    def node_of(name: Any) -> fx.Node:
        if name not in env:
            raise PersistError(f"reference to unknown or later node {name!r}")
        return env[name]

    shared = decode_shared(doc.get("shared", []))
    keys = decode_keys(doc.get("jl_keys", []))
    for rec in doc["nodes"]:
        if not isinstance(rec, dict) or rec.get("op") not in NODE_OPS:
            raise PersistError(f"refusing node record {str(rec)[:200]}: op must be one of "
                               f"{NODE_OPS}")
        op, name = rec["op"], _check_name(rec.get("name"), "node name")
        if op == "call_function":
            target = decode_callable(rec.get("target"))
        elif op == "get_attr":
            target = _check_name(rec.get("target"), "attribute")
            if target not in constants:
                raise PersistError(f"get_attr node '{name}' reads missing constant {target!r}")
        else:
            target = _check_name(rec.get("target"), f"{op} target")
        args, kwargs = decode_args(rec, version, node_of)
        node = graph.create_node(op, target, name=name)
        if node.name != name:
            raise PersistError(f"duplicate or reserved node name {name!r} in the archive")
        # Set after creation: create_node scans args for raw SymInts, which JSON cannot hold.
        node.args = args
        if kwargs:
            node.kwargs = kwargs
        metas.append(decode_meta(rec, version, shared, keys))
        specs.append(rec.get("val"))
        env[name] = node
    restore_meta(graph, metas)
    try:
        graph.lint()
    except Exception as exc:
        raise PersistError(f"the archived graph is inconsistent: {exc}") from exc
    root = torch.nn.Module()
    for key, tensor in constants.items():
        _set_constant(root, key, tensor)
    return DeferredGraphModule(root, graph), specs  # code generated when first run or read


def _set_constant(root: torch.nn.Module, key: str, tensor: torch.Tensor) -> None:
    *path, leaf = _check_name(key, "constant name").split(".")
    mod = root
    for part in path:
        if not hasattr(mod, part):
            mod.add_module(part, torch.nn.Module())
        mod = getattr(mod, part)
    mod.register_buffer(leaf, tensor)
