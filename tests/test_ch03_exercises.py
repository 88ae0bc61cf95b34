"""Chapter 03's two plain-Python exercises: eager RMSNorm's bytes launch by launch, and a
minimal honest timer on simulated GPUs (course.timing).

Each mistake (tests/ch03_answers.py) is the chapter's own answer with a line or two written
wrong: it must fail its own check with a message naming its own bug, and no other
mistake's. The simulated GPU's predictions of each mistake are tried on many seeds, and one
submission with two mistakes is graded by the verifier, the learner's code in its own
process.
"""

from __future__ import annotations

import csv

from course import check, runtime, timing, traffic
from course.check.eager_bytes import model_launches
from course.check.timer import REPS

import ch03_answers
import pytest
from ch03_answers import MISTAKES, load

CHECKS = {"ex03_eager_bytes": lambda ns: check.eager_launch_bytes(
              ns["eager_launch_bytes"], seed=3, quiet=True),
          "ex03_timer": lambda ns: check.honest_timer(ns["time_workload"], seed=3, quiet=True)}


def _message(namespace: dict, cell: str) -> str | None:
    try:
        CHECKS[cell](namespace)
    except AssertionError as failure:
        return str(failure)
    return None


def test_the_chapters_answers_pass_both_checks():
    correct = load()
    assert _message(correct, "ex03_eager_bytes") is None
    assert _message(correct, "ex03_timer") is None


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_each_mistake_fails_its_own_check_naming_its_own_bug(name):
    mistake = MISTAKES[name]
    namespace = load(mistake.edits)
    for cell in CHECKS:
        message = _message(namespace, cell)
        if cell not in mistake.loses:
            assert message is None, f"{name} also failed {cell}:\n{message}"
            continue
        assert message is not None and mistake.phrase in message, f"{name}:\n{message}"
        others = [m.phrase for n, m in MISTAKES.items() if n != name]
        assert not [p for p in others if p in message], f"{name} blamed on another:\n{message}"


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_the_checkers_model_without_slips_is_course_traffic(dtype):
    for M, N in ((1, 1), (7, 12289), (16384, 4096)):
        want = [k.bytes for k in traffic.eager_rmsnorm(M, N, dtype).kernels]
        assert [b for _, b in model_launches(M, N, traffic.dtype_bytes(dtype))] == want


def test_an_answer_that_asks_course_traffic_is_refused():
    def copied(M, N, elem_bytes):
        return [(k.name, k.bytes) for k in
                traffic.eager_rmsnorm(M, N, "bf16" if elem_bytes == 2 else "fp32").kernels]

    with pytest.raises(AssertionError, match="calls course.traffic"):
        check.eager_launch_bytes(copied, seed=1, quiet=True)


def test_a_wrongly_shaped_answer_is_said_in_words():
    with pytest.raises(AssertionError,
                       match=r"entry 0 \('x'\) has 12.5 bytes \(float\): bytes are an int"):
        check.eager_launch_bytes(lambda M, N, e: [("x", 12.5)], seed=1, quiet=True)


# ---------------------------------------------------------------- the simulated GPU


def test_each_timing_mistake_is_told_apart_on_many_simulated_gpus():
    """On 40 seeds, the honest answer passes, and each mistake's answer matches its own
    prediction more closely than any other (what lets the check name it)."""
    variants = {name: load(MISTAKES[name].edits)["time_workload"] for name in
                ("host_clock_no_sync", "no_warmup", "same_input", "same_output",
                 "milliseconds")}
    predicted_as = {"host_clock_no_sync": "host_clock", "no_warmup": "no_warmup",
                    "same_input": "same_input", "same_output": "same_output",
                    "milliseconds": "milliseconds"}
    honest = load()["time_workload"]
    for seed in range(40):
        spec = f"sim:{seed}"
        times = timing.simulated_times(spec, REPS)
        got = honest(spec, REPS)
        assert times.true_s * 0.96 <= got <= times.true_s + 1.05 * times.params.launch_s, seed
        for name, time_workload in variants.items():
            measured = time_workload(spec, REPS)
            gaps = {m: abs(measured / p - 1) for m, p in times.mistakes().items()}
            assert min(gaps, key=gaps.get) == predicted_as[name], (seed, name, gaps)
            assert gaps[predicted_as[name]] < 0.08, (seed, name, gaps)


