"""What the learner's package records of the reference kernels (`course.kernel_records`):
the fingerprints that let the checkers refuse a copy of a reference kernel without shipping
the kernels, and the launch plans the chapters show. Both must match solutions/kernels/
(scripts/reference_records.py writes them). And the Nsight Compute counters recorded on an
H200, which must be the figures of the raw reports they were copied from."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import course  # noqa: F401  (the execution mode is chosen before any kernel is defined)
from course import kernel_records, runtime
from course.check import sandbox

import pytest
import torch

import solutions.kernels
from solutions.kernels import column_sums, launch

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p.name for p in (ROOT / "solutions").glob("ch[0-9][0-9]_*") if p.is_dir())


def _load_script():
    spec = importlib.util.spec_from_file_location("reference_records_script",
                                                  ROOT / "scripts" / "reference_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


script = _load_script()


def _reference_kernels() -> dict[str, object]:
    """'solutions.kernels.module.name' -> the Python function of each @triton.jit object."""
    found = {}
    for info in pkgutil.iter_modules(solutions.kernels.__path__):
        module = importlib.import_module(f"solutions.kernels.{info.name}")
        for name, obj in vars(module).items():
            fn = sandbox._python_function(obj)
            if fn is not obj and getattr(fn, "__module__", None) == module.__name__:
                found[f"{module.__name__}.{name}"] = fn
    return found


# ------------------------------------------------------------------ the records are current


def test_the_shipped_records_are_what_the_script_writes_from_the_kernels_now():
    stale = [p.name for p, text in script.records().items()
             if not p.is_file() or p.read_text() != text]
    assert not stale, (f"course/data/{', '.join(stale)} out of date with solutions/kernels/: "
                       "run `python scripts/reference_records.py`")


def test_every_reference_kernel_is_fingerprinted_and_known_at_run_time():
    kernels = _reference_kernels()
    shipped = set(kernel_records.shipped_fingerprints().values())
    assert set(kernels) == shipped
    for name, fn in kernels.items():   # the source the checkers read: inspect.getsource
        assert kernel_records.copied_from(fn) == name


def test_the_recorded_plans_are_the_plans_made_for_an_h100():
    gpu = torch.device("cuda")
    plan = launch.forward_plan(16384, 4096, gpu, element_size=2, gpu=launch.H100)
    backward = launch.backward_plan(262144, 384, gpu, dtype=torch.bfloat16, gpu=launch.H100)
    recorded = kernel_records.reference_plan("rmsnorm", 16384, 4096)
    assert (recorded.path, recorded.block_m, recorded.num_warps) == (plan.path, plan.block_m,
                                                                      plan.num_warps)
    assert kernel_records.reference_plan("rmsnorm", 262144, 384,
                                         backward=True).programs == backward.programs
    assert "132 SMs" in kernel_records.planned_for()
    with pytest.raises(KeyError, match="no recorded forward plan for rmsnorm at 3 x 5"):
        kernel_records.reference_plan("rmsnorm", 3, 5)


def test_the_records_load_without_solutions(tmp_path):
    """What a learner's Python, which has no solutions/, reads."""
    probe = ("import sys; sys.modules['solutions'] = None\n"
             "from course import kernel_records\n"
             "assert kernel_records.shipped_fingerprints()\n"
             "print(kernel_records.reference_plan('rmsnorm', 16384, 512).path)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "rows"


# ------------------------------------------------------------------ the recorded ncu counters

# KernelCounters' field -> (ncu's metric name, its unit) in a raw report
NCU_METRICS = {
    "grid_size": ("Grid Size", ""),
    "block_size": ("Block Size", ""),
    "registers_per_thread": ("Registers Per Thread", "register/thread"),
    "duration_us": ("Duration", "us"),
    "dram_throughput_pct": ("DRAM Throughput", "%"),
    "dram_tbyte_per_s": ("Memory Throughput", "Tbyte/s"),
    "sm_throughput_pct": ("Compute (SM) Throughput", "%"),
    "warp_cycles_per_issued_instruction": ("Warp Cycles Per Issued Instruction", "cycle"),
    "local_memory_spilling_requests": ("Local Memory Spilling Requests", ""),
    "block_limit_registers": ("Block Limit Registers", "block"),
    "block_limit_warps": ("Block Limit Warps", "block"),
    "theoretical_warps_per_sm": ("Theoretical Active Warps per SM", "warp"),
    "theoretical_occupancy_pct": ("Theoretical Occupancy", "%"),
    "achieved_occupancy_pct": ("Achieved Occupancy", "%"),
}


def _ncu_metrics(report: str) -> dict[tuple[str, str], float]:
    """(metric name, unit) -> value, for every numeric row of an ncu text report's sections."""
    found = {}
    for line in report.splitlines():
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) in (2, 3) and re.fullmatch(r"[\d,]+(\.\d+)?", parts[-1]):
            unit = parts[1] if len(parts) == 3 else ""
            found[(parts[0], unit)] = float(parts[-1].replace(",", ""))
    return found


def test_the_recorded_ncu_counters_are_the_raw_reports_figures():
    record = kernel_records.ncu_counters()
    assert set(record.kernels) == set(record.sources) == {"layernorm", "rmsnorm"}
    for op, counters in record.kernels.items():
        report = (ROOT / record.sources[op]).read_text()
        metrics = _ncu_metrics(report)
        for field, key in NCU_METRICS.items():
            assert getattr(counters, field) == metrics[key], (op, field)
        grid, block = counters.grid_size, counters.block_size
        assert f"{counters.kernel} ({grid}, 1, 1)x({block}, 1, 1)" in report
        assert counters.ncu_says in " ".join(report.split())
    readme = (ROOT / record.sources["layernorm"]).with_name("README.md").read_text()
    for said in (record.gpu, record.driver, record.ncu, record.torch, record.triton,
                 record.date, record.kernels_at):
        assert said in readme, said


