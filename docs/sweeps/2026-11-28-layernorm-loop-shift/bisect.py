# ruff: noqa: E501, B023  (kept as it ran: a record, not course code)
"""Scratch: bisect our loop kernel against the minimal one, course.bench's timer, H200."""
import sys
from pathlib import Path

sys.path.insert(0, ".")
sys.path.insert(0, str(Path(__file__).parent))
import course  # noqa: F401
from course import bench, hardware, shootout

import bisect_kernel as ek
import minimal_kernel as mk
import torch
import torch.nn.functional as F

copy = hardware.copy_bandwidth()
print(torch.cuda.get_device_name(), f"copy {copy / 1e9:.0f} GB/s", flush=True)
op = "layernorm_fwd"
CFG = dict(FIXED_N=0, LANES=False, SHIFT_ONE=0, ROW_BLOCKS=0, FIXED_STRIDE=0, HEADN=256)
VARIANTS = {
    "one_row block mean": dict(ROW_BLOCKS=1),
    "one_row x0": dict(ROW_BLOCKS=1, SHIFT_ONE=1),
    "one_row head16": dict(ROW_BLOCKS=1, SHIFT_ONE=2, HEADN=16),
    "one_row head32": dict(ROW_BLOCKS=1, SHIFT_ONE=2, HEADN=32),
    "one_row head64": dict(ROW_BLOCKS=1, SHIFT_ONE=2, HEADN=64),
}
for M, N, dtype in ((8192, 16384, torch.bfloat16), (16384, 8192, torch.bfloat16), (4096, 32768, torch.bfloat16)):
    nbytes = shootout.ideal_bytes(op, M, N, dtype)

    def exp(t, blk, warps, v):
        x, w, b = t["x"], t["weight"], t["bias"]
        y = torch.empty_like(x)
        flags = CFG | v
        if flags["FIXED_N"]:
            flags["FIXED_N"] = N
        if flags["FIXED_STRIDE"]:
            flags["FIXED_STRIDE"] = N
        if flags["ROW_BLOCKS"]:
            flags["ROW_BLOCKS"] = N // blk
        even = bool(flags["ROW_BLOCKS"]) and N // blk > 1
        return lambda: (ek.ln_exp[(M,)](x, w, b, y, y, y, M, N, N, N, 1e-5, HAS_WEIGHT=True,
                                        HAS_BIAS=True, BLOCK_N=blk, OUT_BLOCK=blk, EVEN=even,
                                        MULTIPLE=16, num_warps=warps, **flags), y)[1]

    def minimal(t, blk, warps):
        y = torch.empty_like(t["x"])
        return lambda: (mk.ln_loop[(M,)](t["x"], t["weight"], t["bias"], y, N, N, 1e-5,
                                         BLOCK=blk, NC=N, CONST_N=True, SHIFT_BLOCK=False,
                                         num_warps=warps, num_stages=1), y)[1]
    entries = []
    for blk, warps in ((4096, 16), (4096, 8), (8192, 32)):
        for name, v in VARIANTS.items():
            entries.append((f"{name} {blk}/{warps}", lambda t, b=blk, w=warps, v=v: exp(t, b, w, v)))
    t = shootout.make_inputs(op, M, N, dtype, seed=1)
    ref = F.layer_norm(t["x"].float(), (N,), t["weight"].float(), t["bias"].float(), 1e-5)
    bad = set()
    for name, make in entries:
        err = (make(t)().float() - ref).abs().max().item()
        if err > 0.1:
            bad.add(name)
            print("   WRONG", name, err)
    del t, ref
    timed = {}
    for rnd in range(2):
        for k, (name, make) in enumerate(entries if rnd == 0 else entries[::-1]):
            sets = [shootout.make_inputs(op, M, N, dtype, seed=1000 * k + s + 7 * rnd)
                    for s in range(bench.copies_needed(nbytes))]
            tm = bench.time_in_turn([make(s) for s in sets], warmup=3, reps=30,
                                    hide_launch=True, timer="call")
            timed[name] = max(timed.get(name, 0), nbytes / tm.median_s / copy)
            del sets
        torch.cuda.empty_cache()
    print(f"== {M}x{N}", flush=True)
    for name, fr in sorted(timed.items(), key=lambda kv: -kv[1]):
        print(f"   {100 * fr:.1f} {name}", flush=True)
