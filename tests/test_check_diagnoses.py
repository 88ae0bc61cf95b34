"""Advice for bugs whose numbers look like another bug's: a mean divided by BLOCK_N fails the
same cases as a missing mask, and a fused add + RMSNorm that normalises the unrounded sum
passes every tolerance. Each kernel here is a mistake a learner really writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import course  # noqa: F401  (the execution mode is chosen before any kernel is defined)
from course import check, runtime, validation
from course.check import sandbox
from course.check.cases import Case
from course.check.compare import Mismatch, compare
from course.check.diagnose import advise
from course.check.runner import CaseResult

import add_rmsnorm_variants
import pytest
import rmsnorm_variants
import torch
import triton
import triton.language as tl
import two_pass_variants

BLOCK_ADVICE = "Divide by n_cols, not BLOCK_N"
MASK_ADVICE = "not masked"
WIDE_ADVICE = "Only rows longer than one block fail"


# --------------------------------------------------------------------------- kernels


@triton.jit
def _add_rmsnorm_unrounded_kernel(x_ptr, residual_ptr, weight_ptr, y_ptr, residual_out_ptr,
                                  stride_x_row, stride_residual_row, stride_y_row,
                                  stride_residual_out_row, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(residual_ptr + row * stride_residual_row + cols, mask=mask,
                other=0.0).to(tl.float32)
    h = x + r
    tl.store(residual_out_ptr + row * stride_residual_out_row + cols,
             h.to(residual_out_ptr.dtype.element_ty), mask=mask)
    # The bug: the statistics and y use the float32 sum, not the rounded one just stored.
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols, (h * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


def add_rmsnorm_unrounded(x, residual, weight, eps=1e-6):
    x_rows = validation.as_rows(x)
    residual_rows = validation.check_same_rows(x, residual, "residual")
    validation.check_param(x, weight, "weight")
    eps = validation.check_eps(eps)
    M, N = x_rows.shape
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(y)
    _add_rmsnorm_unrounded_kernel[(M,)](
        x_rows, residual_rows, weight, y, residual_out, x_rows.stride(0),
        residual_rows.stride(0), y.stride(0), residual_out.stride(0), N, eps,
        BLOCK_N=triton.next_power_of_2(N))
    return y.view(x.shape), residual_out.view(x.shape)


def _failure(checker, fn, seed: int = 3) -> str:
    with pytest.raises(AssertionError) as failure:
        checker(fn, seed=seed, quiet=True)
    return str(failure.value)


# --------------------------------------------------------------------------- BLOCK_N


def test_two_pass_mean_divided_by_block_n_is_named_not_blamed_on_the_mask():
    message = _failure(check.rmsnorm_two_pass,
                       two_pass_variants.mean_over_block)
    assert BLOCK_ADVICE in message, message
    # The factor seen is quoted with the block it implies: rows of 100 in a block of 128.
    assert "sqrt(128 / 100)" in message, message
    assert MASK_ADVICE not in message and WIDE_ADVICE not in message, message


def test_two_pass_that_sums_only_the_first_block_gets_the_loop_advice_not_block_n():
    message = _failure(check.rmsnorm_two_pass,
                       two_pass_variants.sums_first_block_only)
    assert WIDE_ADVICE in message, message
    assert BLOCK_ADVICE not in message, message


def test_fused_mean_divided_by_block_n_is_named_not_blamed_on_the_mask():
    message = _failure(check.rmsnorm_forward, rmsnorm_variants.divides_by_block)
    # Named by the forward checker's own suspect or by the generic rule: either way the
    # advice is the division, never the masks, which are right.
    assert "BLOCK_N" in message and "n_cols" in message, message
    assert MASK_ADVICE not in message, message


def _scaled_case(name: str, n: int, factors: list[float], tags: set[str]) -> CaseResult:
    """A failing float32 case whose three examples are the expected values times `factors`."""
    want = (0.8, -1.3, 0.45)
    examples = tuple(((row, 0), w, w * f)
                     for row, (w, f) in enumerate(zip(want, factors, strict=True)))
    mismatch = Mismatch(name="y", n_rows=3, n_cols=n, bad_rows=(0, 1, 2),
                        bad_cols=tuple(range(n)), n_bad=3 * n, n_poison=0, poison_cols=(),
                        max_abs_err=1.0, examples=examples)
    return CaseResult(Case(name, (3, n), torch.float32, frozenset(tags)), (mismatch,))


def _passing_case(name: str, n: int, tags: set[str]) -> CaseResult:
    return CaseResult(Case(name, (3, n), torch.float32, frozenset(tags)))


def test_block_rule_needs_one_factor_per_case_that_implies_a_power_of_two():
    power_of_two = _passing_case("power-of-two N", 128, {"pow2"})
    # Rows of 100 scaled by sqrt(128 / 100), rows of 3000 by sqrt(4096 / 3000).
    by_block = [power_of_two,
                _scaled_case("odd N", 100, [(128 / 100) ** 0.5] * 3, {"odd_n"}),
                _scaled_case("wide rows", 3000, [(4096 / 3000) ** 0.5] * 3, {"odd_n", "wide"})]
    assert BLOCK_ADVICE in advise(by_block)[0]
    # Each row off by its own factor: not one division, so the mask rule speaks instead.
    row_by_row = [power_of_two,
                  _scaled_case("odd N", 100, [1.13, 1.21, 0.94], {"odd_n"}),
                  _scaled_case("wide rows", 3000, [1.17, 1.05, 1.31], {"odd_n", "wide"})]
    assert MASK_ADVICE in advise(row_by_row)[0]
    # One factor per case, but sqrt(1.7) implies a divisor of 170 for rows of 100: no block.
    no_block = [power_of_two,
                _scaled_case("odd N", 100, [1.7 ** 0.5] * 3, {"odd_n"}),
                _scaled_case("wide rows", 3000, [(4096 / 3000) ** 0.5] * 3, {"odd_n", "wide"})]
    assert BLOCK_ADVICE not in advise(no_block)[0]


# --------------------------------------------------------------------------- add + RMSNorm


def test_add_rmsnorm_that_normalises_the_unrounded_sum_is_refused_with_the_rule():
    message = _failure(check.add_rmsnorm, add_rmsnorm_unrounded)
    assert "not of the sum you store in residual_out" in message, message
    assert "eager PyTorch" in message, message
    # The numbers behind it: how often y sided with each sum where they round differently.
    assert "y takes the exact sum's" in message, message


def test_only_the_bitwise_case_can_see_the_unrounded_sum():
    with pytest.raises(AssertionError) as failure:
        check.add_rmsnorm(add_rmsnorm_unrounded, seed=11, quiet=True)
    report_text = str(failure.value)
    failing = [line for line in report_text.splitlines() if " FAIL " in line]
    # Every tolerance-based case passes this kernel; the stored-sum case alone refuses it.
    assert len(failing) == 1 and "y of the stored sum" in failing[0], report_text


# --------------------------------------------------------------------------- row strides


@triton.jit
def _add_rmsnorm_kernel(x_ptr, residual_ptr, weight_ptr, y_ptr, residual_out_ptr,
                        stride_x_row, stride_residual_row, stride_y_row,
                        stride_residual_out_row, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(residual_ptr + row * stride_residual_row + cols, mask=mask,
                other=0.0).to(tl.float32)
    h = (x + r).to(residual_out_ptr.dtype.element_ty)
    tl.store(residual_out_ptr + row * stride_residual_out_row + cols, h, mask=mask)
    h = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols, (h * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


def add_rmsnorm_with_the_3d_residuals_stride(x, residual, weight, eps=1e-6):
    """Issue #34's mistake: the residual's rows view is checked but not used; the kernel
    gets the residual itself and residual.stride(0), which for a 3-D residual steps over a
    whole block of rows."""
    x_rows = validation.as_rows(x)
    validation.check_same_rows(x, residual, "residual")  # its return value ignored
    validation.check_param(x, weight, "weight")
    eps = validation.check_eps(eps)
    M, N = x_rows.shape
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(y)
    _add_rmsnorm_kernel[(M,)](
        x_rows, residual, weight, y, residual_out, x_rows.stride(0), residual.stride(0),
        y.stride(0), residual_out.stride(0), N, eps, BLOCK_N=triton.next_power_of_2(N))
    return y.view(x.shape), residual_out.view(x.shape)


def test_a_3d_residuals_own_stride_gets_the_rows_views_stride_as_advice():
    message = _failure(check.add_rmsnorm, add_rmsnorm_with_the_3d_residuals_stride)
    failing = [line for line in message.splitlines() if " FAIL " in line]
    assert len(failing) == 1 and "3-D input" in failing[0], message
    advice = message.split("First wrong case")[0]
    # The stride of the tensor the kernel must receive: the rows view's, not the 3-D one's
    # the learner passed (the advice used to say "pass residual.stride(0)").
    assert "residual_rows.stride(0)" in advice, advice
    assert "x_rows.stride(0)" in advice, advice
    assert "pass residual.stride(0)" not in advice, advice
    assert "validation.check_same_rows(x, residual, \"residual\")" in advice, advice


def test_a_3d_inputs_own_stride_gets_the_rows_views_stride_in_every_rmsnorm_checker():
    def rmsnorm_with_the_3d_stride(x, weight, eps=1e-6):
        x2 = validation.as_rows(x)
        M, N = x2.shape
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)
        rmsnorm_variants.rmsnorm_kernel[(M,)](x, weight, y, x.stride(0), y.stride(0), N, eps,
                                              BLOCK_N=triton.next_power_of_2(N))
        return y.view(x.shape)

    for checker in (check.rmsnorm_forward, check.rmsnorm_two_pass):
        advice = _failure(checker, rmsnorm_with_the_3d_stride).split("First wrong case")[0]
        assert "Only the 3-D input fails" in advice, advice
        assert "x2.stride(0)" in advice and "validation.as_rows(x)" in advice, advice


# --------------------------------------------------------------------------- NaN


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_nan_the_code_computed_is_not_taken_for_memory_never_written(dtype):
    with sandbox.watch():
        y = torch.empty(4, 8, dtype=dtype, device=runtime.DEVICE)  # the checker's NaN
    zeros = torch.zeros(8, device=runtime.DEVICE)
    y[0] = 1.0
    y[1] = (zeros / zeros).to(dtype)   # 0 / 0 in float32, rounded: a missing eps
    y[2] = zeros.to(dtype) / zeros.to(dtype)  # 0 / 0 in the output's own dtype
    mismatch = compare("y", y, torch.ones(4, 8, dtype=torch.float64), dtype)
    assert mismatch.n_poison == 8 and mismatch.unwritten_rows == (3,)
    assert mismatch.n_computed_nan == 16
    text = mismatch.describe()
    assert "8 of them are NaN: memory your kernel never wrote" in text, text
    assert "16 of them are NaN that your code computed" in text, text


def test_a_kernel_without_eps_is_told_so_not_that_it_left_memory_unwritten():
    for checker, fn in ((check.rmsnorm_two_pass, two_pass_variants.missing_eps),
                        (check.add_rmsnorm, add_rmsnorm_variants.missing_eps)):
        message = _failure(checker, fn)
        assert message.split("\n\n")[1].startswith("Rows of zeros come out NaN"), message
        assert "eps is missing from the square root" in message, message
        assert "never wrote" not in message and "Compare your formula" not in message, message


def test_an_eps_of_the_kernels_own_is_named_whichever_constant_it_is():
    # (1e-6 itself, the default, is told apart by the pattern: only the custom eps fails.)
    for checker, fn in ((check.rmsnorm_forward, rmsnorm_variants.eps_of_its_own),
                        (check.add_rmsnorm, add_rmsnorm_variants.eps_of_its_own)):
        message = _failure(checker, fn)
        assert message.split("\n\n")[1].startswith("eps is a constant of your own"), message
        assert "Compare your formula" not in message, message


# --------------------------------------------------------------------------- masks


def test_a_mask_one_column_too_long_is_named_in_the_picture():
    message = _failure(check.rmsnorm_two_pass, two_pass_variants.mask_one_past_the_end)
    picture = message.split("What the kernels touched")[1]
    assert "stop exactly 1 column past the end" in picture, picture
    assert "the mask lets column n_cols (20) through" in picture, picture
    assert "The mask is missing" not in picture, picture


def test_a_loop_whose_mask_compares_with_block_n_is_not_told_only_to_loop():
    # Its columns past the first block were never written, and the advice had been "Make
    # the block cover the whole row ... or loop over the row in blocks": it loops already.
    message = _failure(check.rmsnorm_two_pass, two_pass_variants.second_mask_by_block)
    assert "Columns 1024 and beyond were never written" in message, message
    assert "a mask cols < BLOCK_N switches off every block after the first" in message, message


def test_padding_loaded_as_ones_is_named_not_blamed_on_a_missing_mask():
    # other=1.0 in x's load: the masks are right, but each masked lane adds 1.0 to the sum
    # of squares. It fails the cases a missing mask fails, and had been told to add masks.
    for checker in (check.rmsnorm_forward, check.rmsnorm_two_pass):
        message = _failure(checker, rmsnorm_variants.padding_of_ones)
        assert message.split("\n\n")[1].startswith(
            "The masked lanes' fill value enters the sum"), message
        assert "Load x with other=0.0: the padding must add nothing to sum(x * x)" in message
        # Rows of 100 in a block of 128 (triton.next_power_of_2(100)).
        assert "28 extra ones in each row's sum of squares" in message, message
        assert MASK_ADVICE not in message, message


def test_a_loop_that_stops_before_the_last_partial_block_is_told_to_loop_over_cdiv_blocks():
    # range(0, n_cols - BLOCK_N + 1, BLOCK_N): fine where N is a multiple of the block, the
    # columns past the last whole block never summed nor stored elsewhere (rows shorter than
    # a block: nothing at all). Its advice had been that its loads were not masked.
    messages = {checker: _failure(checker, two_pass_variants.whole_blocks_only)
                for checker in (check.rmsnorm_two_pass, check.rmsnorm_forward)}
    for message in messages.values():
        advice = message.split("\n\n")[1]
        assert advice.startswith("Your loop over the row stops before its last, partial "
                                 "block"), message
        assert "Loop over triton.cdiv(n_cols, BLOCK_N) blocks" in advice, message
        assert "rows of 100 columns are shorter than one block: the loop ran no block" in advice
        assert MASK_ADVICE not in message, message
    # The rows of 3000 in blocks of 1024 show the rest of the pattern.
    message = messages[check.rmsnorm_two_pass]
    assert "no program wrote any element of y" in message.split("What the kernels")[1]


def test_a_sum_that_stops_before_the_last_partial_block_is_told_so():
    # n_cols // BLOCK_N blocks in the sum's loop only: every column stored, rstd short.
    for checker in (check.rmsnorm_two_pass, check.rmsnorm_forward):
        message = _failure(checker, two_pass_variants.sums_whole_blocks_only)
        advice = message.split("\n\n")[1]
        assert advice.startswith("The loop that sums the squares stops before the row's "
                                 "last, partial block"), message
        assert "Loop over triton.cdiv(n_cols, BLOCK_N) blocks" in advice, message
        assert MASK_ADVICE not in message and WIDE_ADVICE not in message, message


# --------------------------------------------------------------------------- output order


def test_outputs_returned_in_the_wrong_order_are_called_swapped():
    message = _failure(check.add_rmsnorm, add_rmsnorm_variants.returns_outputs_swapped)
    assert message.split("\n\n")[1].startswith("The two outputs are swapped"), message
    assert "Return (y, residual_out)" in message, message
    assert "Compare your formula" not in message, message


def test_a_block_that_is_not_a_power_of_two_is_told_to_round_up():
    import layernorm_variants

    def block_of_n(x, weight, bias, eps=1e-5):  # BLOCK_N = N: fine at N = 128, refused at 100
        x2 = x.reshape(-1, x.shape[-1])
        y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        n = x2.shape[1]
        layernorm_variants.layernorm_kernel[(x2.shape[0],)](
            x2, weight, bias, y, x2.stride(0), y.stride(0), n, eps, BLOCK_N=n, ONE_PASS=False,
            BIAS=True, UNBIASED=False, CENTRE=True, MEAN_BY_BLOCK=False, VAR_BY_BLOCK=False,
            EPS_OUTSIDE=False, Y_CENTRED=True, VAR_CENTRED=True, WEIGHT=True,
            PARAMS_ROW_OFFSET=False, X_FILL=0.0, BIAS_FIRST=False,
            RSTD=0)
        return y.view(x.shape)

    with pytest.raises(AssertionError) as failure:
        check.layernorm_forward(block_of_n, seed=3, quiet=True)
    assert "BLOCK_N = triton.next_power_of_2(N)" in str(failure.value)


def test_a_block_n_hard_coded_to_the_widest_rows_of_the_checks_fails_on_wider_ones():
    # Chapter 04's widest case without a GPU had 8192 columns, chapter 05's 4096: a kernel
    # whose BLOCK_N was fixed at that width passed every visible and hidden case there.
    for checker, fn, block in ((check.rmsnorm_forward, rmsnorm_variants.block_of_8192, 8192),
                               (check.add_rmsnorm, add_rmsnorm_variants.block_of_4096, 4096)):
        message = _failure(checker, fn)
        assert f"Columns {block} and beyond were never written" in message, message
        assert "rows wider than 8192 (2x10007, float32)" in message, message


@pytest.mark.skipif(runtime.on_gpu(), reason="the weight is read far past its end")
def test_a_weight_loaded_at_xs_row_offset_is_named_in_the_fused_add_too():
    # It had been told that "each tensor [needs] its own row stride": the weight needs none.
    message = _failure(check.add_rmsnorm, add_rmsnorm_variants.weight_row_offset)
    assert "the weight is loaded with a row offset" in message, message
    assert "Row 0 is right but the other rows are wrong" not in message, message


@pytest.mark.skipif(not runtime.interpreted(), reason="only the interpreter records loads")
def test_a_weight_loaded_without_a_mask_fails_the_fused_add_as_it_fails_chapter_04():
    # Its values are right (the store is masked): the recorded loads of one case show it.
    message = _failure(check.add_rmsnorm, add_rmsnorm_variants.weight_without_mask)
    assert "Your kernel loads past the end of an input" in message, message
    assert "past the end of weight[100..127]" in message, message


def test_a_formula_wrong_everywhere_is_not_blamed_on_state_kept_between_calls():
    # On seed 3 the M = 1 row's mean is near 0, where a variance is a mean square: that case
    # passed, the probe's new values failed it, and the first paragraph said "Wrong when
    # called again: state carried between calls".
    message = _failure(check.rmsnorm_forward, rmsnorm_variants.variance_not_mean_square)
    assert "Wrong when called again" not in message, message
    row = next(line for line in message.splitlines() if line.strip().startswith("M = 1 ("))
    assert " ok " in row, message  # the case that passed by chance
    assert message.split("\n\n")[1].startswith("rstd comes from the row's variance"), message


# --------------------------------------------------------------------------- the grid

_GRID_OF_COLUMNS = """
import sys
sys.path.insert(0, {tests!r})
import course
from course import check
import add_rmsnorm_variants, rmsnorm_variants, two_pass_variants
for checker, fn in ((check.rmsnorm_two_pass, two_pass_variants.grid_of_columns),
                    (check.rmsnorm_forward, rmsnorm_variants.grid_of_columns),
                    (check.add_rmsnorm, add_rmsnorm_variants.grid_of_columns)):
    try:
        checker(fn, seed=3, quiet=True)
    except AssertionError as failure:
        print(str(failure).split(chr(10) + chr(10))[1])
        print("=====")
"""


@pytest.mark.slow
@pytest.mark.skipif(runtime.on_gpu(), reason="the interpreter's fence: on a GPU such stores "
                    "fault, and the context is lost")
def test_a_grid_of_one_program_per_column_is_named_instead_of_aborting_python():
    # Programs N > M reach far past every tensor: unfenced, the interpreter's stores there
    # corrupted the heap and the process aborted ("free(): invalid pointer"), in a notebook
    # a dead kernel and no message. A process of its own, so that this test survives that.
    script = _GRID_OF_COLUMNS.format(tests=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    messages = done.stdout.split("=====")[:-1]
    assert len(messages) == 3, done.stdout
    for message in messages:
        assert message.strip().startswith("Your kernel loads or stores far outside every "
                                          "tensor"), message
        assert "instead of (M,)?" in message and "grid = (M,)" in message, message
