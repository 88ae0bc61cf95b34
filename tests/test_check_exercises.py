"""The checkers of chapters 01-03 and 05-08: each correct solution passes, and each broken
one fails with the message that names its own bug, and no other variant's."""

from __future__ import annotations

import dataclasses
import math
import re

from course import bench, check, reference, runtime, traffic
from course.check import sandbox
from course.check.backward import RMSNORM_BACKWARD, dw_sum_atol
from course.check.compare import compare
from course.check.lab import CompileComparison, ShapeTiming
from course.check.layernorm import LAYERNORM_FORWARD, mean_error_atol
from course.check.suite import run_exercise
from course.check.torch_reference import TORCH_RMSNORM
from course.check.two_pass import TWO_PASS
from course.hardware import NeedsGPU

import add_rmsnorm_variants
import backward_variants
import layernorm_variants
import pytest
import rmsnorm_variants
import torch
import two_pass_variants

no_gpu = pytest.mark.skipif(runtime.on_gpu(), reason="checks the message shown without a GPU")


def _fails_with_own_message(checker, fn, name: str, broken: dict, seed: int = 3) -> str:
    with pytest.raises(AssertionError) as failure:
        checker(fn, seed=seed, quiet=True)
    message = str(failure.value)
    assert broken[name][1] in message, message
    for other, (_, other_phrase) in broken.items():
        if other != name:
            assert other_phrase not in message, f"{name} was also blamed for {other}:\n{message}"
    return message


# --------------------------------------------------------------------------- chapter 01

def rmsnorm_torch(x, weight, eps=1e-6):
    h = x.to(torch.float32)
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(torch.float32)).to(x.dtype)


def rmsnorm_torch_hf_style(x, weight, eps=1e-6):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)  # rounds twice, as Hugging Face's Llama does: still fine


def rmsnorm_torch_input_precision(x, weight, eps=1e-6):
    # Squares, mean and rsqrt in the input's dtype: bfloat16 rounds the row's statistic.
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def rmsnorm_torch_in_place(x, weight, eps=1e-6):
    h = x.pow_(2)  # squares x itself
    return h


def test_plain_torch_rmsnorm_passes_without_any_kernel():
    for fn in (rmsnorm_torch, rmsnorm_torch_hf_style):
        report = check.torch_rmsnorm(fn, seed=1, quiet=True)
        assert report.passed and all(r.launches == () for r in report.results)
    assert any(c.shape == (32, 4096) and c.dtype == torch.bfloat16 for c in TORCH_RMSNORM.cases)


def test_16_bit_statistics_in_torch_fail_with_advice_about_float32():
    with pytest.raises(AssertionError) as failure:
        check.torch_rmsnorm(rmsnorm_torch_input_precision, seed=2, quiet=True)
    message = str(failure.value)
    assert "Your statistics are computed in 16 bits" in message
    assert "x.to(torch.float32)" in message and "tl.load" not in message
    assert "issue 11604" not in message  # about Triton's interpreter, not torch
    # The line that computed the statistic, and in which dtype.
    assert "aten.mean.dim on float16" in message and "test_check_exercises.py, line" in message
    report = run_exercise(TORCH_RMSNORM, rmsnorm_torch_input_precision, seed=2)
    failing = {r.case.name for r in report.results if not r.passed}
    assert "bfloat16, many long rows" in failing
    assert all(r.passed for r in report.results if r.case.dtype == torch.float32)


def test_float32_statistics_by_the_dtype_argument_are_accepted():
    def mean_in_float32(x, weight, eps=1e-6):
        ms = (x.float() * x.float()).mean(-1, keepdim=True, dtype=torch.float32)
        return (x.float() * torch.rsqrt(ms + eps) * weight.float()).to(x.dtype)

    assert check.torch_rmsnorm(mean_in_float32, seed=0, quiet=True).passed


