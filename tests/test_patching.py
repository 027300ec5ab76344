"""jointlab.patching.patched, the one attribute patch: everything is put back as it was."""

from __future__ import annotations

import types

import pytest

from jointlab.patching import patched


class _Base:
    def inherited(self):
        return "base"


class _Owner(_Base):
    @staticmethod
    def helper():
        return "own"

    value = 1


def _state():
    return dict(vars(_Owner)), dict(vars(_Base))


def test_patched_restores_own_attributes_exactly_and_removes_inherited_ones():
    before = _state()
    with patched([(_Owner, "helper", lambda: "new"), (_Owner, "inherited", lambda self: "x"),
                  (_Owner, "value", 2)]):
        assert _Owner.helper() == "new" and _Owner().inherited() == "x" and _Owner.value == 2
    after = _state()
    assert after == before  # the staticmethod object itself, no copy of the inherited method
    assert isinstance(vars(_Owner)["helper"], staticmethod)
    assert "inherited" not in vars(_Owner)


def test_patched_undoes_everything_when_the_block_or_a_later_patch_raises():
    mod = types.ModuleType("m")
    mod.f = len
    with pytest.raises(RuntimeError), patched([(mod, "f", abs)]):
        raise RuntimeError("inside")
    assert mod.f is len

    class Frozen:
        __slots__ = ()

    with pytest.raises(AttributeError), patched([(mod, "f", abs), (Frozen(), "x", 1)]):
        pass
    assert mod.f is len  # the first patch was undone after the second failed
