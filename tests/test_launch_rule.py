"""Chapter 08's launch rule: the recorded sweeps, and the check that grades a rule by them."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import course  # noqa: F401  (picks the mode before anything imports Triton)
from course import lab_sweeps
from course.check import lab
from course.verify import learner, proxy

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Recorded shapes beyond the visible ones (the hidden test cell's are the notebook's:
# hidden_shapes).
SHAPES = [(d, lab_sweeps.rows_for(n), n) for d, n in
          (("bfloat16", 256), ("bfloat16", 768), ("bfloat16", 3072), ("bfloat16", 12288),
           ("bfloat16", 49152), ("bfloat16", 131072), ("float32", 24576))]


@dataclasses.dataclass(frozen=True)
class Launch:  # the fields of chapter 08's Launch, as a learner's rule returns them
    rows_per_tile: int = 1
    num_warps: int = 4
    num_stages: int = 1
    programs_per_sm: int = 0
    chunk_n: int = 0


def tuned_rule(n_rows: int, n_cols: int, element_size: int) -> Launch:
    """A rule built from the sweeps of both GPUs (a table; the chapter's model answer is a
    formula)."""
    block_n = lab_sweeps.next_power_of_2(n_cols)
    if element_size == 4 and block_n <= 32768:
        return Launch(num_warps=8)
    if block_n > 8192:
        long = block_n > 16384
        return Launch(num_warps=16 if long else 8, num_stages=3 if long else 1, chunk_n=8192)
    rows, warps = {256: (8, 4), 512: (4, 2), 1024: (2, 2), 2048: (4, 4), 4096: (2, 8),
                   8192: (2, 8)}[max(block_n, 256)]
    return Launch(rows_per_tile=min(rows, lab_sweeps.next_power_of_2(n_rows)), num_warps=warps)


# Without a GPU a rule is judged on the recorded sweeps; with one, `rmsnorm` is timed instead
# (test_gpu_the_rule_is_timed_on_a_gpu).
recorded_only = pytest.mark.skipif(course.on_gpu(), reason="on a GPU the rule is timed")


def no_kernel(*args):
    raise AssertionError("without a GPU the check must not run the kernel")


def test_every_recorded_gpu_has_the_whole_grid():
    sys.path.insert(0, str(ROOT / "scripts"))
    import sweep_lab

    assert lab_sweeps.GPUS == ("H100", "H200")
    for gpu in lab_sweeps.GPUS:
        points = lab_sweeps.load(gpu)
        assert {p.gpu for p in points} == {gpu} and all(gpu in p.device_name for p in points)
        for dtype, n_cols, fields in sweep_lab.planned():
            point = lab_sweeps.find(points, n_cols, dtype, fields)
            assert point is not None, (gpu, dtype, n_cols, fields)
            assert point.ok and 0 < point.seconds and 0.02 < point.fraction_of_copy < 1.1
        for dtype, cols in (("bfloat16", lab_sweeps.BF16_COLS),
                            ("float32", lab_sweeps.FP32_COLS)):
            for n_cols in cols:
                best = lab_sweeps.best(points, n_cols, dtype)
                # the time is the ideal bytes at the recorded bandwidth
                nbytes = 2 * best.n_rows * n_cols * lab_sweeps.DTYPE_BYTES[dtype]
                assert math.isclose(nbytes / best.seconds / (best.copy_gbps * 1e9),
                                    best.fraction_of_copy, rel_tol=0.01)


@recorded_only
def test_a_rule_tuned_on_the_sweeps_passes_at_every_shape():
    report = lab.launch_rule(tuned_rule, no_kernel, quiet=True)
    assert report.passed and report.how == "recorded"
    report = lab.launch_rule(tuned_rule, no_kernel, shapes=SHAPES, quiet=True)
    assert [r.passed for r in report.rows] == [True] * len(SHAPES)
    # 0.95 or more of the best on both GPUs: well clear of the 0.85 that passes
    assert all(r.target == lab.OF_BEST_RECORDED and r.score >= 0.95 for r in report.rows)


@recorded_only
@pytest.mark.parametrize("tuned_for, launch, fails_at", [
    ("N = 4096", Launch(num_warps=8), 256),
    ("N = 256", Launch(rows_per_tile=16, num_warps=16), 3072),
    ("N = 65536", Launch(num_warps=16, num_stages=3, chunk_n=8192), 256),
])
def test_a_rule_tuned_for_one_shape_fails_elsewhere(tuned_for, launch, fails_at):
    with pytest.raises(AssertionError) as failed:
        lab.launch_rule(lambda m, n, e: launch, no_kernel, shapes=SHAPES)
    short_at = str(failed.value).split("falls short at ")[1].split(". ")[0].split(", ")
    assert f"bfloat16 N = {fails_at}" in short_at, (tuned_for, short_at)


def hidden_shapes() -> list[tuple[str, int, int]]:
    """The shapes chapter 08's hidden test cell grades a launch rule at."""
    import nbformat

    notebook = nbformat.read(ROOT / "solutions" / "ch08_performance_lab" /
                             "ch08_performance_lab.ipynb", as_version=4)
    cell = next(c for c in notebook.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == "ex08_launch_rule")
    hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
    graded = []

    class Check:
        def launch_rule(self, choose_launch, rmsnorm, *, shapes, quiet):
            graded.extend(shapes)
    exec(hidden, {"check": Check(), "choose_launch": None, "rmsnorm": None})
    return graded


