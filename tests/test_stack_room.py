"""with_stack_room: a deep call's frames stay in one chunk of CPython's frame stack.

The reference is the kernel's count of minor page faults (``getrusage``): a call
whose depth goes back and forth over more than one 16 KiB chunk maps a fresh
chunk on every descent without the room, and none with it.
"""

from __future__ import annotations

import platform
import resource
import sys

import pytest

from jointlab.runtime.stack_room import with_stack_room

pytestmark = pytest.mark.skipif(
    platform.python_implementation() != "CPython" or sys.version_info < (3, 11)
    or not sys.platform.startswith("linux"),
    reason="CPython >= 3.11's chunked frame stack, counted by Linux's getrusage")


def _descend(depth: int) -> int:
    return 0 if depth == 0 else 1 + _descend(depth - 1)


def _oscillate(times: int, depth: int) -> int:
    """Minor page faults while going ``depth`` frames down and back, ``times`` times."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(times):
        assert _descend(depth) == depth
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_deep_calls_fault_no_pages_inside_the_room():
    times, depth = 400, 300  # 300 frames: more than one 16 KiB chunk each descent
    _oscillate(2, depth)
    without = _oscillate(times, depth)
    with_room = with_stack_room(_oscillate, times, depth)
    assert without > times  # a fresh chunk (several pages) mapped on each descent
    assert with_room < times // 10, (without, with_room)


def test_returns_and_raises_as_the_call_does():
    assert with_stack_room(divmod, 7, 2) == (3, 1)
    assert with_stack_room(dict, a=1) == {"a": 1}
    with pytest.raises(ZeroDivisionError):
        with_stack_room(divmod, 1, 0)