def test_coherent_rounding_of_a_bf16_row_stays_inside_the_torch_tolerance():
    # Rounding x * rstd to bfloat16 moves whole rows by up to 2^-9: fine, but beyond the
    # kernel exercises' row-scale tolerance, so this exercise widens it.
    report = run_exercise(TORCH_RMSNORM, rmsnorm_torch_hf_style, seed=16)
    many = next(r for r in report.results if r.case.name == "bfloat16, many rows")
    assert many.passed
    y = many.outputs[0].double()
    inputs = TORCH_RMSNORM.make_inputs(many.case, torch.Generator().manual_seed(
        16 * 1000 + TORCH_RMSNORM.cases.index(many.case)))
    want = reference.rmsnorm(inputs["x"].tensor, inputs["weight"].tensor)
    scale = (y * want).sum(1) / (want * want).sum(1)
    worst = float((scale - 1).abs().max())
    assert 1e-3 < worst < 2.0 ** -8  # above the kernels' 0.1 %, inside this exercise's bound


# The first few cases are enough to see a call refused (the interpreter is slow).
FIRST_TORCH_CASES = dataclasses.replace(TORCH_RMSNORM, cases=TORCH_RMSNORM.cases[:3])


def test_torch_exercise_still_refuses_writing_into_the_input():
    report = run_exercise(FIRST_TORCH_CASES, rmsnorm_torch_in_place, seed=0)
    assert not report.passed and "writes into an input" in report.message()


def test_torch_exercise_refuses_a_triton_kernel():
    report = run_exercise(FIRST_TORCH_CASES, rmsnorm_variants.correct, seed=0)
    assert not report.passed and "plain PyTorch" in report.message()
    assert all(r.finding("extra_launches") for r in report.results)


# --------------------------------------------------------------------------- chapter 02

def fused_rmsnorm_bytes(M, N, elem_bytes):
    return 2 * M * N * elem_bytes + N * elem_bytes


def rmsnorm_flops(M, N):
    return 4 * M * N + 4 * M


def arithmetic_intensity(flops, nbytes):
    return flops / nbytes


def time_floor_us(nbytes, bytes_per_s):
    return nbytes / bytes_per_s * 1e6


ROOFLINE = (fused_rmsnorm_bytes, rmsnorm_flops, arithmetic_intensity, time_floor_us)


def test_roofline_functions_pass_on_fixed_and_random_odd_shapes():
    report = check.roofline_functions(*ROOFLINE, seed=4, quiet=True)
    assert report.passed and len(report.results) >= 7
    shapes = [r.case.shape for r in report.results]
    assert (7, 12289) in shapes and (1, 1) in shapes
    other = check.roofline_functions(*ROOFLINE, seed=5, quiet=True)
    assert [r.case.shape for r in other.results] != shapes  # random shapes change by seed
    expected = traffic.fused_rmsnorm(7, 12289, torch.bfloat16)
    assert fused_rmsnorm_bytes(7, 12289, 2) == expected.bytes


