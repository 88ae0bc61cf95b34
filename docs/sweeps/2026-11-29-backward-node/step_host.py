"""Host cost of one training step's norm, forward with grads on and backward, through
`torch.autograd.grad`: ours with the C++ node (solutions/kernels/kept_backward.cpp), ours
through the Python Function as before, and PyTorch's fused ops. Also the backward alone
(the graph kept, as `course bench --timer host` times a backward). GPU only; run from the
checkout's root. Calls back to back (100, then one synchronisation: course.bench's
time_back_to_back), median of 15 interleaved rounds, µs a call, bfloat16."""
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


def host(fn) -> float:
    return time_back_to_back([fn], warmup=1, reps=1).times_s[0] * 1e6


def step(fn, leaves, dy):
    return lambda: torch.autograd.grad(fn(*leaves), leaves, dy)


def backward_only(fn, leaves, dy):
    y = fn(*leaves)
    name = y.grad_fn.name()
    return name, lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)


def cases(M, N):
    dt = torch.bfloat16
    x, w, b = (torch.randn(*s, device="cuda", dtype=dt).requires_grad_()
               for s in ((M, N), (N,), (N,)))
    dy = torch.randn(M, N, device="cuda", dtype=dt)
    ours_rms = lambda x, w: RN.rmsnorm(x, w, 1e-6)  # noqa: E731
    function_rms = lambda x, w: RN.RMSNormFunction.apply(x, w, 1e-6)  # noqa: E731
    torch_rms = lambda x, w: F.rms_norm(x, (N,), w, 1e-6)  # noqa: E731
    ours_ln = lambda x, w, b: LN.layernorm(x, w, b, 1e-5)  # noqa: E731
    function_ln = lambda x, w, b: LN.LayerNormFunction.apply(x, w, b, 1e-5)  # noqa: E731
    torch_ln = lambda x, w, b: F.layer_norm(x, (N,), w, b, 1e-5)  # noqa: E731
    for fn, leaves in ((ours_rms, (x, w)), (ours_ln, (x, w, b))):
        for _ in range(2):  # a first step keeps the launches, and the node
            torch.autograd.grad(fn(*leaves), leaves, dy)
    out, names = {}, {}
    for label, fn, leaves in (("RMSNorm ours (node)", ours_rms, (x, w)),
                              ("RMSNorm ours (Function)", function_rms, (x, w)),
                              ("RMSNorm F.rms_norm", torch_rms, (x, w)),
                              ("LayerNorm ours (node)", ours_ln, (x, w, b)),
                              ("LayerNorm ours (Function)", function_ln, (x, w, b)),
                              ("LayerNorm F.layer_norm", torch_ln, (x, w, b))):
        out[f"step     {label}"] = step(fn, leaves, dy)
        names[label], out[f"backward {label}"] = backward_only(fn, leaves, dy)
    # the same gradients from the node and the Function, bit for bit
    for fn, function, leaves in ((ours_rms, function_rms, (x, w)),
                                 (ours_ln, function_ln, (x, w, b))):
        got = torch.autograd.grad(fn(*leaves), leaves, dy)
        want = torch.autograd.grad(function(*leaves), leaves, dy)
        assert all(torch.equal(g, h) for g, h in zip(got, want, strict=True))
    return out, names


def interleaved(title: str, fns: dict, rounds: int = 15) -> None:
    """Print the median and least µs a call of each of `fns`, timed once a round."""
    got = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            got[k].append(host(f))
    print(f"\n{title}: us a call, median of {rounds} rounds of 100", flush=True)
    for k, v in got.items():
        print(f"  {k:36s} {statistics.median(v):7.1f}   (min {min(v):.1f})")


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "Python",
          sys.version.split()[0], flush=True)
    assert kept_backward.module(wait=True) is not None
    for M, N in ((1, 4096), (8, 4096), (64, 4096), (1, 8192), (8, 8192), (64, 8192)):
        fns, names = cases(M, N)
        interleaved(f"{M} x {N} (grad_fn: {names})", fns)


if __name__ == "__main__":
    main()
