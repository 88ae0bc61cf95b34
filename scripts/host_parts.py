"""What a reference wrapper's call costs on the host, and its parts, GPU only.

    python scripts/host_parts.py

Calls back to back from Python (1000, then one synchronisation; the median of 9 rounds,
every variant once a round), bfloat16, µs a call, at two decode shapes: PyTorch's fused
ops against the reference wrappers launching through kept_launch.c and, in the same
process, through Triton's own launcher (each ReadyLaunch's `kept` set aside); then the
parts of a kept call (the key, the allocation, the launch). The wrappers' cost beside every
peer's is `course bench --timer host`; this says where it goes.
"""

import importlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import course  # noqa: E402,F401  (mode first)

import torch
import torch.nn.functional as F
import triton
from triton import knobs

from solutions.kernels import add_rmsnorm, layernorm, rmsnorm
from solutions.kernels.ready_launch import hooked, launch_key, layout

CALLS, ROUNDS = 1000, 9
KEPT = (importlib.import_module("solutions.kernels.rmsnorm")._READY_FORWARDS,
        importlib.import_module("solutions.kernels.layernorm")._READY_FORWARDS)


def per_call(fn) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / CALLS * 1e6


def table(title: str, fns: dict) -> None:
    times = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            times[name].append(per_call(fn))
    print(f"\n{title}")
    for name, t in times.items():
        print(f"  {name:42s} {statistics.median(t):7.2f}  (min {min(t):6.2f})")


def measure(M: int, N: int) -> None:
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    r, w, b = torch.randn_like(x), torch.randn_like(x[0]), torch.randn_like(x[0])
    y = torch.empty_like(x)
    ours = {"rmsnorm": lambda: rmsnorm(x, w), "layernorm": lambda: layernorm(x, w, b),
            "add_rmsnorm": lambda: add_rmsnorm(x, r, w)}
    for call in ours.values():
        call()
    ready = KEPT[0][launch_key(x, w, None, False)]
    kept = ready.kept
    assert kept is not None, "this GPU's launches are not kept in kept_launch.c"
    peers = {"F.rms_norm": lambda: F.rms_norm(x, (N,), w, 1e-6),
             "F.layer_norm": lambda: F.layer_norm(x, (N,), w, b, 1e-5),
             "add + F.rms_norm": lambda: F.rms_norm(x + r, (N,), w, 1e-6)}
    parts = {"part: launch_key": lambda: launch_key(x, w, None, False),
             "part: torch.empty_like": lambda: torch.empty_like(x),
             "part: kept.run alone": lambda: kept.run(x, y, w, y, y, y, 1e-6),
             "part: ready.run (hook check + kept.run)":
                 lambda: ready.run(x, y, w, y, y, y, 1e-6),
             "part: the hook check": lambda: hooked(knobs.runtime.launch_enter_hook),
             "part: layout(w)": lambda: layout(w),
             "an empty torch op (x.view)": lambda: x.view(-1)}
    table(f"{M} x {N} bf16, kept_launch.c",
          peers | {f"ours {k}": v for k, v in ours.items()} | parts)
    first = rmsnorm(x, w)
    launches = [launch for kept_ in KEPT for launch in kept_.values()]
    saved = [launch.kept for launch in launches]
    for launch in launches:  # Triton's launcher from here on
        launch.kept = None
    table(f"{M} x {N} bf16, Triton's launcher",
          {"F.rms_norm": peers["F.rms_norm"]}
          | {f"ours {k} (Triton's launcher)": v for k, v in ours.items()}
          | {"part: ready.run (Triton's launcher)":
             lambda: ready.run(x, y, w, y, y, y, 1e-6)})
    print("the same bits either way:", torch.equal(first, rmsnorm(x, w)))
    for launch, kept_c in zip(launches, saved, strict=True):
        launch.kept = kept_c


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for M, N in [(1, 4096), (64, 8192)]:
        measure(M, N)


if __name__ == "__main__":
    main()
