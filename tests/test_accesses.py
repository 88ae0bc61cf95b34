"""The access recorder (course.accesses), its picture (course.access_picture) and the
pictures under a failed check (course.check.address_pictures), in Triton's interpreter.

For each address bug a chapter-04 learner writes, the failing check's picture names the
bug, and the accesses it recorded are those the kernel makes, worked out here from the
kernel's code and the picture's shape. To keep this file fast the checks run on the float32
row cases (those that tell these bugs apart); one runs the whole check.
"""

from __future__ import annotations

from dataclasses import replace

import course
from course import access_picture, accesses, check, runtime
from course.access_picture import MAX_COLS, MAX_ROWS, show_accesses
from course.check import address_pictures
from course.check.address_pictures import check_with_pictures, small_case
from course.check.cases import row_shape_cases
from course.check.layernorm import LAYERNORM_FORWARD
from course.check.rmsnorm import RMSNORM_FORWARD
from course.check.two_pass import TWO_PASS

import pytest
import rmsnorm_variants as variants
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(not runtime.interpreted(),
                                reason="records launches in Triton's interpreter")

# The float32 row cases, less the 3000-column one (slow in the interpreter for a kernel
# that loops over blocks of 16, and not needed to tell these bugs apart).
ROW_CASES = replace(RMSNORM_FORWARD, cases=tuple(c for c in row_shape_cases()
                                                 if "wide" not in c.tags))


# ---------------------------------------------------------------- wrong kernels


