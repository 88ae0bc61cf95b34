"""Chapter 08's recorded sweeps: its own kernels timed over every launch it offers.

`scripts/sweep_lab.py` ran chapter 08's `rmsnorm_launch` (the notebook cells tagged
`lab-kernel`) on an H100 and an H200, over the launch grid below, at row lengths the
chapter names and at others it does not, and `torch.compile` of the eager code beside it.
The CSV files in `course/data/` are what it wrote. The chapter plots them when no GPU is
there, and `course.check.lab.launch_rule` grades a launch rule against them in
interpreter mode.

A point's time is the median GPU time of one call (`course.bench`, launch hidden, inputs
rotated past L2) unless its `timer` is "call", which counts the launch too, or "graph":
calls captured in turn into one CUDA graph and replayed (`course.bench.time_graph`), the
time of a replay divided by the calls in it. Bandwidth is over the ideal bytes, as a
fraction of the copy bandwidth measured in the same process. Points of a later recording
can be added to a sweep's file (`merged`): each point keeps its own date and versions.

Without a GPU a launch rule is judged on these very records, so while the rule is called
for its grade `reads_watched()` notes every read of them: a call of a function here that
loads or selects points, any attribute of a `SweepPoint`, and opening a sweep's file.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import math
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from course.verify import walls

DATA = Path(__file__).parent / "data"
SWEEP_FILES = {"H100": DATA / "lab-sweep-h100.csv", "H200": DATA / "lab-sweep-h200.csv"}
# The GPUs whose sweep is in the package (scripts/sweep_lab.py writes the others' file).
GPUS = tuple(gpu for gpu, path in SWEEP_FILES.items() if path.is_file())

# The shapes: about 2**26 elements each (128 MB of bfloat16 input), far more than L2.
ELEMENTS = 2**26
BF16_COLS = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384,
             24576, 32768, 49152, 65536, 98304, 131072)
FP32_COLS = (1536, 6144, 24576)
# The launch grid (the fields of chapter 08's Launch).
ROWS_PER_TILE = (1, 2, 4, 8, 16)
WARPS = (1, 2, 4, 8, 16, 32)
MAX_VALUES_PER_THREAD = 256     # past this a thread spills heavily; not worth compiling
MAX_TILE_ELEMENTS = 2**20       # Triton's limit on a tensor inside a kernel
PERSISTENT_UP_TO = 3072         # persistent programs are swept at rows this short or shorter
PROGRAMS_PER_SM = (1, 2, 4, 8)
STAGES = (1, 2, 3)
CHUNKED_FROM = 8192             # the chunked kernel is swept at rows this long or longer
CHUNK_N = (1024, 2048, 4096, 8192)
CHUNK_WARPS = (4, 8, 16)
LAUNCH_FIELDS = ("rows_per_tile", "num_warps", "num_stages", "programs_per_sm", "chunk_n")
# Small shapes timed with the launch counted, and replayed from a CUDA graph: where the
# host's cost decides.
CALL_SHAPES = ((1, 4096), (64, 1024), (64, 4096), (1024, 4096))
# What a point's time counts: the GPU's time alone, each call with its launch, or calls
# replayed back to back from one CUDA graph.
TIMERS = ("gpu", "call", "graph")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


# ------------------------------------------------------------------ reads of the records

# One list per reads_watched() in progress; each read of the records is noted in every one.
_WATCHES: list[list[str]] = []
_RECORD_FILES = frozenset(path.name for path in SWEEP_FILES.values())


def _note(what: str) -> None:
    for found in _WATCHES:
        if what not in found:  # each read once: a loop over the points notes a field once
            found.append(what)


def _audit(event: str, args: tuple) -> None:
    """Note a sweep's file opened (by open(), pathlib, csv, NumPy, pandas, ...)."""
    if event != "open" or not _WATCHES or not args:
        return
    # Read as the walls read names: no code of the path's own runs inside the hook.
    path = walls.plain_text(args[0])
    if path is not None and os.path.basename(path) in _RECORD_FILES:
        _note(f"the file {os.path.basename(path)}")


# Added as the module is imported, not at the first watch: a flag saying "added" could be
# set by other code first. An audit hook stays for the process.
sys.addaudithook(_audit)


@contextlib.contextmanager
def reads_watched() -> Iterator[list[str]]:
    """What the body read of the recorded sweeps, each once, in order: "lab_sweeps.best()"
    for a function that loads or selects points, "SweepPoint.seconds" for an attribute of
    any SweepPoint (the records, wherever they were kept), "the file lab-sweep-h100.csv"
    for a sweep's file opened. A tripwire in the process it runs in, as course.verify.tamper
    is: code written to hide from it can."""
    found: list[str] = []
    if not _WATCHES:  # the points' fields are watched only while a watch is on: free else
        SweepPoint.__getattribute__ = _watched_field
    _WATCHES.append(found)
    try:
        yield found
    finally:  # by identity: list.remove would take the first equal list, not this one
        del _WATCHES[next(i for i, w in enumerate(_WATCHES) if w is found)]
        if not _WATCHES:
            del SweepPoint.__getattribute__


