"""How close a norm of short rows can get to the copy bandwidth: the floors under it.

    python scripts/short_row_floor.py [--shapes 32768x256,32768x512] [--rounds 3] [--out DIR]

RMSNorm at 32768 x 256 in bfloat16 moves 34 MB a call, 11 us at copy speed, and issue #3
asks for 85 % of copy there: at most 2.0 us a call beyond the bytes. This times, the way
`course bench` times a cell (GPU time with the launch hidden, rotating inputs, fresh outputs
kept alive, the best median of several rounds):

- an empty kernel, on one program and on as many programs as a copy launches;
- `torch.Tensor.copy_` of x into fresh memory;
- Triton copies of x, one block a program, with and without `evict_first` on the loads
  (the launches that came out fastest among 58 tried, docs/benchmarks.md);
- our RMSNorm forward (`solutions.kernels.rmsnorm`).

For each it prints the time, the % of copy over RMSNorm's ideal bytes (the benchmark's
figure) and the time beyond those bytes at the copy bandwidth. A norm cannot store any of
a row before it has the whole row and its sum, so a plain copy of the same bytes is a
ceiling it does not reach. Needs a CUDA GPU (without one, `candidates` still builds every
call, which the tests run in Triton's interpreter).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import course  # noqa: E402,F401  (mode first)
from course import bench, hardware, peers, shootout  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from solutions.kernels import rmsnorm  # noqa: E402

# (values a program, warps) of the Triton copies, each timed with and without evict_first
COPY_LAUNCHES = ((4096, 4), (8192, 4), (8192, 8))
OP = "rmsnorm_fwd"


@triton.jit
def empty_kernel(x_ptr):
    pass


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, EVICT_FIRST: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    if EVICT_FIRST:  # x is not read again: L2 may drop it before the lines being written
        values = tl.load(x_ptr + offsets, mask=mask, eviction_policy="evict_first")
    else:
        values = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, values, mask=mask)


MakeCall = Callable[[peers.Inputs], Callable[[], object]]


def candidates(M: int, N: int) -> dict[str, MakeCall]:
    """Name -> a function that binds one set of inputs (`shootout.make_inputs`) to a call."""
    out: dict[str, MakeCall] = {}
    n = M * N
    most_programs = triton.cdiv(n, min(block for block, _ in COPY_LAUNCHES))

    def empty(grid: int) -> MakeCall:
        def bind(t):
            def call():
                empty_kernel[(grid,)](t["x"])
            return call
        return bind

    def triton_copy(block: int, warps: int, evict_first: bool) -> MakeCall:
        def bind(t):
            def call():
                y = torch.empty_like(t["x"])
                copy_kernel[(triton.cdiv(n, block),)](t["x"], y, n, BLOCK=block,
                                                      EVICT_FIRST=evict_first,
                                                      num_warps=warps)
                return y
            return call
        return bind

    out["empty kernel, 1 program"] = empty(1)
    out[f"empty kernel, {most_programs} programs"] = empty(most_programs)
    out["torch copy_"] = lambda t: (lambda: torch.empty_like(t["x"]).copy_(t["x"]))
    for block, warps in COPY_LAUNCHES:
        for evict_first in (False, True):
            hint = ", evict_first" if evict_first else ""
            out[f"Triton copy, {block} values a program, {warps} warps{hint}"] = triton_copy(
                block, warps, evict_first)
    out["ours (RMSNorm)"] = lambda t: (lambda: rmsnorm(t["x"], t["weight"], 1e-6))
    return out


def best_medians(calls: dict[str, list[Callable[[], object]]], rounds: int) -> dict[str, float]:
    """The best median time of each name's calls over `rounds` rounds, taken in the order
    `course bench` times its implementations (`bench.in_alternating_order`)."""
    best: dict[str, float] = {}
    for name in bench.in_alternating_order(list(calls), rounds):
        seconds = bench.time_in_turn(calls[name], warmup=5, reps=40, hide_launch=True).median_s
        best[name] = min(best.get(name, seconds), seconds)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="32768x256,32768x512")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    try:
        copy = hardware.copy_bandwidth()
    except hardware.NeedsGPU as exc:
        sys.exit(str(exc))
    print(f"{torch.cuda.get_device_name()}: copy {copy / 1e9:.0f} GB/s", flush=True)
    results = []
    for M, N in shootout.parse_shapes(args.shapes):
        nbytes = shootout.ideal_bytes(OP, M, N, torch.bfloat16)
        floor_s = nbytes / copy
        sets = [shootout.make_inputs(OP, M, N, torch.bfloat16, seed=s)
                for s in range(bench.copies_needed(nbytes))]
        calls = {name: [bind(t) for t in sets] for name, bind in candidates(M, N).items()}
        print(f"\n{M} x {N} bfloat16: {nbytes / 1e6:.1f} MB, {floor_s * 1e6:.2f} us at copy "
              f"speed; 85 % of copy is {floor_s / 0.85 * 1e6:.2f} us", flush=True)
        for name, seconds in best_medians(calls, args.rounds).items():
            print(f"{seconds * 1e6:8.2f} us  {100 * floor_s / seconds:5.1f} % of copy  "
                  f"{(seconds - floor_s) * 1e6:6.2f} us beyond the bytes  {name}", flush=True)
            results.append({"M": M, "N": N, "name": name, "seconds": seconds,
                            "fraction_of_copy": floor_s / seconds,
                            "beyond_bytes_s": seconds - floor_s})
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "short_row_floor.json").write_text(json.dumps(
            {"copy_bytes_per_s": copy, "results": results}, indent=1))


if __name__ == "__main__":
    main()
