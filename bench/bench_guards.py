"""Cost of checking a graph's recorded assumptions (joint.guards) on every run.

``joint.run`` checks every module's ``training`` flag, every parameter's
``requires_grad``, the plain hyperparameters and torch's settings before it
runs. Target: the check costs at most 2% of one ``joint.run`` of the 12-layer
demo GPT (d=256), measured in the same run.
"""

from __future__ import annotations

from run import interleaved


def rows(ctx):
    model, _fn, inputs = ctx.gpt2
    joint = ctx.gpt2_joint
    facts = len(joint.assumptions.facts)
    t = interleaved({
        "run": lambda: joint.run(model, inputs),
        "check": lambda: [joint.assumptions.check(model) for _ in range(20)],
    }, repeat=3 if ctx.quick else 7, stat=min)
    check = t["check"] / 20
    ratio = check / t["run"]
    return [
        {"name": f"gpt2-12L d256: guard check ({facts} facts)", "value": check * 1e3,
         "unit": "ms", "target": "", "ok": None},
        {"name": "gpt2-12L d256: guard check / joint.run", "value": ratio * 100, "unit": "%",
         "target": "<= 2", "ok": ratio <= 0.02},
    ]