@pytest.mark.parametrize("position, wrong, phrases", [
    (0, lambda M, N, e: 3 * M * N * e + N * e, ["fused_rmsnorm_bytes is off", "counted x twice"]),
    (0, lambda M, N, e: 2 * M * N + N, ["fused_rmsnorm_bytes is off", "elements, not bytes"]),
    (1, lambda M, N: 4 * M * N, ["rmsnorm_flops is off", "4 FLOPs per row"]),
    (2, lambda f, b: b / f, ["arithmetic_intensity is off", "inverted"]),
    (3, lambda b, bw: b / bw, ["time_floor_us is off", "returned seconds"]),
    (3, lambda b, bw: b / bw * 2.5e6, ["time_floor_us is off", "2.5 times the right one"]),
    (3, lambda b, bw: b // bw * 1e6, ["time_floor_us is off", "integer division (//)", "use /"]),
])
def test_each_wrong_roofline_function_is_named_with_its_mistake(position, wrong, phrases):
    fns = list(ROOFLINE)
    fns[position] = wrong
    with pytest.raises(AssertionError) as failure:
        check.roofline_functions(*fns, seed=1, quiet=True)
    message = str(failure.value)
    for phrase in phrases:
        assert phrase in message, message
    right = [f.__name__ for i, f in enumerate(ROOFLINE) if i != position]
    assert not any(f"{name} is off" in message for name in right), message


def test_a_roofline_function_that_raises_is_reported_not_raised():
    def unfinished(M, N):
        raise NotImplementedError("todo")

    with pytest.raises(AssertionError, match="rmsnorm_flops is off: it raised NotImplementedError"):
        check.roofline_functions(fused_rmsnorm_bytes, unfinished, arithmetic_intensity,
                                 time_floor_us, seed=0, quiet=True)



def ridge_point(peak_flops, bytes_per_s):
    return peak_flops / bytes_per_s


def regime(intensity, peak_flops, bytes_per_s):
    return "memory" if intensity < ridge_point(peak_flops, bytes_per_s) else "compute"


def test_ridge_point_and_regime_pass_on_the_table_and_on_made_up_gpus():
    report = check.ridge_point(ridge_point, regime, seed=4, quiet=True)
    assert report.passed
    labels = [r.case.label() for r in report.results]
    assert "H100 SXM bf16 (989 TFLOP/s, 3350 GB/s)" in labels
    assert "H100 SXM fp32 no-FMA (33.5 TFLOP/s, 3350 GB/s)" in labels
    other = check.ridge_point(ridge_point, regime, seed=5, quiet=True)
    assert [r.case.label() for r in other.results] != labels  # made-up GPUs change by seed
    # What the chapter's table concludes with these two functions: the norm left of every
    # no-FMA float32 ridge, the matmul right of every bfloat16 one.
    from course import hardware

    for spec in hardware.SPECS:
        bw = spec.hbm_bytes_per_s
        assert regime(traffic.fused_rmsnorm(4096, 8192, "fp32").intensity,
                      spec.peak_flops(torch.float32) / 2, bw) == "memory"
        if spec.bf16_tflops is not None:
            assert regime(2 * 8192**3 / (3 * 8192**2 * 2), spec.peak_flops(torch.bfloat16),
                          bw) == "compute"


def _regime_on(ridge):
    """A regime built on the given ridge function, as a learner's would be on theirs."""
    return lambda i, p, b: "memory" if i < ridge(p, b) else "compute"


@pytest.mark.parametrize("wrong_ridge, phrase", [
    (lambda p, b: b / p, "your ratio is inverted: bytes_per_s / peak_flops is bytes per FLOP"),
    (lambda p, b: (p / 1e12) / (b / 1e9), "you divided TFLOP/s by GB/s"),
    (lambda p, b: p / (b * 1e9), "you treated bytes_per_s as GB/s"),
    (lambda p, b: p / (b / 1e9), "you converted bytes_per_s to GB/s"),
    (lambda p, b: p * 1e12 / b, "you treated peak_flops as TFLOP/s"),
    (lambda p, b: p / 1e12 / b, "you converted peak_flops to TFLOP/s"),
    (lambda p, b: p / 2 / b, "you halved the peak (an FMA counted as one FLOP?)"),
    (lambda p, b: 2 * p / b, "you doubled the peak (an FMA counted as two FLOPs?)"),
    (lambda p, b: p // b, "you used integer division (//)"),
    (lambda p, b: 3 * p / b, "every answer is 3 times the right one"),
], ids=["inverted", "tflops_over_gbps", "bytes_as_gbps", "bytes_to_gbps", "flops_as_tflops",
        "flops_to_tflops", "halved", "doubled", "floor_division", "factor_3"])
def test_each_wrong_ridge_point_is_named_with_its_mistake(wrong_ridge, phrase):
    with pytest.raises(AssertionError) as failure:  # a regime that uses the right ridge
        check.ridge_point(wrong_ridge, regime, seed=1, quiet=True)
    message = str(failure.value)
    assert f"ridge_point is off: {phrase}" in message, message
    assert "regime is off" not in message, message
    with pytest.raises(AssertionError) as failure:  # a regime built on the wrong ridge
        check.ridge_point(wrong_ridge, _regime_on(wrong_ridge), seed=1, quiet=True)
    message = str(failure.value)
    assert f"ridge_point is off: {phrase}" in message, message
    if "integer division" not in phrase:  # a floored ridge still decides most sides right
        assert "regime is off: its answers follow your ridge_point, which is off" in message


@pytest.mark.parametrize("wrong_regime, phrase", [
    (lambda i, p, b: "compute" if i < p / b else "memory", "you have the sides swapped"),
    (lambda i, p, b: "memory", "it answers 'memory' for every kernel"),
    (lambda i, p, b: "compute", "it answers 'compute' for every kernel, also for a copy"),
    (lambda i, p, b: "memory" if i < b / p else "compute",
     "you compared the intensity with bytes_per_s / peak_flops"),
    (lambda i, p, b: "memory" if i < p / 2 / b else "compute",
     "you compared the intensity with half the ridge"),
    (lambda i, p, b: "memory" if i < 2 * p / b else "compute",
     "you compared the intensity with twice the ridge"),
    (lambda i, p, b: i < p / b, "it returned True (bool): return the string 'memory' or"),
    (lambda i, p, b: "memory-bound" if i < p / b else "compute-bound",
     "it returned 'memory-bound': return exactly 'memory' or 'compute'"),
    (lambda i, p, b: "memory" if i < 295 else "compute",  # the H100's bf16 ridge, hard-coded
     "it answered 'memory': the kernel is right of the ridge, so compute-bound"),
], ids=["swapped", "always_memory", "always_compute", "bytes_per_flop", "half_ridge",
        "twice_ridge", "bool", "memory_bound", "fixed_ridge"])
def test_each_wrong_regime_is_named_with_its_mistake(wrong_regime, phrase):
    with pytest.raises(AssertionError) as failure:
        check.ridge_point(ridge_point, wrong_regime, seed=1, quiet=True)
    message = str(failure.value)
    assert "regime is off: " in message and phrase in message, message
    assert "ridge_point is off" not in message, message


def test_a_ridge_function_that_raises_or_is_not_passed_is_reported():
    def unfinished(*args):
        raise NotImplementedError("todo")

    with pytest.raises(AssertionError) as failure:
        check.ridge_point(unfinished, _regime_on(unfinished), seed=0, quiet=True)
    message = str(failure.value)
    assert "ridge_point is off: it raised NotImplementedError: todo" in message
    assert "regime is off: it raised NotImplementedError: todo" in message  # it calls it
    with pytest.raises(TypeError, match="pass your function regime itself"):
        check.ridge_point(ridge_point, "memory")


def test_a_ridge_function_right_where_it_answers_is_named_by_the_call_it_failed():
    # Right on every roof but one: the advice names that call, not a right answer
    def ridge_but_not_the_h100s(peak_flops, bytes_per_s):
        if bytes_per_s == 3350e9:
            raise ValueError("no H100 here")
        return peak_flops / bytes_per_s

    def ridge_but_nan_for_the_h100(peak_flops, bytes_per_s):
        return math.nan if bytes_per_s == 3350e9 else peak_flops / bytes_per_s

    for wrong, said in ((ridge_but_not_the_h100s, "raised ValueError: no H100 here"),
                        (ridge_but_nan_for_the_h100, "returned nan, not a finite number")):
        with pytest.raises(AssertionError) as failure:
            check.ridge_point(wrong, regime, seed=0, quiet=True)
        message = str(failure.value)
        assert re.search(r"ridge_point is off: for \(\d+\.0, 3350000000000\.0\) it " +
                         re.escape(said), message), message
        assert "expected" not in message.split("Wrong on")[0], message


def test_a_regime_right_where_it_answers_is_named_by_the_call_it_failed():
    def regime_but_not_on_the_h100(intensity, peak_flops, bytes_per_s):
        if bytes_per_s == 3350e9:
            raise ValueError("no H100 here")
        return regime(intensity, peak_flops, bytes_per_s)

    with pytest.raises(AssertionError) as failure:  # not StopIteration from the diagnosis
        check.ridge_point(ridge_point, regime_but_not_on_the_h100, seed=0, quiet=True)
    message = str(failure.value)
    assert re.search(r"regime is off: for .* on H100 SXM .* it raised ValueError: no H100 "
                     r"here \(every answer it gave is right\)", message), message


def test_a_ridge_function_that_calls_course_traffic_fails_even_when_right():
    from course import hardware

    def ridge_from_the_model(peak_flops, bytes_per_s):
        traffic.ridge_point(hardware.lookup("H100 SXM"), "bf16")  # looked at, not needed
        return peak_flops / bytes_per_s

    with pytest.raises(AssertionError, match=r"ridge_point is off: it calls course.traffic "
                                             r"\(ridge_point\)"):
        check.ridge_point(ridge_from_the_model, regime, seed=0, quiet=True)


@pytest.mark.slow
def test_a_wrong_ridge_graded_by_the_verifier_loses_its_own_cell_only(tmp_path):
    """Chapter 02 graded as the autograder grades it (course.verify): the learner's two
    functions in their own process, the check here; an inverted ridge, and a regime built
    on it, cost the ridge's cell and nothing else, with the check's own diagnosis."""
    from grader_submissions import ROOT, Submission, expected_points, solutions, verified

    answer = solutions(ROOT, "ch02_roofline")["ex02_ridge_point_code"]
    assert answer.count("return peak_flops / bytes_per_s") == 1
    inverted = answer.replace("return peak_flops / bytes_per_s",
                              "return bytes_per_s / peak_flops")
    sub = Submission("mistakes_a", "ch02_roofline", "the ridge point inverted",
                     {"ex02_ridge_point_code": inverted}, ("ex02_ridge_point",),
                     "your ratio is inverted")
    verdict = verified(sub, tmp_path)
    got = {c.grade_id: c.points for c in verdict.cells}
    assert got == expected_points(ROOT, sub), verdict.to_json()[:4000]
    reason = next(c.reason for c in verdict.cells if c.grade_id == "ex02_ridge_point")
    assert sub.reason in reason and "its answers follow your ridge_point" in reason, reason


# --------------------------------------------------------------------------- chapter 03

def test_two_pass_kernel_passes_rows_far_longer_than_a_block():
    report = check.rmsnorm_two_pass(two_pass_variants.correct, seed=1, quiet=True)
    assert report.passed
    widths = {r.case.n for r in report.results}
    assert {20000, 12289} <= widths and max(widths) > 10 * two_pass_variants.BLOCK_N
    assert all(len(r.launches) == 1 for r in report.results)


@pytest.mark.parametrize("name", sorted(two_pass_variants.BROKEN))
def test_broken_two_pass_kernel_fails_with_its_own_message(name):
    fn = two_pass_variants.BROKEN[name][0]
    _fails_with_own_message(check.rmsnorm_two_pass, fn, name, two_pass_variants.BROKEN)


def test_two_pass_with_two_launches_is_told_it_is_one_launch():
    report = run_exercise(TWO_PASS, rmsnorm_variants.two_launches, seed=0)
    assert "This exercise is one launch" in report.message()


@pytest.mark.gpu
def test_gpu_two_pass_bandwidth_reports_fraction_and_model_ratio_without_failing():
    slow = check.rmsnorm_two_pass_bandwidth(rmsnorm_variants.two_pass_slow, quiet=True)
    assert 0 < slow.fraction_of_copy < 1 and slow.measured_over_predicted > 0
    assert "predicts" in str(slow) and "x read twice" in str(slow)


# --------------------------------------------------------------------------- chapter 05

def test_fused_add_rmsnorm_passes_every_case():
    report = check.add_rmsnorm(add_rmsnorm_variants.correct, seed=1, quiet=True)
    assert report.passed and len(report.results) >= 12
    assert all(r.launches == ("add_rmsnorm_kernel",) for r in report.results)


@pytest.mark.parametrize("name", sorted(add_rmsnorm_variants.BROKEN))
def test_broken_add_rmsnorm_fails_with_its_own_message(name):
    fn = add_rmsnorm_variants.BROKEN[name][0]
    _fails_with_own_message(check.add_rmsnorm, fn, name, add_rmsnorm_variants.BROKEN)


@pytest.mark.gpu
def test_gpu_add_rmsnorm_bandwidth_of_the_fused_kernel_meets_the_target():
    result = check.add_rmsnorm_bandwidth(add_rmsnorm_variants.correct, target=0.75)
    assert result.passed


@pytest.mark.gpu
def test_gpu_add_rmsnorm_bandwidth_refuses_a_wrong_kernel_before_timing_it():
    with pytest.raises(AssertionError, match="not timed"):
        check.add_rmsnorm_bandwidth(add_rmsnorm_variants.norm_of_x)


# --------------------------------------------------------------------------- chapter 06

def test_layernorm_passes_every_case_including_large_means():
    report = check.layernorm_forward(layernorm_variants.correct, seed=1, quiet=True)
    assert report.passed
    means = [r.case for r in report.results if "mean" in r.case.tags]
    assert {c.offset for c in means} >= {1e3, 1e4} and all(c.dtype == torch.float32
                                                          for c in means)


@pytest.mark.parametrize("name", sorted(layernorm_variants.BROKEN))
def test_broken_layernorm_fails_with_its_own_message(name):
    fn = layernorm_variants.BROKEN[name][0]
    _fails_with_own_message(check.layernorm_forward, fn, name, layernorm_variants.BROKEN)


@no_gpu
def test_parameters_loaded_with_a_row_offset_are_named():
    message = _fails_with_own_message(
        check.layernorm_forward, layernorm_variants.parameters_row_offset,
        "parameters_row_offset", dict(layernorm_variants.BROKEN, parameters_row_offset=(
            layernorm_variants.parameters_row_offset, "loaded with a row offset")))
    assert "weight_ptr + cols and bias_ptr + cols" in message


def test_one_pass_variance_fails_exactly_the_large_mean_cases():
    report = run_exercise(LAYERNORM_FORWARD, layernorm_variants.one_pass, seed=5)
    failing = {r.case.name for r in report.results if not r.passed}
    assert failing == {c.name for c in LAYERNORM_FORWARD.cases if "mean" in c.tags}
    assert "E[x^2] - E[x]^2" in report.message() and "Welford" in report.message()


def test_large_mean_tolerance_admits_float32_rounding_of_the_mean_and_nothing_like_cancellation():
    x = torch.randn(8, 256, dtype=torch.float64) + 1e4
    w = torch.ones(256, dtype=torch.float64)
    atol = mean_error_atol(x.float(), w, 1e-5)
    # One unit in the last place of a float32 mean of 1e4 is ~1e-3: inside the tolerance.
    assert float(atol.min()) > 1e-3
    # A one-pass variance is off by ~ulp(1e8) / variance: tens of units, far outside it.
    assert float(atol.max()) < 0.05


@pytest.mark.gpu
def test_gpu_layernorm_bandwidth_of_the_fused_kernel_meets_the_target():
    assert check.layernorm_forward_bandwidth(layernorm_variants.correct, target=0.75).passed


# --------------------------------------------------------------------------- chapter 07

def test_backward_passes_with_partial_sums_reduced_by_a_second_kernel():
    report = check.rmsnorm_backward(backward_variants.correct, seed=1, quiet=True)
    assert report.passed
    assert all(r.launches == ("rmsnorm_bwd_kernel", "dw_reduce_kernel")
               for r in report.results)
    mixed = [r for r in report.results if r.case.weight_dtype != r.case.dtype]
    assert mixed and mixed[0].outputs[1].dtype == torch.float32  # dw in the weight's dtype


@pytest.mark.parametrize("name", sorted(backward_variants.BROKEN))
def test_broken_backward_fails_with_its_own_message(name):
    fn = backward_variants.BROKEN[name][0]
    _fails_with_own_message(check.rmsnorm_backward, fn, name, backward_variants.BROKEN)


def test_partial_dw_message_says_which_rows_were_summed():
    report = run_exercise(RMSNORM_BACKWARD, backward_variants.first_partial_only, seed=0)
    # The first case has 64 rows: the first program's share of them is all dw holds.
    rows = math.ceil(64 / backward_variants._programs(64))
    assert rows < 64
    assert f"dw equals the sum over rows 0..{rows - 1} only, {rows} of the 64 rows" in (
        report.message())


def test_dw_tolerance_grows_with_the_rows_summed_but_stays_far_below_a_missing_row():
    gen = torch.Generator().manual_seed(0)
    terms = torch.randn(4096, 64, generator=gen, dtype=torch.float64)
    exact = terms.sum(0)
    float32_sum = terms.float().sum(0)  # a correct kernel's float32 accumulation
    atol = dw_sum_atol(terms)
    assert compare("dw", float32_sum, exact, torch.float32, extra_atol=atol) is None
    one_row_short = (terms[1:].sum(0)).float()
    assert compare("dw", one_row_short, exact, torch.float32, extra_atol=atol) is not None
    assert float(dw_sum_atol(terms[:64]).mean()) < float(atol.mean())


def test_atomics_are_seen_only_when_a_kernel_runs_them():
    x = torch.randn(8, 32, device=runtime.DEVICE)
    w = torch.rand(32, device=runtime.DEVICE)
    rstd = torch.rsqrt(x.square().mean(-1) + 1e-6)
    dy = torch.randn(8, 32, device=runtime.DEVICE)
    with sandbox.watch() as record:
        backward_variants.correct(x, w, rstd, dy)  # has an atomic in a branch never taken
    assert record.atomic_kernels == []
    with sandbox.watch() as record:
        backward_variants.atomic_dw(x, w, rstd, dy)
    assert record.atomic_kernels == ["rmsnorm_bwd_kernel"]


def test_autograd_function_passes_and_runs_gradcheck_when_kernels_support_float64():
    report = check.rmsnorm_autograd(backward_variants.RMSNormFunction, seed=1, quiet=True)
    assert report.passed and not report.notes
    names = [r.case.name for r in report.results]
    assert "only x requires grad" in names and "only weight requires grad" in names
    assert names[-1] == "gradcheck, float64"


def test_the_gradcheck_needs_a_forward_that_is_rmsnorm():
    """y = x with dx = dy: a backward that matches its own forward, but not RMSNorm's."""
    with pytest.raises(AssertionError) as failure:
        check.rmsnorm_gradcheck(backward_variants.IdentityFunction, seed=3, quiet=True)
    assert "where RMSNorm's is 0" in str(failure.value)
    check.rmsnorm_gradcheck(backward_variants.RMSNormFunction, seed=3, quiet=True)


def test_autograd_gradcheck_is_skipped_openly_for_float32_kernels():
    report = check.rmsnorm_autograd(backward_variants.Float32Kernels, seed=1, quiet=True)
    assert report.passed
    assert any("skipped the float64 gradcheck" in n and "float32" in n for n in report.notes)
    assert "gradcheck" not in [r.case.name.split(",")[0] for r in report.results]


@pytest.mark.parametrize("name", sorted(backward_variants.BROKEN_FUNCTIONS))
def test_broken_autograd_function_fails_with_its_own_message(name):
    fn = backward_variants.BROKEN_FUNCTIONS[name][0]
    _fails_with_own_message(check.rmsnorm_autograd, fn, name,
                            backward_variants.BROKEN_FUNCTIONS)


def test_four_gradients_are_refused_although_pytorch_accepts_them():
    x = torch.randn(3, 8, requires_grad=True, device=runtime.DEVICE)
    w = torch.rand(8, requires_grad=True, device=runtime.DEVICE)
    backward_variants.FourGradients.apply(x, w, 1e-6).sum().backward()  # no error from torch
    with pytest.raises(AssertionError, match="return exactly one value per input"):
        check.rmsnorm_autograd(backward_variants.FourGradients, seed=0, quiet=True)


def test_autograd_checker_wants_the_class():
    with pytest.raises(TypeError, match="pass your class itself"):
        check.rmsnorm_autograd(backward_variants.correct)


@pytest.mark.gpu
def test_gpu_backward_bandwidth_reports_a_fraction_of_copy():
    result = check.rmsnorm_backward_bandwidth(backward_variants.correct, target=0.5)
    assert result.passed and 0.5 <= result.best.fraction_of_copy < 1.2


# --------------------------------------------------------------------------- chapter 08

def test_beats_torch_compile_refuses_bad_arguments():
    with pytest.raises(ValueError, match="on_cpu"):
        check.beats_torch_compile(rmsnorm_variants.correct, on_cpu="maybe")
    with pytest.raises(ValueError, match="shapes"):
        check.beats_torch_compile(rmsnorm_variants.correct, shapes=[(4096,)])


@pytest.mark.gpu
def test_gpu_slow_kernel_loses_to_torch_compile_with_a_table():
    # A GPU-bound shape (512 MB a call): at 64 MB torch.compile's ~90 us call overhead
    # dominates and even this kernel "wins" (measured on an H100).
    with pytest.raises(AssertionError) as failure:
        check.beats_torch_compile(rmsnorm_variants.two_pass_slow, shapes=[(32768, 4096)],
                                  retries=2)
    message = str(failure.value)
    assert "32768x4096" in message and "SLOWER" in message and "speedup" in message


@pytest.mark.gpu
def test_gpu_beats_torch_compile_refuses_a_wrong_kernel_before_timing():
    with pytest.raises(AssertionError, match="not timed"):
        check.beats_torch_compile(rmsnorm_variants.wrong_row_offset, shapes=[(4096, 4096)])


def test_comparison_verdict_counts_a_tie_within_the_tolerance():
    def timing(yours_us, compiled_us):
        yours = bench.Measurement("yours", yours_us * 1e-6, 10**8, 3e12)
        compiled = bench.Measurement("compile", compiled_us * 1e-6, 10**8, 3e12)
        return ShapeTiming((4096, 4096), yours, compiled, attempts=2, tolerance=0.02)

    assert timing(100.0, 100.0).passed and timing(101.5, 100.0).passed
    assert not timing(103.0, 100.0).passed
    table = str(CompileComparison(torch.bfloat16, (timing(90.0, 100.0), timing(110.0, 100.0))))
    assert "4096x4096" in table and "1.11x" in table and "0.91x" in table
    assert "SLOWER (2 attempts)" in table and "passes at 0.98x or more" in table


@pytest.mark.gpu
def test_gpu_a_kernel_at_the_copy_ceiling_ties_torch_compile():
    result = check.beats_torch_compile(rmsnorm_variants.correct, shapes=[(32768, 4096)],
                                       quiet=True)
    (row,) = result.rows
    assert row.shape == (32768, 4096) and row.passed
    assert row.yours.fraction_of_copy > 0.8  # GPU-bound: no launch overhead compared


# Each chapter's speed check, with a correct answer: without a GPU it fails when asked to
# (on_cpu="fail"), and by default skips, saying why.
SPEED_CHECKS = {
    "two-pass report": (check.rmsnorm_two_pass_bandwidth, two_pass_variants.correct),
    "add + RMSNorm": (check.add_rmsnorm_bandwidth, add_rmsnorm_variants.correct),
    "LayerNorm": (check.layernorm_forward_bandwidth, layernorm_variants.correct),
    "backward": (check.rmsnorm_backward_bandwidth, backward_variants.correct),
    "against torch.compile": (check.beats_torch_compile, rmsnorm_variants.correct),
}


@no_gpu
@pytest.mark.parametrize("name", sorted(SPEED_CHECKS))
def test_speed_checks_need_a_gpu(name, capsys):
    checker, correct = SPEED_CHECKS[name]
    with pytest.raises(NeedsGPU, match="needs a GPU"):
        checker(correct, on_cpu="fail")
    assert checker(correct) is None
    assert "needs a GPU" in capsys.readouterr().out


@pytest.mark.skipif(runtime.on_gpu(), reason="tests what happens without a GPU")
def test_under_the_autograder_a_bandwidth_check_without_gpu_fails(monkeypatch):
    # A learner's notebook skips the bandwidth cell on a laptop; the same cell graded
    # without a GPU must not hand out the points.
    from course.runtime import GRADING_ENV

    monkeypatch.setenv(GRADING_ENV, "1")
    with pytest.raises(NeedsGPU, match="needs a GPU"):
        check.rmsnorm_forward_bandwidth(lambda x, w, eps=1e-6: x)
    with pytest.raises(NeedsGPU, match="needs a GPU"):
        check.beats_torch_compile(lambda x, w, eps=1e-6: x)
    with pytest.raises(NeedsGPU, match="needs a GPU"):
        check.rmsnorm_two_pass_bandwidth(lambda x, w, eps=1e-6: x)
    monkeypatch.setenv(GRADING_ENV, "0")
    assert check.rmsnorm_forward_bandwidth(lambda x, w, eps=1e-6: x) is None
