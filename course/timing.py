"""What a timer needs from a GPU, on a real one or on a simulated one (chapter 03).

    gpu, fn, inputs = timing.workload("cuda:eager:4096x4096")  # eager RMSNorm, on your GPU
    gpu, fn, inputs = timing.workload("sim:1234")               # a simulated GPU, anywhere

`gpu` offers what a timer uses of `torch.cuda`: `gpu.Event(enable_timing=True)` with
`.record()` and `.elapsed_time(end)` (milliseconds), `gpu.synchronize()`, and
`gpu.clock()`, the host's clock in seconds (`time.perf_counter` on a real GPU). `fn(*args)`
runs the workload once and returns its output; `inputs` is a list of argument tuples,
enough copies that taking them in turn keeps each call's inputs out of L2.

The simulated GPU behaves as a real one does in the ways that fool a timer, with
parameters drawn from the seed in the spec:

- calls are asynchronous: `fn` returns once its kernel is queued (the launch costs the host
  a few microseconds) and the GPU runs it when it gets to it;
- the first call of `fn` compiles its kernel on the host (tens to hundreds of ms);
- a kernel reads an input, or overwrites an output, that is still in L2 several times faster
  than from HBM. L2 holds the most recently touched buffers, up to its size; an output
  buffer nobody holds any more goes back to an allocator that hands it to the next output
  of its size, as PyTorch's caching allocator does.

`simulated_times(spec, reps)` gives, for a spec, the true time of a call (inputs and outputs
from HBM, no compilation, no launch) and what each way of timing it wrongly would report:
the chapter's checker compares a learner's timer with them. A timer is handed only what it
needs (`SimDevice`, `SimWorkload`: no `gpu.params`), and while the checker times it, a call
from the timer into this module beyond a workload, its events, synchronize and clock (the
true time through `simulated_times`, `SimParams.kernel_s`, ...) fails the check
(`course.check.timer`). Those objects hold only the number their simulated GPU is known
by; the GPUs are kept in the keyword defaults of `_step`, which the walls of a graded run
refuse to show (`course.verify.walls.guard`; without the walls they are one attribute
away). What stays within reach of code in the same process: the seed's draw of the
parameters written out again (the check cannot tell a time so computed from one
measured), and the frames of the simulation's own code while it runs, for code that
rebinds a name it calls (this module's `weakref`, a builtin) to a function of its own.

`recorded(gpu)` reads the timer figures `scripts/record_timers.py` recorded on a GPU;
`three_timers(rows)` picks from them the three chapter 08 compares (the GPU's time,
`triton.testing.do_bench`'s figure, what a caller waits), and `three_timers_measured`
measures the same three on a GPU.
"""

from __future__ import annotations

import collections
import csv
import math
import random
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from course import hardware, runtime
from course.verify import walls

import torch

DATA = Path(__file__).with_name("data")
SIM_COPIES = 4  # input copies of a simulated workload: each is gone from L2 a call later
MB = 1 << 20
# The suffix of a recorded timer that hid the host's launch time (scripts/record_timers.py).
LAUNCH_HIDDEN = ", launch hidden"


# ---------------------------------------------------------------- the simulated GPU


@dataclass(frozen=True)
class SimParams:
    """A simulated GPU and its one workload (a kernel reading `read_bytes` from one input
    and writing `write_bytes` to a new output)."""

    launch_s: float
    compile_s: float
    hbm_bytes_per_s: float
    l2_speedup: float
    l2_bytes: int
    read_bytes: int
    write_bytes: int

    @classmethod
    def from_seed(cls, seed: int) -> SimParams:
        rng = random.Random(seed)
        l2 = rng.randrange(40, 65) * MB
        # One call's bytes fill most of L2, two calls' more than all of it: the buffers of
        # the call before are still there, those of two calls ago are not.
        footprint = rng.uniform(0.6, 0.85) * l2
        # Reads and writes apart, so that an input left in L2 and an output left there differ.
        share = rng.choice((rng.uniform(0.25, 0.4), rng.uniform(0.6, 0.75)))
        read = int(footprint * share)
        return cls(launch_s=rng.uniform(2e-6, 6e-6), compile_s=rng.uniform(0.05, 0.3),
                   hbm_bytes_per_s=rng.uniform(0.3e12, 0.5e12), l2_speedup=rng.uniform(3, 5),
                   l2_bytes=l2, read_bytes=read, write_bytes=int(footprint) - read)

    def kernel_s(self, input_in_l2: bool, output_in_l2: bool) -> float:
        read = self.read_bytes / (self.l2_speedup if input_in_l2 else 1)
        write = self.write_bytes / (self.l2_speedup if output_in_l2 else 1)
        return (read + write) / self.hbm_bytes_per_s