def grid_of_one(x, weight, eps=1e-6):
    """The right kernel, launched as one program."""
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    n = x2.shape[1]
    variants.rmsnorm_kernel[(1,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps,
                                  BLOCK_N=triton.next_power_of_2(n))
    return y.view(x.shape)


ROWS_PER_PROGRAM = 4


@triton.jit
def _rows_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (cols < n_cols)[None, :]  # the columns only: the last program's extra rows too
    x = tl.load(x_ptr + rows[:, None] * stride_x_row + cols[None, :], mask=mask,
                other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows[:, None] * stride_y_row + cols[None, :],
             (x * rstd[:, None] * w[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


def rows_without_row_mask(x, weight, eps=1e-6):
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    m, n = x2.shape
    _rows_kernel[(triton.cdiv(m, ROWS_PER_PROGRAM),)](
        x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK_M=ROWS_PER_PROGRAM,
        BLOCK_N=triton.next_power_of_2(n))
    return y.view(x.shape)


COLUMN_BLOCK = 16


@triton.jit
def _column_blocks_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                          BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    lanes = tl.arange(0, BLOCK_N)
    mask = lanes < n_cols  # the block's own lanes, not start + lanes: the last block overruns
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        x = tl.load(x_ptr + row * stride_x_row + start + lanes, mask=mask,
                    other=0.0).to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK_N):
        x = tl.load(x_ptr + row * stride_x_row + start + lanes, mask=mask,
                    other=0.0).to(tl.float32)
        w = tl.load(w_ptr + start + lanes, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride_y_row + start + lanes,
                 (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def last_block_past_the_end(x, weight, eps=1e-6):
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    _column_blocks_kernel[(x2.shape[0],)](x2, weight, y, x2.stride(0), y.stride(0),
                                          x2.shape[1], eps, BLOCK_N=COLUMN_BLOCK)
    return y.view(x.shape)


# ---------------------------------------------------------------- what each kernel does
# Lanes on, as offsets from the tensor's first element, per program: worked out from the
# kernels above for rows M, N columns, x's row stride S (y is contiguous).


def _block(n: int) -> int:
    return triton.next_power_of_2(n)


def _rows_of(programs, per_program, lanes, stride):
    return {p: {r * stride + j for r in per_program(p) for j in range(lanes)}
            for p in range(programs)}


def expected_missing_mask(m, n, s):
    return (_rows_of(m, lambda p: [p], _block(n), s), _rows_of(m, lambda p: [p], _block(n), n))


def expected_wrong_row_offset(m, n, s):
    return _rows_of(m, lambda p: [0], n, s), _rows_of(m, lambda p: [p], n, n)


def expected_grid_of_one(m, n, s):
    return _rows_of(1, lambda p: [0], n, s), _rows_of(1, lambda p: [0], n, n)


def expected_rows_without_row_mask(m, n, s):
    programs = triton.cdiv(m, ROWS_PER_PROGRAM)
    rows = lambda p: range(p * ROWS_PER_PROGRAM, (p + 1) * ROWS_PER_PROGRAM)  # noqa: E731
    return _rows_of(programs, rows, n, s), _rows_of(programs, rows, n, n)


def expected_ignores_row_stride(m, n, s):
    return _rows_of(m, lambda p: [p], n, n), _rows_of(m, lambda p: [p], n, n)  # stride N


def expected_right_rows(m, n, s):
    return _rows_of(m, lambda p: [p], n, s), _rows_of(m, lambda p: [p], n, n)


def expected_last_block(m, n, s):
    lanes = triton.cdiv(n, COLUMN_BLOCK) * COLUMN_BLOCK
    return _rows_of(m, lambda p: [p], lanes, s), _rows_of(m, lambda p: [p], lanes, n)


def lanes_on(t: accesses.TensorAccesses, kind: str) -> dict[int, set[int]]:
    """What the recorder saw: per program, the offsets of every lane on (inside the
    tensor's elements or not)."""
    stride = t.layout.row_stride
    found = {p: {r * stride + c for r, c in cells} for p, cells in t.by_program(kind).items()}
    for p, offsets in t.beyond(kind).items():
        found.setdefault(p, set()).update(offsets)
    return found


BUGS = {
    "missing mask": (variants.missing_mask, "the mask is missing", expected_missing_mask),
    "wrong row offset": (variants.wrong_row_offset, "every program read row 0 of x: the "
                         "load's row offset is missing", expected_wrong_row_offset),
    "grid of one program": (grid_of_one, "the grid has 1 program for", expected_grid_of_one),
    "rows per program without a row mask": (rows_without_row_mask, "there is no row mask",
                                            expected_rows_without_row_mask),
    "stride ignored on strided input": (variants.ignores_row_stride, "the row offset uses N "
                                        "(the row length) instead of x's row stride",
                                        expected_ignores_row_stride),
    "a last block past the end": (last_block_past_the_end, "the last block of each row runs "
                                  "past its end", expected_last_block),
    "weight row offset": (variants.weight_row_offset, "its load takes no row offset",
                          expected_right_rows),
    "weight without a mask": (variants.weight_without_mask, "with no mask on that load",
                              expected_right_rows),
}

# The weight's loads, for the bugs that are the weight's: offsets per program.
WEIGHT_LOADS = {
    "weight row offset": lambda m, n, s: _rows_of(m, lambda p: [p], n, s),
    "weight without a mask": lambda m, n, s: {p: set(range(_block(n))) for p in range(m)},
}


def failed_check_pictures(fn, whole_check: bool = False):
    with pytest.raises(AssertionError) as failure:
        if whole_check:
            check.rmsnorm_forward(fn, seed=11)
        else:
            check_with_pictures(ROW_CASES, fn, seed=11)
    pictures = failure.value.pictures
    assert len(pictures) == 2, str(failure.value)
    for picture in pictures:  # the message names what each picture shows
        assert picture.caption in str(failure.value)
    return pictures


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_failed_check_pictures_the_bug_and_records_what_the_kernel_did(bug):
    fn, named, expected = BUGS[bug]
    yours, correct = failed_check_pictures(fn, whole_check=bug == "grid of one program")
    assert named.lower() in yours.caption.lower(), yours.caption
    assert yours.wrong and not correct.wrong
    x, y = yours.tensors["x"], yours.tensors["y"]
    m, n, s = x.layout.rows, x.layout.cols, x.layout.row_stride
    want_x, want_y = expected(m, n, s)
    assert lanes_on(x, accesses.LOAD) == want_x
    assert lanes_on(y, accesses.STORE) == want_y
    if bug in WEIGHT_LOADS:
        assert lanes_on(yours.tensors["weight"], accesses.LOAD) == WEIGHT_LOADS[bug](m, n, s)
    # A correct kernel on the same input: program p reads and writes row p, masked past N.
    cx, cy = correct.tensors["x"], correct.tensors["y"]
    assert (cx.layout, cy.layout) == (x.layout, y.layout)
    assert cx.by_program(accesses.LOAD) == {p: {(p, c) for c in range(n)} for p in range(m)}
    assert cy.by_program(accesses.STORE) == {p: {(p, c) for c in range(n)} for p in range(m)}
    assert cx.masked(accesses.LOAD) == {p: {p * s + j for j in range(n, _block(n))}
                                        for p in range(m) if _block(n) > n}
    assert not cx.beyond(accesses.LOAD) and not cy.beyond(accesses.STORE)


def test_a_weight_loaded_with_a_row_offset_is_told_the_weight_is_one_shared_row():
    with pytest.raises(AssertionError) as failure:
        check_with_pictures(ROW_CASES, variants.weight_row_offset, seed=3)
    message = str(failure.value)
    assert "the weight is loaded with a row offset" in message, message
    assert "one row of N entries that every row of x shares" in message, message
    # not blamed on x's or y's row offset, which are right
    assert "Row 0 is right" not in message and "x_ptr + row" not in message, message


def test_a_weight_loaded_without_a_mask_fails_though_every_value_is_right():
    # The lanes past the weight's end are left out of the masked store: only the recorded
    # loads show them, on the case whose N (100) is not a power of two.
    with pytest.raises(AssertionError) as failure:
        check_with_pictures(ROW_CASES, variants.weight_without_mask, seed=3)
    message = str(failure.value)
    assert "Your kernel loads past the end of an input" in message, message
    assert ("Seen on odd N (7x100, float32): programs 0–6 each read 28 element(s) past the "
            "end of weight[100..127]") in message, message
    assert "its load takes the same mask" in message, message
    failing = [line for line in message.splitlines() if " FAIL " in line]
    assert len(failing) == 1 and "odd N" in failing[0] and "input_read_outside" in failing[0]


def test_a_3d_inputs_own_stride_is_pictured_as_skipped_rows_not_a_missing_row_mask():
    three_d = replace(RMSNORM_FORWARD, cases=tuple(c for c in RMSNORM_FORWARD.cases
                                                   if "nd" in c.tags))
    with pytest.raises(AssertionError) as failure:
        check_with_pictures(three_d, variants.stride_of_the_3d_input, seed=11)
    yours, correct = failure.value.pictures
    # 2 x 3 x 16: x.stride(0) is 48, three rows, so program p reads row 3p.
    assert yours.caption.startswith("program p read row 3·p of x (program 5 row 15; x has 6 "
                                    "rows): the row offset steps 3 rows (48 elements)"), \
        yours.caption
    assert "48 is x.stride(0) of the 3-D x" in yours.caption, yours.caption
    assert "x2.stride(0)" in yours.caption and "row mask" not in yours.caption, yours.caption
    assert lanes_on(yours.tensors["x"], accesses.LOAD) == {p: {48 * p + j for j in range(16)}
                                                           for p in range(6)}
    assert not correct.wrong


def test_lanes_outside_every_tensor_are_listed_and_not_performed():
    # Program p of the missing-mask kernel at 3 x 12 runs 4 lanes past the row; the last
    # program's lie past the end of x and y, which are plain tensors here: reading or
    # writing there would touch memory no tensor owns.
    x, weight = torch.randn(3, 12), torch.rand(12)
    picture = show_accesses(variants.missing_mask, x, weight)
    y = picture.tensors["y"]
    assert y.beyond(accesses.STORE) == {2: {36, 37, 38, 39}}
    assert y.refused(accesses.STORE) == {2: {36, 37, 38, 39}}
    assert picture.tensors["weight"].refused(accesses.LOAD) == {p: {12, 13, 14, 15}
                                                                for p in range(3)}
    assert any(line.startswith("program 2 wrote 4 element(s) past the end of y[36..39]")
               and "not performed" in line for line in picture.outside), picture.outside
    assert any(line.startswith("programs 0–2 each read 4 element(s) past the end of weight")
               for line in picture.outside), picture.outside


@triton.jit
def _far_store_kernel(x_ptr, y_ptr, n_cols, BLOCK_N: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + cols, mask=cols < n_cols)
    tl.store(y_ptr + (1 << 40) + cols, x, mask=cols < n_cols)  # 2**40 elements away


def far_store(x):
    y = torch.empty_like(x)
    _far_store_kernel[(1,)](x, y, x.shape[-1], BLOCK_N=triton.next_power_of_2(x.shape[-1]))
    return y


def test_a_store_far_outside_is_recorded_instead_of_crashing_the_process():
    # Without the recorder the interpreter would write 2**42 bytes past y, and the process
    # would die (or worse, not).
    x = torch.randn(1, 8)
    with accesses.record() as recording:
        y = far_store(x)
    picture = access_picture.picture(recording, {"x": x}, {"y": y}, title="far_store")
    far = picture.tensors[accesses.FAR]
    # Addresses cannot say which pointer a lane outside every tensor came from: offsets are
    # counted from the nearest tensor, x or y, whichever the allocator put closer.
    nearest = {"x": x, "y": y}[far.near]
    stored = [y.data_ptr() + 4 * ((1 << 40) + j) for j in range(8)]
    assert far.refused(accesses.STORE) == {0: {(a - nearest.data_ptr()) // 4 for a in stored}}
    assert not picture.tensors["y"].by_program(accesses.STORE)
    assert picture.caption.startswith("program 0 wrote 8 element(s) far outside every tensor "
                                      "the launch was given"), picture.caption
    assert any(line.startswith(f"program 0 wrote 8 element(s) {accesses.FAR}") and
               line.endswith("not performed: outside every tensor the launch was given")
               for line in picture.outside), picture.outside


@triton.jit
def _crash_in_program_2_kernel(x_ptr, y_ptr, stride, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask)
    if row == 2:
        x += tl.arange(0, 3)  # not a power of two: the interpreter raises here
    tl.store(y_ptr + row * stride + cols, x, mask=mask)


def crashes_in_program_2(x):
    y = torch.empty_like(x)
    _crash_in_program_2_kernel[(x.shape[0],)](x, y, x.stride(0), x.shape[1], BLOCK_N=16)
    return y


def test_a_kernel_that_raises_mid_launch_gets_the_picture_of_what_it_did_before():
    picture = show_accesses(crashes_in_program_2, torch.randn(4, 12))
    assert picture.caption.startswith("program 2 of _crash_in_program_2_kernel raised "
                                      "ValueError: arange's range must be a power of 2")
    assert "what the launch did until then" in picture.caption
    x, y = picture.tensors["x"], picture.tensors["y_ptr"]  # y: never returned
    assert x.by_program(accesses.LOAD) == {p: {(p, c) for c in range(12)} for p in range(3)}
    assert y.by_program(accesses.STORE) == {p: {(p, c) for c in range(12)} for p in range(2)}
    assert picture.figure() is not None


def test_show_accesses_on_a_correct_kernel_draws_each_program_on_its_row():
    x, weight = torch.randn(5, 12), torch.rand(12)
    picture = show_accesses(variants.correct, x, weight)
    assert not picture.wrong
    assert picture.caption.startswith("each program p read row p and wrote row p")
    assert [(t.name, kind) for t, kind in picture.panels()] == [("x", "load"), ("y", "store")]
    html = picture._repr_html_()
    assert '<img alt="correct"' in html and "each program p read row p" in html
    assert picture.png()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_tensor_too_large_to_draw_is_refused_naming_the_largest_that_can_be():
    with pytest.raises(ValueError, match=rf"largest the picture draws is {MAX_ROWS} rows of "
                                         rf"{MAX_COLS} columns"):
        course.show_accesses(variants.correct, torch.randn(MAX_ROWS + 1, 8), torch.rand(8))
    padded = torch.randn(4, MAX_COLS + 8)[:, :MAX_COLS - 4]  # fits, but not with its padding
    with pytest.raises(ValueError, match=r"with its row padding, 72 columns"):
        course.show_accesses(variants.correct, padded, torch.rand(MAX_COLS - 4))


def test_recording_leaves_ordinary_launches_as_they_were():
    from triton.runtime.interpreter import GridExecutor, InterpreterBuilder

    before = (GridExecutor.__call__, InterpreterBuilder.create_masked_load,
              InterpreterBuilder.create_masked_store)
    with accesses.record() as recording:
        pass
    after = (GridExecutor.__call__, InterpreterBuilder.create_masked_load,
             InterpreterBuilder.create_masked_store)
    assert after == before and not recording.launches
    x, weight = torch.randn(3, 12), torch.rand(12)
    torch.testing.assert_close(variants.correct(x, weight), course.reference.rmsnorm(
        x, weight).float(), rtol=1e-5, atol=1e-5)


def test_on_a_gpu_show_accesses_says_how_to_see_the_picture(monkeypatch):
    monkeypatch.setattr(runtime, "interpreted", lambda: False)
    picture = show_accesses(variants.correct, torch.randn(2, 4), torch.rand(4))
    assert "COURSE_DEVICE=cpu" in picture.caption and picture.figure() is None


def test_a_failure_not_about_addresses_gets_no_picture():
    with pytest.raises(AssertionError, match="lacks the weight") as failure:
        check_with_pictures(ROW_CASES, variants.no_weight, seed=3)
    assert failure.value.pictures == []


def test_the_smaller_case_keeps_what_makes_the_case_fail_and_can_be_drawn():
    for case in RMSNORM_FORWARD.cases:
        small = small_case(case)
        rows, n = small.rows, small.n
        assert rows <= MAX_ROWS and n + (small.row_padding if rows > 1 else 0) <= MAX_COLS
        assert (n & (n - 1) == 0) == (case.n & (case.n - 1) == 0), case
        assert n % 16 == case.n % 16 and rows % 16 == case.rows % 16, case
        assert bool(small.row_padding) == bool(case.row_padding)


# ------------------------------------------- chapter 03's and chapter 06's checks, the same way

@triton.jit
def _two_pass_by_n_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc) / n_cols + eps)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * n_cols + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
                 mask=mask)


def two_pass_by_n(x, weight, eps=1e-6):
    """Chapter 03's two-pass kernel with its row offset from N, not x's row stride."""
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    _two_pass_by_n_kernel[(x2.shape[0],)](x2, weight, y, x2.shape[1], eps, BLOCK_N=16)
    return y.view(x.shape)


@triton.jit
def _layernorm_unmasked_kernel(x_ptr, w_ptr, b_ptr, y_ptr, stride_x, stride_y, n_cols, eps,
                               BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + row * stride_x + cols).to(tl.float32)
    mean = tl.sum(x) / n_cols
    diff = x - mean
    rstd = 1.0 / tl.sqrt(tl.sum(diff * diff) / n_cols + eps)
    w = tl.load(w_ptr + cols).to(tl.float32)
    b = tl.load(b_ptr + cols).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (diff * rstd * w + b).to(y_ptr.dtype.element_ty))


def layernorm_unmasked(x, weight, bias, eps=1e-5):
    """Chapter 06's LayerNorm with no mask: the block past N reads the next row."""
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    _layernorm_unmasked_kernel[(x2.shape[0],)](x2, weight, bias, y, x2.stride(0), y.stride(0),
                                               x2.shape[1], eps,
                                               BLOCK_N=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)


def _float32_rows(exercise):
    return replace(exercise, cases=tuple(c for c in exercise.cases if c.dtype == torch.float32
                                         and "wide" not in c.tags))


@pytest.mark.parametrize("checker, exercise, fn, named", [
    ("rmsnorm_two_pass", TWO_PASS, two_pass_by_n, "instead of x's row stride"),
    ("layernorm_forward", LAYERNORM_FORWARD, layernorm_unmasked, "the mask is missing"),
])
def test_the_two_pass_and_layernorm_checks_picture_an_address_bug_too(checker, exercise, fn,
                                                                       named, monkeypatch):
    with pytest.raises(AssertionError) as failure:
        check_with_pictures(_float32_rows(exercise), fn, seed=11)
    yours, correct = failure.value.pictures
    assert named in yours.caption.lower() and yours.wrong and not correct.wrong, yours.caption
    assert yours.caption in str(failure.value)
    # and the chapter's checker is the one that makes them
    used = []
    monkeypatch.setattr(address_pictures, "check_with_pictures",
                        lambda exercise, fn, **kw: used.append(exercise))
    getattr(check, checker)(fn)
    assert used == [exercise]


@pytest.mark.parametrize("wrap, given", [
    (accesses._load, ("ptrs", "mask", "other", "cache_modifier", "eviction_policy", False)),
    (accesses._load, ("ptrs", "mask", "other", "cache_policy", False)),
    (accesses._store, ("ptrs", "value", "mask", "cache_modifier", "eviction_policy")),
    (accesses._store, ("ptrs", "value", "mask", "cache_policy"))])
def test_the_interpreters_loads_and_stores_get_every_argument_of_either_triton(wrap, given):
    """Triton 3.6's interpreter builder takes a cache modifier and an eviction policy where
    3.9's takes one cache policy: the recording's wrappers pass on what they are given (with
    a fixed list, every kernel failed under 3.6, seen on the GPU machine's image)."""
    passed = []
    wrapped = wrap(lambda self, *args: passed.append(args) or "done",
                   accesses.Recording(), None)
    assert wrapped("builder", *given) == "done" and passed == [given]
