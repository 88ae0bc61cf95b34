"""Where a backward's host time goes: calls back to back (100, then one sync), median of
rounds, interleaved. GPU only. Run from the checkout's root.

Timed with course.bench.time_back_to_back (one warm-up call, 100 calls, one
synchronisation: `course bench --timer host`'s protocol, one round at a time). The run of
2026-11-29 timed the same loop written out here; this file calls the course's instead."""
import importlib
import statistics
import sys

sys.path.insert(0, ".")
import course  # noqa: E402,F401  (mode first)
from course.bench import time_back_to_back  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

LN = importlib.import_module("solutions.kernels.layernorm")
RN = importlib.import_module("solutions.kernels.rmsnorm")

dev = "cuda"


def host(fn) -> float:
    """µs a call: one warm-up call, then 100 back to back and one synchronisation."""
    return time_back_to_back([fn], warmup=1, reps=1).times_s[0] * 1e6


class Nothing(torch.autograd.Function):
    """Our forward's saved tensors, a backward that launches nothing."""
    @staticmethod
    def forward(ctx, x, w, eps):
        y, _, rstd = RN._forward(x, w, eps, None, True, None)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        return dy, dy[0], None


class NothingSaved(Nothing):
    @staticmethod
    def forward(ctx, x, w, eps):
        return RN._forward(x, w, eps, None, False, None)[0]


class Unpacks(Nothing):
    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(w), None


def cases(M, N):
    dt = torch.bfloat16
    x0 = torch.randn(M, N, device=dev, dtype=dt)
    w0 = torch.randn(N, device=dev, dtype=dt)
    b0 = torch.randn(N, device=dev, dtype=dt)
    dy = torch.randn(M, N, device=dev, dtype=dt)
    out = {}

    def grad_of(fn, *names):
        leaves = [t.detach().requires_grad_(True) for t in names]
        y = fn(*leaves)
        return lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)

    out["F.rms_norm grad"] = grad_of(lambda x, w: F.rms_norm(x, (N,), w, 1e-6), x0, w0)
    out["ours rms grad"] = grad_of(lambda x, w: RN.rmsnorm(x, w, 1e-6), x0, w0)
    out["Function, no launch"] = grad_of(lambda x, w: Nothing.apply(x, w, 1e-6), x0, w0)
    out["Function, none saved"] = grad_of(lambda x, w: NothingSaved.apply(x, w, 1e-6), x0, w0)
    out["Function, unpack+2 empty"] = grad_of(lambda x, w: Unpacks.apply(x, w, 1e-6), x0, w0)
    out["x*w grad (C++ mul)"] = grad_of(lambda x, w: x * w, x0, w0)
    _, _, rstd = RN._forward(x0, w0, 1e-6, None, True, None)
    RN.rmsnorm_backward(x0, w0, rstd, dy)
    out["ours rms backward direct"] = lambda: RN.rmsnorm_backward(x0, w0, rstd, dy)
    out["F.layer_norm grad"] = grad_of(lambda x, w, b: F.layer_norm(x, (N,), w, b, 1e-5),
                                       x0, w0, b0)
    out["ours ln grad"] = grad_of(lambda x, w, b: LN.layernorm(x, w, b, 1e-5), x0, w0, b0)
    _, mean, rs = LN._forward(x0, w0, b0, 1e-5, True, None)
    LN.layernorm_backward(x0, w0, mean, rs, dy)
    out["ours ln backward direct"] = lambda: LN.layernorm_backward(x0, w0, mean, rs, dy)
    out["2 empty_like"] = lambda: (torch.empty_like(x0), torch.empty_like(w0))
    return out


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, sys.version.split()[0], flush=True)
    for M, N in ((1, 4096), (8, 4096), (64, 4096), (64, 8192)):
        fns = cases(M, N)
        got = {k: [] for k in fns}
        for _ in range(15):
            for k, f in fns.items():
                got[k].append(host(f))
        print(f"\n{M} x {N}: us a call, median of 15 rounds of 100")
        for k, v in got.items():
            print(f"  {k:28s} {statistics.median(v):7.1f}   (min {min(v):.1f})")


if __name__ == "__main__":
    main()
