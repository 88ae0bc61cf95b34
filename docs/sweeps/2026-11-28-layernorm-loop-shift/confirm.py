# ruff: noqa: E501, E702  (kept as it ran: a record, not course code)
"""Scratch: LayerNorm's 16-bit loop path summed about its first 32 values: the rules
against the plans they replace and torch.compile, course.bench's timer, one process.
usage: python ln_confirm.py OUT"""
import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, ".")
import course  # noqa: F401
from course import bench, hardware, shootout

import torch

from solutions.kernels import launch
from solutions.kernels.launch_plans import ForwardPlan as S
from solutions.kernels.launch_plans import Variant as V

spec = importlib.util.spec_from_file_location("tune", "scripts/tune_kernels.py")
tune = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tune)
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
copy = hardware.copy_bandwidth()
print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy / 1e9:.0f} GB/s", flush=True)
op = "layernorm_fwd"
O = lambda bn, w, **k: S(path="loop", block_n=bn, num_warps=w, variant=V.ONE_ROW, **k)  # noqa
R = lambda bn, w, **k: S(path="rows", block_n=bn, num_warps=w, **k)  # noqa
SHAPES = [(16384, 8192, [R(8192, 16, variant=V.STREAM), R(8192, 8), O(4096, 8), O(4096, 16), O(2048, 8)]),
          (8192, 16384, [R(16384, 8, variant=V.STREAM), R(16384, 16, block_m=2), O(4096, 16), O(4096, 8), O(2048, 16)]),
          (4096, 32768, [O(8192, 32), O(4096, 16), O(4096, 32), R(32768, 32)]),
          (32768, 12288, [O(4096, 16), O(4096, 8), O(2048, 8)])]
results = []
for M, N, cands in SHAPES:
    dtype = torch.bfloat16
    nbytes = shootout.ideal_bytes(op, M, N, dtype)
    rule = launch.forward_plan(M, N, torch.device("cuda", 0), element_size=2, layernorm=True)
    plans = [rule] + [p for p in cands if p != rule]
    timed = {}
    for rnd in range(2):
        for k, plan in enumerate(plans if rnd == 0 else plans[::-1]):
            sets = [shootout.make_inputs(op, M, N, dtype, seed=1000 * k + s + 7 * rnd)
                    for s in range(bench.copies_needed(nbytes))]
            tm = bench.time_in_turn([tune.runner(op, t, plan) for t in sets], warmup=3,
                                    reps=30, hide_launch=True, timer="call")
            timed[repr(plan)] = max(timed.get(repr(plan), 0), nbytes / tm.median_s / copy)
            del sets
        torch.cuda.empty_cache()
    peers = {}
    for r in shootout.run_point(op, M, N, dtype, impls=None, reps=30, copy=copy, rounds=2):
        peers[r.impl] = (max(peers.get(r.impl, (0, ""))[0], r.fraction_of_copy or 0), r.status)
    print(f"== {M}x{N} peers (each call alone, run_point checks each against float64): "
          + ", ".join(f"{k} {100 * v:.1f} {st}" for k, (v, st) in peers.items()), flush=True)
    for p, fr in sorted(timed.items(), key=lambda kv: -kv[1]):
        tag = " (rule)" if p == repr(rule) else ""
        print(f"   {100 * fr:.1f}{tag} {p.replace('block_m=1, split=1, ', '').replace('reload=True, max_registers=0, ', '')}", flush=True)
    results.append({"M": M, "N": N, "rule": repr(rule), "plans": timed,
                    "peers": {k: v for k, v in peers.items()}})
    (out / "ln_confirm.json").write_text(json.dumps(results, indent=1))
