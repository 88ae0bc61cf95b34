"""Sweep the reference kernels' launch plans on the GPU in hand; print the best per shape.

    python scripts/tune_kernels.py [--ops rmsnorm_fwd,rmsnorm_bwd,...] [--shapes MxN,...]
                                   [--paths rows,pieces,loop,split] [--dtype bfloat16]
                                   [--timer call|graph] [--out DIR]

The winners are copied by hand into the GPU's table of measured rules,
solutions/kernels/plans/<gpu>.json (docs/launch-rules.md#adding-a-gpu says how), and the
sweep's output is summarised in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import course  # noqa: E402,F401  (mode first)
from course import bench, hardware, shootout  # noqa: E402

import torch  # noqa: E402

from solutions.kernels import launch  # noqa: E402
from solutions.kernels.launch_plans import (  # noqa: E402
    MAX_ROW_BLOCKS,
    BackwardPlan,
    ForwardPlan,
    Variant,
)
from solutions.kernels.layernorm import _forward as ln_fwd  # noqa: E402
from solutions.kernels.layernorm import layernorm_backward  # noqa: E402
from solutions.kernels.rmsnorm import _forward as rms_fwd  # noqa: E402
from solutions.kernels.rmsnorm import rmsnorm_backward  # noqa: E402
from solutions.kernels.sibling_sync import next_power_of_2_split  # noqa: E402

P2 = [1 << i for i in range(19)]
REGISTERS_PER_SM = 65536  # an H100's register file, in 32-bit registers (the default)


def forward_candidates(N: int, sms: int) -> list[ForwardPlan]:
    """Every rows plan of one tile a program comes three times: plain, streamed
    (Variant.STREAM) and with the weight after the sum (Variant.WEIGHT_AFTER)."""
    block_n = 1 << (N - 1).bit_length()
    rows = functools.partial(ForwardPlan, path="rows", block_n=block_n)
    loop = functools.partial(ForwardPlan, path="loop")
    unrolled = (Variant.PLAIN, Variant.ONE_ROW)
    out = []
    if block_n <= 32768:
        for block_m in P2:
            elems = block_m * block_n
            if block_m > 64 or elems > 32768 or (elems < 1024 and block_m < 64):
                continue
            for warps in (1, 2, 4, 8, 16, 32):
                if 4 <= elems / (32 * warps) <= 64:
                    out += [rows(block_m=block_m, num_warps=warps, variant=variant)
                            for variant in (Variant.PLAIN, Variant.STREAM, Variant.WEIGHT_AFTER)]
                    if block_n <= 2048 and elems <= 4096:  # persistent, prefetching
                        out += [rows(block_m=block_m, num_warps=warps, programs=k * sms,
                                     variant=Variant.PREFETCH) for k in (2, 4, 8)]
    if 8192 <= block_n <= 32768:  # one program per row, two per SM if registers allow
        for warps in (16, 32):
            for out_block in (4096, 8192, block_n):
                for registers in (0, 32, 40):
                    out += [loop(block_n=block_n, num_warps=warps,
                                 out_block=min(out_block, block_n), max_registers=registers,
                                 variant=variant) for variant in unrolled]
    if N > 4096:  # one program per row, the row in up to 16 unrolled blocks of its own
        for block in (1024, 2048, 4096, 8192):
            if block < N <= MAX_ROW_BLOCKS * block:
                out += [loop(block_n=block, num_warps=warps, variant=Variant.ONE_ROW)
                        for warps in (4, 8, 16, 32) if 2 <= block / (32 * warps) <= 16]
    if N >= 16384:  # rows too long for registers, or nearly
        for block in (16384, 32768, 65536):
            if block > 2 * block_n:
                continue
            for warps in (16, 32):
                for out_block in (8192, 16384):
                    out.append(loop(block_n=min(block, block_n), num_warps=warps, programs=sms,
                                    out_block=min(out_block, block_n)))
                    if block_n >= 65536 or block < block_n:  # one program per row
                        out += [loop(block_n=min(block, block_n), num_warps=warps,
                                     out_block=min(out_block, block_n), max_registers=registers,
                                     variant=variant)
                                for registers in (0, 40, 64)
                                for variant in (unrolled if block >= block_n else unrolled[:1])]
    if N >= 65536:
        for chunk in (8192, 16384, 32768, 65536):
            split = next_power_of_2_split(N, chunk)
            if 2 <= split <= 64:
                shared = functools.partial(ForwardPlan, path="split", block_n=chunk, split=split)
                for warps in (8, 16, 32):
                    if 8 <= chunk / (32 * warps) <= 64:
                        out += [shared(num_warps=warps, out_block=second)
                                for second in (4096, 8192)]
                        if warps == 16:  # two programs an SM
                            out += [shared(num_warps=warps, out_block=second,
                                           max_registers=64) for second in (4096, 8192)]
                        if chunk >= 32768:  # larger second-pass blocks, register caps
                            out += [shared(num_warps=warps, out_block=min(second, chunk),
                                           max_registers=registers)
                                    for second in (16384, 32768) for registers in (0, 64)]
                        if chunk <= 16384:  # the columns kept in registers
                            out.append(shared(num_warps=warps, reload=False))
    return out


def backward_candidates(M: int, N: int, sms: int, registers_per_sm: int = REGISTERS_PER_SM
                        ) -> list[BackwardPlan]:
    block_n = 1 << (N - 1).bit_length()
    out = []
    if N < block_n <= 16384:  # the pieces path: the row as block_n / 2 columns and the rest
        for warps in (2, 4, 8, 16):
            for k in (1, 2, 4, 8):
                if 2 <= N / (32 * warps) <= 64 and warps * k <= 64 and k * sms <= M:
                    out.append(BackwardPlan(path="pieces", block_n=block_n // 2,
                                            num_warps=warps, programs=k * sms))
    if block_n <= 16384:
        for block_m in (1, 2, 4, 8, 16):
            elems = block_m * block_n
            if elems > 16384 or (elems < 1024 and block_m < 16):
                continue
            for warps in (2, 4, 8, 16):
                if not 4 <= elems / (32 * warps) <= 64:
                    continue
                for k in (1, 2, 4, 8):  # 4 to 8 an SM: short rows, as Inductor launches
                    for each_step in ((False, True) if block_m > 1 else (False,)):
                        if k * sms <= M:
                            out += [BackwardPlan(path="rows", block_m=block_m, block_n=block_n,
                                                 num_warps=warps, programs=k * sms,
                                                 sum_each_step=each_step, prefetch=ahead)
                                    for ahead in (False, True)]
    if 4096 <= block_n <= 16384:  # one row at a time, read again for dx
        out += [BackwardPlan(path="rows", block_n=block_n, num_warps=warps,
                             programs=min(M, sms), reload=True) for warps in (16, 32)]
    if N >= 16384:
        for chunk in (4096, 8192, 16384):
            split = next_power_of_2_split(N, chunk)
            if not 2 <= split <= 32:
                continue
            for warps in (4, 8, 16):
                if not 8 <= chunk / (32 * warps) <= 64:
                    continue
                for k in (1, 2, 4):  # programs per SM, if their registers let them fit
                    groups = max(1, k * sms // split)
                    fits = registers_per_sm // (k * 32 * warps) // 8 * 8
                    caps = (0,) + ((fits,) if 64 <= fits < 255 else ())
                    out += [BackwardPlan(path="split", block_n=chunk, num_warps=warps,
                                         programs=groups, split=split, max_registers=cap)
                            for cap in caps]
    return out


def runner(op: str, t: dict, plan):
    x, w = t["x"], t["weight"]
    if op == "rmsnorm_fwd":
        return lambda: rms_fwd(x, w, 1e-6, None, False, plan)[0]
    if op == "add_rmsnorm_fwd":
        return lambda: rms_fwd(x, w, 1e-6, t["residual"], False, plan)[:2]
    if op == "layernorm_fwd":
        return lambda: ln_fwd(x, w, t["bias"], 1e-5, False, plan)[0]
    if op == "rmsnorm_bwd":
        rstd = torch.rsqrt(x.float().square().mean(-1) + 1e-6)
        return lambda: rmsnorm_backward(x, w, rstd, t["dy"], plan)
    mean = x.float().mean(-1)
    rstd = torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5)
    return lambda: layernorm_backward(x, w, mean, rstd, t["dy"], plan=plan)


def compile_plans(op: str, M: int, N: int, dtype: torch.dtype, plans: list, part: str) -> None:
    """Run this process's share of the plans once, so that Triton compiles each kernel as
    the sweep will: the forwards on 64 rows (a multiple of 16, like the sweep's), the
    backwards on the sweep's M (their rows a program is an argument, which Triton makes a
    constant when it is 1)."""
    k, j = (int(v) for v in part.split("/"))
    if not 0 <= k < j:
        raise SystemExit(f"--compile-part K/J wants 0 <= K < J, not {part}")
    t = shootout.make_inputs(op, M if op.endswith("_bwd") else 64, N, dtype)
    for plan in plans[k::j]:
        try:
            runner(op, t, plan)()
        except Exception as exc:
            print(f"  {plan}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", default="rmsnorm_fwd,rmsnorm_bwd")
    parser.add_argument("--shapes", default="all")
    parser.add_argument("--min-n", type=int, default=0, help="skip shapes with fewer columns")
    parser.add_argument("--paths", default="rows,pieces,loop,split",
                        help="candidate plans of these paths only (the rule always runs)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--timer", default="call", choices=bench.TIMERS,
                        help="how each plan is timed (bench.time_in_turn)")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    parser.add_argument("--compile-part", default="",
                        help="K/J: only compile every J-th plan from the K-th (compile_plans) "
                             "and time nothing; J such processes side by side fill Triton's "
                             "cache for the sweep that follows, whose compiles are most of its "
                             "time")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    gpu = launch.gpu_properties(torch.device("cuda", 0))
    sms, registers = gpu.sms, gpu.registers_per_sm
    results = []
    if not args.compile_part:  # J processes compiling side by side measure nothing
        copy = hardware.copy_bandwidth()
        print(f"{torch.cuda.get_device_name()}: copy {copy / 1e9:.0f} GB/s, {sms} SMs",
              flush=True)
        Path(args.out).mkdir(parents=True, exist_ok=True)
    shapes = shootout.SHAPES if args.shapes == "all" else shootout.parse_shapes(args.shapes)
    for op in args.ops.split(","):
        for M, N in shapes:
            if (op.endswith("_bwd") and N > 65536) or N < args.min_n:
                continue
            nbytes = shootout.ideal_bytes(op, M, N, dtype)
            device = torch.device("cuda", torch.cuda.current_device())
            default = (launch.forward_plan(M, N, device, element_size=dtype.itemsize,
                                           residual=op == "add_rmsnorm_fwd",
                                           layernorm=op == "layernorm_fwd")
                       if op.endswith("fwd") else
                       launch.backward_plan(M, N, device, dtype=dtype,
                                            layernorm=op.startswith("layernorm")))
            cands = (forward_candidates(N, sms) if op.endswith("fwd")
                     else backward_candidates(M, N, sms, registers))
            timed = []
            paths = args.paths.split(",")
            plans = [default] + [c for c in cands if c != default and c.path in paths]
            if args.compile_part:
                compile_plans(op, M, N, dtype, plans, args.compile_part)
                continue
            for k, plan in enumerate(plans):
                # Each plan on inputs of its own, as `course bench` gives each implementation.
                # On inputs shared with the plans before, streamed plans (evict-first loads)
                # measured 1.0 to 1.8 points of copy faster than on their own, plain plans 0.1
                # to 0.7: likely lines the plan before read with normal priority, still in L2
                # (docs/sweeps/2026-11-24-streamed-rows/README.md).
                sets = [shootout.make_inputs(op, M, N, dtype, seed=1000 * k + s)
                        for s in range(bench.copies_needed(nbytes))]
                try:
                    tm = bench.time_in_turn([runner(op, t, plan) for t in sets], warmup=3,
                                            reps=20, hide_launch=True, timer=args.timer)
                    frac = nbytes / tm.median_s / copy
                    timed.append((frac, plan))
                    results.append({"op": op, "dtype": args.dtype, "M": M, "N": N,
                                    "plan": repr(plan), "fraction": frac, "timer": args.timer,
                                    "default": plan == default})
                except Exception as exc:
                    print(f"  {plan}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            timed.sort(key=lambda p: -p[0])
            dflt = next(f for f, p in timed if p == default) if timed else float("nan")
            print(f"{op} {args.dtype} {M}x{N}: default {100 * dflt:.1f}% | best " + " | ".join(
                f"{100 * f:.1f}% {p}" for f, p in timed[:3]), flush=True)
            del sets
            torch.cuda.empty_cache()
            # After every shape, so that a sweep stopped by a time limit keeps what it measured.
            (Path(args.out) / "tune.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
