"""Synthetic submissions for the autograder's end-to-end tests (tests/test_grader.py).

A submission is one student's notebook for one chapter: the released notebook with its
exercise cells answered with the source's own solutions (markers removed), except for the
cells a mistake replaces with a learner's broken or dishonest code. Each mistake names the
test cells it must lose; every other test cell must keep its points. A student may submit
several chapters, each with its own mistake (or none): their chapters are graded apart.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import rmsnorm_variants  # imports course first: kernels are defined after the mode is set

ROOT = Path(__file__).resolve().parents[1]
MARKER_LINE = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.M)


@dataclass(frozen=True)
class Submission:
    student: str
    chapter: str
    what: str = "every exercise answered with the source's solution"
    replaced: dict[str, str] = field(default_factory=dict)  # exercise grade id -> code
    loses: tuple[str, ...] = ()      # test cells that must score 0
    reason: str = ""                 # in the first lost cell's error: why it lost

    @property
    def key(self) -> str:
        return f"{self.student}/{self.chapter}"


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def source_path(root: Path, chapter: str) -> Path:
    return root / "solutions" / chapter / f"{chapter}.ipynb"


def graded_cells(root: Path, chapter: str) -> dict[str, float]:
    """grade id -> points of each autograded test cell of a chapter, from its source."""
    nb = nbformat.read(source_path(root, chapter), as_version=4)
    return {nbgrader_meta(c)["grade_id"]: float(nbgrader_meta(c)["points"]) for c in nb.cells
            if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")}


def solutions(root: Path, chapter: str) -> dict[str, str]:
    """grade id -> the source's answer of each exercise cell, without the markers."""
    nb = nbformat.read(source_path(root, chapter), as_version=4)
    return {nbgrader_meta(c)["grade_id"]: MARKER_LINE.sub("", c.source) for c in nb.cells
            if nbgrader_meta(c).get("solution")}


def answered(release: Path, answers: dict[str, str]) -> nbformat.NotebookNode:
    """The released notebook with every exercise cell holding its answer."""
    nb = nbformat.read(release, as_version=4)
    for cell in nb.cells:
        if nbgrader_meta(cell).get("solution"):
            cell.source = answers[nbgrader_meta(cell)["grade_id"]]
    return nb


def copy_course(root: Path, into: Path, chapters: tuple[str, ...]) -> Path:
    """What grading reads from a checkout: the chapters' sources, the nbgrader config and
    tooling, the release script. Only `chapters` are copied, so a chapter another author is
    still writing cannot break this run. (The notebooks import `course` and
    `solutions.kernels` from the installed checkout.)"""
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    (into / "solutions").mkdir(parents=True)
    for chapter in chapters:
        shutil.copytree(root / "solutions" / chapter, into / "solutions" / chapter,
                        ignore=ignore)
    (into / "grader").mkdir()
    for name in ("nbgrader_config.py", "instructor.py", "slurm_autograde.sbatch"):
        shutil.copy2(root / "grader" / name, into / "grader" / name)
    (into / "scripts").mkdir()
    shutil.copy2(root / "scripts" / "release.py", into / "scripts" / "release.py")
    return into


def course_for_make(root: Path, into: Path, chapters: tuple[str, ...]) -> Path:
    """`copy_course`, released, with what `make` needs to run the instructor's steps there:
    the Makefile, pyproject.toml and this checkout's .venv (already built)."""
    course = copy_course(root, into, chapters)
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(root / name, course / name)
    (course / ".venv").symlink_to(root / ".venv")
    stamp = root / ".venv" / ".installed"
    assert stamp.is_file(), "build .venv first (make test does)"
    # The copy's pyproject.toml must not look newer than the shared .venv's stamp: `make`
    # there would run `pip install -e .` in the copy, and the checkout's .venv would then
    # import `course` and `solutions` from this temporary folder (seen when pyproject.toml
    # was edited after .venv was built).
    # A second older, in nanoseconds: st_mtime as a float can round up past the stamp's own
    # time, and make compares the nanoseconds (a fresh clone's suite once reinstalled so).
    older = stamp.stat().st_mtime_ns - 1_000_000_000
    os.utime(course / "pyproject.toml", ns=(older, older))
    release(course)
    return course