class SimTensor:
    """A buffer of the simulated GPU: an address and a size, no values (and the number its
    GPU is known by, not the GPU)."""

    __slots__ = ("_gpu_id", "address", "nbytes", "__weakref__")

    def __init__(self, gpu_id: int, address: int, nbytes: int):
        self._gpu_id, self.address, self.nbytes = gpu_id, address, nbytes

    def __repr__(self) -> str:
        return f"<simulated tensor of {self.nbytes / MB:.1f} MB at {self.address:#x}>"


class SimEvent:
    """A simulated `torch.cuda.Event`: it completes when the GPU reaches it in its queue."""

    __slots__ = ("_gpu_id", "enable_timing", "at")

    def __init__(self, gpu_id: int, enable_timing: bool = False):
        self._gpu_id, self.enable_timing = gpu_id, bool(enable_timing)
        self.at: float | None = None

    def record(self) -> None:
        self.at = _step(self._gpu_id, "reached")

    def elapsed_time(self, end: SimEvent) -> float:
        """Milliseconds from this event to `end`, as torch.cuda.Event.elapsed_time."""
        if type(end) is not SimEvent or end._gpu_id != self._gpu_id:
            raise TypeError(f"elapsed_time takes another event of the same GPU, got {end!r}")
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("elapsed_time needs both events created with "
                               "enable_timing=True")
        if self.at is None or end.at is None:
            raise RuntimeError("elapsed_time: record() both events first")
        if end.at > _step(self._gpu_id, "clock"):
            raise RuntimeError("elapsed_time: the GPU has not reached the end event yet "
                               "(on a real GPU: 'device not ready'); call gpu.synchronize() "
                               "before reading the times")
        return (end.at - self.at) * 1e3


class SimulatedGPU:
    """A GPU that runs one workload, simulated (see the module's text). A timer is never
    handed one: `simulated` keeps it where only `_step` reaches it."""

    def __init__(self, params: SimParams, gpu_id: int = 0):
        self.params, self.gpu_id = params, gpu_id
        self.host_s = 0.0        # the host's clock
        self.busy_until_s = 0.0  # when the GPU finishes what is queued
        self.compiled = False
        self._next_address = 1 << 32
        self._free: dict[int, list[int]] = collections.defaultdict(list)
        self._l2: collections.OrderedDict[int, int] = collections.OrderedDict()

    # what a timer uses, as torch.cuda offers it
    def reached(self) -> float:
        """When an event recorded now completes: once the GPU has done what is queued."""
        return max(self.host_s, self.busy_until_s)

    def synchronize(self) -> None:
        self.host_s = max(self.host_s, self.busy_until_s)

    def clock(self) -> float:
        return self.host_s

    # memory
    def allocate(self, nbytes: int) -> SimTensor:
        free = self._free[nbytes]
        if free:
            address = free.pop()  # the block freed last, as a caching allocator does
        else:
            address, self._next_address = self._next_address, self._next_address + nbytes
        tensor = SimTensor(self.gpu_id, address, nbytes)
        weakref.finalize(tensor, free.append, address)
        return tensor

    def _touch(self, address: int, nbytes: int) -> bool:
        """Touch a buffer; whether it was still in L2."""
        hit = address in self._l2
        self._l2.pop(address, None)
        self._l2[address] = nbytes
        while sum(self._l2.values()) > self.params.l2_bytes:
            self._l2.popitem(last=False)
        return hit

    # the workload
    def run(self, address: int, nbytes: int) -> SimTensor:
        """Queue the workload on the input buffer at `address`; its new output."""
        if not self.compiled:  # the first call compiles, on the host
            self.host_s += self.params.compile_s
            self.compiled = True
        self.host_s += self.params.launch_s
        y = self.allocate(self.params.write_bytes)
        input_hit, output_hit = self._touch(address, nbytes), self._touch(y.address, y.nbytes)
        start = max(self.host_s, self.busy_until_s)
        self.busy_until_s = start + self.params.kernel_s(input_hit, output_hit)
        return y


# The simulated GPUs, by number, live in the keyword defaults of the two functions below,
# which the walls refuse to show (`walls.guard`): a timer's handles carry the number only,
# so no attribute read leads from them to a GPU's parameters.
_GPUS: dict[int, SimulatedGPU] = {}


