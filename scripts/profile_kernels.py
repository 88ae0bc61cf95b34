"""Device time of every kernel an implementation launches, per call: ours against the peers.

    python scripts/profile_kernels.py --ops layernorm_fwd --shapes 32768x512 [--impls ours,...]

A whole call's time (`course bench`) says which implementation is slower; this says in which
of its kernels. Profiling this way (a one-off script then) found, the night of 2026-11-23,
that a quarter of our RMSNorm backward at 256 columns was its second kernel, the column
sums, which no sweep had tuned (docs/sweeps/2026-11-24/README.md, "The night's changes and
experiments"). Inputs rotate and outputs are kept alive, as `course bench` times them; the
kernel times come from `torch.profiler` over REPS calls. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import course  # noqa: E402,F401  (mode first)
from course import bench, hardware, peers, runtime, shootout  # noqa: E402

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

REPS = 20


def kernel_times(calls: list, reps: int = REPS) -> list[tuple[float, float, str]]:
    """(device us per call, launches per call, kernel name) for each kernel, slowest first."""
    keep = bench.output_keeper()
    for i in range(5):  # warm-up: compilation, autotuning, clocks
        keep(calls[i % len(calls)]())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            keep(calls[i % len(calls)]())
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        if event.device_type.name == "CUDA" and event.count:
            rows.append((event.device_time_total / reps, event.count / reps, event.key))
    return sorted(rows, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", default="rmsnorm_fwd", help=f"from {', '.join(peers.OPS)}")
    parser.add_argument("--shapes", default="32768x512", help="MxN[,MxN...]")
    parser.add_argument("--impls", default="", help="implementations (default: all)")
    parser.add_argument("--dtype", default="bfloat16", choices=list(shootout.DTYPES))
    args = parser.parse_args()
    if not runtime.on_gpu():
        raise hardware.NeedsGPU("profile_kernels.py reads kernel times from the GPU: it needs "
                                "a CUDA GPU (no GPU is visible here)")
    dtype = shootout.DTYPES[args.dtype]
    wanted = [name for name in args.impls.split(",") if name]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for op in args.ops.split(","):
        for M, N in shootout.parse_shapes(args.shapes):
            nbytes = shootout.ideal_bytes(op, M, N, dtype)
            sets = [shootout.make_inputs(op, M, N, dtype, seed=s)
                    for s in range(bench.copies_needed(nbytes))]
            for impl in peers.implementations(op):
                if wanted and impl.name not in wanted:
                    continue
                try:
                    calls = [impl.prepare(t, 1e-6) for t in sets]
                except peers.Unavailable as exc:
                    print(f"{op} {M}x{N} {impl.name}: unavailable ({exc})", flush=True)
                    continue
                rows = kernel_times(calls)
                total = sum(r[0] for r in rows)
                print(f"{op} {M}x{N} {impl.name}: {total:.1f} us of kernels per call", flush=True)
                for us, launches, name in rows:
                    print(f"    {us:8.2f} us  x{launches:g}  {name[:100]}", flush=True)
            del sets
            torch.cuda.empty_cache()


if __name__ == "__main__":
    try:
        main()
    except hardware.NeedsGPU as exc:
        sys.exit(str(exc))