def load_instructor(course_root: Path, name: str = "instructor_under_test"):
    """`course_root`'s grader/instructor.py as a module of this process, under `name` (each
    test file its own, so that copies of the course do not share one module)."""
    spec = importlib.util.spec_from_file_location(name, course_root / "grader" / "instructor.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def release(course_root: Path) -> None:
    done = subprocess.run([sys.executable, str(course_root / "scripts" / "release.py")],
                          cwd=course_root, capture_output=True, text=True)
    assert done.returncode == 0, f"the release failed:\n{done.stdout}{done.stderr}"


def write_inbox(course_root: Path, inbox: Path, submissions: list[Submission]) -> None:
    """inbox/<student>/<chapter>/<chapter>.ipynb for every submission, as an instructor
    receives them, built from the released notebooks of `course_root`."""
    for sub in submissions:
        answers = solutions(course_root, sub.chapter)
        unknown = sorted(set(sub.replaced) - set(answers))
        assert not unknown, f"{sub.key}: {sub.chapter} has no exercise cell {unknown}"
        nb = answered(course_root / "notebooks" / sub.chapter / f"{sub.chapter}.ipynb",
                      answers | sub.replaced)
        folder = inbox / sub.student / sub.chapter
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{sub.chapter}.ipynb")


def verified(sub: Submission, tmp_path: Path):
    """The verifier's verdict on `sub` (course.verify: the learner's cells in a process of
    their own, the test cells in this one), its notebook built as the autograder's tests
    build it."""
    from course.verify.verifier import verify

    path = tmp_path / sub.chapter / f"{sub.chapter}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(answered(ROOT / "notebooks" / sub.chapter / f"{sub.chapter}.ipynb",
                            solutions(ROOT, sub.chapter) | sub.replaced), path)
    return verify(path, source_path(ROOT, sub.chapter), cell_timeout_s=300)


# The test cells that measure speed. Under the autograder they fail without a GPU ("needs a
# GPU", COURSE_GRADING=1), for every submission; on a GPU they measure the kernel.
GPU_ONLY_CELLS = ("ex03_two_pass_bandwidth", "ex04_fused_bandwidth",
                  "ex05_add_rmsnorm_bandwidth", "ex06_layernorm_bandwidth",
                  "ex07_backward_bandwidth", "ex07_layernorm_bandwidth")


def gpu_only_cells_of(root: Path, chapter: str) -> set[str]:
    """The test cells of a chapter that call a bandwidth or torch.compile checker."""
    nb = nbformat.read(source_path(root, chapter), as_version=4)
    return {nbgrader_meta(c)["grade_id"] for c in nb.cells
            if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")
            and ("_bandwidth(" in c.source or "beats_torch_compile(" in c.source)}


def expected_points(course_root: Path, sub: Submission, *, gpu: bool = False
                    ) -> dict[str, float]:
    """grade id -> the exact points `sub` must get on each test cell of its chapter: full
    points, except 0 on the cells it loses and,
    without a GPU, on the cells that measure speed."""
    cells = graded_cells(course_root, sub.chapter)
    unknown = sorted(set(sub.loses) - set(cells))
    assert not unknown, f"{sub.key}: {sub.chapter} has no test cell {unknown}"
    return {g: 0.0 if g in sub.loses or (not gpu and g in GPU_ONLY_CELLS)
            else p for g, p in cells.items()}


# ---------------------------------------------------------------- chapter 01 and 02

CH01_WRONG_MATH = '''\
def rmsnorm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Divides by the standard deviation (LayerNorm's statistic), not the root mean square."""
    x32 = x.to(torch.float32)
    rstd = torch.rsqrt(x32.var(dim=-1, unbiased=False, keepdim=True) + eps)
    return (x32 * rstd * weight.to(torch.float32)).to(x.dtype)
'''

_CH02_FIRST_THREE = '''\
def fused_rmsnorm_bytes(M: int, N: int, elem_bytes: int) -> int:
    return 2 * M * N * elem_bytes + N * elem_bytes


def rmsnorm_flops(M: int, N: int) -> int:
    return 4 * M * N + 4 * M


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    return flops / nbytes
'''

CH02_EXCEPTION = _CH02_FIRST_THREE + '''

def time_floor_us(nbytes: float, bytes_per_s: float) -> float:
    return nbytes / bytes_per_sec * 1e6   # a misspelt name: NameError
'''

