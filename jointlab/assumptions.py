"""What a joint graph assumes about the Python state it was traced in.

A joint graph is a specialisation of ``train_fn``: tracing reads Python state
once and bakes what it read into the graph. A module's ``training`` flag picks
dropout or not; a parameter's ``requires_grad`` decides which gradients are
outputs; ``p``, ``eps`` or ``momentum`` become constants; autocast decides the
casts. Change any of them after tracing and the graph silently computes the
old step. :class:`Assumptions` records these facts at trace time and
:meth:`Assumptions.check` refuses a later call whose state differs, before
anything runs, naming the module or parameter, the traced value and the
value now.

Recorded (each row of :meth:`Assumptions.table`):

- ``training``: every module's ``training`` flag.
- ``requires_grad``: every parameter's ``requires_grad``.
- ``hyperparameter``: every public attribute of a module holding a plain
  number, string, bool or None (or a tuple of those): dropout ``p``,
  ``eps``, ``momentum``, ``inplace``, HF's ``attention_dropout``...
- ``global``: the process-wide settings this graph bakes (autocast per device
  type and its dtype; the SDPA backend flags where it holds an attention
  kernel; oneDNN where it holds oneDNN's LSTM layer; the default dtype where
  it creates a tensor without naming a dtype...): the table and each
  setting's predicate are in :mod:`jointlab.global_state`. Settings the
  graph's ops read as they run (deterministic algorithms, float32 matmul
  precision) are followed as eager follows them and are not recorded.
- ``rank``: every rank the user's code read while traced (``dist.get_rank()``,
  ``mesh.get_local_rank("tp")``...; :mod:`jointlab.runtime.rank_reads`), with
  the value read, the user's line and the world ranks that read the same
  value: the only ranks the graph may run as (a branch on the rank is baked).
  Also (attr ``"coordinate"``) each mesh coordinate torch's DTensor read to
  choose values (the chunk a ``Replicate -> Shard`` redistribute keeps, a
  vocab-parallel embedding's mask offset), sequence parallel's and torchtitan's
  plans among them.

Values are plain Python data, so the record is saved with the graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from jointlab.errors import AssumptionError
from jointlab.global_state import SETTINGS, advice, read_all, relevant

if TYPE_CHECKING:
    import pandas as pd
    import torch.fx as fx

__all__ = ["Assumption", "Assumptions", "global_settings", "model_facts"]

_PLAIN = (bool, int, float, str, type(None))
_ROOT = "<the model>"
_RETRACE = "The graph computes the step as traced; call jl.trace again with the model as it is now."
KINDS = ("training", "requires_grad", "hyperparameter", "global", "rank")


@dataclass(frozen=True)
class Assumption:
    """One fact the graph was traced under.

    Attributes:
        kind: ``"training"``, ``"requires_grad"``, ``"hyperparameter"``, ``"global"``
            or ``"rank"``.
        target: The module FQN (``"<the model>"`` for the root), parameter FQN, setting,
            or the rank read (``"torch.distributed.get_rank()"``).
        attr: The attribute or setting name (``"training"``, ``"p"``, ``"autocast[cpu]"``,
            ``"rank"``).
        value: The value at trace time (plain Python data).
        source: Where it came from (``"model at jl.trace"``, ``"torch at jl.trace"``, the
            user's line of a rank read).
        ranks: For a ``rank`` fact, the world ranks that read ``value`` there (the ranks
            the graph may run as); None for the other kinds.
    """

    kind: str
    target: str
    attr: str
    value: Any
    source: str
    ranks: tuple[int, ...] | None = None


def _is_plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    return isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)


def _hyperparameters(mod: nn.Module) -> Iterator[tuple[str, Any]]:
    """Public plain-valued attributes of ``mod`` (``training`` apart), sorted by name."""
    for name in sorted(vars(mod)):
        if name.startswith("_") or name == "training":
            continue
        value = vars(mod)[name]
        if _is_plain(value):
            yield name, value


def model_facts(model: nn.Module) -> list[Assumption]:
    """The model's flags, ``requires_grad`` and hyperparameters, as they are now.

    Args:
        model: The user's model (real tensors or meta; nothing is read from tensors).

    Returns:
        One assumption per module flag, parameter and plain attribute.
    """
    src = "model at jl.trace"
    out: list[Assumption] = []
    for fqn, mod in model.named_modules():
        where = fqn or _ROOT
        out.append(Assumption("training", where, "training", bool(mod.training), src))
        out.extend(Assumption("hyperparameter", where, k, v, src)
                   for k, v in _hyperparameters(mod))
    out.extend(Assumption("requires_grad", fqn, "requires_grad", bool(p.requires_grad), src)
               for fqn, p in model.named_parameters())
    return out


#: Process-wide settings a graph may depend on, read the same way at trace and run time
#: (the table, and when each one matters for a graph: :mod:`jointlab.global_state`).
GLOBALS: dict[str, Callable[[], Any]] = {s.name: s.read for s in SETTINGS}


def global_settings() -> list[Assumption]:
    """Every process-wide setting of :data:`GLOBALS`, as it is now.

    The trace keeps those that matter for its graph (:meth:`Assumptions.relevant_to`).
    """
    return [Assumption("global", "torch", name, value, "torch at jl.trace")
            for name, value in read_all().items()]


def _modules_by_name(model: nn.Module) -> dict[str, nn.Module]:
    return {fqn or _ROOT: mod for fqn, mod in model.named_modules()}


def _current(fact: Assumption, modules: dict[str, nn.Module],
             params: dict[str, nn.Parameter]) -> Any:
    """What ``fact`` reads now; ``_MISSING`` when its module or parameter is gone."""
    if fact.kind == "global":
        return GLOBALS[fact.attr]()
    if fact.kind == "requires_grad":
        p = params.get(fact.target)
        return _MISSING if p is None else bool(p.requires_grad)
    mod = modules.get(fact.target)
    if mod is None:
        return _MISSING
    return bool(mod.training) if fact.kind == "training" else vars(mod).get(fact.attr, _MISSING)


class _Missing:
    def __repr__(self) -> str:
        return "(missing)"


_MISSING = _Missing()


def _what_to_do(fact: Assumption, now: Any) -> str:
    if fact.kind == "training":
        call = "train()" if fact.value else "eval()"
        return (f"Put those modules back (model.{call}) to run this graph, or trace again: "
                f"the graph keeps {'training' if fact.value else 'eval'}-mode behaviour "
                "(dropout, batch statistics) whatever the flags say now.")
    if fact.kind == "requires_grad":
        return ("The graph's gradient outputs were chosen at trace time; set requires_grad "
                f"back to {fact.value}, or trace again.")
    if fact.kind == "global":
        return advice(fact.attr, fact.value)
    return _RETRACE


def _describe(fact: Assumption, now: Any) -> str:
    name = f"'{fact.target}'.{fact.attr}" if fact.kind != "global" else f"torch's {fact.attr}"
    return f"{name} was {fact.value!r} when traced and is {now!r} now"


def _describe_all(bad: list[tuple[Assumption, Any]], most: int = 5) -> str:
    """The violations in words; flipped ``training`` flags are told as one item."""
    flips = [f.target for f, _ in bad if f.kind == "training"]
    items = []
    if flips:
        was = "training" if bad[[f.kind for f, _ in bad].index("training")][0].value else "eval"
        shown = ", ".join(f"'{t}'" for t in flips[:most])
        more = f" and {len(flips) - most} more" if len(flips) > most else ""
        items.append(f"{shown}{more} {'was' if len(flips) == 1 else 'were'} in {was} mode "
                     f"when traced and {'is' if len(flips) == 1 else 'are'} not now")
    rest = [(f, n) for f, n in bad if f.kind != "training"]
    items.extend(_describe(f, n) for f, n in rest[:most])
    if len(rest) > most:
        items.append(f"{len(rest) - most} more facts differ")
    return "; ".join(items)


@dataclass(frozen=True)
class Assumptions:
    """Every Python-state fact a joint graph was traced under.

    Attributes:
        facts: The recorded facts, model facts first, then the global settings.
        recorded: False for a graph loaded from an archive written before
            assumptions were recorded: nothing is checked, and the table says so.
    """

    facts: tuple[Assumption, ...] = ()
    recorded: bool = True

    @classmethod
    def record(cls, model: nn.Module) -> Assumptions:
        """Record ``model``'s facts and the global settings, as they are now.

        Args:
            model: The model about to be traced.

        Returns:
            The record.
        """
        return cls(tuple(model_facts(model) + global_settings()))

    def relevant_to(self, gm: fx.GraphModule) -> Assumptions:
        """These facts less the global settings ``gm`` does not depend on.

        Args:
            gm: The graph traced under these facts.

        Returns:
            A copy keeping a ``"global"`` fact only where
            :func:`jointlab.global_state.relevant` says the graph bakes it.
        """
        keep = tuple(f for f in self.facts
                     if f.kind != "global" or relevant(f.attr, gm, f.value))
        return dataclasses.replace(self, facts=keep)

    def violations(self, model: nn.Module) -> list[tuple[Assumption, Any]]:
        """Every recorded fact that differs now, with its current value.

        Args:
            model: The live model.

        Returns:
            ``(fact, value now)`` pairs, in record order; empty when all hold.
        """
        modules = _modules_by_name(model)
        params = dict(model.named_parameters())
        out = []
        for fact in self.facts:
            if fact.kind == "rank":
                continue  # checked for the ranks a graph runs as: check_ranks
            now = _current(fact, modules, params)
            if now is _MISSING or now != fact.value or type(now) is not type(fact.value):
                out.append((fact, now))
        return out

    def check(self, model: nn.Module, where: str = "The joint graph") -> None:
        """Refuse when the model or torch's settings differ from trace time.

        Args:
            model: The live model.
            where: What is refused, for the message (``"The joint graph"``).

        Raises:
            AssumptionError: A fact differs; the message names each one (first five),
                its traced value and its value now, and what to do.
        """
        self.check_ranks(None, where)
        bad = self.violations(model)
        if not bad:
            return
        first, now = bad[0]
        raise AssumptionError(
            f"{where} was traced under other conditions than hold now: "
            f"{_describe_all(bad)}. {_what_to_do(first, now)} See joint.guards for "
            "everything the graph assumes."
        )

    def rank_facts(self) -> tuple[Assumption, ...]:
        """The ranks the user's code read while traced (``rank`` facts), in read order."""
        return tuple(f for f in self.facts if f.kind == "rank")

    def ranks_allowed(self, world: tuple[int, ...]) -> tuple[int, ...]:
        """The ranks of ``world`` that read what the trace read at every rank read."""
        return tuple(r for r in world if all(r in (f.ranks or ()) for f in self.rank_facts()))

    def check_ranks(self, ranks: tuple[int, ...] | None, where: str = "The joint graph"
                    ) -> None:
        """Refuse running as a rank that reads another value than the trace read.

        Args:
            ranks: The world ranks the graph is about to run as; None for this
                process's rank (``torch.distributed.get_rank()``, as the world reports it).
            where: What is refused, for the message.

        Raises:
            AssumptionError: One of ``ranks`` reads another value at a recorded rank
                read (or no process group is initialised to say which rank this is).
        """
        facts = self.rank_facts()
        if not facts:
            return
        if ranks is None:
            ranks = _this_rank(where, facts[0])
        for fact in facts:
            other = [r for r in ranks if r not in (fact.ranks or ())]
            if other:
                who, holds = (("torch read", "the piece of a tensor it chose for them")
                              if fact.attr == "coordinate" else
                              ("the user's code read", "another rank's branch"))
                raise AssumptionError(
                    f"{where} cannot run as rank {other[0]}: {who} "
                    f"{fact.target} = {fact.value!r} at {fact.source} when traced, which only "
                    f"ranks {list(fact.ranks or ())} read; rank {other[0]} reads another value "
                    f"there, so the graph holds {holds}. Trace every rank with "
                    "jl.trace_ranks(model, train_fn, inputs), which traces the ranks that "
                    "read different values separately, and run them with jl.run_all_ranks. "
                    "See joint.guards.")

    def headline(self) -> dict[str, Any]:
        """The few facts a summary card shows.

        Returns:
            ``recorded``, ``count`` (every fact), ``train``/``eval`` (module counts),
            ``trainable``/``frozen`` (parameter counts), ``dropout`` (distinct ``p``
            values of modules named ``*Dropout*``) and ``autocast`` (device type to dtype,
            only where on).
        """
        kinds = [f.kind for f in self.facts]
        train = [f.value for f in self.facts if f.kind == "training"]
        grads = [f.value for f in self.facts if f.kind == "requires_grad"]
        dropout = sorted({f.value for f in self.facts if f.kind == "hyperparameter"
                          and f.attr == "p" and isinstance(f.value, float)})
        autocast = {f.attr[len("autocast["):-1]: f.value for f in self.facts
                    if f.kind == "global" and f.attr.startswith("autocast[") and f.value}
        return dict(recorded=self.recorded, count=len(kinds), train=sum(train),
                    eval=len(train) - sum(train), trainable=sum(grads),
                    frozen=len(grads) - sum(grads), dropout=dropout, autocast=autocast)

    def table(self) -> pd.DataFrame:
        """One row per fact: kind, target, attribute, traced value, what it checks, source.

        Returns:
            A DataFrame (columns ``kind, target, attr, traced, checks, source``).
        """
        import pandas as pd

        rows = [dict(kind=f.kind, target=f.target, attr=f.attr, traced=f.value,
                     checks=_CHECKS[f.kind] + (f" {list(f.ranks or ())}" if f.kind == "rank"
                                               else ""),
                     source=f.source) for f in self.facts]
        if not self.recorded:
            rows.append(dict(kind="unknown", target="", attr="", traced=None,
                             checks="nothing: this archive was saved before jointlab "
                                    "recorded the state a graph assumes",
                             source="archive"))
        return pd.DataFrame(rows, columns=["kind", "target", "attr", "traced", "checks",
                                           "source"])


_CHECKS = {
    "training": "module.training on every run",
    "requires_grad": "param.requires_grad on every run",
    "hyperparameter": "the attribute's value on every run",
    "global": "torch's setting on every run",
    "rank": "the graph runs only as a rank that reads the same value: ranks",
}


def _this_rank(where: str, fact: Assumption) -> tuple[int, ...]:
    """This process's world rank, as the (simulated) world reports it now."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise AssumptionError(
            f"{where} was traced reading the rank ({fact.target} = {fact.value!r} at "
            f"{fact.source}), but no process group is initialised now, so nothing says which "
            "rank runs it. Run it inside the world it was traced in (jl.fake_world).")
    return (int(dist.get_rank()),)
