"""Inductor's generated wrapper cut into one runnable piece per kernel call.

Inductor's wrapper runs every kernel of a compiled graph from one Python
function, ``call(args)``, in the order its comments number them
(``# [Provenance debug handles] cpp_fused_mul_3:7``). :func:`kernel_pieces`
parses that function (with :mod:`ast`, from the generated source) and cuts its
body at each kernel call, so piece ``k`` runs the allocations and buffer
reuses the generated code places before kernel ``k``, kernel ``k`` itself,
and its tail: the frees, checks, picked outputs and in-place fallbacks
(``bernoulli_``) that follow it. Running the pieces in order on one
namespace runs exactly the statements ``call`` runs, in the same order,
calling the same compiled kernels: nothing is recompiled and nothing falls
back to the uncompiled graph.

Each piece also lists the buffers its kernel writes, read from the code: for
C++ kernels the pointer arguments their signature does not mark ``const``;
for extern calls the ``out=`` buffer or the assigned result (and the outputs
picked from it); for in-place ATen fallbacks their first argument. Kernels
whose writes cannot be read this way (e.g. Triton launches) list none.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from types import CodeType

from jointlab.errors import CompiledGraphError

__all__ = ["KernelPiece", "call_arity", "kernel_pieces"]

_HANDLE = re.compile(r"#\s*\[Provenance debug handles\]\s*(\S+)\s*$")
OUTPUTS = "_jointlab_outputs"


@dataclass(frozen=True)
class KernelPiece:
    """The statements of the wrapper's ``call`` that run one kernel call.

    Attributes:
        kernel: The kernel call, ``name:call number`` as in the kernel map.
        code: The piece, compiled (run with ``exec`` on the shared namespace).
        writes: Buffer names the kernel writes (empty where the code does not say).
        last: True for the final piece (it sets the outputs).
    """

    kernel: str
    code: CodeType
    writes: tuple[str, ...]
    last: bool


def _call_function(source: ast.Module) -> ast.FunctionDef:
    """The wrapper's ``call``: ``Runner.call`` (or a module-level ``call``)."""
    for node in source.body:
        if isinstance(node, ast.ClassDef) and node.name == "Runner":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "call":
                    return item
        if isinstance(node, ast.FunctionDef) and node.name == "call":
            return node
    raise CompiledGraphError(
        "cannot step this compiled graph: Inductor's generated wrapper has no call() "
        "function jointlab recognises, so its kernels cannot be run one at a time.")


def call_arity(source_code: str) -> int | None:
    """How many args the wrapper's ``call`` unpacks (``arg0_1, ..., argN = args``), or None."""
    body = _flat_body(_call_function(ast.parse(source_code)).body)
    for stmt in body:
        if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name)
                and stmt.value.id == "args" and isinstance(stmt.targets[0], ast.Tuple)):
            return len(stmt.targets[0].elts)
    return None


def _is_device_guard(stmt: ast.stmt) -> bool:
    """True for ``with torch.cuda._DeviceGuard(i):``, which wraps a GPU wrapper's body."""
    return (isinstance(stmt, ast.With) and len(stmt.items) == 1
            and "_DeviceGuard" in ast.unparse(stmt.items[0].context_expr))


def _flat_body(body: list[ast.stmt]) -> list[ast.stmt]:
    """``call``'s statements, a GPU device guard's body inlined (its ``set_device`` stays)."""
    out: list[ast.stmt] = []
    for stmt in body:
        out.extend(_flat_body(stmt.body) if _is_device_guard(stmt) else [stmt])
    return out


def _signatures(source: ast.Module) -> dict[str, list[str]]:
    """``kernel name -> C++ argument types`` from ``async_compile.cpp_pybinding([...], ...)``."""
    out: dict[str, list[str]] = {}
    for node in source.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        func, args = node.value.func, node.value.args
        if (isinstance(func, ast.Attribute) and func.attr == "cpp_pybinding" and args
                and isinstance(args[0], ast.List) and isinstance(node.targets[0], ast.Name)):
            out[node.targets[0].id] = [getattr(e, "value", "") for e in args[0].elts]
    return out


def _base_name(arg: ast.expr) -> str | None:
    """``buf3`` for ``buf3`` or ``reinterpret_tensor(buf3, ...)``; None otherwise."""
    if isinstance(arg, ast.Name):
        return arg.id
    if isinstance(arg, ast.Call) and arg.args and isinstance(arg.func, ast.Name) \
            and arg.func.id == "reinterpret_tensor":
        return _base_name(arg.args[0])
    return None


def _is_inplace_op(call: ast.Call) -> bool:
    """True for ``torch.ops.aten.<name>_.<overload>(...)`` (an in-place ATen op)."""
    func = call.func
    return (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute)
            and ast.unparse(func).startswith("torch.ops.") and func.value.attr.endswith("_"))