def test_the_ncu_record_loads_from_a_file_of_its_own(tmp_path):
    record = json.loads(kernel_records.NCU_COUNTERS.read_text())
    record["kernels"]["rmsnorm"]["registers_per_thread"] = 31
    path = tmp_path / "ncu.json"
    path.write_text(json.dumps(record))
    loaded = kernel_records.ncu_counters(path)
    assert loaded.kernels["rmsnorm"].registers_per_thread == 31
    assert loaded.shape == (1024, 131072)
    assert "NVIDIA H200 (driver 580.159.04)" in loaded.recorded_with()


# ------------------------------------------------------------------ the fingerprint


KERNEL = '''
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, SCALE: tl.constexpr):
    offs = tl.arange(0, 16)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * SCALE, mask=offs < n)
'''


def test_a_fingerprint_ignores_layout_comments_docstrings_names_and_decorators():
    base = kernel_records.fingerprint(KERNEL)
    same = '''
        @triton.autotune(configs=[], key=[])
        @triton.jit(do_not_specialize=["n"])
        def my_own_kernel(x_ptr, y_ptr, n, SCALE: tl.constexpr):
            """I wrote this."""
            # load, scale, store
            offs = tl.arange(0,
                             16)
            tl.store(y_ptr + offs, (tl.load(x_ptr + offs, mask=offs < n) * SCALE),
                     mask=offs < n)  # done
    '''
    assert base is not None and kernel_records.fingerprint(same) == base
    changed = KERNEL.replace("* SCALE", "* SCALE + 1")
    assert kernel_records.fingerprint(changed) != base
    assert kernel_records.fingerprint("x = 1\n") is None
    assert kernel_records.fingerprint("def broken(:\n") is None


def _copy_as_module(tmp_path: Path, monkeypatch, source: str, name: str):
    """`source` as the module `name` in a file of its own (inspect.getsource needs a file, as
    a notebook cell has one), with what a reference kernel's module imports."""
    path = tmp_path / f"{name}.py"
    path.write_text("import triton\nimport triton.language as tl\n"
                    "from solutions.kernels.row_loads import stated_multiples\n\n" + source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


def test_a_pasted_copy_of_a_reference_kernel_is_refused(tmp_path, monkeypatch):
    """A learner's notebook has no solutions/ to import from: pasting a reference kernel,
    renamed, its comments changed, is still refused, by fingerprint."""
    import inspect

    original = inspect.getsource(column_sums.column_sums_kernel.fn)
    pasted = original.replace("def column_sums_kernel(", "def my_column_sums(")
    pasted = pasted.replace("# axis 1 picks", "# my own idea: axis 1 picks")
    module = _copy_as_module(tmp_path, monkeypatch, pasted, "pasted_copy_for_the_test")
    assert module.my_column_sums.fn.__module__ == "pasted_copy_for_the_test"
    x = torch.zeros(4, device=runtime.DEVICE)
    with sandbox.watch() as record:
        with pytest.raises(sandbox.CourseKernelRefused) as refused:
            module.my_column_sums[(1, 1)](x, x, 1, 4, 0, 0, BLOCK_P=2, BLOCK_N=2, MULTIPLE=1)
    message = str(refused.value)
    assert "a kernel the course ships" in message
    assert "a copy of `solutions.kernels.column_sums.column_sums_kernel`" in message
    assert record.course_kernels == [message] and record.launches == []


def test_a_kernel_of_ones_own_is_not_refused(tmp_path, monkeypatch):
    module = _copy_as_module(tmp_path, monkeypatch, KERNEL, "own_kernel_for_the_test")
    x = torch.arange(16, dtype=torch.float32, device=runtime.DEVICE)
    y = torch.empty_like(x)
    with sandbox.watch() as record:
        module.scale_kernel[(1,)](x, y, 16, SCALE=2.0)
    assert record.course_kernels == [] and record.launches == ["scale_kernel"]
    assert torch.equal(y, 2 * x)


def _chapter_kernels(chapter: str) -> dict[str, str]:
    """'chapter cell-id name' -> source, for every @triton.jit function in a source notebook
    (the model solutions included)."""
    nb = json.loads((ROOT / "solutions" / chapter / f"{chapter}.ipynb").read_text())
    found = {}
    for cell in nb["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] != "code" or "triton" not in text:
            continue
        lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith(("%", "!"))]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and script._is_kernel(node):
                found[f"{chapter} {cell.get('id')} {node.name}"] = ast.get_source_segment(
                    "\n".join(lines), node, padded=True)
    return found


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_kernel_a_chapter_writes_or_asks_for_is_taken_for_a_reference_kernel(chapter):
    """A learner who writes the model solution must not be refused as a copier."""
    shipped = kernel_records.shipped_fingerprints()
    kernels = _chapter_kernels(chapter)
    clashes = {name: shipped[kernel_records.fingerprint(source)]
               for name, source in kernels.items()
               if kernel_records.fingerprint(source) in shipped}
    assert not clashes, clashes


def test_the_chapters_do_define_kernels_so_the_check_above_checks_something():
    assert sum(len(_chapter_kernels(ch)) for ch in CHAPTERS) >= 10
