"""Record chapter 08's sweeps on the GPU in hand: `course/data/lab-sweep-<gpu>.csv`.

    python scripts/sweep_lab.py --gpu H100 --out course/data/lab-sweep-h100.csv

Runs the chapter's own kernels (the cells of the solutions notebook tagged `lab-kernel`)
over the launch grid of `course.lab_sweeps`, every launch checked against the float64
reference on a small input first, and `torch.compile` of the eager RMSNorm beside them.
Triton compiles each launch once; worker processes compile them all first, in parallel,
into Triton's cache on disk, so that the timing process only loads them.

Only the small shapes of experiment 5 (`lab_sweeps.CALL_SHAPES`: the starting launch and
torch.compile), with the timers named, in a minute or so; then, where there is no GPU,
their rows added to the sweep's file (a point recorded again replaces the old one):

    python scripts/sweep_lab.py --gpu H200 --small-shapes --timers graph --out new.csv
    python scripts/sweep_lab.py --merge new.csv --into course/data/lab-sweep-h200.csv
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import course  # noqa: E402  (decides the Triton mode before Triton is imported)
from course import baselines, bench, hardware, lab_sweeps, reference, traffic  # noqa: E402
from course.check.compare import compare  # noqa: E402

import torch  # noqa: E402

NOTEBOOK = ROOT / "solutions" / "ch08_performance_lab" / "ch08_performance_lab.ipynb"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
REPS, WARMUP = 30, 5


def lab_namespace() -> dict:
    """Run the notebook's lab-kernel cells: Launch, rmsnorm_launch and the kernels. They
    are written to a module file first: Triton reads a kernel's source from its file."""
    cells = ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"]
             if "lab-kernel" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise SystemExit(f"{NOTEBOOK}: no cell is tagged lab-kernel")
    path = Path(tempfile.gettempdir()) / "ch08_lab_kernels.py"
    text = "import course\n\n" + "\n\n".join(cells) + "\n"
    if not path.is_file() or path.read_text() != text:
        partial_path = path.with_suffix(f".{os.getpid()}.tmp")
        partial_path.write_text(text)
        partial_path.replace(path)  # atomic: workers may be reading it
    spec = importlib.util.spec_from_file_location("ch08_lab_kernels", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return vars(module)


def planned(points_of_best: dict | None = None) -> list[tuple[str, int, dict]]:
    """(dtype, n_cols, launch) of every lab point, persistent ones around the best tile
    launch found (`points_of_best`: (dtype, n_cols) -> launch), when it is known."""
    plan = []
    for dtype, cols in (("bfloat16", lab_sweeps.BF16_COLS), ("float32", lab_sweeps.FP32_COLS)):
        for n in cols:
            plan += [(dtype, n, f) for f in lab_sweeps.tile_launches(n)]
            plan += [(dtype, n, f) for f in lab_sweeps.chunked_launches(n)]
            if points_of_best is not None and (dtype, n) in points_of_best:
                b = points_of_best[dtype, n]
                plan += [(dtype, n, f) for f in lab_sweeps.persistent_launches(
                    n, b["rows_per_tile"], b["num_warps"])]
    return plan


_NS: dict = {}


def compile_and_check(job: tuple[str, int, dict]) -> str:
    """In a worker: run the launch on a 16-row input (compiling it into the disk cache)
    and compare with the reference. Returns "ok" or why not."""
    dtype_name, n_cols, fields = job
    if not _NS:
        _NS.update(lab_namespace())
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(n_cols)
    x = torch.randn(16, n_cols, generator=gen).to(dtype).cuda()
    w = (torch.rand(n_cols, generator=gen) + 0.5).to(dtype).cuda()
    try:
        y = _NS["rmsnorm_launch"](x, w, 1e-6, _NS["Launch"](**fields))
        torch.cuda.synchronize()
    except Exception as error:  # out of resources, for instance: a result of the sweep
        return f"failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
    mismatch = compare("y", y, reference.rmsnorm(x, w, eps=1e-6), dtype)
    return "ok" if mismatch is None else f"failed: wrong result: {mismatch.describe()[:120]}"


def precompile(jobs: list[tuple[str, int, dict]], workers: int) -> dict:
    """Compile every job in parallel; (dtype, n_cols, launch as a tuple) -> status."""
    keyed = {(d, n, tuple(f.values())): (d, n, f) for d, n, f in jobs}
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        statuses = pool.map(compile_and_check, keyed.values(), chunksize=4)
        return dict(zip(keyed, statuses, strict=True))


def make_inputs(n_rows: int, n_cols: int, dtype: torch.dtype):
    def make_args():
        return (torch.randn(n_rows, n_cols, device="cuda", dtype=dtype),
                torch.rand(n_cols, device="cuda", dtype=dtype) + 0.5, 1e-6)
    return make_args


def graph_measure(label: str, fn, make_args, nbytes: int) -> bench.Measurement:
    """Median time a call of `fn` among calls captured in turn, on rotating inputs, into one
    CUDA graph and replayed (`bench.time_graph`, as `course bench --timer graph` times)."""
    with bench.graph_stream():  # the inputs, the warm-up and the capture off the default
        calls = [partial(fn, *make_args()) for _ in range(bench.copies_needed(nbytes))]
        timing = bench.time_in_turn(calls, reps=REPS, timer="graph")
    return bench.Measurement(label, timing.median_s, int(nbytes), hardware.copy_bandwidth())


@cache
def notebook_graph_timer():
    """The chapter's own `graph_seconds_per_call` (the cell `e5-graph-capture`), which the
    notebook times a live panel with on a GPU: run beside the recorded graph points as a
    check of that cell, its figures printed, never recorded."""
    cells = {c.get("id"): "".join(c["source"])
             for c in json.loads(NOTEBOOK.read_text())["cells"]}
    names = {"torch": torch, "Callable": Callable}
    exec(cells["e5-graph-capture"], names)
    return names["graph_seconds_per_call"]


def small_shapes(rec: Recorder, timers: tuple[str, ...], launch_cls, rmsnorm_launch) -> None:
    """Experiment 5's shapes: the starting launch and torch.compile, with each timer."""
    none, starting = lab_sweeps.launch(num_warps=0), lab_sweeps.launch()
    for n_rows, n_cols in lab_sweeps.CALL_SHAPES:
        torch._dynamo.reset()  # a fresh compile for this fixed shape, as a model gets
        compiled = torch.compile(baselines.eager_rmsnorm, dynamic=False)
        for timer in timers:
            for impl, fields, fn in (
                    ("lab", starting, partial(rmsnorm_launch, launch=launch_cls(**starting))),
                    ("torch.compile", none, compiled)):
                p = rec.time(impl, timer, "bfloat16", n_rows, n_cols, fields, fn)
                result = f"{p.seconds * 1e6:.1f} us" if p.ok else p.status
                print(f"  {impl}, {timer}, {n_rows} x {n_cols}: {result}", flush=True)
                if timer == "graph" and course.on_gpu():
                    print(f"    the notebook's graph_seconds_per_call: "
                          f"{notebook_check(fn, n_rows, n_cols)}", flush=True)


def notebook_check(fn, n_rows: int, n_cols: int) -> str:
    try:
        seconds = notebook_graph_timer()(fn, make_inputs(n_rows, n_cols, torch.bfloat16))
    except Exception as error:
        return f"failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return f"{seconds * 1e6:.1f} us"


def merge(new: Path, into: Path) -> None:
    """Add the points of `new` (a file this script wrote) to the sweep file `into`, each
    point recorded again replacing the old one. Both must be one GPU's."""
    points = lab_sweeps.read(new)
    old = lab_sweeps.read(into) if into.is_file() else ()
    gpus = {p.gpu for p in points} | {p.gpu for p in old}
    if len(gpus) > 1:
        raise SystemExit(f"{new} and {into} hold points of {', '.join(sorted(gpus))}: "
                         f"a sweep's file is one GPU's")
    out = lab_sweeps.merged(old, points)
    lab_sweeps.write(out, into)
    added = len(out) - len(old)
    print(f"{into}: {len(old)} points before, {added} added, {len(points) - added} replaced")


class Recorder:
    def __init__(self, gpu: str, out: Path):
        import triton

        self.out, self.points = out, []
        self.env = {"gpu": gpu, "device_name": torch.cuda.get_device_name(),
                    "torch": torch.__version__, "triton": triton.__version__,
                    "date": time.strftime("%Y-%m-%d")}
        self.copy = hardware.copy_bandwidth()
        print(f"{self.env['device_name']}: copy bandwidth {self.copy / 1e9:.0f} GB/s; torch "
              f"{self.env['torch']}, triton {self.env['triton']}", flush=True)

    def time(self, impl: str, timer: str, dtype_name: str, n_rows: int, n_cols: int,
             fields: dict, fn, status: str = "ok") -> lab_sweeps.SweepPoint:
        values = {**self.env, "impl": impl, "timer": timer, "dtype": dtype_name,
                  "n_rows": n_rows, "n_cols": n_cols, **fields, "copy_gbps": self.copy / 1e9}
        if status == "ok":
            nbytes = traffic.fused_rmsnorm(n_rows, n_cols, DTYPES[dtype_name]).bytes
            make_args = make_inputs(n_rows, n_cols, DTYPES[dtype_name])
            try:
                m = (graph_measure(impl, fn, make_args, nbytes) if timer == "graph" else
                     bench.measure(impl, fn, make_args, nbytes, warmup=WARMUP, reps=REPS,
                                   hide_launch=(timer == "gpu")))
                point = lab_sweeps.SweepPoint(**values, seconds=m.seconds,
                                              fraction_of_copy=m.fraction_of_copy,
                                              status="ok")
            except Exception as error:
                status = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
        if status != "ok":
            point = lab_sweeps.nan_point(**values, status=status)
        self.points.append(point)
        return point

    def save(self) -> None:
        lab_sweeps.write(self.points, self.out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", choices=tuple(lab_sweeps.SWEEP_FILES))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--small-shapes", action="store_true",
                        help="only experiment 5's shapes (lab_sweeps.CALL_SHAPES)")
    parser.add_argument("--timers", default=",".join(lab_sweeps.TIMERS),
                        help="the timers of the small shapes (default: %(default)s)")
    parser.add_argument("--merge", type=Path, metavar="NEW",
                        help="add the points of NEW, a file this script wrote, to --into "
                             "(no GPU needed)")
    parser.add_argument("--into", type=Path, metavar="SWEEP_FILE")
    args = parser.parse_args()
    if args.merge:
        if args.into is None:
            parser.error("--merge needs --into, the sweep's file in course/data/")
        merge(args.merge, args.into)
        return
    if args.gpu is None or args.out is None:
        parser.error("--gpu and --out are needed to record")
    timers = tuple(t.strip() for t in args.timers.split(",") if t.strip())
    if not timers or set(timers) - set(lab_sweeps.TIMERS):
        parser.error(f"--timers takes some of {', '.join(lab_sweeps.TIMERS)}")
    if not course.on_gpu():
        raise SystemExit("sweep_lab.py needs a CUDA GPU")
    if args.gpu not in torch.cuda.get_device_name():
        raise SystemExit(f"--gpu {args.gpu} but this is {torch.cuda.get_device_name()}")
    start = time.perf_counter()
    ns = lab_namespace()
    launch_cls, rmsnorm_launch = ns["Launch"], ns["rmsnorm_launch"]
    if args.small_shapes:
        rec = Recorder(args.gpu, args.out)
        small_shapes(rec, timers, launch_cls, rmsnorm_launch)
        rec.save()
        print(f"{len(rec.points)} points ({sum(p.ok for p in rec.points)} timed) in "
              f"{time.perf_counter() - start:.0f} s -> {args.out}")
        return
    statuses = precompile(planned(), args.workers)
    print(f"compiled {len(statuses)} launches in {time.perf_counter() - start:.0f} s "
          f"({sum(s != 'ok' for s in statuses.values())} failed)", flush=True)
    rec = Recorder(args.gpu, args.out)
    best: dict = {}
    for dtype_name, n_cols, fields in planned():
        status = statuses[dtype_name, n_cols, tuple(fields.values())]
        rec.time("lab", "gpu", dtype_name, lab_sweeps.rows_for(n_cols), n_cols, fields,
                 partial(rmsnorm_launch, launch=launch_cls(**fields)), status)
        if fields["chunk_n"] == 0:
            p = rec.points[-1]
            if p.ok and (best.get((dtype_name, n_cols)) is None
                         or p.seconds < best[dtype_name, n_cols].seconds):
                best[dtype_name, n_cols] = p
    print(f"tile and chunked launches timed at {time.perf_counter() - start:.0f} s", flush=True)
    rec.save()
    around = {key: p.launch for key, p in best.items()}
    persistent = [job for job in planned(around) if job[2]["programs_per_sm"]]
    statuses = precompile(persistent, args.workers)
    for dtype_name, n_cols, fields in persistent:
        rec.time("lab", "gpu", dtype_name, lab_sweeps.rows_for(n_cols), n_cols, fields,
                 partial(rmsnorm_launch, launch=launch_cls(**fields)),
                 statuses[dtype_name, n_cols, tuple(fields.values())])
    print(f"persistent launches timed at {time.perf_counter() - start:.0f} s", flush=True)
    rec.save()
    none = lab_sweeps.launch(num_warps=0)
    for n_cols in (n for n in lab_sweeps.BF16_COLS if n & (n - 1) == 0):
        torch._dynamo.reset()  # a fresh compile for each fixed shape, as a model gets
        compiled = torch.compile(baselines.eager_rmsnorm, dynamic=False)
        rec.time("torch.compile", "gpu", "bfloat16", lab_sweeps.rows_for(n_cols), n_cols,
                 none, compiled)
    print(f"torch.compile timed at {time.perf_counter() - start:.0f} s", flush=True)
    small_shapes(rec, timers, launch_cls, rmsnorm_launch)
    rec.save()
    ok = sum(p.ok for p in rec.points)
    print(f"{len(rec.points)} points ({ok} timed) in {time.perf_counter() - start:.0f} s "
          f"-> {args.out}")
    for n in (256, 1024, 4096, 16384, 65536):
        b = lab_sweeps.best(rec.points, n)
        print(f"  best at N = {n}: {b.label}: {100 * b.fraction_of_copy:.1f} % of copy")


if __name__ == "__main__":
    main()
