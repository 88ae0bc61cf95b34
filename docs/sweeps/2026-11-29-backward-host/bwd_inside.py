"""Inside our backward, on autograd's worker thread: where the time goes. GPU only."""
import importlib
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, ".")
RN = importlib.import_module("solutions.kernels.rmsnorm")
print(torch.cuda.get_device_name(), torch.__version__, sys.version.split()[0], flush=True)
acc = {"unpack": [], "body": [], "inside": []}
threads = set()


class Timed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        y, _, rstd = RN._forward(x, w, eps, None, True, None)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        t0 = time.perf_counter_ns()
        threads.add(threading.get_ident())
        x, w, rstd = ctx.saved_tensors
        t1 = time.perf_counter_ns()
        dx, dw = RN.rmsnorm_backward(x, w, rstd, dy.contiguous())
        t2 = time.perf_counter_ns()
        acc["unpack"].append(t1 - t0)
        acc["body"].append(t2 - t1)
        acc["inside"].append(t2 - t0)
        return dx, dw, None


def host(fn, calls=100):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


for M, N in ((1, 4096), (64, 4096)):
    dt = torch.bfloat16
    x = torch.randn(M, N, device="cuda", dtype=dt).requires_grad_()
    w = torch.randn(N, device="cuda", dtype=dt).requires_grad_()
    dy = torch.randn(M, N, device="cuda", dtype=dt)
    y = Timed.apply(x, w, 1e-6)
    _, _, rstd = RN._forward(x.detach(), w.detach(), 1e-6, None, True, None)
    fns = {"grad": lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True),  # noqa: B023 (called in this iteration)
           "direct body": lambda: RN.rmsnorm_backward(x.detach(), w.detach(), rstd, dy)}  # noqa: B023
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    for k in acc:
        acc[k].clear()
    got = {k: [] for k in fns}
    for _ in range(15):
        for k, f in fns.items():
            got[k].append(host(f))
    print(f"{M} x {N}: grad {statistics.median(got['grad']):.1f} us, direct body "
          f"{statistics.median(got['direct body']):.1f}; inside backward (median): "
          + ", ".join(f"{k} {statistics.median(acc[k]) / 1e3:.1f}" for k in acc)
          + f"; backward threads {len(threads)} (main {threading.get_ident() in threads})")
    # same grad, the backward run on this thread (CPU-side engine call from main thread)
