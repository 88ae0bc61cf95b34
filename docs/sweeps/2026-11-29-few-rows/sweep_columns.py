"""GPU time of a backward of a few rows, in a CUDA graph (course.bench.time_graph): the
columns path (one launch) at several settings, against the plan the rules after `few_rows`
give (the rows or pieces kernel, then the column sums). bfloat16, µs a call. GPU only; run
from the checkout's root."""
import importlib
import itertools
import statistics
import sys

sys.path.insert(0, ".")
import course  # noqa: E402,F401  (mode first)
from course.bench import time_graph  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

from solutions.kernels import launch  # noqa: E402
from solutions.kernels.launch_plans import BackwardPlan, Rows  # noqa: E402

RN = importlib.import_module("solutions.kernels.rmsnorm")
LN = importlib.import_module("solutions.kernels.layernorm")
# (columns a program owns, values in its tile of every row, warps)
SETTINGS = list(itertools.product((128, 256), (4096, 8192, 16384), (4, 8)))


def without_few_rows(op: str, M: int, N: int) -> BackwardPlan:
    rows = Rows(op, M, N, "bfloat16", 2, launch.gpu_properties(torch.device("cuda")))
    rules = launch.BACKWARD_RULES[op][1:]  # every rule but few_rows
    return next(plan for rule in rules if (plan := rule(rows)) is not None)


def gpu_us(fn) -> float:
    return statistics.median(time_graph([fn], reps=20).times_s) * 1e6


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    print("settings: (columns, tile, warps) ->", SETTINGS)
    for M, N in itertools.product((2, 4, 8, 16, 32), (2048, 4096, 8192, 16384)):
        one_shape(M, N)


def one_shape(M: int, N: int) -> None:
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(1) + 1e-6)
    mean = xf.mean(1)
    ln_rstd = torch.rsqrt(xf.var(1, unbiased=False) + 1e-5)
    for op, call in (("rmsnorm_backward",
                      lambda p: (lambda: RN.rmsnorm_backward(x, w, rstd, dy, plan=p))),
                     ("layernorm_backward",
                      lambda p: (lambda: LN.layernorm_backward(x, w, mean, ln_rstd, dy,
                                                               plan=p)))):
        old = without_few_rows(op, M, N)
        want = call(old)()
        times = {}
        for columns, tile, warps in SETTINGS:
            block_m = triton.next_power_of_2(M)
            plan = BackwardPlan(path="columns", block_m=block_m, block_n=min(tile // block_m, N),
                                num_warps=warps, programs=1, columns=columns)
            got = call(plan)()
            for g, h in zip(got, want, strict=True):
                if g is not None:
                    torch.testing.assert_close(g.float(), h.float(), atol=0.1, rtol=0.05)
            times[(columns, tile, warps)] = gpu_us(call(plan))
        best = min(times, key=times.get)
        now = launch.backward_plan(M, N, x.device, layernorm=op.startswith("layer"))
        rule = (now.columns, now.block_m * now.block_n, now.num_warps)
        print(f"{op:18s} {M:3d} x {N:5d}  {old.path} + sums {gpu_us(call(old)):6.2f}  "
              f"columns best {best} {times[best]:6.2f}  rule's {now.path} "
              f"{rule} {times.get(rule, float('nan')):6.2f}  "
              + " ".join(f"{t:.1f}" for t in times.values()), flush=True)


if __name__ == "__main__":
    main()