CH02_INFINITE_LOOP = _CH02_FIRST_THREE + '''

def time_floor_us(nbytes: float, bytes_per_s: float) -> float:
    """Adds up steps of one microsecond until the bytes are moved."""
    moved, microseconds = 0.0, 0
    while moved < nbytes:
        moved + bytes_per_s * 1e-6   # `+` where `+=` was meant: never gets anywhere
        microseconds += 1
    return float(microseconds)
'''

# Stands in for a GPU kernel that never returns: the kernel process then sits inside CUDA,
# where Python's interrupt handler cannot run, so the interrupt at the time limit is lost.
# It waits asleep rather than spinning: nbgrader and the verifier wait about a minute for it
# in all (the time limit, then the grace after each interrupt, per test cell), and a busy
# loop would take a CPU core from the rest of the suite all that time.
CH02_IGNORES_INTERRUPT = _CH02_FIRST_THREE + '''

def time_floor_us(nbytes: float, bytes_per_s: float) -> float:
    import signal
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        time.sleep(1.0)
'''

# ---------------------------------------------------------------- chapter 04: the fused kernel
# The exercise cell holds the kernel and the wrapper; earlier cells of the chapter define
# `validation` (course.validation) and `warps_for`.

_CH04_WRAPPER = '''

def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x2 = validation.as_rows(x)
    M, N = x2.shape
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    block_n = triton.next_power_of_2(N)
    rmsnorm_kernel[(M,)](x2, weight, y, x2.stride(0), y.stride(0), N, eps, BLOCK_N=block_n,
                         num_warps=warps_for(block_n))
    return y.view(x.shape)
'''

# The correct kernel the checker tests use (tests/rmsnorm_variants.py), as a learner writes it.
_CH04_KERNEL = inspect.getsource(rmsnorm_variants.rmsnorm_kernel.fn)


def _ch04_kernel_with(*edits: tuple[str, str]) -> str:
    """The correct kernel, each (old, new) edit applied."""
    kernel = _CH04_KERNEL
    for old, new in edits:
        assert old in kernel, f"the chapter 4 kernel has no {old!r}"
        kernel = kernel.replace(old, new)
    return kernel


def _ch04_with(*edits: tuple[str, str]) -> str:
    """The exercise cell with the correct kernel, each (old, new) edit applied (one bug),
    and the wrapper."""
    return _ch04_kernel_with(*edits) + _CH04_WRAPPER


CH04_MISSING_MASK = _ch04_with(  # BLOCK_N columns even when N is less
    ("    mask = cols < n_cols\n", ""),
    (", mask=mask, other=0.0)", ")"),
    (",\n             mask=mask)", ")"))

CH04_BF16_ACCUMULATION = _ch04_with(  # x stays 16-bit, and so does the sum of squares
    ("other=0.0).to(tl.float32)\n    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols",
     "other=0.0)\n    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0).to(tl.float32) / n_cols"),
    ("(x * rstd * w)", "(x.to(tl.float32) * rstd * w)"))

CH04_TORCH_OPS = _CH04_KERNEL + '''

def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Launches the kernel for show; the answer comes from PyTorch."""
    x2 = validation.as_rows(x)
    M, N = x2.shape
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    block_n = triton.next_power_of_2(N)
    rmsnorm_kernel[(M,)](x2, weight, y, x2.stride(0), y.stride(0), N, eps, BLOCK_N=block_n)
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight).to(x.dtype)
'''

CH04_NO_STORE = _ch04_with((  # y reads as whatever memory held before
    "    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),"
    "\n             mask=mask)\n", "    y = x * rstd * w    # computed, never stored\n"))

CH04_CACHED = _CH04_KERNEL + '''

_results = {}


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Remembers the answer per shape and dtype: right once, then stale."""
    key = (tuple(x.shape), x.dtype, eps)
    if key not in _results:
        x2 = validation.as_rows(x)
        M, N = x2.shape
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)
        block_n = triton.next_power_of_2(N)
        rmsnorm_kernel[(M,)](x2, weight, y, x2.stride(0), y.stride(0), N, eps,
                             BLOCK_N=block_n, num_warps=warps_for(block_n))
        _results[key] = y.view(x.shape)
    return _results[key]
'''