def _kernel_writes(stmt: ast.stmt, sigs: dict[str, list[str]]) -> list[str]:
    """Buffers the kernel call ``stmt`` writes (see the module docstring)."""
    if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
        return [stmt.targets[0].id]
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not isinstance(call, ast.Call):
        return []
    out = [_base_name(k.value) for k in call.keywords if k.arg == "out"]
    if isinstance(call.func, ast.Name) and call.func.id in sigs:
        types = sigs[call.func.id]
        out += [_base_name(a) for a, t in zip(call.args, types)
                if t.endswith("*") and "const" not in t]
    return [n for n in out if n]


def _is_tail(stmt: ast.stmt, written: list[str]) -> bool:
    """True for what belongs to the kernel just called: frees, checks, picks, in-place ops."""
    if isinstance(stmt, ast.Delete):
        return True
    if isinstance(stmt, ast.Assign):  # buf9 = buf8[0]
        return (isinstance(stmt.value, ast.Subscript)
                and _base_name(stmt.value.value) in written)
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not isinstance(call, ast.Call):
        return False
    if isinstance(call.func, ast.Name) and call.func.id.startswith("assert_"):
        return True
    return _is_inplace_op(call) and bool(call.args) and _base_name(call.args[0]) in written


def _tail(body: list[ast.stmt], at: int, stop: int,
          sigs: dict[str, list[str]]) -> tuple[int, list[str]]:
    """End of the kernel call at ``at`` and its tail, and every buffer they write.

    The tail is what follows the call and belongs to it (frees, checks, outputs
    picked from its result, in-place fallbacks on what it wrote). The allocations
    and buffer reuses the generated code places before the next kernel go to the
    next piece, so at a stop every buffer the kernel wrote is still held under its
    own name. The tail ends at ``stop`` (the next kernel call) at the latest.
    """
    written = _kernel_writes(body[at], sigs)
    end = at + 1
    while end < stop and _is_tail(body[end], written):
        stmt = body[end]
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            written.append(stmt.targets[0].id)
        end += 1
    return end, written


def _starts(body: list[ast.stmt], lines: list[str]) -> list[tuple[str, int]]:
    """``(kernel, index of its call statement)`` for every handle comment, in code order."""
    handles = [(i + 1, m.group(1)) for i, text in enumerate(lines)
               if (m := _HANDLE.search(text))]
    first = body[0].lineno
    last = body[-1].end_lineno or body[-1].lineno
    found = []
    for line, kernel in handles:
        if not first <= line <= last:
            continue
        index = next((i for i, s in enumerate(body) if s.lineno > line), None)
        if index is not None:
            found.append((kernel, index))
    return found


def kernel_pieces(source_code: str) -> list[KernelPiece]:
    """Cut the wrapper's ``call`` into one :class:`KernelPiece` per kernel call.

    Args:
        source_code: Inductor's generated wrapper (``compiled.compiled.source_code``).

    Returns:
        The pieces in the order ``call`` runs them; together they are ``call``'s body,
        with its ``return`` turned into an assignment of the outputs.

    Raises:
        jointlab.errors.CompiledGraphError: No ``call`` function, no kernel handles
            (provenance tracking was off), or a ``return`` before the end.
    """
    tree = ast.parse(source_code)
    body = _flat_body(_call_function(tree).body)
    starts = _starts(body, source_code.splitlines())
    ret = body[-1]
    if not starts or not isinstance(ret, ast.Return) or any(
            isinstance(s, ast.Return) for s in body[:-1]):
        raise CompiledGraphError(
            "cannot step this compiled graph: its generated code carries no kernel "
            "handles (Inductor's provenance tracking was off) or returns early. Compile "
            "with joint.compile('inductor') on a static-shape graph.")
    body[-1] = ast.copy_location(
        ast.Assign(targets=[ast.Name(OUTPUTS, ast.Store())], value=ret.value), ret)
    sigs = _signatures(tree)
    stops = [at for _, at in starts[1:]] + [len(body)]
    tails = [_tail(body, at, stop, sigs) for (_, at), stop in zip(starts, stops)]
    ends, writes = [e for e, _ in tails], [w for _, w in tails]
    bounds = [0] + ends[:-1] + [len(body)]
    pieces = []
    for k, (kernel, _) in enumerate(starts):
        stmts = body[bounds[k]:bounds[k + 1]]
        module = ast.fix_missing_locations(ast.Module(body=stmts, type_ignores=[]))
        code = compile(module, f"<inductor kernel {kernel}>", "exec")
        pieces.append(KernelPiece(kernel, code, tuple(writes[k]), k == len(starts) - 1))
    return pieces