def _watched_field(point: SweepPoint, name: str) -> object:
    """SweepPoint's attribute lookup while reads_watched() is on: each field read noted."""
    _note(f"SweepPoint.{name}")
    return object.__getattribute__(point, name)


def rows_for(n_cols: int) -> int:
    """The row count the sweeps use at `n_cols` columns: about ELEMENTS in all, a multiple
    of 16 (so that every shape's kernel is compiled for the same integer properties)."""
    return max(16, ELEMENTS // n_cols // 16 * 16)


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def values_per_thread(n_cols: int, rows_per_tile: int, num_warps: int) -> float:
    """Values of a tile each thread holds, for whole rows in registers."""
    return rows_per_tile * next_power_of_2(n_cols) / (32 * num_warps)


def tile_launches(n_cols: int) -> list[dict]:
    """One program per tile: every rows_per_tile x num_warps that fits a thread's budget."""
    block_n = next_power_of_2(n_cols)
    return [launch(rows_per_tile=r, num_warps=w) for r in ROWS_PER_TILE for w in WARPS
            if r * block_n <= MAX_TILE_ELEMENTS
            and values_per_thread(n_cols, r, w) <= MAX_VALUES_PER_THREAD]


def chunked_launches(n_cols: int) -> list[dict]:
    if n_cols < CHUNKED_FROM:
        return []
    return [launch(num_warps=w, num_stages=s, chunk_n=c) for c in CHUNK_N for w in CHUNK_WARPS
            for s in STAGES if c <= n_cols]


def persistent_launches(n_cols: int, rows_per_tile: int, num_warps: int) -> list[dict]:
    """Persistent programs around the best one-program-per-tile launch at short rows."""
    if n_cols > PERSISTENT_UP_TO:
        return []
    return [launch(rows_per_tile=rows_per_tile, num_warps=num_warps, num_stages=s,
                   programs_per_sm=p) for p in PROGRAMS_PER_SM for s in STAGES]


def launch(*, rows_per_tile: int = 1, num_warps: int = 4, num_stages: int = 1,
           programs_per_sm: int = 0, chunk_n: int = 0) -> dict:
    """A launch as a dict of chapter 08's Launch fields (defaults as Launch's)."""
    return {"rows_per_tile": rows_per_tile, "num_warps": num_warps, "num_stages": num_stages,
            "programs_per_sm": programs_per_sm, "chunk_n": chunk_n}


def launch_fields(value: object) -> dict:
    """The Launch fields of a Launch, of any object with those attributes, or of a mapping."""
    if isinstance(value, Mapping):
        get = value.get
    else:
        def get(name, default=None):
            return getattr(value, name, default)
    missing = [name for name in LAUNCH_FIELDS if get(name) is None]
    if missing:
        raise TypeError(f"a launch needs the fields {', '.join(LAUNCH_FIELDS)}; "
                        f"{type(value).__name__} has no {', '.join(missing)}")
    return {name: get(name) for name in LAUNCH_FIELDS}


def normalized(fields_: Mapping) -> dict:
    """A launch as the sweeps record it: stages mean nothing to a loop that runs once, so a
    one-program-per-tile launch is recorded with num_stages 1, whatever it asked for; and
    rows_per_tile means nothing to the chunked kernel (one row per program)."""
    out = dict(fields_)
    if out["chunk_n"]:
        out["rows_per_tile"], out["programs_per_sm"] = 1, 0
    elif not out["programs_per_sm"]:
        out["num_stages"] = 1
    return out


def describe(fields_: Mapping) -> str:
    f = fields_
    if f["chunk_n"]:
        return f"chunked {f['chunk_n']} columns, {f['num_warps']} warps, {f['num_stages']} stage(s)"
    text = f"{f['rows_per_tile']} row(s) per tile, {f['num_warps']} warps"
    if f["programs_per_sm"]:
        text += f", {f['programs_per_sm']} persistent programs per SM, {f['num_stages']} stage(s)"
    return text


@dataclass(frozen=True)
class SweepPoint:
    gpu: str               # "H100" or "H200"
    device_name: str       # as torch names the device
    torch: str
    triton: str
    date: str
    impl: str              # "lab": chapter 08's rmsnorm_launch; or "torch.compile"
    timer: str             # "gpu": launch hidden; "call": each call with its launch cost;
    #                        "graph": a call among many replayed from one CUDA graph
    dtype: str
    n_rows: int
    n_cols: int
    rows_per_tile: int
    num_warps: int
    num_stages: int
    programs_per_sm: int
    chunk_n: int
    seconds: float         # median per call; nan when status is not "ok"
    fraction_of_copy: float
    copy_gbps: float
    status: str            # "ok", or "failed: <why>" (a launch that would not compile)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def launch(self) -> dict:
        return {name: getattr(self, name) for name in LAUNCH_FIELDS}

    @property
    def label(self) -> str:
        return describe(self.launch) if self.impl == "lab" else self.impl


COLUMNS = tuple(f.name for f in fields(SweepPoint))
_INTS = {"n_rows", "n_cols", *LAUNCH_FIELDS}
_FLOATS = {"seconds", "fraction_of_copy", "copy_gbps"}


def parse(row: Mapping[str, str]) -> SweepPoint:
    _note("lab_sweeps.parse()")
    values = {}
    for name in COLUMNS:
        text = row[name]
        values[name] = (int(text) if name in _INTS else
                        float(text) if name in _FLOATS else text)
    return SweepPoint(**values)


def load(gpu: str) -> tuple[SweepPoint, ...]:
    """Every point recorded on `gpu` (one of GPUS); the file is read once a process."""
    _note("lab_sweeps.load()")
    if gpu not in GPUS:
        raise ValueError(f"no sweep was recorded on {gpu!r}; recorded: {', '.join(GPUS)}")
    return _read(SWEEP_FILES[gpu])


@functools.cache
def _read(path: Path) -> tuple[SweepPoint, ...]:
    _note("lab_sweeps._read()")  # the first time only (then the cache answers)
    return read(path)


def read(path: Path) -> tuple[SweepPoint, ...]:
    """Every point of a sweep's file, read now (`load` reads the course's once a process)."""
    with Path(path).open(newline="") as f:
        return tuple(parse(row) for row in csv.DictReader(f))


def write(points: Iterable[SweepPoint], path: Path) -> None:
    with Path(path).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for p in points:
            writer.writerow({name: getattr(p, name) for name in COLUMNS})


def point_key(point: SweepPoint) -> tuple:
    """What a point measured (GPU, implementation, timer, dtype, shape, launch): two points
    with one key are two recordings of the same thing."""
    return (point.gpu, point.impl, point.timer, point.dtype, point.n_rows, point.n_cols,
            *point.launch.values())


def merged(old: Iterable[SweepPoint], new: Iterable[SweepPoint]) -> list[SweepPoint]:
    """The points of `old`, each replaced where `new` recorded the same thing again (same
    key), in place, then the rest of `new` after them, in their order."""
    new = list(new)
    unknown = sorted({p.timer for p in new} - set(TIMERS))
    if unknown:
        raise ValueError(f"a sweep point's timer is one of {', '.join(TIMERS)}, "
                         f"not {', '.join(unknown)}")
    latest = {point_key(p): p for p in new}
    out = [latest.pop(point_key(p), p) for p in old]
    return out + [p for p in new if latest.get(point_key(p)) is p]


def select(points: Iterable[SweepPoint], **field_values) -> list[SweepPoint]:
    """The points whose fields equal every value given (e.g. n_cols=4096, timer="gpu")."""
    _note("lab_sweeps.select()")
    unknown = set(field_values) - set(COLUMNS)
    if unknown:
        raise ValueError(f"a sweep point has no field {', '.join(sorted(unknown))}")
    return [p for p in points if all(getattr(p, k) == v for k, v in field_values.items())]


def sweep_at(points: Iterable[SweepPoint], n_cols: int, dtype: str = "bfloat16"
             ) -> list[SweepPoint]:
    """Chapter 08's launches recorded at the sweep's shape of `n_cols` columns (GPU time):
    not the small shapes timed for the host's cost."""
    _note("lab_sweeps.sweep_at()")
    return select(points, impl="lab", timer="gpu", n_rows=rows_for(n_cols), n_cols=n_cols,
                  dtype=dtype)


def best(points: Sequence[SweepPoint], n_cols: int, dtype: str = "bfloat16") -> SweepPoint:
    """The fastest launch of chapter 08's kernels recorded at `n_cols` (GPU time)."""
    _note("lab_sweeps.best()")
    timed = [p for p in sweep_at(points, n_cols, dtype) if p.ok]
    if not timed:
        raise ValueError(f"nothing was recorded at N = {n_cols} in {dtype}")
    return min(timed, key=lambda p: p.seconds)


def find(points: Sequence[SweepPoint], n_cols: int, dtype: str, launch_: object
         ) -> SweepPoint | None:
    """The recorded point of `launch_` (a Launch or its fields) at `n_cols`, if any."""
    _note("lab_sweeps.find()")
    wanted = normalized(launch_fields(launch_))
    for p in sweep_at(points, n_cols, dtype):
        if p.launch == wanted:
            return p
    return None


def nan_point(**values) -> SweepPoint:
    """A point with no time (a failed launch), the other fields as given."""
    return SweepPoint(**{**values, "seconds": math.nan, "fraction_of_copy": math.nan})
