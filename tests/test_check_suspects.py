"""Known wrong answers are named: each common RMSNorm mistake fails with its own advice (and
no other suspect's), in the plain-PyTorch exercise of chapter 01 and in the kernel
exercise; chapter 01 refuses PyTorch's own RMSNorm and gives torch-level advice; chapter
02's check refuses functions that call into course.traffic."""

from __future__ import annotations

import dataclasses
import math
import sys

from course import check, reference, traffic
from course.check import sandbox
from course.check.cases import Case
from course.check.rmsnorm import (
    RMSNORM_FORWARD,
    SUSPECTS,
    padding_of_ones,
    whole_blocks_stored,
    whole_blocks_summed,
)
from course.check.suite import run_exercise
from course.check.torch_reference import TORCH_RMSNORM

import pytest
import rmsnorm_variants
import torch

ADVICE = {s.name: s.advice for s in TORCH_RMSNORM.suspects}


def _fails_naming(exercise, fn, name: str, seed: int = 3, *, alone: bool = True) -> str:
    """The failure message of `fn`, checked to carry suspect `name`'s advice and no other
    suspect's; `alone`: and no other advice either (the suspect explains every failure)."""
    report = run_exercise(exercise, fn, seed=seed)
    assert not report.passed
    message = report.message()
    suspects = {s.name: s.advice for s in exercise.suspects}
    assert suspects[name] in message, message
    for other, advice in suspects.items():
        if other != name:
            assert advice not in message, f"{name} was also blamed on {other}:\n{message}"
    if alone:
        assert len(report.advice) == 1 and report.advice[0].startswith(suspects[name]), message
    return message


# --------------------------------------------------------------- wrong PyTorch RMSNorms

def _rmsnorm(x, weight, eps, *, mean_square, eps_inside=True, weighted=True):
    h = x.to(torch.float32)
    if eps_inside:
        y = h * torch.rsqrt(mean_square(h * h) + eps)
    else:
        y = h / (torch.sqrt(mean_square(h * h)) + eps)
    return (y * weight.to(torch.float32) if weighted else y).to(x.dtype)


def _row_mean(squares):
    return squares.mean(dim=-1, keepdim=True)


def without_weight(x, weight, eps=1e-6):
    return _rmsnorm(x, weight, eps, mean_square=_row_mean, weighted=False)


def sum_not_mean(x, weight, eps=1e-6):
    return _rmsnorm(x, weight, eps, mean_square=lambda s: s.sum(dim=-1, keepdim=True))


def eps_outside_sqrt(x, weight, eps=1e-6):
    return _rmsnorm(x, weight, eps, mean_square=_row_mean, eps_inside=False)


def mean_over_dim_0(x, weight, eps=1e-6):
    return _rmsnorm(x, weight, eps, mean_square=lambda s: s.mean(dim=0, keepdim=True))


def mean_without_dim(x, weight, eps=1e-6):
    return _rmsnorm(x, weight, eps, mean_square=lambda s: s.mean())


@pytest.mark.parametrize("name, fn", [
    ("weight_not_applied", without_weight),
    ("sum_instead_of_mean", sum_not_mean),
    ("eps_outside_sqrt", eps_outside_sqrt),
    ("mean_down_columns", mean_over_dim_0),
    ("mean_over_everything", mean_without_dim),
])
def test_each_torch_mistake_is_named_by_its_suspect(name, fn):
    _fails_naming(TORCH_RMSNORM, fn, name)


def without_eps(x, weight, eps=1e-6):
    return _rmsnorm(x, weight, 0.0, mean_square=_row_mean)


def test_a_missing_eps_is_named_not_blamed_on_a_kernel_that_never_wrote():
    report = run_exercise(TORCH_RMSNORM, without_eps, seed=3)
    message = report.message()
    assert len(report.advice) == 1, message
    assert report.advice[0].startswith("Rows of zeros come out NaN"), message
    assert "eps is missing from the square root" in message, message
    assert "never wrote" not in message, message


def returns_float32(x, weight, eps=1e-6):
    h = x.to(torch.float32)
    return h * torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + eps) * weight.to(torch.float32)


