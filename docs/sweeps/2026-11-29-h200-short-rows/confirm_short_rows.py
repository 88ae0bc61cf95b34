# ruff: noqa
"""Scratch: at 32768 x 256/512 (bf16) the H200 rule's plan against the best plans of the
2026-11-28 sweeps (docs/sweeps/2026-11-28-h200-head/tune-*.json), both timers, 4 rounds
alternated, plus torch.compile. usage: python confirm256.py OUT"""
import importlib.util, json, sys, time
from pathlib import Path
sys.path.insert(0, ".")
import course
from course import bench, hardware, peers, shootout
import torch, triton
from solutions.kernels import launch
from solutions.kernels.launch_plans import ForwardPlan, Variant
spec = importlib.util.spec_from_file_location("tune", "scripts/tune_kernels.py")
tune = importlib.util.module_from_spec(spec); spec.loader.exec_module(tune)
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
copy = hardware.copy_bandwidth()
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, f"copy {copy/1e9:.0f} GB/s", flush=True)
bf = torch.bfloat16
sweeps = []
for f in ("tune-add-256.json", "tune-rms-short.json"):
    sweeps += json.loads(Path("docs/sweeps/2026-11-28-h200-head", f).read_text())
res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "copy": copy, "points": []}
t0 = time.time()
for op, M, N in [("add_rmsnorm_fwd", 32768, 256), ("rmsnorm_fwd", 32768, 256), ("rmsnorm_fwd", 32768, 512)]:
    rows = sorted((r for r in sweeps if (r["op"], r["M"], r["N"], r["timer"]) == (op, M, N, "call")), key=lambda r: -r["fraction"])
    import re
    cands = [eval(re.sub(r"<Variant\.(\w+): '[^']*'>", r"Variant.\1", r["plan"]), {"ForwardPlan": ForwardPlan, "Variant": Variant}) for r in rows[:4]]
    rule = launch.forward_plan(M, N, torch.device("cuda", 0), element_size=2, residual=op.startswith("add"))
    nbytes = shootout.ideal_bytes(op, M, N, bf)
    sets = [shootout.make_inputs(op, M, N, bf, seed=s) for s in range(bench.copies_needed(nbytes))]
    impls = {}
    for i, plan in enumerate([rule] + [c for c in cands if c != rule]):
        name = ("RULE " if plan == rule else f"cand{i} ") + repr(plan).replace("ForwardPlan", "")
        impls[name] = [tune.runner(op, t, plan) for t in sets]
    for p in peers.implementations(op):
        if p.name == "torch.compile":
            impls["torch.compile"] = [p.prepare(t, 1e-6) for t in sets]
            for c in impls["torch.compile"]: c()
    row = {"op": op, "M": M, "N": N}
    for timer in ("call", "graph"):
        best = {}
        names = list(impls)
        for rnd in range(4):
            for name in (names if rnd % 2 == 0 else names[::-1]):
                s = bench.time_in_turn(impls[name], warmup=3, reps=30, hide_launch=True, timer=timer).median_s
                best[name] = min(best.get(name, 9), s)
        row[timer] = {n: round(100 * nbytes / best[n] / copy, 2) for n in names}
    print(f"{op} {M}x{N} [{time.time()-t0:.0f}s]", flush=True)
    for n in row["call"]:
        print(f"   alone {row['call'][n]:6.2f}  graph {row['graph'][n]:6.2f}  {n}", flush=True)
    res["points"].append(row)
    (out / "confirm256.json").write_text(json.dumps(res, indent=1))
    del sets, impls; torch.cuda.empty_cache()
