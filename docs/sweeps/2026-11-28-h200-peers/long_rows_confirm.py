# ruff: noqa: E401, E501, E702, I001  (kept as it ran: a record, not course code)
"""Scratch: the H200's new LayerNorm rules for rows of 65536 to 262144 against the plans
they replace (each on its own inputs, two rounds, course.bench's timer), and the rule
against the peers through course.shootout.run_point, both timers. usage: python X.py OUT"""
import importlib.util, json, sys, time
from pathlib import Path
sys.path.insert(0, ".")
import course  # noqa: F401
from course import bench, hardware, shootout
import torch
from solutions.kernels import launch
from solutions.kernels.launch_plans import ForwardPlan as S
spec = importlib.util.spec_from_file_location("tune", "scripts/tune_kernels.py")
tune = importlib.util.module_from_spec(spec); spec.loader.exec_module(tune)
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
copy = hardware.copy_bandwidth(); bf = torch.bfloat16; op = "layernorm_fwd"; t0 = time.time()
print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy / 1e9:.0f} GB/s", flush=True)
OLD = {65536: S(path="split", block_n=16384, num_warps=16, split=4, out_block=8192),
       131072: S(path="split", block_n=16384, num_warps=16, split=8, out_block=8192),
       262144: S(path="split", block_n=16384, num_warps=16, split=16, out_block=8192)}
res = {"gpu": torch.cuda.get_device_name(), "copy": copy, "rows": []}
for M, N in [(2048, 65536), (1024, 131072), (512, 262144), (4096, 65536)]:
    nbytes = shootout.ideal_bytes(op, M, N, bf)
    rule = launch.forward_plan(M, N, torch.device("cuda", 0), element_size=2, layernorm=True)
    timed = {}
    for rnd in range(2):
        for k, plan in enumerate([rule, OLD[N]] if rnd == 0 else [OLD[N], rule]):
            sets = [shootout.make_inputs(op, M, N, bf, seed=1000 * k + s + 7 * rnd) for s in range(bench.copies_needed(nbytes))]
            tm = bench.time_in_turn([tune.runner(op, t, plan) for t in sets], warmup=3, reps=30, hide_launch=True, timer="call")
            key = "rule" if plan == rule else "old"
            timed[key] = max(timed.get(key, 0), round(100 * nbytes / tm.median_s / copy, 1))
            del sets
        torch.cuda.empty_cache()
    peers = {}
    for timer in ("call", "graph"):
        rows = shootout.run_point(op, M, N, bf, impls=["ours", "torch.compile"], reps=30, copy=copy, rounds=2, timer=timer)
        peers[timer] = {r.impl: (round(100 * (r.fraction_of_copy or 0), 1), r.status[:50]) for r in rows}
    print(f"LN {M}x{N}: rule {timed['rule']} old {timed['old']} | run_point {peers}  [{time.time() - t0:.0f}s]", flush=True)
    res["rows"].append({"M": M, "N": N, "rule": repr(rule), "old": repr(OLD[N]), "pct": timed, "run_point": peers})
    (out / "ln_long_confirm.json").write_text(json.dumps(res, indent=1))