# For the GPU run: correct, but a two-pass kernel (x read twice, in blocks of 128 with one
# warp). The bandwidth check counts its loads and refuses the second read before timing.
CH04_TWO_PASS_SLOW = inspect.getsource(rmsnorm_variants.two_pass_kernel.fn).replace(
    "two_pass_kernel", "rmsnorm_kernel") + '''

def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x2 = validation.as_rows(x)
    M, N = x2.shape
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    rmsnorm_kernel[(M,)](x2, weight, y, x2.stride(0), y.stride(0), N, eps, BLOCK_N=128,
                         num_warps=1)
    return y.view(x.shape)
'''

# For the GPU run: chapter 03's answer, its two-pass kernel as the source notebook has it
# (blocks of 1024, 4 warps), handed in as chapter 04's. Right and one launch, so it keeps the
# correctness points; on an H200 its second read came from L2 fast enough to pass the speed
# target (86.7 % of copy), so only the count of its loads refuses it.
CH04_CH03_ANSWER = solutions(ROOT, "ch03_two_pass")["ex03_two_pass_code"] + '''

rmsnorm_kernel = rmsnorm_two_pass_kernel  # the name later cells of chapter 04 launch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return rmsnorm_two_pass(x, weight, eps)
'''
# What the bandwidth cell says of both (course.check.bandwidth.second_reads).
READS_TWICE = "reads each row of `x` twice"

# For the GPU run: x read once, but y written four times (three copies into scratch memory),
# on a side stream the call never waits for: events recorded on the current stream would
# time an idle GPU. What the verifier times is its own replay of the call's GPU work,
# whatever stream it was launched on, so the four writes are timed and the cell is lost.
CH04_SIDE_STREAM = _ch04_kernel_with(
    ("y_ptr, stride_x_row, stride_y_row, n_cols,",
     "y_ptr, scratch_ptr, stride_x_row, stride_y_row, n_rows,\n                   n_cols,"),
    ("    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),"
     "\n             mask=mask)\n",
     "    y = (x * rstd * w).to(y_ptr.dtype.element_ty)\n"
     "    tl.store(y_ptr + row * stride_y_row + cols, y, mask=mask)\n"
     "    for copy in range(3):\n"
     "        tl.store(scratch_ptr + (copy * n_rows + row) * n_cols + cols, y, mask=mask)\n"),
) + """

_side = []


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if not _side:
        _side.append(torch.cuda.Stream())
    x2 = validation.as_rows(x)
    M, N = x2.shape
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    scratch = torch.empty((3, M, N), dtype=x.dtype, device=x.device)
    block_n = triton.next_power_of_2(N)
    _side[0].wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_side[0]):
        rmsnorm_kernel[(M,)](x2, weight, y, scratch, x2.stride(0), y.stride(0), M, N, eps,
                             BLOCK_N=block_n, num_warps=warps_for(block_n))
    return y.view(x.shape)
"""

# Every program reads row 0 (x's row offset left out): row 0 comes out right, the rest wrong.
CH04_ROW_OFFSET = _ch04_with(("x_ptr + row * stride_x_row + cols", "x_ptr + cols"))

# For the GPU run: an offset 2**40 elements past the output, an illegal address on a GPU.
CH04_ILLEGAL_ADDRESS = _ch04_with(("tl.store(y_ptr + row * stride_y_row + cols,",
                                   "tl.store(y_ptr + (1 << 40) + row * stride_y_row + cols,"))

CH01_TESTS = ("ex01_torch_rmsnorm", "ex01_torch_rmsnorm_hidden")
CH02_TESTS = ("ex02_roofline_functions", "ex02_roofline_functions_hidden")
CH04_CORRECTNESS = ("ex04_fused_correct", "ex04_fused_hidden")
CH04_BANDWIDTH = "ex04_fused_bandwidth"


def _ch04(student: str, what: str, code: str, reason: str) -> Submission:
    return Submission(student, "ch04_fused", what, {"ex04_fused_code": code}, CH04_CORRECTNESS,
                      reason)