def _new_gpu(params: SimParams, *, _gpus: dict[int, SimulatedGPU] = _GPUS) -> int:
    gpu_id = len(_gpus) + 1
    _gpus[gpu_id] = SimulatedGPU(params, gpu_id)
    return gpu_id


def _step(gpu_id: int, step: str, x: SimTensor | None = None, *,
          _gpus: dict[int, SimulatedGPU] = _GPUS) -> object:
    """One step of simulated GPU `gpu_id`: "reached", "synchronize", "clock", "run" (on
    input `x`) or "input" (a new input buffer)."""
    # What the caller hands over is read and checked before the GPU is looked up: nothing
    # of the caller's (a property, an __eq__) runs while this frame holds it.
    if step == "run":
        if type(x) is not SimTensor:
            raise TypeError(f"the simulated workload takes one of its own inputs, got {x!r}")
        owner, address, nbytes = x._gpu_id, x.address, x.nbytes
        if owner != gpu_id or type(address) is not int or type(nbytes) is not int:
            raise TypeError(f"the simulated workload takes one of its own inputs, got {x!r}")
    if type(gpu_id) is not int or type(step) is not str:
        raise TypeError(f"not a step of a simulated GPU: {step!r}")
    gpu = None
    try:
        gpu = _gpus.get(gpu_id)
        if gpu is None:
            found: object = LookupError
        elif step == "run":
            found = gpu.run(address, nbytes)
        elif step == "input":
            found = gpu.allocate(gpu.params.read_bytes)
        elif step in ("reached", "synchronize", "clock"):
            found = getattr(gpu, step)()
        else:
            found = LookupError
    except BaseException as error:
        # Its traceback would hold the frames that hold the GPU: raised without them.
        gpu = _gpus = None
        raise error.with_traceback(None) from None
    gpu = _gpus = None
    if found is LookupError:
        raise LookupError(f"no simulated GPU {gpu_id} or no step {step!r}")
    return found


del _GPUS
walls.guard(_new_gpu, _step)


def parse_sim_spec(spec: str) -> int:
    """The seed of a 'sim:<seed>' spec."""
    kind, _, seed = spec.partition(":")
    if kind != "sim" or not seed.isdigit():
        raise ValueError(f"a simulated GPU's spec is 'sim:<seed>', e.g. 'sim:1234'; got "
                         f"{spec!r}")
    return int(seed)


class SimDevice:
    """What a timer is handed for a simulated GPU: `Event`, `synchronize` and `clock`, as
    for a real one, and nothing of the simulation's parameters (a timer measures the time a
    call takes; the parameters would give it away). Chapter 03's check, as it times, also
    refuses any call of this module's functions beyond what a timer uses
    (`course.check.roofline.TIMER_USES`)."""

    __slots__ = ("_gpu_id",)

    def __init__(self, gpu_id: int):
        self._gpu_id = gpu_id

    def Event(self, enable_timing: bool = False) -> SimEvent:  # noqa: N802  (torch's name)
        return SimEvent(self._gpu_id, enable_timing)

    def synchronize(self) -> None:
        _step(self._gpu_id, "synchronize")

    def clock(self) -> float:
        return _step(self._gpu_id, "clock")

    def __repr__(self) -> str:
        return "<simulated GPU>"


class SimWorkload:
    """The simulated GPU's one workload: `fn(x)` queues its kernel on one of `inputs`' copies
    and returns the new output."""

    __slots__ = ("_gpu_id",)

    def __init__(self, gpu_id: int):
        self._gpu_id = gpu_id

    def __call__(self, x: SimTensor) -> SimTensor:
        return _step(self._gpu_id, "run", x)

    def __repr__(self) -> str:
        return "<the simulated GPU's workload>"


def simulated(spec: str) -> tuple[SimDevice, SimWorkload, list[tuple[SimTensor]]]:
    gpu_id = _new_gpu(SimParams.from_seed(parse_sim_spec(spec)))
    inputs = [(_step(gpu_id, "input"),) for _ in range(SIM_COPIES)]
    return SimDevice(gpu_id), SimWorkload(gpu_id), inputs