def hard_coded_eps(x, weight, eps=1e-6):
    return _rmsnorm(x, weight, 1e-6, mean_square=_row_mean)


@pytest.mark.parametrize("fn, phrase", [(returns_float32, "return y.to(x.dtype)"),
                                        (hard_coded_eps, "use the eps argument")])
def test_torch_exercise_advice_is_about_pytorch_not_a_kernel(fn, phrase):
    message = run_exercise(TORCH_RMSNORM, fn, seed=3).message()
    assert phrase in message, message
    assert "kernel" not in message and "y_ptr" not in message, message


def test_eps_outside_the_root_fails_only_where_eps_matters():
    report = run_exercise(TORCH_RMSNORM, eps_outside_sqrt, seed=3)
    failing = {r.case.name for r in report.results if not r.passed}
    assert "custom eps" in failing and "power-of-two N" not in failing


def rstd_rounded_to_input_dtype(x, weight, eps=1e-6):
    h = x.to(torch.float32)
    rstd = torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + eps).to(x.dtype)
    return x * rstd * weight


def statistics_in_input_dtype(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps) * weight


def test_an_upcast_rstd_rounded_to_bf16_is_told_to_keep_rstd_in_float32():
    message = _fails_naming(TORCH_RMSNORM, rstd_rounded_to_input_dtype, "rstd_rounded", seed=2)
    assert "Keep rstd in float32" in message
    # It did upcast and ran no 16-bit reduction: the statistics-in-16-bits finding is absent.
    assert "Your statistics are computed in 16 bits" not in message


def test_statistics_in_16_bits_are_not_blamed_on_a_rounded_rstd():
    report = run_exercise(TORCH_RMSNORM, statistics_in_input_dtype, seed=2)
    message = report.message()
    assert "Your statistics are computed in 16 bits" in message
    assert ADVICE["rstd_rounded"] not in message


def test_the_kernel_only_suspect_is_not_offered_to_the_torch_exercise():
    names = {s.name for s in TORCH_RMSNORM.suspects}
    assert "divided_by_block" not in names
    assert names >= {s.name for s in SUSPECTS} - {"divided_by_block"}


FIRST_TORCH_CASES = dataclasses.replace(TORCH_RMSNORM, cases=TORCH_RMSNORM.cases[:3])


def test_writing_into_x_gets_torch_advice_not_kernel_advice():
    def scales_x_in_place(x, weight, eps=1e-6):
        h = x.to(torch.float32)  # x itself when x is float32
        h.mul_(torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + eps))
        return (h * weight).to(x.dtype)

    message = run_exercise(FIRST_TORCH_CASES, scales_x_in_place, seed=0).message()
    assert "writes into an input: an in-place op" in message
    assert "x.to(torch.float32) returns x" in message
    assert "y_ptr" not in message and "x_ptr" not in message


@pytest.mark.parametrize("builtin", [
    lambda x, w, eps: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps),
    lambda x, w, eps: torch.rms_norm(x, (x.shape[-1],), w, eps),
], ids=["F.rms_norm", "torch.rms_norm"])
def test_pytorchs_own_rmsnorm_is_refused_with_the_line_that_called_it(builtin):
    def wraps_builtin(x, weight, eps=1e-6):
        return builtin(x, weight, eps)

    with pytest.raises(AssertionError) as failure:
        check.torch_rmsnorm(wraps_builtin, seed=1, quiet=True)
    message = str(failure.value)
    assert "BuiltInRMSNormRefused" in message and "write the formula" in message
    assert "test_check_suspects.py, line" in message


def test_the_rmsnorm_module_is_refused_too():
    def module_rmsnorm(x, weight, eps=1e-6):
        norm = torch.nn.RMSNorm(x.shape[-1], eps=eps, dtype=x.dtype)
        with torch.no_grad():
            norm.weight.copy_(weight)
            return norm(x)

    report = run_exercise(FIRST_TORCH_CASES, module_rmsnorm, seed=0)
    assert all(r.error and "BuiltInRMSNormRefused" in r.error for r in report.results)


