"""Record what each ingredient of an honest GPU timer changes (chapter 03's timer exercise).

    PYTHONPATH=. python3 scripts/record_timers.py --out course/data/timers-h100.csv

On a GPU, times two workloads (eager PyTorch RMSNorm, `course.baselines.eager_rmsnorm`, and
the course's fused Triton RMSNorm, `solutions.kernels.rmsnorm.rmsnorm`) at two bfloat16
shapes, one whose input fits in L2 and one that does not, with:

- the honest timer: CUDA events around each call, a warm-up, inputs rotated through copies
  that add up to several times L2, every output kept alive (so each call writes fresh
  memory), the mean over the repetitions;
- that timer missing one ingredient: the host clock without synchronising, no warm-up, the
  same input every call, the same output buffer every call;
- `course.bench.time_rotating` and `triton.testing.do_bench` on one input;
- the honest timer, the two variants that find data in L2 and course.bench again with the
  launch hidden (a GPU sleep queued ahead of each start event, as `course.bench` does with
  `hide_launch`): per-call events otherwise count the host's time issuing a call whenever
  the kernel is shorter than that, and the host then hides what L2 changes.

Each workload's first timer is "no warm-up", run before anything else touched its kernels
in this process, and Triton's cache points to an empty folder: the first call compiles, as
it does for a learner. Every row carries the GPU's name, the torch and triton versions and
the date. Takes well under a minute.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import itertools
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# An empty Triton cache, so that "no warm-up" sees a real compilation (before triton loads).
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="record-timers-triton-")

import course  # noqa: E402  (first: it picks the execution mode)
from course import baselines, bench, hardware, timing, traffic  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

SHAPES = ((2048, 2048), (8192, 4096))  # x of 8 MB (fits in L2) and of 64 MB (does not)
DTYPE = torch.bfloat16
REPS = 30
WARMUP = 3
L2_MULTIPLE = 3  # the rotating inputs add up to this many times L2
FIELDS = ("gpu", "torch", "triton", "date", "workload", "M", "N", "dtype", "timer", "reps",
          "mean_us", "median_us", "first_us", "ideal_bytes", "copies")

# The timers, in the order each workload runs them ("no warm-up" first: see the docstring).
# ", launch hidden": a GPU sleep queued ahead of each start event keeps the host's time
# issuing the call out of the measurement (course.bench's hide_launch), so that what L2
# changes shows where the host, not the GPU, decides the plain timers' figures.
HIDDEN = timing.LAUNCH_HIDDEN
TIMERS = ("no warm-up", "honest", "host clock, no synchronize", "same input every call",
          "same output every call", "course.bench", "triton do_bench", "honest" + HIDDEN,
          "same input every call" + HIDDEN, "same output every call" + HIDDEN,
          "course.bench" + HIDDEN)


def per_call_seconds(fn: Callable, inputs: Sequence[tuple], reps: int, *, warmup: bool = True,
                     events: bool = True, rotate: bool = True, keep_outputs: bool = True,
                     hide_launch: bool = False) -> list[float]:
    """The honest timer of chapter 03, with each ingredient a switch that can be turned off
    (and the launch hidden as course.bench hides it, on request)."""
    call_s = 0.0
    if warmup:
        for i in range(WARMUP):
            t0 = time.perf_counter()
            fn(*inputs[i % len(inputs)])
            call_s = time.perf_counter() - t0
        torch.cuda.synchronize()
    # Twice the host's time for a call plus a margin, at a generous 2 GHz (as course.bench).
    sleep_cycles = int((2 * call_s + 50e-6) * 2e9)
    kept = []
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    host = []
    for i in range(reps):
        args = inputs[i % len(inputs)] if rotate else inputs[0]
        if events:
            if hide_launch:
                torch.cuda._sleep(sleep_cycles)
            starts[i].record()
        else:
            t0 = time.perf_counter()
        out = fn(*args)
        if events:
            ends[i].record()
        else:
            host.append(time.perf_counter() - t0)
        if keep_outputs:
            kept.append(out)
        del out  # without keep_outputs, the allocator hands this block to the next call
    torch.cuda.synchronize()  # (after the host clock stopped, for that variant)
    if not events:
        return host
    return [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends, strict=True)]


def run_timer(timer: str, fn: Callable, inputs: Sequence[tuple], nbytes: int) -> list[float]:
    hidden = timer.endswith(HIDDEN)
    timer = timer.removesuffix(HIDDEN)
    if timer == "no warm-up":
        return per_call_seconds(fn, inputs, REPS, warmup=False)
    if timer == "honest":
        return per_call_seconds(fn, inputs, REPS, hide_launch=hidden)
    if timer == "host clock, no synchronize":
        return per_call_seconds(fn, inputs, REPS, events=False)
    if timer == "same input every call":
        return per_call_seconds(fn, inputs, REPS, rotate=False, hide_launch=hidden)
    if timer == "same output every call":
        return per_call_seconds(fn, inputs, REPS, keep_outputs=False, hide_launch=hidden)
    if timer == "course.bench":
        copies = itertools.cycle(inputs)
        timing = bench.time_rotating(fn, lambda: next(copies), nbytes, warmup=WARMUP,
                                     reps=REPS, hide_launch=hidden)
        return list(timing.times_s)
    if timer == "triton do_bench":
        args = inputs[0]
        return [t * 1e-3 for t in triton.testing.do_bench(lambda: fn(*args),
                                                           return_mode="all")]
    raise ValueError(f"unknown timer {timer!r}")


def make_inputs(M: int, N: int, copies: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.rand(N, generator=gen, device="cuda").to(DTYPE) + 0.5
    return [(torch.randn(M, N, generator=gen, device="cuda").to(DTYPE), weight)
            for _ in range(copies)]


def workloads() -> dict[str, Callable]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from solutions.kernels.rmsnorm import rmsnorm as fused_rmsnorm

    return {"eager RMSNorm": baselines.eager_rmsnorm, "fused Triton RMSNorm": fused_rmsnorm}


def record(out: Path) -> list[dict]:
    gpu = torch.cuda.get_device_name()
    print(f"GPU: {gpu}; torch {torch.__version__}, triton {triton.__version__}", flush=True)
    same = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.date.today().isoformat(), "dtype": "bf16", "reps": REPS}
    l2 = hardware.l2_bytes()
    rows = []
    for M, N in SHAPES:
        # The bytes of the inputs that change: copies add up to L2_MULTIPLE times L2.
        copies = max(2, math.ceil(L2_MULTIPLE * l2 / (M * N * DTYPE.itemsize)))
        inputs = make_inputs(M, N, copies)
        ideal = traffic.fused_rmsnorm(M, N, "bf16").bytes
        for name, fn in workloads().items():
            for timer in TIMERS:
                times = run_timer(timer, fn, inputs, M * N * DTYPE.itemsize)
                row = dict(same, workload=name, M=M, N=N, timer=timer,
                           mean_us=statistics.fmean(times) * 1e6,
                           median_us=statistics.median(times) * 1e6, first_us=times[0] * 1e6,
                           ideal_bytes=ideal, copies=copies)
                rows.append(row)
                print(f"{name:<22} {M:>5} x {N:<5} {timer:<28} mean {row['mean_us']:9.1f} us"
                      f"  median {row['median_us']:8.1f} us  first {row['first_us']:9.1f} us",
                      flush=True)
        del inputs
        torch.cuda.empty_cache()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v)
                             for k, v in row.items()})
    print(f"wrote {len(rows)} rows to {out}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="CSV to write, e.g. course/data/timers-h100.csv")
    args = parser.parse_args(argv)
    if not course.on_gpu():
        print("record_timers needs a GPU: these are timings of GPU kernels", file=sys.stderr)
        return 2
    started = time.perf_counter()
    record(args.out)
    print(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