# Chapters 01 and 02: fast cells, so the time limit per cell can be short (see the test).
SHORT_LIMIT_SUBMISSIONS = [
    Submission("correct", "ch01_math"),
    Submission("correct", "ch02_roofline"),
    Submission("mistakes_a", "ch01_math", "divides by the standard deviation, not the RMS",
               {"ex01_torch_rmsnorm_code": CH01_WRONG_MATH}, CH01_TESTS, "AssertionError"),
    Submission("mistakes_b", "ch02_roofline", "time_floor_us raises NameError",
               {"ex02_roofline_functions_code": CH02_EXCEPTION}, CH02_TESTS,
               "name 'bytes_per_sec' is not defined"),
    Submission("mistakes_c", "ch02_roofline", "time_floor_us loops forever (interrupted)",
               {"ex02_roofline_functions_code": CH02_INFINITE_LOOP}, CH02_TESTS,
               "CellTimeoutError"),
    Submission("mistakes_d", "ch02_roofline",
               "hangs and ignores the interrupt (its process is killed)",
               {"ex02_roofline_functions_code": CH02_IGNORES_INTERRUPT}, CH02_TESTS,
               "CellTimeoutError"),
]

# Chapter 04: the adversarial Triton kernels, one per student above, so that each of those
# students also has a chapter graded apart from their other mistake.
CH04_SUBMISSIONS = [
    Submission("correct", "ch04_fused"),
    _ch04("mistakes_a", "no mask: loads and stores past the end of each row",
          CH04_MISSING_MASK, "writes outside the output tensor"),
    _ch04("mistakes_b", "squares and sums in the input's 16-bit dtype",
          CH04_BF16_ACCUMULATION, "statistics are computed in the input's precision"),
    _ch04("mistakes_c", "computes the answer with PyTorch, launches the kernel for show",
          CH04_TORCH_OPS, "computes with PyTorch"),
    _ch04("mistakes_d", "never stores: the output is whatever memory held",
          CH04_NO_STORE, "never stores into the tensor you return"),
    _ch04("mistakes_e", "caches the result per shape", CH04_CACHED,
          "returned the first call's result"),
]


# ---------------------------------------------------------------- chapter 04: cheats
# Submissions that tamper with grading from inside the notebook, each of which stock
# nbgrader (test cells in the learner's own process) would have given points. The
# verifier (course.verify) must leave each 0 on the cells it targets. They build on the
# correct kernel and wrapper above where they need a working kernel.

_RETURNS_INPUT = '''

def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x
'''

# The checkers replaced with setattr, their names assembled from strings so that no line
# names them; the comparison and torch.equal too, so the hidden test passes in-notebook.
CH04_SETATTR_PATCH = _RETURNS_INPUT + '''
_target = __import__("cour" + "se.che" + "ck", fromlist=["_"])
for _name in ("rmsnorm_for" + "ward", "rmsnorm_for" + "ward_bandwidth"):
    setattr(_target, _name, lambda *a, **k: None)
setattr(__import__("cour" + "se.check.com" + "pare", fromlist=["_"]), "com" + "pare",
        lambda *a, **k: None)
'''

# A module of permissive checkers in place of course.check in sys.modules.
CH04_SYS_MODULES_SWAP = _RETURNS_INPUT + '''
import sys
import types

_fake = types.ModuleType("course.check")
_fake.rmsnorm_forward = _fake.rmsnorm_forward_bandwidth = lambda *a, **k: None
sys.modules["course.check"] = _fake
sys.modules["course"].check = _fake
'''

# The comparisons themselves replaced: torch.allclose, torch.testing, the course's compare.
CH04_COMPARISON_PATCH = _RETURNS_INPUT + '''
import torch.testing
from course.check import compare as _compare_module
from course.check import runner as _runner

torch.allclose = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
_compare_module.compare = _runner.compare = lambda *a, **k: None
_runner.provenance_findings = _runner.rule_findings = lambda *a, **k: []
'''

# A correct kernel, and clocks that run slow: every time comes out tiny.
CH04_TIMER_PATCH = _ch04_with() + '''
import time

_clock = time.perf_counter
time.perf_counter = lambda: _clock() / 100
torch.cuda.Event.elapsed_time = lambda self, end: 1e-3
'''

