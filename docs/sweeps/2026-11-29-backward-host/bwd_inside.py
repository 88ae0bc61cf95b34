"""Inside our backward, on autograd's worker thread: where the time goes. GPU only. Run from
the checkout's root; the timer and the forward are bwd_parts.py's."""
import statistics
import sys
import threading
import time

import torch
from bwd_parts import RN, Nothing, host

acc = {"unpack": [], "body": [], "inside": []}
threads = set()


class Timed(Nothing):
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


def measure(M: int, N: int) -> None:
    dt = torch.bfloat16
    x = torch.randn(M, N, device="cuda", dtype=dt).requires_grad_()
    w = torch.randn(N, device="cuda", dtype=dt).requires_grad_()
    dy = torch.randn(M, N, device="cuda", dtype=dt)
    y = Timed.apply(x, w, 1e-6)
    _, _, rstd = RN._forward(x.detach(), w.detach(), 1e-6, None, True, None)
    fns = {"grad": lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True),
           "direct body": lambda: RN.rmsnorm_backward(x.detach(), w.detach(), rstd, dy)}
    for f in fns.values():  # the first backward compiles: not counted inside
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


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, sys.version.split()[0], flush=True)
    for M, N in ((1, 4096), (64, 4096)):
        measure(M, N)
