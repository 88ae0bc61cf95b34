"""The H200 confirmation of 2026-11-28: the new RMSNorm rules against the peers (call and
graph timers), and more plans for the fused add and LayerNorm.
usage (repository root): python confirm.py OUTDIR"""
import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, ".")
import course  # noqa: F401
from course import bench, hardware, shootout

import torch

from solutions.kernels import launch
from solutions.kernels.launch_plans import ForwardPlan, Variant

spec = importlib.util.spec_from_file_location("tune", "scripts/tune_kernels.py")
tune = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tune)
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
copy = hardware.copy_bandwidth()
print(f"copy {copy / 1e9:.0f} GB/s", flush=True)
dtype = torch.bfloat16
S = ForwardPlan
results = []
for timer in ("call", "graph"):
    for op, M, N in (("rmsnorm_fwd", 1024, 131072), ("rmsnorm_fwd", 512, 262144)):
        rows = shootout.run_point(op, M, N, dtype, impls=["ours", "Quack", "torch.compile"],
                                  reps=30, copy=copy, rounds=3, timer=timer)
        line = ", ".join(f"{r.impl} {100 * r.fraction_of_copy:.1f}" for r in rows
                         if r.status == "ok")
        print(f"{timer} {op} {M}x{N}: {line}", flush=True)
        results.append({"timer": timer, "op": op, "M": M, "N": N,
                        "rows": {r.impl: r.fraction_of_copy for r in rows if r.status == "ok"}})
        (out / "confirm.json").write_text(json.dumps(results, indent=1))


def split(chunk, warps, n, reload=True, out_block=8192, regs=0):
    return S(path="split", block_n=chunk, split=max(2, -(-n // chunk)), num_warps=warps,
             reload=reload, out_block=min(out_block, chunk), max_registers=regs)


MORE = {("add_rmsnorm_fwd", 1024, 131072): [split(16384, 8, 131072, out_block=4096),
                                            split(16384, 8, 131072),
                                            split(8192, 8, 131072, out_block=4096),
                                            split(16384, 16, 131072, reload=False, regs=64)],
        ("add_rmsnorm_fwd", 512, 262144): [split(16384, 8, 262144, out_block=4096),
                                           split(8192, 8, 262144, out_block=4096),
                                           split(16384, 16, 262144, out_block=2048)],
        ("layernorm_fwd", 8192, 16384): [S(path="rows", block_n=16384, num_warps=8,
                                           variant=Variant.STREAM),
                                         S(path="rows", block_n=16384, num_warps=8,
                                           variant=Variant.WEIGHT_AFTER),
                                         S(path="loop", block_n=16384, num_warps=16,
                                           out_block=4096),
                                         S(path="loop", block_n=16384, num_warps=16,
                                           out_block=4096, max_registers=64)]}
for (op, M, N), plans in MORE.items():
    nbytes = shootout.ideal_bytes(op, M, N, dtype)
    default = launch.forward_plan(M, N, torch.device("cuda", 0), element_size=2,
                                  residual=op == "add_rmsnorm_fwd", layernorm=op == "layernorm_fwd")
    plans = [default] + plans
    timed = {}
    for rnd in range(3):
        for k, plan in enumerate(plans if rnd % 2 == 0 else plans[::-1]):
            try:
                sets = [shootout.make_inputs(op, M, N, dtype, seed=100 * k + s + 7 * rnd)
                        for s in range(bench.copies_needed(nbytes))]
                tm = bench.time_in_turn([tune.runner(op, t, plan) for t in sets], warmup=3,
                                        reps=30, hide_launch=True, timer="call")
                timed[repr(plan)] = max(timed.get(repr(plan), 0), nbytes / tm.median_s / copy)
                del sets
            except Exception as exc:
                print(f"  {plan}: {type(exc).__name__}: {str(exc)[:150]}", flush=True)
    print(f"== {op} {M}x{N}", flush=True)
    for p, f in sorted(timed.items(), key=lambda kv: -kv[1]):
        print(f"   {100 * f:.1f}{' (rule)' if p == repr(default) else ''} {p}", flush=True)
    results.append({"op": op, "M": M, "N": N, "plans": timed, "rule": repr(default)})
    (out / "confirm.json").write_text(json.dumps(results, indent=1))
