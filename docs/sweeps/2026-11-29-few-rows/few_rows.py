"""Whether a backward of a few rows should take the columns path (no column sums' launch):
each process times the backward alone (`autograd.grad` of a kept graph, as `course bench
--timer host` does) of ours and of PyTorch's op, interleaved, and the same in a CUDA graph
(GPU time). `FEW_ROWS=0` takes the `few_rows` rule (the columns path) out of the
backward rules, as they were before it; `FEW_ROWS=1` (the default) keeps it. GPU only; run
from the checkout's root, once per setting, alternating (the node keeps its launches for the
process's life). bfloat16, µs a call."""
import importlib
import os
import statistics
import sys

sys.path.insert(0, ".")
import course  # noqa: E402,F401  (mode first)
from course.bench import graph_stream, time_back_to_back, time_graph  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from solutions.kernels import kept_backward, launch  # noqa: E402

# the modules (the package's own names are their public functions)
RN = importlib.import_module("solutions.kernels.rmsnorm")
LN = importlib.import_module("solutions.kernels.layernorm")

RULE_ON = os.environ.get("FEW_ROWS", "1") == "1"
if not RULE_ON:  # the rules as they were before few_rows: rows (or pieces), then column sums
    launch.BACKWARD_RULES = {op: rules[1:] for op, rules in launch.BACKWARD_RULES.items()}


def backward_only(fn, leaves, dy):
    y = fn(*leaves)
    return y.grad_fn.name(), lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "few_rows rule:",
          RULE_ON, flush=True)
    assert kept_backward.module(wait=True) is not None
    for M, N in ((8, 4096), (64, 4096), (8, 8192), (64, 8192), (16, 4096), (32, 8192)):
        with graph_stream():  # the forwards too: a captured backward runs on their stream
            one_shape(M, N)


def one_shape(M: int, N: int) -> None:
    dt = torch.bfloat16
    x, w, b = (torch.randn(*s, device="cuda", dtype=dt).requires_grad_()
               for s in ((M, N), (N,), (N,)))
    dy = torch.randn(M, N, device="cuda", dtype=dt)
    ops = {"RMSNorm ours": (lambda x, w: RN.rmsnorm(x, w, 1e-6), (x, w)),
           "RMSNorm F.rms_norm": (lambda x, w: F.rms_norm(x, x.shape[-1:], w, 1e-6), (x, w)),
           "LayerNorm ours": (lambda x, w, b: LN.layernorm(x, w, b, 1e-5), (x, w, b)),
           "LayerNorm F.layer_norm":
               (lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, 1e-5), (x, w, b))}
    calls, names = {}, {}
    for label, (fn, leaves) in ops.items():
        for _ in range(2):  # a first step keeps the launches, and the node
            torch.autograd.grad(fn(*leaves), leaves, dy)
        names[label], calls[label] = backward_only(fn, leaves, dy)
    # the gradients agree with PyTorch's
    for ours, theirs in (("RMSNorm ours", "RMSNorm F.rms_norm"),
                         ("LayerNorm ours", "LayerNorm F.layer_norm")):
        for g, h in zip(calls[ours](), calls[theirs](), strict=True):
            torch.testing.assert_close(g.float(), h.float(), atol=0.1, rtol=0.05)
    host = {k: [] for k in calls}
    for _ in range(15):
        for k, f in calls.items():
            host[k].append(time_back_to_back([f], warmup=1, reps=1).times_s[0] * 1e6)
    print(f"\n{M} x {N} {names}", flush=True)
    for k, f in calls.items():
        gpu = statistics.median(time_graph([f], reps=20).times_s) * 1e6
        print(f"  {k:24s} host {statistics.median(host[k]):6.1f} (min {min(host[k]):5.1f})"
              f"   graph {gpu:6.2f}", flush=True)


if __name__ == "__main__":
    main()