def test_elapsed_time_before_the_gpu_reached_the_end_event_raises():
    gpu, fn, inputs = timing.workload("sim:5")
    start, end = gpu.Event(enable_timing=True), gpu.Event(enable_timing=True)
    start.record()
    fn(*inputs[0])
    end.record()
    with pytest.raises(RuntimeError, match="synchronize"):
        start.elapsed_time(end)
    gpu.synchronize()
    assert start.elapsed_time(end) > 0
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        gpu.Event().elapsed_time(end)


def test_a_freed_output_block_goes_to_the_next_output():
    gpu, fn, inputs = timing.workload("sim:5")
    first = fn(*inputs[0])
    address = first.address
    del first
    assert fn(*inputs[1]).address == address
    kept = fn(*inputs[2])
    assert fn(*inputs[3]).address != kept.address


def test_bad_specs_are_refused_with_the_expected_form():
    with pytest.raises(ValueError, match="'sim:<seed>'"):
        timing.workload("sim:abc")
    with pytest.raises(ValueError, match="cuda:<eager|rms_norm>:MxN"):
        timing.workload("cuda:eager:4096")


@pytest.mark.skipif(runtime.on_gpu(), reason="the message without a GPU")
def test_a_gpu_workload_without_a_gpu_says_it_needs_one():
    with pytest.raises(RuntimeError, match="needs a GPU"):
        timing.workload("cuda:eager:64x64")


def test_recorded_timers_are_shown_with_their_gpu_and_ratios(tmp_path, monkeypatch):
    fields = ("gpu", "torch", "triton", "date", "workload", "M", "N", "dtype", "timer", "reps",
              "mean_us", "median_us")
    same = {"gpu": "NVIDIA H100", "torch": "2.11.0", "triton": "3.6.0", "date": "2026-11-26",
            "workload": "eager RMSNorm", "M": "2048", "N": "2048", "dtype": "bf16",
            "reps": "30"}
    with open(tmp_path / "timers-h100.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerow(dict(same, timer="honest", mean_us="50.0", median_us="40.0"))
        writer.writerow(dict(same, timer="same input every call", mean_us="30.0",
                             median_us="36.0"))
    monkeypatch.setattr(timing, "DATA", tmp_path)
    table = timing.recorded_table(timing.recorded("H100"))
    assert "NVIDIA H100, torch 2.11.0, triton 3.6.0, 2026-11-26" in table
    assert "30.0 us   0.60x      36.0 us   0.90x  (honest)" in table
    with pytest.raises(FileNotFoundError, match="record_timers"):
        timing.recorded("h200")


# ---------------------------------------------------------------- graded end to end


@pytest.mark.slow
@pytest.mark.skipif(runtime.on_gpu(), reason="the points without a GPU (speed cells fail)")
def test_the_mistakes_graded_by_the_verifier_lose_their_own_cells_only(tmp_path):
    from grader_submissions import ROOT, ch03_submissions, expected_points, verified

    sub = next(s for s in ch03_submissions() if s.student == "mistakes_a")
    verdict = verified(sub, tmp_path)
    got = {c.grade_id: c.points for c in verdict.cells}
    assert got == expected_points(ROOT, sub), (sub.what, verdict.to_json()[:4000])
    by_id = {c.grade_id: c for c in verdict.cells}
    assert sub.reason in by_id[sub.loses[0]].reason, by_id[sub.loses[0]].reason
    timer_phrase = ch03_answers.MISTAKES["same_output"].phrase
    assert timer_phrase in by_id["ex03_timer"].reason, by_id["ex03_timer"].reason


@pytest.mark.gpu
def test_gpu_the_honest_timer_agrees_with_course_bench_on_eager_rmsnorm():
    from course import bench

    gpu, fn, inputs = timing.workload("cuda:eager:8192x4096")
    mine = load()["time_per_call"](gpu, fn, inputs)
    copies = iter(inputs * 64)
    theirs = bench.measure("eager", fn, lambda: next(copies), 1).seconds
    assert 0.8 < mine / theirs < 1.25, (mine, theirs)
