# ruff: noqa: E401, E501, E702, I001  (kept as it ran: a record, not course code)
"""Scratch: LayerNorm's loop-path cells (and RMSNorm 32768 x 4096) against every peer, both
timers, course.shootout.run_point (float64 check first). usage: python ln_peers.py OUT"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, ".")
import course  # noqa: F401
from course import hardware, shootout
import torch
from solutions.kernels import launch
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
copy = hardware.copy_bandwidth()
print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy / 1e9:.0f} GB/s", flush=True)
res = {"gpu": torch.cuda.get_device_name(), "copy": copy, "rows": []}; t0 = time.time()
cells = [("layernorm_fwd", M, N) for M, N in [(16384, 8192), (8192, 16384), (4096, 32768), (32768, 12288), (32768, 4096)]] + [("rmsnorm_fwd", 32768, 4096)]
for op, M, N in cells:
    rule = launch.forward_plan(M, N, torch.device("cuda", 0), element_size=2, layernorm=op == "layernorm_fwd")
    for timer in ("call", "graph"):
        rows = shootout.run_point(op, M, N, torch.bfloat16, impls=None, reps=30, copy=copy, rounds=3, timer=timer)
        got = {r.impl: (round(100 * (r.fraction_of_copy or 0), 1), r.status[:50]) for r in rows}
        best = max((v[0] for k, v in got.items() if k != "ours" and v[1] == "ok"), default=0)
        print(f"{op} {M}x{N} {timer}: ours/best {got['ours'][0] / best:.3f} {got}  [{time.time() - t0:.0f}s]", flush=True)
        res["rows"].append({"op": op, "M": M, "N": N, "timer": timer, "rule": repr(rule), "pct": got})
        (out / "ln_peers.json").write_text(json.dumps(res, indent=1))
