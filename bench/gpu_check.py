"""Prepared GPU check for the stepper: step and compare on CUDA, per-node timings.

Run on a machine with a GPU: ``python bench/gpu_check.py``. Prints one line
per check and exits non-zero when one fails. Budget: well under a minute.
"""

from __future__ import annotations

import sys
import time

import torch

sys.path.insert(0, ".")


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    import jointlab as jl
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    failures = 0

    def check(name: str, ok: bool, detail: str = "") -> None:
        nonlocal failures
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)

    # traced on CPU, stepped on CUDA (device kwargs retargeted), and traced on CUDA
    small = make_gpt2(n_layer=2, d=64, n_head=2, vocab=128, seq=16)
    inputs = lm_inputs(2, 128, 16)
    joint = jl.trace(small, lm_train_fn, inputs)
    s = jl.Stepper(joint, small, inputs, device="cuda", seed=3)
    while not s.done:
        s.step()
    bulk = jl.Stepper(joint, small, inputs, device="cuda", seed=3).run()
    same = torch.equal(s.outputs[0], bulk[0]) and all(
        torch.equal(s.outputs[1][k], bulk[1][k]) for k in bulk[1])
    check("stepped == run() on cuda, bitwise", same)
    cuda_model = make_gpt2(n_layer=2, d=64, n_head=2, vocab=128, seq=16).cuda()
    cuda_inputs = {k: v.cuda() for k, v in inputs.items()}
    cuda_joint = jl.trace(cuda_model, lm_train_fn, cuda_inputs)
    torch.manual_seed(3)
    ref = cuda_joint.run(cuda_model, cuda_inputs)
    s2 = jl.Stepper(cuda_joint, cuda_model, cuda_inputs, device="cuda", seed=3).run()
    check("Stepper(seed) == joint.run under seed on cuda", torch.equal(ref[0], s2[0]))

    t = s.node_timings()
    top = t.sort_values("step_s", ascending=False).head(8)
    print(top.join(joint.nodes[["target", "module"]], how="left").to_string())
    check("per-node cuda memory recorded", bool((t["step_mem_peak"] > 0).any()))

    t0 = time.perf_counter()
    c = jl.compare(joint, small, inputs, train_fn=lm_train_fn, device="cuda", seed=1)
    check("compare on cuda (dropout aligned)", c.ok,
          f"{time.perf_counter() - t0:.2f}s, max grad err {c.grads['max_abs_err'].max():.2e}")
    gelu = next(n for n in joint.graph.nodes if n.target == torch.ops.aten.gelu.default
                and n.meta["jointlab"]["module"].startswith("h.1."))
    gelu.target, gelu.kwargs = torch.ops.aten.relu.default, {}
    joint.recompute()
    c = jl.compare(joint, small, inputs, train_fn=lm_train_fn, device="cuda")
    d = c.first_divergence
    check("injected GELU->ReLU localized on cuda", d is not None and d.module == "h.1.mlp.1",
          str(d))

    big = make_gpt2(n_layer=12, d=256)
    big_in = lm_inputs(8, 1024, 128)
    big = big.cuda()
    big_in = {k: v.cuda() for k, v in big_in.items()}
    bj = jl.trace(big, lm_train_fn, big_in)
    st = jl.Stepper(bj, big, big_in, device="cuda", seed=0)

    def timed(fn, k=5):
        fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(k):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best

    tj = timed(lambda: bj.run(big, big_in))
    ts = timed(lambda: (st.reset(), st.run()))
    check("gpt2-12L cuda: Stepper.run()/joint.run <= 1.10", ts / tj <= 1.10,
          f"{ts / tj:.3f}x ({tj * 1e3:.1f} ms vs {ts * 1e3:.1f} ms)")
    st.reset()
    t0 = time.perf_counter()
    while not st.done:
        st.step()
    stepped = time.perf_counter() - t0
    print(f"     gpt2-12L cuda: stepping {len(st.nodes)} nodes with sync took {stepped:.2f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
