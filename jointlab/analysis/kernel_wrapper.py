"""Inductor's generated wrapper read and instrumented for the kernel-by-kernel probe.

:func:`kernel_calls` finds every kernel call of the wrapper's ``call`` by its
provenance handle (``# [Provenance debug handles] cpp_fused_mul_3:7``) and
the buffers it writes: the non-``const`` pointer arguments of a C++ kernel,
``out=`` of an extern call, an assigned result and the items picked from it.
:func:`unprobed_writes` names the buffers other lines of ``call`` may write
(never compared), and :func:`instrumented_call` builds ``call`` with a probe
after each kernel call. :mod:`jointlab.analysis.kernel_probe` runs it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["KernelCall", "instrumented_call", "kernel_calls", "unprobed_writes"]

_HANDLE = re.compile(r"^(\s*)# \[Provenance debug handles\] (\S+)\s*$")
_SIGNATURE = re.compile(r"^(\w+) = async_compile\.cpp_pybinding\((\[.*?\]), r'''", re.M)
_BUF = re.compile(r"\b(buf\d+)\b")
_ASSIGN = re.compile(r"^\s*(buf\d+) = ")
_ITEM = re.compile(r"^\s*(buf\d+) = (buf\d+)\[\d+\]\s*$")


@dataclass(frozen=True)
class KernelCall:
    """One kernel call of the generated wrapper: its handle, line and written buffers."""

    kernel: str
    line: int
    writes: tuple[str, ...]
    indent: str = ""
    start: int = 0  # the line of its provenance handle


def _written(call: str, signatures: dict[str, list[str]]) -> list[str]:
    """Buffers a kernel-call line writes (non-const pointers, ``out=``, assignment)."""
    if m := re.search(r"\bout=(buf\d+)\b", call):
        return [m.group(1)]
    if m := _ASSIGN.match(call):
        return [m.group(1)]
    name = call.strip().split("(", 1)[0]
    sig = signatures.get(name)
    if sig is None:  # an unknown call may mutate any buffer it is given
        return list(dict.fromkeys(_BUF.findall(call)))
    args = [a.strip() for a in call.strip()[len(name) + 1:].rsplit(")", 1)[0].split(",")]
    return [a for a, t in zip(args, sig) if _BUF.fullmatch(a) and not t.startswith("const")]


def kernel_calls(source_code: str) -> list[KernelCall]:
    """Every kernel call of Inductor's Python wrapper, in the order it runs them.

    Args:
        source_code: Inductor's generated module.

    Returns:
        One :class:`KernelCall` per provenance handle; ``line`` is where its probe goes.
    """
    signatures = {m.group(1): ast.literal_eval(m.group(2))
                  for m in _SIGNATURE.finditer(source_code)}
    lines = source_code.splitlines()
    calls = []
    for i, line in enumerate(lines):
        m = _HANDLE.match(line)
        if m is None or i + 1 >= len(lines):
            continue
        writes, end = _written(lines[i + 1], signatures), i + 1
        while end + 1 < len(lines) and (_ITEM.match(lines[end + 1])
                                        or lines[end + 1].strip().startswith("assert_")):
            if item := _ITEM.match(lines[end + 1]):
                writes.append(item.group(1))
            end += 1
        calls.append(KernelCall(m.group(2), end, tuple(writes), m.group(1), i))
    return calls


_PLAIN = re.compile(r"^\s*(#|del |return|assert_|buf\d+ = (buf\d+|empty_strided\w*\(|"
                    r"reinterpret_tensor\(|buf\d+\[))")


def unprobed_writes(source_code: str, calls: list[KernelCall]) -> set[str]:
    """Buffers a line of ``call`` other than a probed kernel call may write (never compared)."""
    lines = source_code.splitlines()
    probed = {i for c in calls for i in range(c.start, c.line + 1)}
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("def call("))
    except StopIteration:
        return set()
    out: set[str] = set()
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.strip() and not line.startswith(" " * 8) and not line.startswith("\t"):
            break
        if i not in probed and not _PLAIN.match(line) and "(" in line:
            out.update(_BUF.findall(line))
    return out


def instrumented_call(source_code: str, calls: list[KernelCall], probe: Any) -> Any:
    """Inductor's ``call`` with ``probe(kernel, {buffer: value})`` after each kernel call."""
    lines = source_code.splitlines()
    for c in sorted(calls, key=lambda c: c.line, reverse=True):
        bufs = ", ".join(f"{b!r}: {b}" for b in c.writes)
        lines.insert(c.line + 1, f"{c.indent}_jointlab_probe({c.kernel!r}, {{{bufs}}})")
    namespace: dict[str, Any] = {"__name__": "jointlab_kernel_probe",
                                 "_jointlab_probe": probe}
    exec(compile("\n".join(lines), "<jointlab kernel probe>", "exec"), namespace)  # noqa: S102
    return namespace["call"]
