# ruff: noqa
"""Scratch: the split kernels without masks (EVEN) and LayerNorm's two sums in one reduction,
against the kernels at HEAD (.scratch/head/*.py) and the peers, both timers, one process.
usage: python split_even.py OUT [groups]"""
import importlib.util, json, sys, time
from pathlib import Path
sys.path.insert(0, ".")
import course
from course import bench, hardware, peers, shootout
import torch, triton
from solutions.kernels import add_rmsnorm, layernorm, rmsnorm, launch

def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); return mod
ln_head = load("ln_head", ".scratch/head/ln_head.py")
rms_head = load("rms_head", ".scratch/head/rms_head.py")

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
groups = sys.argv[2].split(",") if len(sys.argv) > 2 else ["split", "loop"]
copy = hardware.copy_bandwidth()
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, f"copy {copy/1e9:.0f} GB/s", flush=True)
bf = torch.bfloat16
EPS = 1e-6
OURS = {"layernorm_fwd": (lambda t: lambda: layernorm(t["x"], t["weight"], t["bias"], EPS),
                          lambda t: lambda: ln_head.layernorm(t["x"], t["weight"], t["bias"], EPS)),
        "rmsnorm_fwd": (lambda t: lambda: rmsnorm(t["x"], t["weight"], EPS),
                        lambda t: lambda: rms_head.rmsnorm(t["x"], t["weight"], EPS)),
        "add_rmsnorm_fwd": (lambda t: lambda: add_rmsnorm(t["x"], t["residual"], t["weight"], EPS),
                            lambda t: lambda: rms_head.add_rmsnorm(t["x"], t["residual"], t["weight"], EPS))}
PEERS = {"layernorm_fwd": [], "rmsnorm_fwd": ["Quack", "Liger"], "add_rmsnorm_fwd": ["Quack"]}
points = []
if "split" in groups:
    points += [(op, M, N) for op in ("layernorm_fwd", "add_rmsnorm_fwd", "rmsnorm_fwd")
               for M, N in ((2048, 65536), (1024, 131072), (512, 262144))]
if "loop" in groups:
    points += [("layernorm_fwd", M, N) for M, N in ((16384, 8192), (8192, 16384), (4096, 32768), (32768, 12288))]
res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "copy": copy, "points": []}
t0 = time.time()
for op, M, N in points:
    plan = launch.forward_plan(M, N, torch.device("cuda", 0), element_size=2, layernorm=op.startswith("layernorm"), residual=op.startswith("add"))
    check = shootout.run_point(op, M, N, bf, impls=["ours"] + PEERS[op], reps=5, copy=copy, rounds=1)
    status = {r.impl: r.status for r in check}
    nbytes = shootout.ideal_bytes(op, M, N, bf)
    sets = [shootout.make_inputs(op, M, N, bf, seed=s) for s in range(bench.copies_needed(nbytes))]
    impls = {"new": [OURS[op][0](t) for t in sets], "head": [OURS[op][1](t) for t in sets]}
    for p in peers.implementations(op):
        if p.name in PEERS[op] and status.get(p.name) == "ok":
            impls[p.name] = [p.prepare(t, EPS) for t in sets]
    row = {"op": op, "M": M, "N": N, "plan": repr(plan), "even": plan.split_even(N), "status": status}
    for timer in ("call", "graph"):
        best = {}
        names = list(impls)
        for rnd in range(3):
            for name in (names if rnd % 2 == 0 else names[::-1]):
                s = bench.time_in_turn(impls[name], warmup=3, reps=30, hide_launch=True, timer=timer).median_s
                best[name] = min(best.get(name, 9), s)
        row[timer] = {n: round(100 * nbytes / best[n] / copy, 2) for n in names}
    print(f"{op} {M}x{N} even={row['even']} {plan.path}/{plan.block_n}/{plan.num_warps}w/split{plan.split}/out{plan.out_block}: "
          f"alone {row['call']}  graph {row['graph']}  status {status}  [{time.time()-t0:.0f}s]", flush=True)
    res["points"].append(row)
    (out / "split_even.json").write_text(json.dumps(res, indent=1))
    del sets, impls; torch.cuda.empty_cache()