@dataclass(frozen=True)
class SimTimes:
    """For one simulated spec: the true seconds per call, and what each mistake reports."""

    params: SimParams
    reps: int

    @property
    def true_s(self) -> float:
        return self.params.kernel_s(False, False)

    def mistakes(self) -> dict[str, float]:
        p, true = self.params, self.true_s
        first = p.launch_s / self.reps  # the first timed call also waits for its launch

        def same_input(output_in_l2: bool) -> float:
            # ... and reads an input the warm-up left some calls before
            hit, miss = p.kernel_s(True, output_in_l2), p.kernel_s(False, output_in_l2)
            return hit + first + (miss - hit) / self.reps

        return {
            "no_warmup": true + (p.compile_s + p.launch_s) / self.reps,
            "host_clock": p.launch_s,
            "same_input": same_input(False),
            "same_output": p.kernel_s(False, True) + first,
            "same_input_and_output": same_input(True),
            "milliseconds": true * 1e3,
            "microseconds": true * 1e6,
            "total": true * self.reps,
        }


def simulated_times(spec: str, reps: int) -> SimTimes:
    return SimTimes(SimParams.from_seed(parse_sim_spec(spec)), reps)


# ---------------------------------------------------------------- a real GPU


class CudaDevice:
    """torch.cuda's events and synchronize, and the host's clock."""

    name = "cuda"

    @staticmethod
    def Event(enable_timing: bool = False) -> torch.cuda.Event:  # noqa: N802
        return torch.cuda.Event(enable_timing=enable_timing)

    @staticmethod
    def synchronize() -> None:
        torch.cuda.synchronize()

    @staticmethod
    def clock() -> float:
        return time.perf_counter()


CUDA_WORKLOADS = {"eager": "course.baselines.eager_rmsnorm",
                  "rms_norm": "torch.nn.functional.rms_norm"}


def _rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)


def cuda_workload(spec: str) -> tuple[CudaDevice, Callable, list[tuple[torch.Tensor, ...]]]:
    """'cuda:eager:MxN' or 'cuda:rms_norm:MxN': RMSNorm of a bfloat16 M x N input, with
    input copies that add up to three times L2."""
    from course import baselines

    parts = spec.split(":")
    shape = parts[2].split("x") if len(parts) == 3 else []
    if len(shape) != 2 or parts[1] not in CUDA_WORKLOADS or not all(s.isdigit() for s in shape):
        raise ValueError(f"a GPU workload's spec is 'cuda:<{'|'.join(CUDA_WORKLOADS)}>:MxN', "
                         f"e.g. 'cuda:eager:4096x4096'; got {spec!r}")
    if not runtime.on_gpu():
        raise hardware.NeedsGPU(f"{spec} needs a GPU; without one, time 'sim:<seed>'")
    M, N = int(shape[0]), int(shape[1])
    fn = baselines.eager_rmsnorm if parts[1] == "eager" else _rms_norm
    copies = max(2, math.ceil(3 * hardware.l2_bytes() / (M * N * 2)))
    w = torch.rand(N, device="cuda").to(torch.bfloat16) + 0.5
    inputs = [(torch.randn(M, N, device="cuda", dtype=torch.bfloat16), w) for _ in range(copies)]
    return CudaDevice(), fn, inputs


def workload(spec: str) -> tuple[object, Callable, list[tuple]]:
    """(gpu, fn, inputs) for a spec: 'sim:<seed>' or 'cuda:<workload>:MxN' (the module's
    text says what each is)."""
    if not isinstance(spec, str):
        raise TypeError(f"spec must be a str such as 'sim:1234', got {type(spec).__name__}")
    return simulated(spec) if spec.startswith("sim") else cuda_workload(spec)


# ---------------------------------------------------------------- recorded figures


def recorded(gpu: str) -> list[dict[str, str]]:
    """The rows of course/data/timers-<gpu>.csv (scripts/record_timers.py writes them)."""
    path = DATA / f"timers-{gpu.lower()}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no recorded timers for {gpu!r} ({path.name}); "
                                "scripts/record_timers.py records them on a GPU")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def recorded_table(rows: Sequence[dict[str, str]]) -> str:
    """Each workload and shape's timers, mean and median microseconds a call, each with its
    ratio to the honest timer's, with the GPU, versions and date they were recorded with.
    (A mistake that adds one slow call shows in the mean; the median shows the rest.)"""
    if not rows:
        raise ValueError("no rows to show")
    first = rows[0]
    lines = [f"recorded on {first['gpu']}, torch {first['torch']}, triton {first['triton']}, "
             f"{first['date']} ({first['reps']} calls each)"]
    for (name, M, N), group in _by_workload(rows).items():
        by_timer = {r["timer"]: (float(r["mean_us"]), float(r["median_us"])) for r in group}
        lines.append(f"{name}, {M} x {N} {first['dtype']}:{'mean':>31}{'median':>22}")
        for timer, (mean, median) in by_timer.items():
            # Timers with the launch hidden are compared with the honest one hiding it too.
            hidden = "honest" + LAUNCH_HIDDEN
            base = hidden if timer.endswith(LAUNCH_HIDDEN) and hidden in by_timer else "honest"
            base_mean, base_median = by_timer[base]
            lines.append(f"  {timer:<36} {mean:9.1f} us {mean / base_mean:6.2f}x "
                         f"{median:9.1f} us {median / base_median:6.2f}x  ({base})")
    return "\n".join(lines)