def four_warps_always(n_rows: int, n_cols: int, element_size: int) -> Launch:
    """Right about short rows and the loop, blind to warps: four, at every length."""
    block_n = lab_sweeps.next_power_of_2(n_cols)
    if n_cols > 8192:
        return Launch(num_warps=16, num_stages=3, chunk_n=8192)
    return Launch(rows_per_tile=min(2048 // block_n, 16) if block_n < 1024 else 1)


@recorded_only
def test_a_rule_blind_to_warps_passes_the_visible_shapes_and_fails_hidden_ones():
    # Over most row lengths four warps are within 0.85 of the best; where they are not, the
    # hidden cell looks: chapter 08's experiment 1 (warps) is needed for the points.
    assert lab.launch_rule(four_warps_always, no_kernel, quiet=True).passed
    assert lab.launch_rule(tuned_rule, no_kernel, shapes=hidden_shapes(), quiet=True).passed
    with pytest.raises(AssertionError) as failed:
        lab.launch_rule(four_warps_always, no_kernel, shapes=hidden_shapes())
    short_at = str(failed.value).split("falls short at ")[1].split(". ")[0].split(", ")
    assert short_at == ["bfloat16 N = 12288", "float32 N = 24576"], short_at


@recorded_only
def test_a_launch_the_sweeps_did_not_time_fails_with_the_reason():
    def spills(n_rows, n_cols, element_size):  # one row over 4 warps, at any length
        return Launch()

    with pytest.raises(AssertionError) as failed:
        lab.launch_rule(spills, no_kernel, shapes=[("bfloat16", 512, 131072)])
    assert "1024 values a thread" in str(failed.value)
    assert "not among the recorded launches" in str(failed.value)


def chapter_08() -> dict:
    """The chapter's Launch (which refuses a chunk_n that is not a power of two) and its
    model answer, choose_launch, from the source notebook's cells."""
    import nbformat
    import triton

    cells = {c.get("id"): c.source for c in nbformat.read(
        ROOT / "solutions" / "ch08_performance_lab" / "ch08_performance_lab.ipynb",
        as_version=4).cells}
    scope = {"triton": triton}
    for cell_id in ("launch-class", "exercise-code"):
        exec(compile(cells[cell_id], f"ch08 {cell_id}", "exec"), scope)
    return scope


SWEEPS = {gpu: lab_sweeps.load(gpu) for gpu in lab_sweeps.GPUS}  # as the chapter loads them


def _dtype(element_size: int) -> str:
    return "bfloat16" if element_size == 2 else "float32"


def looks_up_best(n_rows, n_cols, element_size):
    return Launch(**lab_sweeps.best(SWEEPS["H100"], n_cols, _dtype(element_size)).launch)


def looks_up_with_find(n_rows, n_cols, element_size):  # the fastest of the chapter's grid
    launches = lab_sweeps.tile_launches(n_cols) + lab_sweeps.chunked_launches(n_cols)
    found = [lab_sweeps.find(SWEEPS["H200"], n_cols, _dtype(element_size), f) for f in launches]
    return Launch(**min((p for p in found if p and p.ok), key=lambda p: p.seconds).launch)


def reads_the_sweeps_dict(n_rows, n_cols, element_size):  # no function of lab_sweeps
    points = [p for p in SWEEPS["H100"] if p.n_cols == n_cols and p.impl == "lab"
              and p.timer == "gpu" and p.dtype == _dtype(element_size) and p.ok]
    b = min(points, key=lambda p: p.seconds)
    return Launch(b.rows_per_tile, b.num_warps, b.num_stages, b.programs_per_sm, b.chunk_n)


def reads_the_csv(n_rows, n_cols, element_size):  # the file itself, as text
    import csv

    with open(lab_sweeps.DATA / "lab-sweep-h200.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if (r["impl"], r["timer"], r["dtype"], r["n_cols"])
                == ("lab", "gpu", _dtype(element_size), str(n_cols)) and r["status"] == "ok"]
    b = min(rows, key=lambda r: float(r["seconds"]))
    return Launch(**{name: int(b[name]) for name in lab_sweeps.LAUNCH_FIELDS})


@recorded_only
@pytest.mark.parametrize("rule, read", [
    (looks_up_best, "lab_sweeps.best()"),
    (looks_up_with_find, "lab_sweeps.find()"),
    (reads_the_sweeps_dict, "the recorded points' .n_cols"),
    (reads_the_csv, "the file lab-sweep-h200.csv"),
])
def test_a_rule_that_reads_the_recorded_sweeps_is_refused(rule, read):
    # Judged on the records it reads, each would pass at every shape, the hidden ones too.
    with pytest.raises(AssertionError) as refused:
        lab.launch_rule(rule, no_kernel, shapes=hidden_shapes())
    message = str(refused.value)
    dtype, n_rows, n_cols = hidden_shapes()[0]  # refused at the first shape
    assert message.startswith("Your choose_launch reads the recorded sweeps: choose_launch("
                              f"{n_rows}, {n_cols}, 2) ({dtype}) read "), message
    assert read in message and lab.READS_RECORDS_ADVICE in message, message
    # Reading them outside choose_launch (as the chapter's cells do) is what the text asks.
    assert lab_sweeps.best(SWEEPS["H100"], 3072).ok


@recorded_only
def test_the_chapters_model_rule_reads_nothing_and_passes_every_shape():
    choose_launch = chapter_08()["choose_launch"]
    for shapes in (lab.DEFAULT_RULE_SHAPES, hidden_shapes(), SHAPES):
        assert lab.launch_rule(choose_launch, no_kernel, shapes=shapes, quiet=True).passed


def test_reads_are_watched_only_inside_the_watch_and_each_is_noted_once():
    point_fields = vars(lab_sweeps.SweepPoint)
    assert "__getattribute__" not in point_fields  # unwatched, a field costs nothing extra
    with lab_sweeps.reads_watched() as outer:
        with lab_sweeps.reads_watched() as inner:
            assert lab_sweeps.next_power_of_2(3000) == 4096  # the grid's arithmetic: no read
            [p.n_cols for p in SWEEPS["H100"][:3]]
        lab_sweeps.sweep_at(SWEEPS["H200"], 512)
    assert inner == ["SweepPoint.n_cols"]
    assert outer == ["SweepPoint.n_cols", "lab_sweeps.sweep_at()", "lab_sweeps.select()",
                     "SweepPoint.impl", "SweepPoint.timer", "SweepPoint.n_rows",
                     "SweepPoint.dtype"]
    with lab_sweeps.reads_watched() as after:
        pass
    assert after == [] and not lab_sweeps._WATCHES
    assert "__getattribute__" not in point_fields


@recorded_only
def test_a_launch_the_chapters_launch_refuses_fails_its_shape_with_the_reason():
    launch = chapter_08()["Launch"]

    def quarter_rows(n_rows, n_cols, element_size):  # chunk_n must be a power of two
        return launch(num_warps=8, chunk_n=n_cols // 4)

    with pytest.raises(AssertionError) as failed:
        lab.launch_rule(quarter_rows, no_kernel, shapes=[("bfloat16", 2720, 24576)])
    message = str(failed.value)
    assert ("choose_launch(2720, 24576, 2) raised ValueError: chunk_n must be 0 or a power of "
            "two, got 6144. A rule must return a valid Launch at every shape") in message
    assert "falls short at bfloat16 N = 24576. At bfloat16 N = 24576 your choose_launch " \
        "raised instead of returning a Launch" in message, message


def test_on_a_gpu_the_rule_is_asked_too_before_anything_is_timed(monkeypatch):
    timed = []

    def measured(rmsnorm, dtype, n_rows, n_cols, recorded, **_):
        timed.append(n_cols)
        return lab.RuleShape(dtype, n_rows, n_cols, None, 1.0, 0.5, "timed")

    monkeypatch.setattr(lab.runtime, "on_gpu", lambda: True)
    monkeypatch.setattr(lab, "_measured_row", measured)
    monkeypatch.setattr(lab.torch.cuda, "get_device_name", lambda: "a GPU")
    with pytest.raises(AssertionError, match="reads the recorded sweeps"):
        lab.launch_rule(looks_up_best, no_kernel)
    assert timed == []

    def raises_at_4096(n_rows, n_cols, element_size):
        if n_cols == 4096:
            raise KeyError(n_cols)
        return Launch()

    with pytest.raises(AssertionError, match=r"choose_launch\(16384, 4096, 2\) raised KeyError"):
        lab.launch_rule(raises_at_4096, no_kernel)
    assert timed == [512, 65536, 1536]


@recorded_only
def test_bad_rules_and_shapes_get_clear_errors():
    with pytest.raises(AssertionError, match=r"returned 3, not a Launch"):
        lab.launch_rule(lambda m, n, e: 3, no_kernel)
    with pytest.raises(ValueError, match="rows of 5000 were not recorded"):
        lab.launch_rule(tuned_rule, no_kernel, shapes=[("bfloat16", 64, 5000)])
    with pytest.raises(TypeError, match="pass your choose_launch function"):
        lab.launch_rule(Launch(), no_kernel)


def test_a_launch_travels_from_the_learners_process_as_its_fields():
    """The verifier's choose_launch stand-in returns a Launch's fields, never its class."""
    field = {"kind": "record", "type": "Launch",
             "fields": learner._plain_fields(Launch(rows_per_tile=2, num_warps=8))}
    assert learner._plain_fields(Launch) is None  # a class does not travel
    got = proxy._Outputs().build(field, [])
    assert (got.rows_per_tile, got.num_warps, got.chunk_n) == (2, 8, 0)
    assert lab_sweeps.launch_fields(got) == dataclasses.asdict(Launch(2, 8))
    with pytest.raises(AttributeError, match="read-only"):
        got.num_warps = 4
    assert learner._plain_fields(dataclasses.make_dataclass("Holder", ["fn"])(print)) is None


def _verified_ch08(student: str, tmp_path: Path):
    """The verdict on chapter 08's submission `student` (tests/grader_submissions.py),
    checked to lose exactly its launch rule's points; the cell it lost."""
    from grader_submissions import ch08_submissions, expected_points, verified

    sub = next(s for s in ch08_submissions() if s.student == student)
    verdict = verified(sub, tmp_path)
    got = {c.grade_id: c.points for c in verdict.cells}
    assert got == expected_points(ROOT, sub), (sub.what, verdict.to_json()[:4000])
    lost = next(c for c in verdict.cells if c.grade_id == "ex08_launch_rule")
    assert sub.reason in lost.reason, lost.reason
    return lost


without_a_gpu = pytest.mark.skipif(course.on_gpu(), reason="the points without a GPU (the rule "
                                   "is judged on the recorded sweeps there)")


@pytest.mark.slow
@without_a_gpu
def test_a_rule_tuned_for_one_shape_loses_the_launch_rule_cell_only(tmp_path):
    """Graded as `make autograde` grades it: the verifier, the learner's code in a process
    of its own, the Launch coming back as its fields."""
    lost = _verified_ch08("one_shape", tmp_path)
    assert "1 row(s) per tile, 8 warps" in lost.reason, lost.reason


@pytest.mark.slow
@without_a_gpu
def test_a_rule_that_looks_the_records_up_loses_the_launch_rule_cell_only(tmp_path):
    """The rule reads the chapter's `sweeps` in the learner's process: the reads come back
    to the verifier (guards.READS_RECORDS), which refuses the rule."""
    lost = _verified_ch08("looks_up", tmp_path)
    assert "the recorded points' .impl" in lost.reason, lost.reason


@pytest.mark.gpu
def test_gpu_the_rule_is_timed_on_a_gpu():
    sys.path.insert(0, str(ROOT / "scripts"))
    import sweep_lab  # the chapter's own kernels, from its notebook

    lab_kernels = sweep_lab.lab_namespace()
    chapter_launch, rmsnorm_launch = lab_kernels["Launch"], lab_kernels["rmsnorm_launch"]

    def rule_of(rule):
        return lambda x, w, eps=1e-6: rmsnorm_launch(
            x, w, eps, lambda m, n, e: chapter_launch(**dataclasses.asdict(rule(m, n, e))))

    report = lab.launch_rule(tuned_rule, rule_of(tuned_rule), quiet=True)
    assert report.how == "measured" and report.passed, str(report)
    with pytest.raises(AssertionError, match="falls short at bfloat16 N = 512"):
        lab.launch_rule(tuned_rule, rule_of(lambda m, n, e: Launch(num_warps=8)))
