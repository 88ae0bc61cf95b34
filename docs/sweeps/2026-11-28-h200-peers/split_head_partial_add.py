# ruff: noqa: E401, E501, E702, I001  (kept as it ran: a record, not course code)
"""Scratch: (1) LayerNorm's split path, 16-bit rows, summed about the first 256 values'
mean (now) or the first 32 values' (the loop path's since 2026-11-28); (2) the H200's
partial-block rule at 11264 < N <= 16384; (3) fused add at 131072 / 262144 against Quack.
Each through course.shootout.run_point (float64 check first), both timers.
usage: python ln_split_head.py OUT"""
import importlib.util, json, sys, time
from pathlib import Path
sys.path.insert(0, ".")
import course  # noqa: F401
from course import bench, hardware, shootout
import torch
from solutions.kernels import launch, layernorm
from solutions.kernels.launch_plans import ForwardPlan as S
from solutions.kernels.launch_plans import Variant as V

spec = importlib.util.spec_from_file_location("tune", "scripts/tune_kernels.py")
tune = importlib.util.module_from_spec(spec); spec.loader.exec_module(tune)
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
parts = sys.argv[2].split(",") if len(sys.argv) > 2 else ["split", "partial", "add"]
copy = hardware.copy_bandwidth()
print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy / 1e9:.0f} GB/s", flush=True)
bf = torch.bfloat16
results = {"gpu": torch.cuda.get_device_name(), "copy": copy, "split": [], "partial": [], "add": []}
def save(): (out / "ln_split_head.json").write_text(json.dumps(results, indent=1))
def pct(rows): return {r.impl: (round(100 * (r.fraction_of_copy or 0), 1), r.status[:60]) for r in rows}
t0 = time.time()
if "split" in parts:
    for M, N in [(2048, 65536), (1024, 131072), (512, 262144)]:
        rule = launch.forward_plan(M, N, torch.device("cuda", 0), element_size=2, layernorm=True)
        for timer in ("call", "graph"):
            got = {}
            for rnd in range(2):
                for head in ((256, 32) if rnd == 0 else (32, 256)):
                    layernorm.HEAD = head
                    for r in shootout.run_point("layernorm_fwd", M, N, bf, impls=["ours"], reps=30, copy=copy, rounds=1, timer=timer):
                        key = f"ours HEAD={head}"
                        got[key] = max(got.get(key, (0, ""))[0], round(100 * (r.fraction_of_copy or 0), 1)), r.status[:60]
            layernorm.HEAD = 256
            peers = pct(shootout.run_point("layernorm_fwd", M, N, bf, impls=["torch.compile", "Liger", "Quack"], reps=30, copy=copy, rounds=2, timer=timer))
            got.update(peers)
            print(f"LN {M}x{N} {timer} rule={rule}: {got}  [{time.time() - t0:.0f}s]", flush=True)
            results["split"].append({"M": M, "N": N, "timer": timer, "rule": repr(rule), "pct": got}); save()
if "partial" in parts:
    O = lambda bn, w: S(path="loop", block_n=bn, num_warps=w, variant=V.ONE_ROW)  # noqa
    for M, N in [(32768, 12288), (16384, 14336), (16384, 15360), (32768, 13312)]:
        op = "layernorm_fwd"
        nbytes = shootout.ideal_bytes(op, M, N, bf)
        rule = launch.forward_plan(M, N, torch.device("cuda", 0), element_size=2, layernorm=True)
        plans = [rule] + [p for p in (O(4096, 16), O(4096, 8), O(2048, 8), O(2048, 16)) if p != rule]
        timed = {}
        for rnd in range(2):
            for k, plan in enumerate(plans if rnd == 0 else plans[::-1]):
                sets = [shootout.make_inputs(op, M, N, bf, seed=1000 * k + s + 7 * rnd) for s in range(bench.copies_needed(nbytes))]
                tm = bench.time_in_turn([tune.runner(op, t, plan) for t in sets], warmup=3, reps=30, hide_launch=True, timer="call")
                key = f"{plan.path} {plan.block_n}/{plan.num_warps} {plan.variant}" + (" (rule)" if plan == rule else "")
                timed[key] = max(timed.get(key, 0), round(100 * nbytes / tm.median_s / copy, 1))
                del sets
            torch.cuda.empty_cache()
        print(f"LN {M}x{N} partial: {timed}  [{time.time() - t0:.0f}s]", flush=True)
        results["partial"].append({"M": M, "N": N, "rule": repr(rule), "pct": timed}); save()
if "add" in parts:
    for M, N in [(1024, 131072), (512, 262144), (2048, 65536)]:
        for timer in ("call", "graph"):
            got = pct(shootout.run_point("add_rmsnorm_fwd", M, N, bf, impls=["ours", "torch.compile", "Quack"], reps=30, copy=copy, rounds=3, timer=timer))
            print(f"ADD {M}x{N} {timer}: {got}  [{time.time() - t0:.0f}s]", flush=True)
            results["add"].append({"M": M, "N": N, "timer": timer, "pct": got}); save()
