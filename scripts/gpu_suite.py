"""The GPU suite: GPU-only tests and the measurements quoted in docs/benchmarks.md, in one
process tree, so that every figure comes from the same machine, the same run.

    python scripts/gpu_suite.py [--out DIR]      (make bench-gpu)

Writes DIR/gpu_suite.json (every number), DIR/gpu_suite.md (tables to paste into
docs/benchmarks.md) and DIR/pytest.log. Needs a CUDA GPU.

On a bare GPU image without the Jupyter stack (the notebooks, widget and grader tests need
it), carry wheels of nbgrader, nbclient, ipykernel, ipywidgets and tqdm for its Python and
install them byte-compiled (without .pyc files every nbgrader process and kernel compiles
its modules again: about 5 s a chapter), with their bin/ on PATH for nbgrader's `alembic`:

    pip install --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
    export JUPYTER_PATH=/tmp/site/share/jupyter     (nbconvert's templates, for feedback)

Within a 10-minute call, split the work. On an H100 (2026-11-28) every test file but
test_grader.py took more than 9.5 minutes: give them two calls, half the files each. On an
H200: test_solution_kernels.py with test_ready_launch.py 4 min; notebooks 7 to 19 s a
chapter, chapter 08 92 s; on an H100, `pytest tests/test_grader.py -k test_on_a_gpu -s`
about 6 min. Write --out under the call's $OUT: pytest.log is written as the tests run.

The image's Python and Triton (3.12 and 3.6 in 2026-11) are not CI's (3.11 and 3.9), and
faults of their own hid there (docs/sweeps/2026-11-29-python312): run the walls, tamper and
verifier tests on it too (with pytest-xdist's wheel carried, `pytest -n 14 tests/test_walls*.py
tests/test_oracle_refusals.py tests/test_verify.py ...`: 2 minutes), and the CPU suite with
the GPU hidden (`CUDA_VISIBLE_DEVICES= pytest -n 15 --dist loadfile tests`). That image's
Triton 3.6 interpreter cannot run with its NumPy (2.4 or later), and `import course` in
interpreter mode says so and stops (the tests that start COURSE_DEVICE=cpu processes
included): carry a wheel of NumPy before 2.4 with the others. The wheels and NumPy's are
over one call's 64 MiB together: carry the wheels in one call, NumPy's in the next (the
machine keeps /tmp while warm). Tests that build the checkout's .venv or a fresh one
(test_grader_trust, _workers, _worker_deaths, test_learner_distribution, test_lab) cannot
run there: the image reaches no package index. On the H200 (2026-11-29) that suite took
two calls of 7.5 and over 9 minutes (docs/sweeps/2026-11-29-python312-cpu).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import course  # noqa: E402
from course import baselines, bench, check, hardware, reference, runtime, traffic  # noqa: E402
from course.check.rmsnorm import RMSNORM_FORWARD  # noqa: E402
from course.check.suite import run_exercise  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

EAGER_SHAPES = [(32768, 1024), (16384, 4096), (16384, 8192), (4096, 32768), (1024, 131072)]
# Everything but what needs a fresh venv; the widget and grader tests need the Jupyter stack
# too (absent from the bare GPU image: carry its wheels), and join in when it imports.
# Every file with a test marked `gpu` is in one of the two lists (tests/test_gpu_suite.py).
GPU_TEST_FILES = ["tests/test_check.py", "tests/test_reference.py", "tests/test_traffic.py",
                  "tests/test_cli.py", "tests/test_runtime.py", "tests/test_bench.py",
                  "tests/test_solution_kernels.py", "tests/test_check_exercises.py",
                  "tests/test_shootout.py", "tests/test_profile_kernels.py",
                  "tests/test_plain_kernels.py", "tests/test_launch_rule.py",
                  "tests/test_ready_launch.py", "tests/test_kept_backward.py",
                  "tests/test_columns_backward.py",
                  "tests/test_one_read.py",
                  "tests/test_backward_diagnoses.py", "tests/test_check_adversarial.py",
                  "tests/test_compiled.py"]
try:
    import ipywidgets  # noqa: F401
    import nbclient  # noqa: F401
    import nbgrader  # noqa: F401
except ImportError:
    JUPYTER_TEST_FILES: list[str] = []
else:
    JUPYTER_TEST_FILES = ["tests/test_widgets.py", "tests/test_grader.py",
                          "tests/test_ch03_exercises.py", "tests/test_verify.py",
                          "tests/test_check_timed_calls.py", "tests/test_gpu_lane.py"]


def header() -> dict:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    return {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
            "nvidia_smi": smi, "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "python": sys.version.split()[0]}


def run_pytest(out: Path, files: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    path = out / "pytest.log"
    with path.open("w") as log_file:  # written as it runs: a call stopped by its time limit
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p",  # keeps it
                               "no:cacheprovider", "--durations=15", *files], cwd=ROOT, env=env,
                              stdout=log_file, stderr=subprocess.STDOUT, text=True)
    log = path.read_text()
    summary = [line for line in log.splitlines() if " passed" in line or " failed" in line]
    print(log[-3000:])
    return {"returncode": proc.returncode, "summary": summary[-1] if summary else log[-500:]}


def cell_seconds(nb) -> list[tuple[float, int, str]]:
    """(seconds, index, grade id or first line) of each executed code cell, from the timing
    nbclient records in its metadata: where a notebook's (and so a grading run's) time goes."""
    out = []
    for i, cell in enumerate(nb.cells):
        timing = cell.get("metadata", {}).get("execution", {})
        start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        if cell.cell_type != "code" or not (start and end):
            continue
        seconds = (datetime.datetime.fromisoformat(end.replace("Z", "+00:00"))
                   - datetime.datetime.fromisoformat(start.replace("Z", "+00:00"))
                   ).total_seconds()
        label = (cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                 or cell.source.strip().splitlines()[0][:40])
        out.append((seconds, i, label))
    return out


def run_notebooks(out: Path, pattern: str = "ch*") -> list[dict]:
    """Execute every source notebook top to bottom on the GPU (visible and hidden tests,
    bandwidth checks included); record each graded cell's outcome and the text it printed."""
    import nbclient
    import nbformat

    results = []
    for path in sorted((ROOT / "solutions").glob(f"{pattern}/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                         resources={"metadata": {"path": str(path.parent)}},
                                         allow_errors=True)
        t0 = datetime.datetime.now()
        client.execute()
        seconds = (datetime.datetime.now() - t0).total_seconds()
        cells = []
        for cell in nb.cells:
            grade = cell.get("metadata", {}).get("nbgrader", {})
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            if not (grade.get("grade") or errors):
                continue
            text = "".join(o.get("text", "") for o in cell.get("outputs", [])
                           if o.get("output_type") == "stream")
            cells.append({"grade_id": grade.get("grade_id", ""), "points": grade.get("points"),
                          "passed": not errors, "output": text[-1500:],
                          "error": (f"{errors[0]['ename']}: {errors[0]['evalue']}"[:1500]
                                    if errors else "")})
        ok = all(c["passed"] for c in cells)
        print(f"{path.parent.name}: {'all cells pass' if ok else 'FAILED'} in {seconds:.0f} s",
              flush=True)
        slowest = sorted(cell_seconds(nb), reverse=True)[:5]
        print("  slowest cells: " + ", ".join(f"#{i} {label} {t:.1f} s"
                                              for t, i, label in slowest), flush=True)
        for c in cells:
            if "bandwidth" in c["grade_id"] or "compile" in c["grade_id"] or not c["passed"]:
                print(f"  {c['grade_id']}: {'pass' if c['passed'] else c['error']}\n"
                      f"    {c['output'].strip()[-600:]}", flush=True)
        if not ok:  # the executed notebook, outputs and all, comes back for a look
            nbformat.write(nb, out / f"{path.stem}.executed.ipynb")
        results.append({"notebook": path.parent.name, "seconds": seconds, "passed": ok,
                        "cells": cells, "slowest_cells": slowest})
    (out / "notebooks.json").write_text(json.dumps(results, indent=1))
    return results


def eager_model(copy_bw: float, bcast_bw: float, launch_s: float) -> list[dict]:
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for m, n in EAGER_SHAPES:
            model = traffic.eager_rmsnorm(m, n, dtype)
            ideal = traffic.fused_rmsnorm(m, n, dtype)

            def make_args(m=m, n=n, dtype=dtype):
                return (torch.randn(m, n, device="cuda", dtype=dtype),
                        torch.rand(n, device="cuda", dtype=dtype) + 0.5)

            measured = bench.time_rotating(baselines.eager_rmsnorm, make_args, ideal.bytes,
                                           warmup=5, reps=30).median_s
            predicted = model.predicted_time(copy_bw, bcast_bw, launch_s)
            rows.append({
                "M": m, "N": n, "dtype": str(dtype).replace("torch.", ""),
                "model_bytes": model.bytes, "ideal_bytes": ideal.bytes,
                "bytes_vs_ideal": model.bytes / ideal.bytes, "launches": model.launches,
                "predicted_us": predicted * 1e6, "measured_us": measured * 1e6,
                "predicted_over_measured": predicted / measured,
                "fraction_of_copy": ideal.bytes / measured / copy_bw,
            })
            r = rows[-1]
            print(f"eager {r['dtype']} {m}x{n}: {r['measured_us']:.0f} us measured, "
                  f"{r['predicted_us']:.0f} us predicted ({r['predicted_over_measured']:.3f}), "
                  f"{100 * r['fraction_of_copy']:.1f} % of copy")
    return rows


def checker_gpu_path() -> dict:
    import rmsnorm_variants as variants

    result: dict = {}
    report = check.rmsnorm_forward(variants.correct, seed=2026, quiet=True)
    result["correct_report"] = report.summary()
    print(report.summary())
    verdicts = {}
    for name, (fn, phrase) in variants.BROKEN.items():
        r = run_exercise(RMSNORM_FORWARD, fn, seed=2026)
        text = r.message() if not r.passed else ""
        verdicts[name] = {"passed": r.passed, "phrase_found": phrase in text,
                          "first_advice": r.advice[0].splitlines()[0] if r.advice else ""}
        print(f"broken {name}: {'PASSED (bad)' if r.passed else 'rejected'}; "
              f"{verdicts[name]['first_advice']}")
    result["broken"] = verdicts

    # What poisoning protects against: on a GPU the caching allocator hands the freed block
    # of a correct answer to the next allocation of the same size, contents intact.
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(4096, device="cuda", dtype=torch.bfloat16) + 0.5
    y = variants.correct(x, w)
    del y
    stale = variants.stale_memory(x, w)
    want = reference.rmsnorm(x, w, eps=1e-6)
    looks_right = bool(((stale.double() - want).abs() <= 2e-2 + 2e-2 * want.abs()).all())
    result["stale_kernel_looks_right_without_poison"] = looks_right
    print(f"no-op kernel after a correct call, no poisoning: looks right = {looks_right}")

    # Run-to-run spread of one kernel's measurement: what the bandwidth check's retries absorb.
    def make_args():
        return (torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16),
                torch.rand(4096, device="cuda", dtype=torch.bfloat16) + 0.5)

    nbytes = traffic.fused_rmsnorm(16384, 4096, torch.bfloat16).bytes
    spread = sorted(bench.measure("fused", variants.correct, make_args, nbytes).fraction_of_copy
                    for _ in range(7))
    result["fused_fraction_spread"] = spread
    print("fused kernel, 7 measurements, fraction of copy:", [f"{f:.3f}" for f in spread])
    bw = check.rmsnorm_forward_bandwidth(variants.correct, target=0.75)
    result["bandwidth_correct"] = str(bw)
    result["bandwidth_correct_fraction"] = bw.best.fraction_of_copy
    print("bandwidth, fused kernel:", bw)
    try:
        check.rmsnorm_forward_bandwidth(variants.two_pass_slow, target=0.75, retries=2)
        result["bandwidth_slow"] = "PASSED (unexpected)"
    except AssertionError as exc:
        result["bandwidth_slow"] = str(exc)
    print("bandwidth, slow two-pass kernel:", result["bandwidth_slow"])
    low = run_exercise(RMSNORM_FORWARD, variants.low_precision_accumulation, seed=2026)
    result["low_precision_failing_cases"] = [r.case.label() for r in low.results if not r.passed]
    result["low_precision_advice"] = low.advice[0] if low.advice else ""
    print("bf16 accumulation on the GPU fails:", result["low_precision_failing_cases"])
    print(result["low_precision_advice"])
    return result