def test_a_correct_rmsnorm_with_float32_statistics_still_passes():
    def rmsnorm_torch(x, weight, eps=1e-6):
        h = x.to(torch.float32)
        rstd = torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + eps)
        return (h * rstd * weight.to(torch.float32)).to(x.dtype)

    assert check.torch_rmsnorm(rmsnorm_torch, seed=5, quiet=True).passed


# --------------------------------------------------------------- what the suspects model

def _inputs(shape, eps=1e-6):
    case = Case("probe", shape, torch.float32, eps=eps)
    gen = torch.Generator().manual_seed(0)
    return {k: g.tensor for k, g in RMSNORM_FORWARD.make_inputs(case, gen).items()}, case


def _suspect(name):
    return next(s for s in SUSPECTS if s.name == name)


def test_sum_for_mean_shrinks_every_row_by_the_square_root_of_n():
    t, case = _inputs((4, 300), eps=0.0)
    ratio = _suspect("sum_instead_of_mean").expected(t, case) / reference.rmsnorm(
        t["x"], t["weight"], eps=0.0)
    torch.testing.assert_close(ratio, torch.full_like(ratio, 1 / math.sqrt(300)))


def test_dividing_by_the_block_grows_rows_by_sqrt_block_over_n_and_only_for_odd_n():
    t, case = _inputs((4, 300), eps=0.0)
    ratio = _suspect("divided_by_block").expected(t, case) / reference.rmsnorm(
        t["x"], t["weight"], eps=0.0)
    torch.testing.assert_close(ratio, torch.full_like(ratio, math.sqrt(512 / 300)))
    t, case = _inputs((4, 256))
    assert _suspect("divided_by_block").expected(t, case) is None  # the block is the row


def test_padding_of_ones_is_matched_only_where_the_ones_change_the_answer():
    t, case = _inputs((4, 300))
    right = reference.rmsnorm(t["x"], t["weight"], eps=case.eps)
    squares = t["x"].double().square()
    # 212 ones: the lanes 300..511 of a block of 512.
    ones = t["x"].double() * torch.rsqrt((squares.sum(-1, keepdim=True) + 212) / 300
                                         + case.eps) * t["weight"].double()
    detail = padding_of_ones(t, case, ones.float())
    assert detail is not None and "212 extra ones" in detail and "a block of 512" in detail
    assert padding_of_ones(t, case, right.float()) is None
    assert padding_of_ones(t, case, (1.1 * right).float()) is None  # some other mistake
    t, case = _inputs((4, 256))  # no padding in a power-of-two row
    assert padding_of_ones(t, case, ones[:, :256].float()) is None


def _stored_up_to(right: torch.Tensor, k: int) -> torch.Tensor:
    with sandbox.watch():  # fresh memory holds the checker's poison
        y = torch.empty(right.shape, dtype=torch.float32, device=right.device)
    y[:, :k] = right[:, :k].float()
    return y


def test_whole_blocks_are_matched_only_where_a_loop_shows_them():
    t, case = _inputs((3, 3000))
    right = reference.rmsnorm(t["x"], t["weight"], eps=case.eps)
    x, w = t["x"].double(), t["weight"].double()

    def summed_up_to(k):
        return x * torch.rsqrt(x[:, :k].square().sum(-1, keepdim=True) / 3000 + case.eps) * w

    # Blocks of 512 in both loops: columns 2560.. neither summed nor stored.
    detail = whole_blocks_stored(t, case, _stored_up_to(summed_up_to(2560), 2560))
    assert detail is not None and "columns 2560..2999" in detail, detail
    assert "neither summed nor stored" in detail, detail
    assert "columns 2560..2999" in whole_blocks_summed(t, case, summed_up_to(2560).float())
    # The sum right, the stores short.
    detail = whole_blocks_stored(t, case, _stored_up_to(right, 2560))
    assert detail is not None and detail.endswith("were never stored"), detail
    # Up to 2048 (blocks of 1024) or 1024 (one block of 1024 and no loop): a power of two,
    # the same output as one block that size without a loop, which the tail rule (or the
    # wide rule) names.
    for k in (1024, 2048):
        assert whole_blocks_stored(t, case, _stored_up_to(summed_up_to(k), k)) is None
        assert whole_blocks_summed(t, case, summed_up_to(k).float()) is None
    assert whole_blocks_stored(t, case, right.float()) is None


