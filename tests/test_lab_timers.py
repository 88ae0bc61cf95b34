"""Chapter 08's Exercise 8a: the recorded figures of the three timers, and the checker of
`launch_counted(gpu_us, timer_us, call_us)`: the model answer passes on fresh cases every
run, each common slip fails with the message that names it (and no other slip's), and a
wrong answer graded by the verifier loses its own cell only; and the host-clock benchmarker
that lets the chapter run `@triton.autotune` in the interpreter."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from course import check, runtime, timing
from course.check import lab_timers
from course.hardware import NeedsGPU

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


def launch_counted(gpu_us, timer_us, call_us):
    return (timer_us - gpu_us) / (call_us - gpu_us)


SLIPS = {
    "left_out": (lambda g, t, c: (c - t) / (c - g), "it gives the share the timer leaves out"),
    "upside_down": (lambda g, t, c: (c - g) / (t - g), "your ratio is upside down"),
    "sign": (lambda g, t, c: (g - t) / (c - g), "the sign is flipped"),
    "over_call": (lambda g, t, c: (t - g) / c, "you divided by the whole call"),
    "over_gpu": (lambda g, t, c: (t - g) / g, "you divided by the GPU's time"),
    "timer_over_call": (lambda g, t, c: t / c, "you returned timer_us / call_us"),
    "microseconds": (lambda g, t, c: t - g, "you returned microseconds"),
    "percent": (lambda g, t, c: 100 * (t - g) / (c - g), "you returned a percentage"),
    "clamped": (lambda g, t, c: min(1.0, max(0.0, (t - g) / (c - g))),
                "you clamped the share to 0..1"),
    "floored": (lambda g, t, c: (t - g) // (c - g), "you used integer division"),
    "rounded": (lambda g, t, c: round((t - g) / (c - g), 2), "you rounded the share"),
    "timer_first": (lambda t, g, c: (t - g) / (c - g),
                    "your answers are those of a function that takes (timer_us, gpu_us, "
                    "call_us)"),
    "call_first": (lambda c, g, t: (t - g) / (c - g),
                   "your answers are those of a function that takes (call_us, gpu_us, "
                   "timer_us)"),
}


def test_the_model_answer_passes_and_the_made_up_cases_change_with_the_seed():
    first = check.launch_counted(launch_counted, seed=1, quiet=True)
    second = check.launch_counted(launch_counted, seed=2, quiet=True)
    assert first.passed and second.passed
    labels = [[r.case.label() for r in report.results] for report in (first, second)]
    fixed = len(lab_timers._fixed())
    assert labels[0][:fixed] == labels[1][:fixed]
    assert labels[0][fixed:] != labels[1][fixed:] and len(labels[0]) > fixed


def test_the_cases_hold_both_ends_and_figures_outside_them():
    shares = [case.counted for case in lab_timers._cases(seed=0)]
    assert 0.0 in shares and 1.0 in shares
    assert min(shares) < 0 and max(shares) > 1  # where a clamp shows


@pytest.mark.parametrize("name", sorted(SLIPS))
def test_each_slip_is_named_with_its_own_message(name):
    wrong, phrase = SLIPS[name]
    with pytest.raises(AssertionError) as failure:
        check.launch_counted(wrong, seed=3, quiet=True)
    message = str(failure.value)
    assert f"launch_counted is off: {phrase}" in message, message
    for other, (_, other_phrase) in SLIPS.items():
        if other != name:
            assert other_phrase not in message, f"{name} was also blamed for {other}:\n{message}"


def test_an_answer_that_knows_only_the_fixed_cases_fails_on_the_fresh_ones():
    known = {(g, t, c): (t - g) / (c - g) for _, g, t, c in lab_timers._fixed()}
    with pytest.raises(AssertionError) as failure:
        check.launch_counted(lambda g, t, c: known.get((g, t, c), 0.5), seed=4, quiet=True)
    assert "made-up" in str(failure.value), failure.value


def test_an_unfinished_or_odd_answer_is_reported():
    def unfinished(g, t, c):
        raise NotImplementedError("todo")

    with pytest.raises(AssertionError, match="launch_counted is off: it raised "
                                             "NotImplementedError: todo"):
        check.launch_counted(unfinished, seed=0, quiet=True)
    with pytest.raises(AssertionError, match=r"returned '17%' \(str\), not a number"):
        check.launch_counted(lambda g, t, c: "17%", seed=0, quiet=True)
    with pytest.raises(TypeError, match="pass your function launch_counted itself"):
        check.launch_counted(0.17)


def _chapter_cell(cell_id: str) -> str:
    nb = nbformat.read(ROOT / "solutions" / "ch08_performance_lab" /
                       "ch08_performance_lab.ipynb", as_version=4)
    source = next(c.source for c in nb.cells if c.get("id") == cell_id)
    return re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", "", source, flags=re.M)


def test_the_chapters_solution_passes():
    scope: dict = {}
    exec(compile(_chapter_cell("timers-code"), "ch08 timers-code", "exec"), scope)
    assert check.launch_counted(scope["launch_counted"], seed=5, quiet=True).passed


# ---------------------------------------------------------------- the recorded figures


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_the_recorded_timers_give_each_workload_three_medians(gpu):
    rows = timing.recorded(gpu)
    three = timing.three_timers(rows)
    assert {(t.workload, t.M, t.N) for t in three} == {
        (w, m, n) for w in ("eager RMSNorm", "fused Triton RMSNorm")
        for m, n in ((2048, 2048), (8192, 4096))}
    medians = {(r["workload"], int(r["M"]), int(r["N"]), r["timer"]): float(r["median_us"])
               for r in rows}
    for t in three:
        key = (t.workload, t.M, t.N)
        assert t.gpu_us == medians[(*key, timing.GPU_TIME)]
        assert t.bench_us == medians[(*key, timing.DO_BENCH)]
        assert t.call_us == medians[(*key, timing.CALLER_WAITS)]
        assert t.host_us == t.call_us - t.gpu_us
        assert t.gpu == rows[0]["gpu"]


def test_a_recording_without_one_of_the_three_timers_is_refused(tmp_path, monkeypatch):
    fields = ("gpu", "workload", "M", "N", "timer", "mean_us", "median_us")
    with open(tmp_path / "timers-h100.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for timer in (timing.GPU_TIME, timing.CALLER_WAITS):
            writer.writerow({"gpu": "NVIDIA H100", "workload": "eager RMSNorm", "M": "64",
                             "N": "64", "timer": timer, "mean_us": "9", "median_us": "8"})
    monkeypatch.setattr(timing, "DATA", tmp_path)
    with pytest.raises(ValueError, match="eager RMSNorm 64 x 64 has no 'triton do_bench'"):
        timing.three_timers(timing.recorded("H100"))


@pytest.mark.skipif(runtime.on_gpu(), reason="the message without a GPU")
def test_measuring_the_three_timers_without_a_gpu_says_it_needs_one():
    with pytest.raises(NeedsGPU, match="read the recorded figures"):
        timing.three_timers_measured(lambda: None, lambda: (), 0, "nothing", (1, 1))


# ---------------------------------------------------------------- graded end to end


@pytest.mark.slow
@pytest.mark.skipif(runtime.on_gpu(), reason="the points without a GPU (speed cells fail)")
def test_a_wrong_launch_counted_graded_by_the_verifier_loses_its_own_cell_only(tmp_path):
    """Chapter 08 graded as the autograder grades it (course.verify), with the share left
    out instead of the share counted: ex08_launch_counted loses its points, with the check's
    diagnosis, and every other cell keeps what the correct chapter gets."""
    from grader_submissions import Submission, expected_points, solutions, verified

    answer = solutions(ROOT, "ch08_performance_lab")["ex08_launch_counted_code"]
    right = "return (timer_us - gpu_us) / (call_us - gpu_us)"
    assert answer.count(right) == 1
    sub = Submission("mistakes_a", "ch08_performance_lab", "the share left out",
                     {"ex08_launch_counted_code": answer.replace(
                         right, "return (call_us - timer_us) / (call_us - gpu_us)")},
                     ("ex08_launch_counted",), "it gives the share the timer leaves out")
    verdict = verified(sub, tmp_path)
    got = {c.grade_id: c.points for c in verdict.cells}
    assert got == expected_points(ROOT, sub), verdict.to_json()[:4000]
    reason = next(c.reason for c in verdict.cells if c.grade_id == "ex08_launch_counted")
    assert sub.reason in reason, reason


# ---------------------------------------------------------------- autotune in the interpreter


def test_the_host_clock_bench_gives_milliseconds_at_each_quantile_after_a_warm_up():
    calls = []
    clock = iter([0.0, 0.001, 1.0, 1.002, 2.0, 2.003, 3.0, 3.004, 4.0, 4.2])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timing.time, "perf_counter", lambda: next(clock))
        got = timing.host_clock_bench(lambda: calls.append(1), quantiles=(0.5, 0.2, 0.8))
    assert len(calls) == 6  # the warm-up, untimed, then five calls of 1, 2, 3, 4 and 200 ms
    assert got == pytest.approx([3.0, 2.0, 200.0])
