"""The words of a guard: what differs, what to do, and what ``joint.guards`` says each row checks.

:meth:`jointlab.assumptions.Assumptions.check` refuses a run whose state
differs from the trace's; this module writes that refusal. Each differing
fact is told with its traced value and its value now, and where the trace
read it (:func:`describe_all`); the advice fits the first fact
(:func:`what_to_do`). Flipped ``training`` flags are told per direction and
per module: a frozen BatchNorm switched back to training is told to call
``.eval()`` on that module, not on the whole model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jointlab.global_state import advice

if TYPE_CHECKING:
    from jointlab.facts import Assumption

__all__ = ["checks", "describe_all", "what_to_do"]

_RETRACE = "The graph computes the step as traced; call jl.trace again with the model as it is now."
_ADVICE = {
    "requires_grad": "The graph's gradient outputs were chosen at trace time; set "
                     "requires_grad back to {value}, or trace again.",
    "class": "The graph runs the traced module's code, not the new one's: put the original "
             "module back, or trace again with the model as it is now.",
    "hooks": "The graph runs the hooks it was traced with (forward hooks in its forward, tensor "
             "hooks in its backward): register or remove hooks before jl.trace, then trace "
             "again.",
    "read": "The traced step read this value and baked it into the graph: set it back, or "
            "trace again (pass a value that changes every step to train_fn as a tensor input).",
}
_ADVICE["variable"] = _ADVICE["read"]
_HOOK_KINDS = ("forward pre-hooks", "forward hooks", "backward pre-hooks", "backward hooks",
               "parameter hooks")
_CHECKS = {
    "training": "module.training on every run",
    "requires_grad": "param.requires_grad on every run",
    "class": "the module's class on every run",
    "hooks": "every module and parameter hook, by function, on every run",
    "read": "the value at this path on every run",
    "variable": "the variable's value on every run",
    "hyperparameter": "the attribute's value on every run",
    "global": "torch's setting on every run",
    "rank": "the graph runs only as a rank that reads the same value: ranks",
}


def _names(targets: list[str], most: int = 5) -> str:
    shown = ", ".join(f"'{t}'" for t in targets[:most])
    return shown + (f" and {len(targets) - most} more" if len(targets) > most else "")


def _mode_advice(bad: list[tuple[Assumption, Any]], model_size: int) -> str:
    """Per direction: ``model.train()`` when every module flipped, else the modules' own call."""
    parts = []
    for was_training, call in ((True, "train()"), (False, "eval()")):
        flipped = [f.target for f, _ in bad if f.kind == "training" and f.value is was_training]
        if not flipped:
            continue
        if len(flipped) == model_size:
            parts.append(f"model.{call}")
        else:
            parts.append(f".{call} on {_names(flipped)}")
    return (f"Put those modules back ({' and '.join(parts)}) to run this graph, or trace "
            "again: the graph keeps each module's traced behaviour (dropout, batch "
            "statistics) whatever the flags say now.")


def what_to_do(bad: list[tuple[Assumption, Any]], model_size: int) -> str:
    """The advice for the first differing fact (all flipped flags at once).

    Args:
        bad: ``(fact, value now)`` pairs that differ, in record order.
        model_size: How many modules the model has (to tell "the whole model").

    Returns:
        One or two sentences.
    """
    fact = bad[0][0]
    if fact.kind == "training":
        return _mode_advice(bad, model_size)
    if fact.kind == "global":
        return advice(fact.attr, fact.value)
    return _ADVICE.get(fact.kind, _RETRACE).format(value=fact.value)


def _hook_changes(was: dict[str, Any], now: Any) -> str:
    if not isinstance(now, dict):
        return f"hooks were {was!r} when traced and are {now!r} now"
    diffs = []
    for key in sorted(set(was) | set(now)):
        before, after = list(was.get(key, ())), list(now.get(key, ()))
        if before != after:
            kind = next((k for k in _HOOK_KINDS if key.endswith(" " + k)), "")
            where = key[: len(key) - len(kind)].strip()
            diffs.append(f"'{where}' {kind or 'hooks'} were {before} when traced and are "
                         f"{after} now")
    return "; ".join(diffs)


def _describe(fact: Assumption, now: Any) -> str:
    if fact.kind == "class":
        return (f"'{fact.target}' was a {fact.value} when traced and is a {now} now "
                "(the module was replaced)")
    if fact.kind == "hooks":
        return _hook_changes(fact.value, now)
    if fact.kind == "global":
        name = f"torch's {fact.attr}"
    elif fact.kind == "variable":
        name = f"{fact.target}: {fact.attr}"
    else:
        name = f"'{fact.target}'.{fact.attr}"
    where = {"read": f" (read at {fact.source})",
             "variable": f" (named by {fact.source})"}.get(fact.kind, "")
    return f"{name} was {_show(fact.value)} when traced and is {_show(now)} now{where}"


def _show(value: Any) -> str:
    """A guard's value in words: a tensor form as ``tensor float32[3] [1.0, 2.0, 3.0]``."""
    if isinstance(value, dict) and "tensor" in value and "shape" in value:
        shape = "x".join(map(str, value["shape"]))
        data = value.get("values", f"sha1 {value.get('sha1', '?')[:10]}")
        return f"tensor {value['tensor']}[{shape}] {data}"
    return repr(value)


def describe_all(bad: list[tuple[Assumption, Any]], most: int = 5) -> str:
    """The differing facts in words; flipped ``training`` flags are told per direction.

    Args:
        bad: ``(fact, value now)`` pairs that differ.
        most: How many of each sort to name.

    Returns:
        The items joined with ``"; "``.
    """
    items = []
    for was_training, mode in ((True, "training"), (False, "eval")):
        flips = [f.target for f, _ in bad if f.kind == "training" and f.value is was_training]
        if flips:
            one = len(flips) == 1
            items.append(f"{_names(flips, most)} {'was' if one else 'were'} in {mode} mode "
                         f"when traced and {'is' if one else 'are'} not now")
    rest = [(f, n) for f, n in bad if f.kind != "training"]
    items.extend(_describe(f, n) for f, n in rest[:most])
    if len(rest) > most:
        items.append(f"{len(rest) - most} more facts differ")
    return "; ".join(items)


def checks(fact: Assumption) -> str:
    """The ``checks`` text of ``joint.guards`` for one fact.

    Args:
        fact: A recorded fact.

    Returns:
        What is compared on each run, or why nothing is (a loaded graph's variables).
    """
    if fact.kind == "rank":
        return f"{_CHECKS['rank']} {list(fact.ranks or ())}"
    rooted_in_code = fact.kind == "read" and fact.target.startswith(("train_fn", "global "))
    if (fact.kind == "variable" or rooted_in_code) and fact.reader is None:
        return ("not checked: this graph was loaded, and the variable lives in the code "
                "that traced it")
    return _CHECKS[fact.kind]