# A correct kernel behind a cache keyed by the inputs' addresses: right for new tensors,
# stale when the same buffers are refilled (as a model's static buffers are).
CH04_ADDRESS_CACHE = _CH04_KERNEL + '''

_by_address = {}


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    key = (x.data_ptr(), weight.data_ptr(), tuple(x.shape), tuple(x.stride()), x.dtype, eps)
    if key not in _by_address:
        x2 = validation.as_rows(x)
        M, N = x2.shape
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)
        block_n = triton.next_power_of_2(N)
        rmsnorm_kernel[(M,)](x2, weight, y, x2.stride(0), y.stride(0), N, eps,
                             BLOCK_N=block_n, num_warps=warps_for(block_n))
        _by_address[key] = y.view(x.shape)
    return _by_address[key]
'''

# A kernel that fails to launch, an exception swallowed into returning the input, and the
# notebook told to show no error for any cell (so every failing test cell looks passed).
CH04_SILENCED = _ch04_with(("BLOCK_N: tl.constexpr", "BLOCK_N: tl.constexpr, MISSING")) + '''
_launch = rmsnorm


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    try:
        return _launch(x, weight, eps)
    except Exception:
        return x.clone()


get_ipython().set_custom_exc((BaseException,), lambda *args, **kwargs: None)
'''

# The course's own reference kernel in place of the learner's.
CH04_REFERENCE_IMPORT = '''
from solutions.kernels import rmsnorm as _reference


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return _reference(x, weight, eps)
'''

# A kernel that reads a row and stores nothing: the cheats below do the work elsewhere.
_CH04_IDLE_KERNEL = """
@triton.jit
def rmsnorm_kernel(x_ptr, y_ptr, n_cols, BLOCK_N: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + tl.program_id(0) * n_cols + cols, mask=cols < n_cols, other=0.0)
"""

# PyTorch in the grid function, which Triton calls inside its launch step.
CH04_GRID_FUNCTION = _CH04_IDLE_KERNEL + """

def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x2 = validation.as_rows(x)
    y = torch.empty_like(x2)

    def grid(meta):
        xf = x2.float()
        y.copy_(xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float())
        return (x2.shape[0],)

    rmsnorm_kernel[grid](x2, y, x2.shape[1], BLOCK_N=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
"""

# PyTorch in an int subclass's comparisons, which Triton makes inside its launch step.
CH04_INT_SUBCLASS = _CH04_IDLE_KERNEL + """

class Cols(int):
    def __new__(cls, n, work):
        made = super().__new__(cls, n)
        made.work = work
        return made

    def __le__(self, other):
        self.work()
        return int(self) <= other

    def __ge__(self, other):
        self.work()
        return int(self) >= other


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x2 = validation.as_rows(x)
    y = torch.empty_like(x2)

    def work():
        xf = x2.float()
        y.copy_(xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float())

    rmsnorm_kernel[(x2.shape[0],)](x2, y, Cols(x2.shape[1], work),
                                   BLOCK_N=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
"""

# Right on every input the checker makes; on the hidden cell's extra inputs (float16 rows of
# 3000, bfloat16 rows of 600) it zeroes y and the weight, so that a reference computed from
# the weight after the call agrees.
CH04_ZEROED_WEIGHT = _CH04_KERNEL + _CH04_WRAPPER.replace("    return y.view(x.shape)", """\
    if (x.dtype, N) in ((torch.float16, 3000), (torch.bfloat16, 600)):
        _zero_kernel[(1,)](y, weight, y.numel(), N, BLOCK=triton.next_power_of_2(y.numel()))
    return y.view(x.shape)""") + """

@triton.jit
def _zero_kernel(y_ptr, w_ptr, n_y, n_w, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.zeros([BLOCK], tl.float32).to(y_ptr.dtype.element_ty), mask=i < n_y)
    tl.store(w_ptr + i, tl.zeros([BLOCK], tl.float32).to(w_ptr.dtype.element_ty), mask=i < n_w)
"""

# The answer computed in NumPy on a copy of x (copies are allowed, NumPy runs no PyTorch
# op; plain Python on x.tolist() is the same, only slower), and a kernel that only moves it
# into y: its stores are y's values, so only repeating the kernels' work on other inputs
# tells (course.check.runner.probe_repeat).
CH04_COPIED_ANSWER = """
import numpy as np


@triton.jit
def rmsnorm_kernel(src_ptr, y_ptr, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    values = tl.load(src_ptr + row * n_cols + cols, mask=cols < n_cols)
    tl.store(y_ptr + row * n_cols + cols, values.to(y_ptr.dtype.element_ty), mask=cols < n_cols)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x2 = validation.as_rows(x)
    xs = x2.detach().cpu().double().numpy()
    ws = weight.detach().cpu().double().numpy()
    ys = xs / np.sqrt((xs * xs).mean(-1, keepdims=True) + eps) * ws
    answer = torch.from_numpy(ys).to(device=x.device, dtype=torch.float32)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    rmsnorm_kernel[(x2.shape[0],)](answer, y, x2.shape[1],
                                   BLOCK_N=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
"""