def _by_workload(rows: Sequence[dict[str, str]]) -> dict[tuple[str, str, str],
                                                          list[dict[str, str]]]:
    """Recorded rows grouped by (workload, M, N), in the order recorded."""
    groups: dict[tuple[str, str, str], list[dict[str, str]]] = {}
    for row in rows:
        groups.setdefault((row["workload"], row["M"], row["N"]), []).append(row)
    return groups


# ---------------------------------------------------------------- three timers (chapter 08)

# The recorded timers chapter 08 sets side by side (scripts/record_timers.py's names).
GPU_TIME = "honest" + LAUNCH_HIDDEN  # per-call events, the host's launch hidden
DO_BENCH = "triton do_bench"         # triton.testing.do_bench, on one input
CALLER_WAITS = "honest"              # per-call events, the host's launch counted
# What triton.testing.do_bench zeroes before each call to flush L2 (triton 3.x).
DO_BENCH_FLUSH_BYTES = 256 * MB


@dataclass(frozen=True)
class ThreeTimers:
    """One workload at one shape, timed three ways: median microseconds a call."""

    gpu: str        # the GPU's name
    workload: str
    M: int
    N: int
    gpu_us: float    # the GPU's time: events around each call, the launch hidden
    bench_us: float  # triton.testing.do_bench
    call_us: float   # what a caller waits: events around each call, the launch counted

    @property
    def host_us(self) -> float:
        """What a caller waits beyond the GPU's time: the host's part of a call."""
        return self.call_us - self.gpu_us


def three_timers(rows: Sequence[dict[str, str]]) -> list[ThreeTimers]:
    """Each workload and shape of `recorded(gpu)`'s rows, by the three timers, in the order
    recorded. Medians, so that one slow call moves none of the three (do_bench returns the
    mean unless asked; its recorded median is that of its own calls)."""
    found = []
    for (workload, M, N), group in _by_workload(rows).items():
        by_timer = {row["timer"]: float(row["median_us"]) for row in group}
        missing = [t for t in (GPU_TIME, DO_BENCH, CALLER_WAITS) if t not in by_timer]
        if missing:
            raise ValueError(f"{workload} {M} x {N} has no {', '.join(map(repr, missing))} "
                             "timer: scripts/record_timers.py records all three")
        found.append(ThreeTimers(group[-1]["gpu"], workload, int(M), int(N),
                                 by_timer[GPU_TIME], by_timer[DO_BENCH], by_timer[CALLER_WAITS]))
    return found


def three_timers_measured(fn: Callable, make_args: Callable[[], Sequence], nbytes: int,
                          workload: str, shape: tuple[int, int]) -> ThreeTimers:
    """`fn` timed here the three ways (GPU only): `course.bench` on rotating inputs with the
    launch hidden and with it counted, and `triton.testing.do_bench` on one input."""
    if not runtime.on_gpu():
        raise hardware.NeedsGPU("timing needs a GPU; without one, read the recorded "
                                "figures: three_timers(recorded('h100'))")
    from course import bench

    import triton

    gpu_s, call_s = (bench.measure(workload, fn, make_args, nbytes, warmup=5, reps=30,
                                   hide_launch=hide).seconds for hide in (True, False))
    args = make_args()
    bench_ms = triton.testing.do_bench(lambda: fn(*args), return_mode="median")
    return ThreeTimers(torch.cuda.get_device_name(), workload, *shape, gpu_s * 1e6,
                       bench_ms * 1e3, call_s * 1e6)


def host_clock_bench(fn: Callable[[], object], quantiles: Sequence[float] = (0.5,),
                     reps: int = 5) -> list[float]:
    """Milliseconds a call of `fn` takes by the host's clock, at each quantile, after one
    warm-up call. What `@triton.autotune(do_bench=...)` can time its configs with in Triton's
    interpreter, which has no GPU to time: it says how fast the CPU interprets a config,
    nothing about a GPU."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return [times[min(reps - 1, int(q * reps))] * 1e3 for q in quantiles]
