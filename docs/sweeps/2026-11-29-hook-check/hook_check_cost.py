"""What the node's check for a profiler's launch hook costs a backward: the backward alone
(graph kept) of ours through the C++ node with the check (as shipped) and without it
(`check_launch_hooks_with(None)`), beside F.rms_norm's and F.layer_norm's, interleaved in
the same process. GPU only; run from the checkout's root. µs a call, median of 21 rounds
of 100 calls back to back, bfloat16."""
import importlib
import statistics
import sys

sys.path.insert(0, ".")
import course  # noqa: E402,F401  (mode first)
from course.bench import time_back_to_back  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from solutions.kernels import kept_backward  # noqa: E402

RN = importlib.import_module("solutions.kernels.rmsnorm")
LN = importlib.import_module("solutions.kernels.layernorm")
module = kept_backward.module(wait=True)


def host(fn) -> float:
    return time_back_to_back([fn], warmup=1, reps=1).times_s[0] * 1e6


def backward_only(fn, leaves, dy):
    y = fn(*leaves)
    return y.grad_fn.name(), lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)


def with_check(check, run):
    def timed():
        module.check_launch_hooks_with(check)
        return host(run)
    return timed


print(torch.cuda.get_device_name(), torch.__version__, sys.version.split()[0])
for M, N in ((1, 4096), (64, 8192)):
    x, w, b = (torch.randn(*s, device="cuda", dtype=torch.bfloat16).requires_grad_()
               for s in ((M, N), (N,), (N,)))
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    ours = {"RMSNorm": (lambda x, w: RN.rmsnorm(x, w, 1e-6), (x, w)),
            "LayerNorm": (lambda x, w, b: LN.layernorm(x, w, b, 1e-5), (x, w, b))}
    timers = {}
    for name, (fn, leaves) in ours.items():
        for _ in range(2):  # the first steps keep the launches, and the plan
            torch.autograd.grad(fn(*leaves), leaves, dy)
        node, run = backward_only(fn, leaves, dy)
        assert "kept_backward.cpp" in node, node
        timers[f"{name} node, hook check"] = with_check(kept_backward.launch_hooked, run)
        timers[f"{name} node, no check"] = with_check(None, run)
    timers["F.rms_norm"] = backward_only(
        lambda x, w, N=N: F.rms_norm(x, (N,), w, 1e-6), (x, w), dy)[1]
    timers["F.layer_norm"] = backward_only(
        lambda x, w, b, N=N: F.layer_norm(x, (N,), w, b, 1e-5), (x, w, b), dy)[1]
    got = {k: [] for k in timers}
    for _ in range(21):
        for k, f in timers.items():
            got[k].append(f() if "node" in k else host(f))
    module.check_launch_hooks_with(kept_backward.launch_hooked)
    print(f"\n{M} x {N}: backward alone, us a call, median of 21 rounds of 100")
    for k, v in got.items():
        print(f"  {k:28s} {statistics.median(v):7.1f}   (min {min(v):.1f})")