TAMPERING = "changed what the checks rely on"


def _cheat(student: str, what: str, code: str, reason: str,
           loses: tuple[str, ...] = CH04_CORRECTNESS) -> Submission:
    return Submission(student, "ch04_fused", what, {"ex04_fused_code": code}, loses, reason)


CH04_CHEATS = [
    Submission("honest", "ch04_fused"),
    _cheat("setattr", "replaces the checkers with setattr (names built from strings)",
           CH04_SETATTR_PATCH, TAMPERING),
    _cheat("modules", "swaps course.check in sys.modules", CH04_SYS_MODULES_SWAP, TAMPERING),
    _cheat("compare", "replaces torch.allclose, torch.testing and the course's compare",
           CH04_COMPARISON_PATCH, TAMPERING),
    _cheat("timer", "a correct kernel, with time.perf_counter and Event.elapsed_time patched",
           CH04_TIMER_PATCH, TAMPERING),
    _cheat("address", "caches results by the inputs' addresses", CH04_ADDRESS_CACHE,
           "cached by the input's address"),
    _cheat("silenced", "swallows its kernel's exception and hides every failing cell",
           CH04_SILENCED, "wrong"),
    # Graded from a checkout, its import of solutions/ is refused by the walls before the
    # fingerprint check (the kernel the course ships) would see the launch.
    _cheat("reference", "calls the course's own reference kernel", CH04_REFERENCE_IMPORT,
           "a folder of the course's grading"),
    _cheat("grid", "computes with PyTorch in its grid function", CH04_GRID_FUNCTION,
           "computes with PyTorch"),
    _cheat("argument", "computes with PyTorch in an int subclass's comparisons",
           CH04_INT_SUBCLASS, "only passes for a number or a tensor"),
    _cheat("weight", "zeroes y and the weight on inputs only the hidden cell makes",
           CH04_ZEROED_WEIGHT, "of y are wrong", ("ex04_fused_hidden",)),
    _cheat("copied", "computes the answer in NumPy; its kernel only copies it into y",
           CH04_COPIED_ANSWER, "did not come from its kernels"),
]


# ---------------------------------------------------------------- chapter 07
# Mistakes in chapter 07's scaffolded exercises (tests/ch07_answers.py writes each as edits
# of the source's answers; tests/test_backward_diagnoses.py tries each one cell by cell).
# One submission carries three of them, in three exercises, for the verifier to grade
# (tests/test_backward_diagnoses.py; tests/test_grader.py grades the correct chapter 07 end
# to end). dX and dW are graded in cells of their own, and so are LayerNorm's dx, dW and dB,
# so each mistake costs its own cell, plus the cells of exercises built on it (the
# autograd.Function calls the RMSNorm backward). That is in interpreter mode: on a GPU the
# autograd checks' inputs are short enough that the split rule gives every row a program of
# its own, where a dW that is not accumulated is right (docs/benchmarks.md, the H100 run).
CH07_AUTOGRAD = ("ex07_autograd_correct", "ex07_autograd_hidden", "ex07_autograd_gradcheck")
CH07_MISTAKES = {"ln_without_mean_g": ("ex07_layernorm_dx",),
                 "row_dots_no_loop": ("ex07_row_dots",),
                 "dw_not_accumulated": ("ex07_backward_dw", *CH07_AUTOGRAD)}


def ch07_submissions() -> list[Submission]:
    """The correct chapter 07, and one with the mistakes of CH07_MISTAKES (its reason: the
    first one's phrase, in the first cell it loses)."""
    import ch07_answers  # it imports this module: looked up when first needed

    edits: dict[str, list[tuple[str, str]]] = {}
    for name in CH07_MISTAKES:
        for grade_id, changes in ch07_answers.MISTAKES[name].edits.items():
            edits.setdefault(grade_id, []).extend(changes)
    answers = ch07_answers.answers(edits)
    first = ch07_answers.MISTAKES[next(iter(CH07_MISTAKES))]
    return [
        Submission("correct", "ch07_backward"),
        Submission("mistakes_a", "ch07_backward",
                   "; ".join(ch07_answers.MISTAKES[n].what for n in CH07_MISTAKES),
                   {grade_id: answers[grade_id] for grade_id in edits},
                   tuple(g for lost in CH07_MISTAKES.values() for g in lost), first.phrase),
    ]


