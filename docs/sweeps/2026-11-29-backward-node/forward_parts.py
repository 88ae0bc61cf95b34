"""Where a forward with grads on goes, ours through the C++ plan against F.rms_norm: the
parts of `rmsnorm(x, w)` when x requires grad (the checks, the plan's lookup and forward in
C++; before 2026-11-29 evening, the lookup by launch_key in Python) timed apart, beside
the same forward's launch in Python (the kept forward keeping rstd). GPU only; run from
the checkout's root. Calls back to back (100, then one synchronisation), median of 15
interleaved rounds, µs a call (step_host.interleaved)."""
import importlib
import sys

sys.path.insert(0, ".")
import course  # noqa: E402,F401  (mode first)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from step_host import interleaved  # noqa: E402  (beside this file)

from solutions.kernels import kept_backward  # noqa: E402
from solutions.kernels.ready_launch import launch_key  # noqa: E402

RN = importlib.import_module("solutions.kernels.rmsnorm")


def parts(M, N):
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(N, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        torch.autograd.grad(RN.rmsnorm(x, w), (x, w), dy)
    plans = RN._KEPT_PLANS
    assert plans.has(x, w, None), "no plan was kept"
    xd = x.detach()
    fns = {
        "ours rmsnorm(x, w), grads on": lambda: RN.rmsnorm(x, w),
        "F.rms_norm, grads on": lambda: F.rms_norm(x, (N,), w, 1e-6),
        "ours rmsnorm, x detached": lambda: RN.rmsnorm(xd, w.detach()),
        "F.rms_norm, x detached": lambda: F.rms_norm(xd, (N,), w.detach(), 1e-6),
        "ours Function.apply": lambda: RN.RMSNormFunction.apply(x, w, 1e-6),
        "  launch_key (the old lookup's key)": lambda: launch_key(x, w),
        "  plans.has (the C++ lookup)": lambda: plans.has(x, w, None),
        "  kept_backward.usable()": kept_backward.usable,
        "  plans.forward (C++ lookup, forward)": lambda: plans.forward(x, w, None, 1e-6),
        "  Python: _forward keeping rstd": lambda: RN._forward(x, w, 1e-6, None, True, None),
        "  torch.empty_like(x)": lambda: torch.empty_like(x),
        "  x.view(-1) (grads on)": lambda: x.view(-1),
    }
    return fns


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "Python",
          sys.version.split()[0], flush=True)
    assert kept_backward.module(wait=True) is not None
    for M, N in ((1, 4096), (64, 8192)):
        interleaved(f"{M} x {N}", parts(M, N))


if __name__ == "__main__":
    main()
