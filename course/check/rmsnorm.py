"""Checkers for the RMSNorm exercises.

The learner writes `rmsnorm(x, weight, eps=1e-6) -> y`: y = x / sqrt(mean(x^2) + eps) * weight
over the last dimension of an input of any shape, y in x's dtype. A wrong output is also
compared with the answers of common mistakes (SUSPECTS: no weight, a sum for the mean, eps
outside the square root, rstd without its square root or not inverted, a statistic over the
wrong dimension, a division by the padded block, padding loaded as ones, a loop that leaves
out the last partial block, a weight loaded with a row offset), so that the message names
the bug.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from course import reference, runtime, traffic
from course.check.bandwidth import BandwidthResult, CallSpec, check_bandwidth
from course.check.cases import Case, row_shape_cases
from course.check.compare import compare
from course.check.inputs import GUARD_VALUE, guard_margin
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.runner import CaseResult, Exercise, Suspect, Tensors
from course.check.sandbox import poison_mask

import torch

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16


def _cases() -> tuple[Case, ...]:
    cases = [
        *row_shape_cases(),
        Case("3-D input", (2, 3, 64), f32, frozenset({"nd", "pow2"})),
        Case("rows of zeros", (6, 64), f32, frozenset({"zeros", "pow2"}), zero_rows=(1, 4)),
        Case("custom eps", (4, 64), f32, frozenset({"eps", "pow2"}), scale=0.05, eps=0.01),
        Case("float16", (8, 256), f16, frozenset({"half", "pow2"})),
        Case("float16, odd N", (9, 300), f16, frozenset({"half", "odd_n"})),
        Case("float16, large values", (4, 512), f16, frozenset({"half", "magnitude"}),
             scale=300.0),
        Case("bfloat16", (8, 256), bf16, frozenset({"half", "bf16", "pow2"})),
        Case("bfloat16, long rows", (4, 8192), bf16, frozenset({"half", "bf16", "long"}),
             offset=1.0, scale=0.5),
        Case("many rows", (257, 512), f16, frozenset({"half", "pow2"})),
        # Wider than every case above: a BLOCK_N fixed at 8192 (or 4096) covers those.
        Case("rows wider than 8192", (2, 10007), f32, frozenset({"wide", "odd_n"})),
    ]
    if runtime.on_gpu():  # sizes the interpreter would take minutes over
        cases += [
            Case("bfloat16, very long rows", (64, 65536), bf16,
                 frozenset({"half", "bf16", "long"}), offset=1.0, scale=0.5),
            Case("large M", (4099, 1024), bf16, frozenset({"half", "bf16", "pow2"})),
        ]
    return tuple(cases)


def _inputs(case: Case, gen: torch.Generator):
    return {"x": case.make_input(gen), "weight": case.make_vector(gen)}


def _call(fn: Callable, t: dict[str, torch.Tensor], case: Case):
    return fn(t["x"], t["weight"], eps=case.eps)


def _expected(t: dict[str, torch.Tensor], case: Case):
    return (reference.rmsnorm(t["x"], t["weight"], eps=case.eps),)


# ------------------------------------------------------------------ known wrong answers
# Each computes, in float64, what a common mistake returns, so that a failing output that
# matches one is named for its bug instead of described by its numbers.


def _wrong_rmsnorm(t: Tensors, case: Case, mean_square: torch.Tensor, *,
                   eps_outside: bool = False, weighted: bool = True) -> torch.Tensor:
    """x / sqrt(mean_square + eps) * weight with one of the statistics or steps wrong."""
    x64 = t["x"].to(torch.float64)
    if eps_outside:
        scale = 1.0 / (mean_square.sqrt() + case.eps)
    else:
        scale = torch.rsqrt(mean_square + case.eps)
    y = x64 * scale
    return y * t["weight"].to(torch.float64) if weighted else y


def _squares(t: Tensors) -> torch.Tensor:
    return t["x"].to(torch.float64).square()


def _without_weight(t: Tensors, case: Case) -> torch.Tensor:
    return _wrong_rmsnorm(t, case, _squares(t).mean(dim=-1, keepdim=True), weighted=False)


def sum_not_mean(t: Tensors, case: Case) -> torch.Tensor:
    return _wrong_rmsnorm(t, case, _squares(t).sum(dim=-1, keepdim=True))


def eps_outside_sqrt(t: Tensors, case: Case) -> torch.Tensor:
    return _wrong_rmsnorm(t, case, _squares(t).mean(dim=-1, keepdim=True), eps_outside=True)


def rstd_misshapen(t: Tensors, case: Case, got: torch.Tensor, *, of: str = "x") -> str | None:
    """A detail when y is x times (mean(x^2) + eps) to a power other than -1/2, * weight: the
    square root left out (1 / (mean(x^2) + eps)), or the root mean square multiplied by
    instead of divided by (sqrt(mean(x^2) + eps)). `of` names the normalised tensor in the
    detail (chapter 05 normalises h)."""
    x64 = t["x"].to(torch.float64)
    mean_square_eps = _squares(t).mean(dim=-1, keepdim=True) + case.eps
    w = t["weight"].to(torch.float64)
    for wrong, what in (
            (x64 / mean_square_eps, f"{of} / (mean({of}^2) + eps) * weight: the square root "
             "is missing"),
            (x64 * mean_square_eps.sqrt(), f"{of} * sqrt(mean({of}^2) + eps) * weight: the "
             "RMS multiplied by, not divided by")):
        if compare("y", got, wrong * w, got.dtype) is None:
            return f"y is {what}"
    return None


# eps values a wrapper or kernel may hard-code instead of passing the argument on.
COMMON_EPS = (1e-5, 1e-6)


def constant_eps(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """A detail when y is RMSNorm with one of COMMON_EPS other than the case's own, where
    that differs from the right answer beyond the tolerance (elsewhere a y wrong in some other
    way, by a bit or two, would match every eps), and from the answer without eps (a missing
    eps has its own advice)."""
    mean_square = _squares(t).mean(dim=-1, keepdim=True)
    for other in (case.eps, 0.0):
        if compare("y", got, _wrong_rmsnorm(t, replace(case, eps=other), mean_square),
                   got.dtype) is None:
            return None
    for eps in COMMON_EPS:
        if eps == case.eps:
            continue
        want = _wrong_rmsnorm(t, replace(case, eps=eps), mean_square)
        if compare("y", got, want, got.dtype) is None:
            return f"y is what eps = {eps:g} gives, where the case passed eps = {case.eps:g}"
    return None


def _centred(t: Tensors) -> torch.Tensor:
    x = t["x"].to(torch.float64)
    return x - x.mean(dim=-1, keepdim=True)


def variance_not_mean_square(t: Tensors, case: Case) -> torch.Tensor:
    # rstd from the row's variance, LayerNorm's statistic; x itself not centred.
    return _wrong_rmsnorm(t, case, _centred(t).square().mean(dim=-1, keepdim=True))


def layernorm_without_bias(t: Tensors, case: Case) -> torch.Tensor:
    centred = _centred(t)
    rstd = torch.rsqrt(centred.square().mean(dim=-1, keepdim=True) + case.eps)
    return centred * rstd * t["weight"].to(torch.float64)


def _mean_down_columns(t: Tensors, case: Case) -> torch.Tensor:
    # Every leading dimension flattened into rows, then the mean taken across the rows.
    squares = _squares(t)
    per_column = squares.reshape(-1, case.n).mean(dim=0)
    return _wrong_rmsnorm(t, case, per_column.expand_as(squares))


def _mean_over_everything(t: Tensors, case: Case) -> torch.Tensor:
    squares = _squares(t)
    return _wrong_rmsnorm(t, case, squares.mean().expand_as(squares))


def _divided_by_block(t: Tensors, case: Case) -> torch.Tensor | None:
    block = 1 << (case.n - 1).bit_length()  # triton.next_power_of_2(N)
    if block == case.n:
        return None  # then the block is the row and the answer is right
    return _wrong_rmsnorm(t, case, _squares(t).sum(dim=-1, keepdim=True) / block)


def _blocks(n: int) -> list[int]:
    """The power-of-two block sizes a kernel may take for rows of n columns: 1 up to
    triton.next_power_of_2(n) (a loop over the row takes a smaller one)."""
    return [1 << e for e in range((n - 1).bit_length() + 1)]


def padding_of_ones(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """A detail when y is what a load with other=1.0 gives: each masked lane past the end of
    the row adds 1.0 to the sum of squares, cdiv(N, B) * B - N of them for blocks of B
    (B = next_power_of_2(N) for one block a row). Only where that differs from the right
    answer beyond the tolerance."""
    n = case.n
    total = _squares(t).sum(dim=-1, keepdim=True)
    right = _wrong_rmsnorm(t, case, total / n)
    seen = set()
    for block in reversed(_blocks(n)):  # one block a row first
        padding = -(-n // block) * block - n
        if padding == 0 or padding in seen:
            continue
        seen.add(padding)
        want = _wrong_rmsnorm(t, case, (total + padding) / n)
        if compare("y", want.to(got.dtype), right, got.dtype) is None:
            continue  # too few ones to tell
        if compare("y", got, want, got.dtype) is None:
            where = (f"a block of {block}" if block > n
                     else f"the last of its blocks of {block}")
            return (f"y is what {padding} extra ones in each row's sum of squares give: the "
                    f"{padding} lanes past N = {n} in {where}")
    return None


def _whole_blocks(t: Tensors, case: Case, got: torch.Tensor, *, stored: bool) -> str | None:
    """A detail when y is what a loop over whole blocks only gives (range(0, n_cols - BLOCK_N
    + 1, BLOCK_N), or n_cols // BLOCK_N blocks), in the sum of squares and, if `stored`, in
    the stores: the columns from k = (N // B) * B on neither summed nor (if `stored`)
    written, B a power of two. Only where k is not a power of two: a kernel without a loop,
    whose one block of B columns covers part of a longer row, leaves out the columns from
    B on, and has its own advice (the tail rule, "only rows longer than one block")."""
    n = case.n
    x = t["x"].to(torch.float64).reshape(-1, n)
    w = t["weight"].to(torch.float64)
    y = got.reshape(-1, n)
    unwritten = poison_mask(got.detach()).reshape(-1, n)
    right = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + case.eps) * w
    for k in dict.fromkeys((n // block) * block for block in reversed(_blocks(n))):
        if k == n or (k & (k - 1) == 0 and k > 0):
            continue
        partial = x[:, :k].square().sum(dim=-1, keepdim=True) / n
        summed_part = x * torch.rsqrt(partial + case.eps) * w
        if stored:
            if not bool(unwritten[:, k:].all()):
                continue
            if k == 0:
                return (f"rows of {n} columns are shorter than one block: the loop ran no "
                        "block, and nothing of y was stored")
            head = y[:, :k]
            if compare("y", head, summed_part[:, :k], got.dtype) is None:
                return (f"columns {k}..{n - 1} of rows of {n}, past the last whole block, "
                        f"were neither summed nor stored (rstd summed columns 0..{k - 1})")
            if compare("y", head, right[:, :k], got.dtype) is None:
                return (f"columns {k}..{n - 1} of rows of {n}, past the last whole block, "
                        "were never stored")
        elif compare("y", got, summed_part.reshape(got.shape), got.dtype) is None:
            if k == 0:
                return (f"rows of {n} columns are shorter than one block: the sum's loop ran "
                        "no block, and rstd = 1 / sqrt(eps)")
            return (f"rstd summed the squares of columns 0..{k - 1} of rows of {n}, the "
                    f"whole blocks, and left out columns {k}..{n - 1}")
    return None


def whole_blocks_stored(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    return _whole_blocks(t, case, got, stored=True)


def whole_blocks_summed(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    return _whole_blocks(t, case, got, stored=False)


def _something_stored(results: Sequence[CaseResult]) -> bool:
    """Some case's y was written somewhere (a kernel that stores nothing anywhere is not
    looping over too few blocks, and has its own advice)."""
    return any(r.error is None and not any(m.name == "y" and m.all_poison
                                           for m in r.mismatches) for r in results)


def weight_row_offset(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    """A detail when y is what a weight loaded at w_ptr + row * stride + cols gives: row r
    times the memory r * stride entries past the weight's start (stride x's row stride, N,
    or 1 for w_ptr + row + cols). Past its end that is the checker's guard value, as far as
    the margin goes; the rows that read beyond it read memory nobody knows, and are left
    out."""
    n = case.n
    x = t["x"].to(torch.float64).reshape(-1, n)
    normalised = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + case.eps)
    guard = torch.full((guard_margin(n),), GUARD_VALUE, dtype=torch.float64, device=x.device)
    memory = torch.cat([t["weight"].to(torch.float64), guard])
    y = got.reshape(-1, n)
    for stride in dict.fromkeys((n + case.row_padding, n, 1)):  # x's row stride, N, 1
        rows = [r for r in range(x.shape[0]) if r * stride + n <= memory.numel()]
        if len(rows) < 2 or (stride == 1 and n == 1):  # then the two coincide
            continue
        want = torch.stack([normalised[r] * memory[r * stride:r * stride + n] for r in rows])
        if compare("y", y[rows], want, got.dtype) is None:
            if stride == 1 < n:
                return ("row r of y is x's normalised row r times the weight shifted r "
                        "entries along (w_ptr + row + cols), and its last r columns times "
                        f"{GUARD_VALUE:g}, the value the checker keeps past the end of the "
                        "weight")
            return (f"row 1 of y is x's normalised row 1 times {GUARD_VALUE:g}, the value "
                    "the checker keeps past the end of the weight")
    return None


SUSPECTS = (
    Suspect("weight_not_applied", "y",
            "y lacks the weight: RMSNorm's output is x * rstd * weight, one weight per column. "
            "Multiply by the weight before converting y to x's dtype (in a kernel, load it with "
            "the same column offsets and mask as x).",
            expected=_without_weight),
    Suspect("sum_instead_of_mean", "y",
            "y is about sqrt(N) times too small: rstd is computed from the *sum* of the "
            "squares. RMSNorm uses their mean: divide the sum of squares by N (the row length) "
            "before adding eps and taking the square root.", expected=sum_not_mean),
    Suspect("eps_outside_sqrt", "y",
            "eps is added outside the square root: you divide by sqrt(mean(x^2)) + eps. "
            "RMSNorm adds it inside, rstd = 1 / sqrt(mean(x^2) + eps). With the default eps "
            "the two barely differ, so only rows with a small mean square or a larger eps "
            "show it.", expected=eps_outside_sqrt),
    Suspect("rstd_not_inverse_sqrt", "y",
            "rstd is not 1 / sqrt(mean(x^2) + eps): y is x scaled by 1 / (mean(x^2) + eps) "
            "(the square root left out) or by sqrt(mean(x^2) + eps) (the root mean square "
            "multiplied by instead of divided by). Compute rstd = 1.0 / tl.sqrt(tl.sum(x * x, "
            "axis=0) / n_cols + eps) and y = x * rstd * w (in PyTorch, rstd = "
            "torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)).",
            matches=rstd_misshapen),
    Suspect("constant_eps", "y",
            "eps is a constant of your own: use the eps argument you are given, all the "
            "way to where rstd is computed. With a small eps the two barely differ, so only "
            "rows with a small mean square (N = 1) or a non-default eps show it.",
            matches=constant_eps),
    Suspect("variance_not_mean_square", "y",
            "rstd comes from the row's variance, the squares of x - mean(x), as in LayerNorm. "
            "RMSNorm subtracts no mean: rstd = 1 / sqrt(mean(x^2) + eps), the mean of the "
            "squares of x as loaded. (Rows whose mean is near 0 barely differ, so a case may "
            "pass by chance.)", expected=variance_not_mean_square),
    Suspect("layernorm_without_bias", "y",
            "y is LayerNorm's (x - mean) * rstd * weight: RMSNorm subtracts no mean, neither "
            "in the statistic nor in y. y = x * rstd * weight, with rstd = 1 / sqrt(mean(x^2) "
            "+ eps).", expected=layernorm_without_bias),
    Suspect("mean_down_columns", "y",
            "The mean of squares is taken down each column, across the rows (dim 0), not "
            "along each row: every row needs its own statistic over its N values, the last "
            "dimension (in PyTorch, .mean(dim=-1, keepdim=True)).", expected=_mean_down_columns),
    Suspect("mean_over_everything", "y",
            "One mean of squares for the whole tensor: the mean is taken over every element "
            "(a .mean() without dim?), so all rows share one rstd. Each row needs its own, over "
            "the last dimension: .mean(dim=-1, keepdim=True).", expected=_mean_over_everything),
    Suspect("weight_row_offset", "y",
            "y's first row is right, but each later row is scaled by memory past the end of "
            "the weight: the weight is loaded with a row offset (w_ptr + row * stride + cols). "
            "The weight is one row of N entries that every row of x shares: load it at "
            "w_ptr + cols, with the row's mask, the same in every program.",
            matches=weight_row_offset),
    Suspect("padding_of_ones", "y",
            "The masked lanes' fill value enters the sum: x is loaded with other=1.0 (or "
            "another value that is not 0), so every lane past the end of the row adds its "
            "square to sum(x * x), and rows whose N is not a power of two get a wrong rstd. "
            "The mask is right; its fill is not. Load x with other=0.0: the padding must add "
            "nothing to sum(x * x).", matches=padding_of_ones),
    Suspect("whole_blocks_stored", "y",
            "Your loop over the row stops before its last, partial block (range(0, n_cols - "
            "BLOCK_N + 1, BLOCK_N), or n_cols // BLOCK_N blocks): the columns from the last "
            "whole block to N are never summed nor stored, and a row shorter than one block "
            "gets no block at all. Loop over triton.cdiv(n_cols, BLOCK_N) blocks, for start in "
            "range(0, n_cols, BLOCK_N), in both loops, and mask the last one: cols = start + "
            "tl.arange(0, BLOCK_N), mask = cols < n_cols, in every load and store.",
            matches=whole_blocks_stored, across=_something_stored),
    Suspect("whole_blocks_summed", "y",
            "The loop that sums the squares stops before the row's last, partial block "
            "(range(0, n_cols - BLOCK_N + 1, BLOCK_N), or n_cols // BLOCK_N blocks): the "
            "columns from the last whole block to N are stored but never summed, so rstd "
            "leaves them out (a row shorter than one block sums nothing). Loop over "
            "triton.cdiv(n_cols, BLOCK_N) blocks, for start in range(0, n_cols, BLOCK_N), and "
            "mask the last one: cols = start + tl.arange(0, BLOCK_N), tl.load(..., "
            "mask=cols < n_cols, other=0.0).", matches=whole_blocks_summed),
    Suspect("divided_by_block", "y",
            "The sum of squares is divided by BLOCK_N, the padded block size, instead of N: "
            "rows whose length is a power of two pass, the others come out sqrt(BLOCK_N / N) "
            "times too large. The masked lanes add zeros to the sum but are not elements of "
            "the row: divide by n_cols.", expected=_divided_by_block),
)

RMSNORM_FORWARD = Exercise(
    name="rmsnorm_forward",
    signature="rmsnorm(x, weight, eps=1e-6) -> y",
    cases=_cases(),
    make_inputs=_inputs,
    call=_call,
    expected=_expected,
    output_names=("y",),
    max_launches=1,
    suspects=SUSPECTS,
)


@learner_facing
def rmsnorm_forward(fn: Callable, *, seed: int | None = None, max_launches: int = 1,
                    quiet: bool = False) -> Report:
    """Check a learner's `rmsnorm(x, weight, eps=1e-6)` on every case; raise AssertionError
    with advice on failure (and, for a failure about addresses, pictures of what the kernel
    touched: course.check.address_pictures), return the report (printed unless quiet) on
    success."""
    from course.check.address_pictures import check_with_pictures  # imports Triton

    exercise = RMSNORM_FORWARD
    if max_launches != exercise.max_launches:
        exercise = replace(exercise, max_launches=max_launches)
    return check_with_pictures(exercise, fn, seed=seed, quiet=quiet)


@learner_facing
def rmsnorm_forward_bandwidth(fn: Callable, *, target: float = 0.75,
                              shape: tuple[int, int] = (16384, 4096),
                              dtype: torch.dtype | None = None, retries: int = 3,
                              on_cpu: str = "skip") -> BandwidthResult | None:
    """On a GPU: check the output at `shape` against the reference, require one load of
    each element of x (a two-pass kernel loads it twice, and its second read may come from
    L2 fast enough to pass), then `target` of the copy bandwidth (ideal bytes: read x and
    the weight once, write y once). Every call is held to the correctness checks' rules and
    every timed output checked (`check_bandwidth`). Without a GPU, the loads are counted on
    a few rows of N columns in Triton's interpreter before the check says it needs one."""
    if dtype is None:
        dtype = bf16 if runtime.supports_bf16() else f16
    m, n = shape
    label = f"rmsnorm {m}x{n} {str(dtype).replace('torch.', '')}"

    def make_args(rows: int = m):
        return (torch.randn((rows, n), dtype=dtype, device=runtime.DEVICE),
                torch.rand(n, dtype=dtype, device=runtime.DEVICE) + 0.5)

    nbytes = traffic.fused_rmsnorm(m, n, dtype).bytes
    return check_bandwidth(label, fn, make_args, nbytes, spec=forward_call_spec(dtype),
                           target=target, retries=retries, on_cpu=on_cpu,
                           small_args=lambda: make_args(4),
                           advice="A fused kernel reads each row once: keep the "
                           "row in registers, BLOCK_N = next_power_of_2(N), and choose "
                           "num_warps by block size (8 or 16 for N of several thousand).")


def forward_call_spec(dtype: torch.dtype) -> CallSpec:
    """What makes one call of chapter 04's `rmsnorm` right at a timing shape: y, one launch,
    no element of x loaded twice, and nothing the call allocates (y, or a buffer it does
    not return) loaded at all."""
    return CallSpec(("y",), lambda x, w: reference.rmsnorm(x, w, eps=1e-6), (dtype,),
                    max_launches=RMSNORM_FORWARD.max_launches, arg_names=("x", "weight"),
                    read_once="x", read_once_advice=ONE_READ_ADVICE,
                    scratch_advice=SCRATCH_ADVICE)


ONE_READ_ADVICE = (
    "Chapter 04 asks for one read of x: chapter 03's two-pass kernel reads each row once to "
    "sum its squares and again to normalise it. Load the whole row once, as one block "
    "(BLOCK_N = triton.next_power_of_2(N)), and compute both the sum of squares and y from "
    "those values, kept in registers.")

SCRATCH_ADVICE = (
    "Chapter 04 keeps the row in registers: load x once, compute the sum of squares and y "
    "from the values tl.load gave you (x.to(tl.float32)), and store y once; load nothing "
    "your kernel stored, in y or in a buffer of its own.")