# ---------------------------------------------------------------- chapter 03
# Mistakes in chapter 03's plain-Python exercises (tests/ch03_answers.py writes each as
# edits of the source's answers; tests/test_ch03_exercises.py tries each one, and grades
# this submission with the verifier: the learner's functions run in a process of their own).
CH03_MISTAKES = ("weight_forgotten", "same_output")


def with_edits(answers: dict[str, str], edits: dict[str, list[tuple[str, str]]]
               ) -> dict[str, str]:
    """`answers` (grade id -> code) with each exercise's (old, new) replacements made."""
    found = dict(answers)
    for grade_id, changes in edits.items():
        for old, new in changes:
            assert old in found[grade_id], f"{grade_id} has no {old!r}"
            found[grade_id] = found[grade_id].replace(old, new)
    return found


def ch03_submissions() -> list[Submission]:
    """The correct chapter 03, and one with a mistake in each of its two plain-Python
    exercises (its reason: the first one's phrase, in the first cell it loses)."""
    import ch03_answers  # it imports this module: looked up when first needed

    edits: dict[str, list[tuple[str, str]]] = {}
    for name in CH03_MISTAKES:
        for grade_id, changes in ch03_answers.MISTAKES[name].edits.items():
            edits.setdefault(grade_id, []).extend(changes)
    answers = ch03_answers.answers(edits)
    mistakes = [ch03_answers.MISTAKES[n] for n in CH03_MISTAKES]
    return [
        Submission("correct", "ch03_two_pass"),
        Submission("mistakes_a", "ch03_two_pass", "; ".join(m.what for m in mistakes),
                   {grade_id: answers[grade_id] for grade_id in edits},
                   tuple(g for m in mistakes for g in m.loses), mistakes[0].phrase),
    ]


# A rule that looks the best recorded launch up wherever the sweeps recorded the row length
# (the model rule elsewhere, so that every shape the correctness checks try gets a launch).
CH08_LOOKS_UP = """\
    recorded = lab_sweeps.BF16_COLS if element_size == 2 else lab_sweeps.FP32_COLS
    if n_cols in recorded:
        dtype = "bfloat16" if element_size == 2 else "float32"
        return Launch(**lab_sweeps.best(sweeps["H100"], n_cols, dtype).launch)
"""


def ch08_submissions() -> list[Submission]:
    """The correct chapter 08; a launch rule tuned for one row length: the launch that
    wins at 4096 columns, everywhere; and a rule that looks the recorded best launch up,
    which the recorded sweeps would judge perfect. The correctness cells keep their points
    (the kernel is right at any launch that compiles); the launch rule's cell loses them."""
    code = solutions(ROOT, "ch08_performance_lab")["ex08_tuned_rmsnorm_code"]
    head, rest = code.split("    block_n = triton.next_power_of_2(n_cols)\n", 1)
    one_shape = head + "    return Launch(num_warps=8)\n\n\n" + rest[rest.index("def rmsnorm("):]
    looks_up = head + CH08_LOOKS_UP + "    block_n = triton.next_power_of_2(n_cols)\n" + rest
    return [
        Submission("correct", "ch08_performance_lab"),
        Submission("one_shape", "ch08_performance_lab", "a launch rule tuned for 4096 columns",
                   {"ex08_tuned_rmsnorm_code": one_shape}, ("ex08_launch_rule",),
                   "Your launch rule falls short at bfloat16 N = 512"),
        Submission("looks_up", "ch08_performance_lab",
                   "a launch rule that looks the best launch up in the recorded sweeps",
                   {"ex08_tuned_rmsnorm_code": looks_up}, ("ex08_launch_rule",),
                   "Your choose_launch reads the recorded sweeps: choose_launch(131072, 512, 2) "
                   "(bfloat16) read lab_sweeps.best()"),
    ]