# --------------------------------------------------------------- wrong Triton kernels

# Few, small cases: the interpreter is slow. Power-of-two and odd N, one row, one odd
# float16 case.
SMALL_KERNEL_CASES = dataclasses.replace(RMSNORM_FORWARD, cases=tuple(
    c for c in RMSNORM_FORWARD.cases
    if c.name in ("power-of-two N", "odd N", "M = 1", "strided rows", "float16, odd N")))


def test_a_kernel_dividing_by_its_block_is_named_not_taken_for_a_missing_mask():
    fn = rmsnorm_variants.divides_by_block
    message = _fails_naming(SMALL_KERNEL_CASES, fn, "divided_by_block")
    assert "not masked" not in message
    report = run_exercise(SMALL_KERNEL_CASES, fn, seed=3)
    passing = {r.case.name for r in report.results if r.passed}
    assert passing == {"power-of-two N", "strided rows"}  # N = 128: the block is the row


def test_a_kernel_without_the_weight_is_named():
    _fails_naming(SMALL_KERNEL_CASES, rmsnorm_variants.no_weight, "weight_not_applied")


# --------------------------------------------------------------- chapter 02: no traffic

def _bytes(M, N, elem_bytes):
    return 2 * M * N * elem_bytes + N * elem_bytes


def _flops(M, N):
    return 4 * M * N + 4 * M


def _intensity(flops, nbytes):
    return flops / nbytes


def _time_us(nbytes, bytes_per_s):
    return nbytes / bytes_per_s * 1e6


def test_a_roofline_function_that_calls_course_traffic_fails_even_when_right():
    from course.traffic import fused_rmsnorm  # a bare name escapes module patching

    def flops_from_the_model(M, N):
        return fused_rmsnorm(M, N, "fp32").flops

    previous = sys.getprofile()
    with pytest.raises(AssertionError) as failure:
        check.roofline_functions(_bytes, flops_from_the_model, _intensity, _time_us, seed=2,
                                 quiet=True)
    message = str(failure.value)
    assert "rmsnorm_flops is off: it calls course.traffic (fused_rmsnorm, flops)" in message
    assert "fused_rmsnorm_bytes is off" not in message
    assert sys.getprofile() is previous  # the hook is gone afterwards


def test_extra_roofline_cases_are_checked_and_validated():
    extremes = [(1, 262144, "fp32", 3.0e11), (65536, 1, torch.float16, 1.0e9)]
    report = check.roofline_functions(_bytes, _flops, _intensity, _time_us, seed=2,
                                      quiet=True, extra_cases=extremes)
    assert report.passed and (65536, 1) in [r.case.shape for r in report.results]

    def bytes_for_even_shapes_only(M, N, elem_bytes):
        return _bytes(M, N, elem_bytes) if N > 1 else 0

    with pytest.raises(AssertionError, match="fused_rmsnorm_bytes is off"):
        check.roofline_functions(bytes_for_even_shapes_only, _flops, _intensity, _time_us,
                                 seed=2, quiet=True, extra_cases=extremes)
    with pytest.raises(ValueError, match="N must be a positive int"):
        check.roofline_functions(_bytes, _flops, _intensity, _time_us, seed=2, quiet=True,
                                 extra_cases=[(4, 0, "fp32", 1e12)])
    with pytest.raises(ValueError, match="bandwidth must be a positive number"):
        check.roofline_functions(_bytes, _flops, _intensity, _time_us, seed=2, quiet=True,
                                 extra_cases=[(4, 4, "fp32", 0)])


def test_traffic_constants_alone_are_not_refused():
    # The rule is about the model's functions; reading the documented constants is fine.
    def flops_from_constants(M, N):
        return traffic.RMSNORM_FLOPS_PER_ELEMENT * M * N + traffic.RMSNORM_FLOPS_PER_ROW * M

    assert check.roofline_functions(_bytes, flops_from_constants, _intensity, _time_us,
                                    seed=2, quiet=True).passed