def accumulation_precision() -> list[dict]:
    """How far a kernel that sums squares in the input's dtype drifts from float32 statistics,
    as rows grow: worst elementwise relative error, and worst per-row scale error."""
    import rmsnorm_variants as variants

    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for n in (1024, 8192, 65536):
            gen = torch.Generator().manual_seed(n)
            x = (torch.randn(64, n, generator=gen) * 0.5 + 1.0).to(dtype).cuda()
            w = (torch.rand(n, generator=gen) + 0.5).to(dtype).cuda()
            want = reference.rmsnorm(x, w, eps=1e-6)
            for name, fn in (("float32 statistics", variants.correct),
                             ("input-dtype statistics", variants.low_precision_accumulation)):
                got = fn(x, w).double()
                rel = ((got - want).abs() / want.abs().clamp_min(1e-3)).max().item()
                scale = ((got * want).sum(1) / (want * want).sum(1) - 1).abs().max().item()
                rows.append({"dtype": str(dtype).replace("torch.", ""), "N": n, "kernel": name,
                             "max_rel_err": rel, "max_row_scale_err": scale})
                print(f"accumulation {rows[-1]}")
    return rows


def markdown(data: dict) -> str:
    h = data["header"]
    lines = [f"Run: {h['date']}, {h['gpu']} (driver {h['nvidia_smi'].split(',')[-1].strip()}), "
             f"torch {h['torch']}, triton {h['triton']}, CUDA {h['cuda']}, Python {h['python']}.",
             "", f"- copy bandwidth: {data['copy_gbps']:.0f} GB/s",
             f"- PyTorch broadcast (non-vectorised) elementwise: {data['broadcast_gbps']:.0f} GB/s",
             f"- one tiny kernel back to back: {data['launch_us']:.2f} us", "",
             "| dtype | M x N | launches | bytes / ideal | predicted (us) | measured (us) "
             "| predicted / measured | % of copy |", "|---|---|---|---|---|---|---|---|"]
    for r in data["eager"]:
        lines.append(f"| {r['dtype']} | {r['M']} x {r['N']} | {r['launches']} | "
                     f"{r['bytes_vs_ideal']:.2f} | {r['predicted_us']:.0f} | "
                     f"{r['measured_us']:.0f} | {r['predicted_over_measured']:.3f} | "
                     f"{100 * r['fraction_of_copy']:.1f} |")
    lines += ["", "| dtype | N | statistics | max elementwise rel. error | max row scale error |",
              "|---|---|---|---|---|"]
    for r in data["accumulation"]:
        lines.append(f"| {r['dtype']} | {r['N']} | {r['kernel']} | {r['max_rel_err']:.2e} | "
                     f"{r['max_row_scale_err']:.2e} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench-results")))
    parser.add_argument("--bench", default="", help="also run `course bench` for these ops "
                        "(comma-separated, or 'all') after the suite, into the same folder")
    parser.add_argument("--bench-dtypes", default="bfloat16,float16,float32")
    parser.add_argument("--notebooks", default="", help="also execute these source notebooks "
                        "(a glob under solutions/, e.g. 'ch*'); needs nbclient and ipykernel")
    parser.add_argument("--tests", default="all", help="test files to run: 'all', 'none', or "
                        "a comma-separated list (the grader's GPU test alone takes minutes)")
    parser.add_argument("--skip-measurements", action="store_true",
                        help="only the tests (and --notebooks / --bench)")
    args = parser.parse_args()
    if not runtime.on_gpu():
        print("gpu_suite.py needs a CUDA GPU:", course.banner())
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data: dict = {"header": header()}
    print(data["header"])
    files = {"all": GPU_TEST_FILES + JUPYTER_TEST_FILES, "none": []}.get(
        args.tests, args.tests.split(","))
    data["pytest"] = run_pytest(out, files) if files else {"returncode": 0, "summary": "not run"}
    if args.notebooks:
        data["notebooks"] = run_notebooks(out, args.notebooks)
    if args.skip_measurements:
        (out / "gpu_suite.json").write_text(json.dumps(data, indent=2))
        return 0 if data["pytest"]["returncode"] == 0 else 1
    copy_bw = hardware.copy_bandwidth()
    bcast_bw = hardware.broadcast_bandwidth()
    launch_s = hardware.launch_overhead()
    data.update(copy_gbps=copy_bw / 1e9, broadcast_gbps=bcast_bw / 1e9, launch_us=launch_s * 1e6)
    print(f"copy {copy_bw / 1e9:.0f} GB/s, broadcast {bcast_bw / 1e9:.0f} GB/s, "
          f"launch {launch_s * 1e6:.2f} us")
    data["eager"] = eager_model(copy_bw, bcast_bw, launch_s)
    data["accumulation"] = accumulation_precision()
    data["checker"] = checker_gpu_path()
    (out / "gpu_suite.json").write_text(json.dumps(data, indent=2))
    (out / "gpu_suite.md").write_text(markdown(data))
    print(markdown(data))
    if args.bench:
        from course import peers, shootout

        ops = peers.OPS if args.bench == "all" else args.bench.split(",")
        shootout.run(ops, args.bench_dtypes.split(","), out)
    return 0 if data["pytest"]["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
