"""Checkers for chapter 07's first exercise: the RMSNorm backward kernels.

The learner writes `rmsnorm_backward(x, weight, rstd, dy) -> (dx, dw)`. rstd is float32 of
shape x.shape[:-1], as a forward saved it; dx comes back in x's dtype, dw in the weight's.
dW is a sum over every row: each program of kernel 1 sums its own rows into a float32
partial row, and kernel 2 adds the partial rows up. No atomics, at most two launches.

dW's tolerance reflects that it is a sum over M rows: on top of the usual tolerance for
its dtype, each column may be off by the float32 rounding of summing |dy * x_hat| over the
rows (see `dw_sum_atol`).

The chapter grades dx and dw in separate cells (`only="dx"`, `only="dw"`): each output's
own mistakes cost that cell alone. The known wrong answers for a sum over rows (a partial
row never added, a loop that keeps only its last row, padding rows of a tile summed, a
workspace never cleared, a constant factor, the wrong sign) are built by `sum_suspects`,
which chapter 07's LayerNorm checker uses for dW and dB too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from course import reference, runtime, traffic
from course.check.bandwidth import BandwidthResult, CallSpec, check_bandwidth
from course.check.cases import Case
from course.check.compare import TOLERANCES
from course.check.inputs import guarded
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.runner import CaseResult, Exercise, Inputs, Suspect, Tensors
from course.check.suite import check_and_raise

import torch

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
F64 = torch.float64
_F32_UNIT = 2.0 ** -24


def _cases() -> tuple[Case, ...]:
    cases = [
        # M well above any sensible rows-per-program, so that several programs' partial
        # sums must be added up.
        Case("power-of-two N", (64, 128), f32, frozenset({"pow2"})),
        Case("odd N, odd M", (37, 100), f32, frozenset({"odd_n"})),
        Case("N = 1", (5, 1), f32, frozenset({"edge"})),
        Case("M = 1", (1, 257), f32, frozenset({"edge", "odd_n"})),
        Case("wide rows", (6, 3000), f32, frozenset({"wide", "odd_n"})),
        Case("strided rows", (16, 128), f32, frozenset({"strided"}), row_padding=40),
        Case("3-D input", (2, 8, 64), f32, frozenset({"nd", "pow2"})),
        Case("rows of zeros", (8, 64), f32, frozenset({"zeros", "pow2"}), zero_rows=(1, 4)),
        Case("float16", (32, 256), f16, frozenset({"half", "pow2"})),
        Case("bfloat16, float32 weight", (32, 256), bf16, frozenset({"half", "bf16", "pow2"}),
             param_dtype=f32),
    ]
    if runtime.on_gpu():
        cases += [
            Case("large M", (8192, 1024), bf16, frozenset({"half", "bf16", "pow2"})),
            Case("long rows", (512, 16384), bf16, frozenset({"half", "bf16", "long"})),
            # More rows than a GPU's split gives programs, and not a multiple of the rows a
            # program takes: the one GPU case whose last block is short (ROWS_LEFT_OVER).
            ROWS_LEFT_OVER,
        ]
    return tuple(cases)


# 20003 rows of 64: split_programs gives 16896 programs on 132 SMs (2 rows each, so 10002
# blocks, the last of one row), 7424 on 58 SMs (3 rows, 6668 blocks, the last of two).
ROWS_LEFT_OVER = Case("rows left over", (20003, 64), f32, frozenset({"pow2"}))


def _inputs(case: Case, gen: torch.Generator) -> Inputs:
    x = case.make_input(gen)
    rstd = reference.rmsnorm_rstd(x.tensor, case.eps).to(f32)  # as a forward saved it
    return {"x": x, "weight": case.make_vector(gen), "rstd": guarded(rstd),
            "dy": dy_like(case, gen)}


def _call(fn: Callable, t: Tensors, case: Case) -> object:
    return fn(t["x"], t["weight"], t["rstd"], t["dy"])


def _expected(t: Tensors, case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    return reference.rmsnorm_backward(t["x"], t["weight"], t["dy"], eps=case.eps)


def _dtypes(case: Case) -> tuple[torch.dtype, torch.dtype]:
    return (case.dtype, case.weight_dtype)


def dw_terms(t: Tensors) -> torch.Tensor:
    """dy * x_hat per element, rows flattened: dw is their column sum."""
    n = t["x"].shape[-1]
    x64 = t["x"].to(F64).reshape(-1, n)
    x_hat = x64 * t["rstd"].to(F64).reshape(-1, 1)
    return t["dy"].to(F64).reshape(-1, n) * x_hat


def dw_sum_atol(terms: torch.Tensor) -> torch.Tensor:
    """Per column of dw: the float32 rounding a correct sum of M terms may collect, taken
    as 4 * sqrt(M) units of the sum of the terms' magnitudes (rounding errors of a long sum
    add up like a random walk; the bound is loose enough for any order of summation)."""
    m = terms.shape[0]
    return 4.0 * math.sqrt(m) * _F32_UNIT * terms.abs().sum(dim=0)


def _extra_atol(name: str, t: Tensors, case: Case) -> torch.Tensor | None:
    return dw_sum_atol(dw_terms(t)) if name == "dw" else None


def padded_block(n: int) -> int:
    """BLOCK_N = triton.next_power_of_2(n): what a mean divided by the block, not by N,
    divides by."""
    return 1 << max(0, (n - 1).bit_length())


def _rowwise(t: Tensors, case: Case, *, weight: bool = True, projection: bool = True,
             mean: bool = True, over_block: bool = False) -> torch.Tensor:
    """dx with one of the usual slips: no weight in g, no term through rstd, a row sum
    where the row mean belongs, a mean over the padded block (BLOCK_N lanes, not N)."""
    x64, dy64 = t["x"].to(F64), t["dy"].to(F64)
    rstd = reference.rmsnorm_rstd(x64, case.eps).unsqueeze(-1)
    x_hat = x64 * rstd
    g = dy64 * t["weight"].to(F64) if weight else dy64
    if not projection:
        return rstd * g
    c = (x_hat * g).sum(dim=-1, keepdim=True)
    if over_block:
        c = c / padded_block(case.n)
    elif mean:
        c = c / case.n
    return rstd * (g - x_hat * c)


# --------------------------------------------------------------------------- sums over rows
# dW (and LayerNorm's dB) is a column sum of per-element terms over every row. The wrong
# answers below are the ways such a sum goes wrong; `sum_suspects` builds them for one
# output from a function giving its terms, (M, N) float64.

Terms = Callable[[Tensors, Case], torch.Tensor]


def _wrong(result: CaseResult, output: str) -> bool:
    return any(m.name == output for m in result.mismatches)


def _compared(result: CaseResult) -> bool:
    """The case ran, and its outputs were compared (no error, no unreadable output)."""
    return result.error is None and bool(result.outputs) and not any(
        f.kind in ("output_layout", "output_count") for f in result.findings)


def _right_somewhere(output: str) -> Callable[[Sequence[CaseResult]], bool]:
    def check(results: Sequence[CaseResult]) -> bool:
        return any(_compared(r) and not _wrong(r, output) for r in results)
    return check


def _kernel_received(output: str) -> Callable[[Sequence[CaseResult]], bool]:
    """Wrong in every case compared, and handed to a kernel in each (it was not left out
    of the kernels altogether)."""
    def check(results: Sequence[CaseResult]) -> bool:
        compared = [r for r in results if _compared(r)]
        never_passed = any(f.kind == "output_not_from_kernel" and f"`{output}`" in f.message
                           for r in results for f in r.findings)
        return bool(compared) and all(_wrong(r, output) for r in compared) and not never_passed
    return check


def _one_row_right(output: str) -> Callable[[Sequence[CaseResult]], bool]:
    """Right where M = 1 (nothing to add up) and wrong wherever M > 1."""
    def check(results: Sequence[CaseResult]) -> bool:
        compared = [r for r in results if _compared(r)]
        single = [r for r in compared if r.case.rows == 1]
        several = [r for r in compared if r.case.rows > 1]
        return (bool(single) and all(not _wrong(r, output) for r in single)
                and bool(several) and all(_wrong(r, output) for r in several))
    return check


def _nan_where_finite(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    have = got.detach().to(F64)
    if bool(torch.isnan(have).any()):
        return f"{int(torch.isnan(have).sum())} of its {have.numel()} values are NaN"
    return None


def _all_nan(name: str) -> Callable[[Tensors, Case, torch.Tensor], str | None]:
    def matches(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
        if bool(torch.isnan(got).all()):
            return f"{name} is all NaN"
        return None
    return matches


def _never_written(name: str) -> Callable[[Tensors, Case, torch.Tensor], str | None]:
    def matches(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
        if bool(torch.isnan(got).all()):
            return f"{name} is all NaN, memory that was never written"
        if bool((got == 0).all()):
            return f"{name} is all zeros"
        return None
    return matches


def _sum_close(sums: torch.Tensor, got: torch.Tensor, terms: torch.Tensor) -> torch.Tensor:
    """Which rows of `sums` (candidate answers, one per row) `got` matches, generously: any
    rounding passes, a row left out or added does not."""
    have = got.detach().to(F64).reshape(1, -1)
    tol = 1e-2 * (terms.abs().sum(dim=0) + 1e-6)
    return ((sums - have).abs() <= tol).all(dim=1)


def _partial_rows(name: str, terms_of: Terms) -> Callable:
    """`name` equal to the sum over the first k rows only (or the last k), k < M: the
    partial sums of one program, or of some programs, never added up with the others."""
    def matches(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
        terms = terms_of(t, case)
        m = terms.shape[0]
        if m < 2:
            return None
        prefix = terms.cumsum(dim=0)[:-1]                       # rows 0..k-1, k = 1..M-1
        suffix = terms.flip(0).cumsum(dim=0)[:-1]               # rows M-k..M-1
        for label, sums in (("first", prefix), ("last", suffix)):
            close = _sum_close(sums, got, terms)
            if bool(close.any()):
                k = int(close.nonzero()[0]) + 1
                rows = f"0..{k - 1}" if label == "first" else f"{m - k}..{m - 1}"
                return f"{name} equals the sum over rows {rows} only, {k} of the {m} rows"
        return None
    return matches


def _one_row_per_block(name: str, terms_of: Terms) -> Callable:
    """`name` equal to the sum of the last row of each block of k consecutive rows, 2 <= k:
    each program's loop overwrote its accumulator (or stored it every iteration), so its
    partial row holds its last row. Only the last: the first row of each block of two is
    also what a kernel 2 that adds every other partial row gives when every program has
    one row (P = M, as the split rule gives for short M on a GPU)."""
    def matches(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
        terms = terms_of(t, case)
        m = terms.shape[0]
        if m < 2:
            return None
        for k in range(2, m + 1):
            starts = torch.arange(0, m, k)
            lasts = torch.clamp(starts + k, max=m) - 1
            if bool(_sum_close(terms[lasts].sum(dim=0, keepdim=True), got, terms).all()):
                return (f"{name} equals the sum of the last row of each block of {k} "
                        f"rows ({len(lasts)} of the {m} rows)")
        return None
    return matches


def _factor(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> float | None:
    """c when got = c * want for one number c (not 1) in every element, within the rounding
    of `dtype`; None otherwise."""
    have, want = got.detach().to(F64).reshape(-1), want.to(F64).reshape(-1)
    if not bool(torch.isfinite(have).all()):
        return None
    energy = float((want * want).sum())
    if energy == 0.0 or float(want.abs().max()) < 1e-3:
        return None
    c = float((have * want).sum()) / energy
    if c == 0.0 or abs(c - 1.0) < 1e-2:
        return None
    atol, rtol = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    scale = float(want.abs().max())
    if float((have - c * want).abs().max()) > 4 * (atol + rtol * abs(c) * scale) + \
            1e-3 * abs(c) * scale:
        return None
    return c


def _factor_names(c: float, case: Case) -> str:
    """What a factor c may be, among the numbers of a case: N, M, a block size, 2."""
    n, m = case.n, case.rows
    block = padded_block(n)
    named = []
    for label, value in (("N, the row's length", n), ("M, the number of rows", m),
                         ("BLOCK_N = next_power_of_2(N)", block), ("2", 2)):
        for power, form in ((1, "{}"), (-1, "1 / ({})")):
            target = value ** power
            if value > 1 and abs(c / target - 1) < 1e-3:
                named.append(form.format(label))
    if named:
        return " = " + " or ".join(named)
    return ""


def constant_factor(name: str, want_of: Callable[[Tensors, Case], torch.Tensor],
                     sign: int | None = None) -> Callable:
    """`name` equal to the right answer times one number c (c = -1 when sign = -1; any other
    c, named where it is N, M, a block size or 2, when sign is None)."""
    def matches(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
        c = _factor(got, want_of(t, case), got.dtype)
        if c is None:
            return None
        if sign == -1:
            return f"{name} is minus the right value" if abs(c + 1) < 1e-2 else None
        if abs(c + 1) < 1e-2:
            return None
        return (f"every element of {name} is the right value times {c:.6g}"
                f"{_factor_names(c, case)} (here M = {case.rows}, N = {case.n})")
    return matches


def _rows_not_summed(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    return "" if case.rows > 1 else None


def sum_suspects(output: str, terms_of: Terms, *, what: str, zero_acc: str,
                 workspace: str) -> tuple[Suspect, ...]:
    """The known wrong answers of an output that is the sum over every row of per-element
    `terms_of(inputs, case)` (an (M, N) float64 tensor): dw = sum of dy * x_hat, db = sum
    of dy. `what` names the terms in messages ("dy * x_hat"); `zero_acc` is the
    accumulator's line (dw_acc = tl.zeros(...)); `workspace` the partial rows' name."""
    def want_of(t: Tensors, case: Case) -> torch.Tensor:
        return terms_of(t, case).sum(dim=0)

    upper = {"dw": "dW", "db": "dB"}.get(output, output)  # as the chapter writes them
    return (
        Suspect(f"{output}_padded_partials", output,
                f"{output} is NaN in some cases and right in others: kernel 2 adds up memory "
                f"that kernel 1 never wrote (here NaN, the checker's poison; on a GPU, other "
                f"data or a fault). Two slips do that. Kernel 2's tile reads rows past the P "
                f"partial rows of the {workspace}: it has BLOCK_P = next_power_of_2(P) rows, "
                f"and when P is not a power of two, BLOCK_P - P of them are padding. Mask the "
                f"tile's rows as well as its columns: mask = (rows < n_partials)[:, None] & "
                f"(cols < n_cols)[None, :], with other=0.0, so that the padding adds nothing. "
                f"Or kernel 1 leaves part of the {workspace} unwritten: program pid stores "
                f"its whole partial row at {output}_partial_ptr + pid * n_cols + cols (not "
                f"+ pid + cols, which makes the programs' rows overlap).",
                matches=_nan_where_finite, across=_right_somewhere(output)),
        Suspect(f"{output}_workspace_not_cleared", output,
                f"{output} is NaN in every case although your kernels received it: what "
                f"they added up was never written. Most likely the {workspace} was never "
                f"cleared: kernel 1 adds into partial rows (load, add, store) that nothing "
                f"set to zero first. torch.empty hands back whatever the memory held (here "
                f"NaN, the checker's poison; on a GPU, the previous call's sums or garbage). "
                f"Keep each program's running sum in registers ({zero_acc} before the loop) "
                f"and store it once after the loop, or allocate the {workspace} with "
                f"torch.zeros. (If not that: kernel 1 never stores its partial row, or "
                f"kernel 2 never stores {output}.)",
                matches=_all_nan(output), across=_kernel_received(output)),
        Suspect(f"{output}_never_computed", output,
                f"{upper} is never computed: {output} = sum over rows of {what}. Let kernel 1 "
                f"accumulate each program's rows into a float32 partial row, and kernel 2 "
                f"add the partial rows into {output}.", matches=_never_written(output)),
        Suspect(f"{output}_partial_rows", output,
                f"{upper} holds the sum of only some rows: the partial sums of the programs "
                f"of kernel 1 are not all added up. Write one float32 partial row per program "
                f"(partial[pid, :]), then launch a second kernel in which each program sums "
                f"one block of columns over all the partial rows and stores {output}.",
                matches=_partial_rows(output, terms_of)),
        Suspect(f"{output}_one_row_per_block", output,
                f"{upper} is not summed over the rows of each program: each partial row holds "
                f"one row's {what}, not the sum over the program's block of rows. Accumulate "
                f"inside the loop ({output}_acc += ..., not =), from {zero_acc} set once "
                f"before the loop, and store the partial row after the loop ends.",
                matches=_one_row_per_block(output, terms_of)),
        Suspect(f"{output}_wrong_sign", output,
                f"{upper} has the wrong sign: {output} = + sum over rows of {what}.",
                matches=constant_factor(output, want_of, sign=-1)),
        Suspect(f"{output}constant_factor", output,
                f"{upper} is off by a constant factor: every element is the right value "
                f"times the same number (below). {upper} = sum over rows of {what}, with "
                f"nothing divided or multiplied after the sum: look for a count (N, M, the "
                f"number of programs P, rows per program, a block size) that multiplies or "
                f"divides the sum, in kernel 1's accumulation or in kernel 2.",
                matches=constant_factor(output, want_of)),
        Suspect(f"{output}_rows_not_summed", output,
                f"{upper} is right only where there is one row (M = 1) and wrong wherever "
                f"there are several: it is not summed over all the rows. dW sums down the "
                f"columns, over every row of every program: each program adds its rows into "
                f"a float32 partial row ({output}_acc += ... in the loop), and kernel 2 adds "
                f"all P partial rows up.",
                matches=_rows_not_summed, across=_one_row_right(output)),
    )


def _dx(t: Tensors, case: Case) -> torch.Tensor:
    return _expected(t, case)[0]


def _dw_from(t: Tensors, *, normalised: bool, weighted: bool) -> torch.Tensor:
    """dw summed from x instead of x_hat, or from g = weight * dy instead of dy."""
    n = t["x"].shape[-1]
    x64 = t["x"].to(F64).reshape(-1, n)
    x = x64 * t["rstd"].to(F64).reshape(-1, 1) if normalised else x64
    dy = t["dy"].to(F64).reshape(-1, n)
    return ((dy * t["weight"].to(F64) if weighted else dy) * x).sum(dim=0)


SUSPECTS = (
    Suspect("dx_is_dy", "dx",
            "dx is dy unchanged (dX = dY: a published RMSNorm backward does exactly this). "
            "The gradient goes through the normalisation: with x_hat = x * rstd and "
            "g = weight * dy, dx = rstd * (g - x_hat * mean(x_hat * g)) per row.",
            expected=lambda t, c: t["dy"].to(F64)),
    Suspect("dx_without_projection", "dx",
            "dx = rstd * weight * dy misses the term that flows through rstd: every x_j "
            "changes the row's rms, so dx = rstd * (g - x_hat * mean(x_hat * g)) with "
            "g = weight * dy and x_hat = x * rstd.",
            expected=lambda t, c: _rowwise(t, c, projection=False)),
    Suspect("dx_sum_not_mean", "dx",
            "dx uses the row sum of x_hat * g where its mean belongs: divide that sum by N, "
            "dx = rstd * (g - x_hat * sum(x_hat * g) / N).",
            expected=lambda t, c: _rowwise(t, c, mean=False)),
    Suspect("dx_mean_over_block", "dx",
            "dx is right where N is a power of two and wrong elsewhere: c is divided by "
            "BLOCK_N, the padded block, where the mean over the row's N elements belongs. "
            "The lanes past N add 0 to the sum, but they must not count: "
            "c = tl.sum(x_hat * g, axis=0) / n_cols.",
            expected=lambda t, c: _rowwise(t, c, over_block=True)),
    Suspect("dx_without_weight", "dx",
            "dx leaves out the weight: the gradient reaching x_hat is g = weight * dy, in "
            "both places it appears, dx = rstd * (g - x_hat * mean(x_hat * g)).",
            expected=lambda t, c: _rowwise(t, c, weight=False)),
    Suspect("dx_wrong_sign", "dx",
            "dx has the wrong sign: dx = rstd * (g - x_hat * c), with c = mean(x_hat * g), "
            "g = weight * dy and x_hat = x * rstd.",
            matches=constant_factor("dx", _dx, sign=-1)),
    Suspect("dx_constant_factor", "dx",
            "dx is off by a constant factor: every element is the right value times the "
            "same number (below). dx = rstd * (g - x_hat * c): rstd once, and c = "
            "sum(x_hat * g) / N divided by N alone, nothing else.",
            matches=constant_factor("dx", _dx)),
    Suspect("dw_from_x", "dw",
            "dW is summed from the un-normalised x: dw = sum over rows of dy * x_hat, with "
            "x_hat = x * rstd, the value the weight multiplied in the forward, not x itself.",
            expected=lambda t, c: _dw_from(t, normalised=False, weighted=False)),
    Suspect("dw_from_g", "dw",
            "dW is summed from g = weight * dy: the weight multiplied x_hat in the forward, "
            "so its own gradient is dw = sum over rows of dy * x_hat, without the weight "
            "(g belongs to dx).", expected=lambda t, c: _dw_from(t, normalised=True,
                                                                    weighted=True)),
    *sum_suspects("dw", lambda t, c: dw_terms(t), what="dy * x_hat",
                  zero_acc="dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)",
                  workspace="workspace"),
)

# In the padded case x's rows and dy's are laid out apart (dy with half x's padding): a
# kernel that steps through dy with x's row stride, or the other way round, fails there.
STRIDED_ADVICE = (
    "Only the case with padded rows fails. There the inputs' rows are not N elements apart, "
    "and not the same distance apart either: x's rows are N + 40 elements apart, dy's "
    "N + 20. Each tensor needs its own row stride: pass x2.stride(0), dy2.stride(0) and "
    "dx.stride(0) to the kernel (as_rows and check_same_rows give the 2-D views), and offset "
    "each by its own, x_ptr + row * stride_x_row, dy_ptr + row * stride_dy_row, "
    "dx_ptr + row * stride_dx_row.")


# Kernel 1 loops over a block of rows: a block that runs past row M - 1 (no tl.minimum on
# its end) reads and writes past the tensors, which the generic advice (one program per
# row, mask the columns) does not name.
BLOCK_BOUNDS_ADVICE = {
    "output_margin_written": (
        "Your kernel writes outside a tensor your function allocated (its shape is below): "
        "past the end of a row, or past the last row. Mask each store with the columns' "
        "mask (cols < n_cols). And stop each program's block "
        "of rows at row M - 1: last = tl.minimum(first + rows_per_program, n_rows), since "
        "the last block is short when rows_per_program does not divide M."),
    "outside_every_tensor": (
        "Your kernel loads or stores far outside every tensor it was given. The check "
        "switched those lanes off; left alone, Triton's interpreter reads and writes whatever "
        "memory lies there (the notebook's kernel can crash), and a GPU stops with an "
        "illegal memory access. Check the blocks of rows: program pid owns rows "
        "first = pid * rows_per_program up to, not including, "
        "last = tl.minimum(first + rows_per_program, n_rows), and the grid has "
        "triton.cdiv(M, rows_per_program) programs. And check each pointer: a row of x, dy "
        "or dx starts at row * that tensor's own row stride, row pid of a workspace at "
        "pid * n_cols, and the weight takes no row offset (w_ptr + cols)."),
    # The one case whose blocks do not divide M (37 rows over 8 programs) has an odd N too.
    "mask": (
        "Cases where N is a power of two pass, the others fail. Are the loads (and stores) "
        "past the end of a row masked? Use cols = tl.arange(0, BLOCK_N), mask = cols < "
        "n_cols (not <=: column n_cols is already past the end), tl.load(..., mask=mask, "
        "other=0.0) and tl.store(..., mask=mask). If they are, and only the case of 37 rows "
        "fails, look at the rows instead: stop each program's block of rows at row M - 1."),
}


def dy_like(case: Case, gen: torch.Generator):
    """dy for a backward case: x's shape and dtype, its rows laid out with half x's padding."""
    return case.make_like_input(gen, row_padding=case.row_padding // 2)


RMSNORM_BACKWARD = Exercise(
    name="rmsnorm_backward",
    signature="rmsnorm_backward(x, weight, rstd, dy) -> (dx, dw)",
    cases=_cases(),
    make_inputs=_inputs,
    call=_call,
    expected=_expected,
    output_names=("dx", "dw"),
    max_launches=2,
    atomics_allowed=False,
    dtypes=_dtypes,
    extra_atol=_extra_atol,
    suspects=SUSPECTS,
    dtype_reasons={"dx": "x's dtype: compute in float32, store in x's dtype",
                   "dw": "the weight's dtype: accumulate in float32, store in weight.dtype"},
    advice={
        "input_written:dy": (
            "Your kernel writes dX over dY (into dy's memory): the caller still owns dy, and "
            "autograd may hand the same gradient to other branches of the graph. Allocate "
            "dx = torch.empty_like(x) and store dx there."),
        "input_written:rstd": ("Your kernel writes into rstd: it is the forward's saved "
                               "statistic, an input here. Only read it."),
        "extra_launches": (
            "This exercise allows two launches: kernel 1 computes dx and each program's "
            "partial dW sums (float32), kernel 2 adds the partial rows into dw."),
        "torch_ops": (
            "Your wrapper computes with PyTorch (a partial.sum(0) for dW counts too). Only "
            "allocation, views and your two kernel launches belong in the wrapper: reduce the "
            "partial sums in a second kernel."),
        "output_not_from_kernel": (
            "A tensor you return was never passed to a kernel, so no kernel computed it. "
            "Allocate dx (and the dw that kernel 2 writes), pass them to your kernels, and "
            "return them."),
        "strided": STRIDED_ADVICE,
        **BLOCK_BOUNDS_ADVICE,
    },
)


def graded_part(exercise: Exercise, only: str | Sequence[str] | None) -> Exercise:
    """`exercise` grading only the outputs `only` names (all of them for None): the
    others are neither compared nor traced to a kernel, and a rule that concerns only
    them (no atomics: a rule for the sums) is left to their own check."""
    if only is None:
        return exercise
    names = (only,) if isinstance(only, str) else tuple(only)
    unknown = [n for n in names if n not in exercise.output_names]
    if unknown or not names:
        raise ValueError(f"only= takes {' or '.join(map(repr, exercise.output_names))} "
                         f"(or several of them), not {only!r}")
    sums = {n for n in exercise.output_names if n != "dx"}
    return dataclasses.replace(
        exercise, name=f"{exercise.name} ({', '.join(names)})", graded=names,
        atomics_allowed=exercise.atomics_allowed or not (sums & set(names)),
        suspects=tuple(s for s in exercise.suspects if s.output in names))


@learner_facing
def rmsnorm_backward(fn: Callable, *, seed: int | None = None, quiet: bool = False,
                     only: str | None = None) -> Report:
    """Check a learner's `rmsnorm_backward(x, weight, rstd, dy) -> (dx, dw)` against
    `course.reference.rmsnorm_backward`; raise AssertionError with advice on failure.
    `only="dx"` or `only="dw"` grades that output alone (chapter 07's separate cells)."""
    return check_and_raise(graded_part(RMSNORM_BACKWARD, only), fn, seed=seed, quiet=quiet)


@learner_facing
def rmsnorm_backward_bandwidth(fn: Callable, *, target: float = 0.6,
                               shape: tuple[int, int] = (16384, 4096),
                               dtype: torch.dtype | None = None, retries: int = 3,
                               on_cpu: str = "skip") -> BandwidthResult | None:
    """On a GPU: check dx and dw at `shape`, then require `target` of the copy bandwidth.
    Ideal bytes (`course.traffic.ideal_backward_bytes`): x, dy and the weight read once,
    dx and dw written once; rstd and the partial sums are overheads a kernel pays for."""
    if dtype is None:
        dtype = bf16 if runtime.supports_bf16() else f16
    m, n = shape
    label = f"rmsnorm_backward {m}x{n} {str(dtype).replace('torch.', '')}"

    def make_args():
        x = torch.randn(shape, dtype=dtype, device=runtime.DEVICE)
        w = torch.rand(n, dtype=dtype, device=runtime.DEVICE) + 0.5
        rstd = torch.rsqrt(x.float().square().mean(-1) + 1e-6)
        return x, w, rstd, torch.randn(shape, dtype=dtype, device=runtime.DEVICE)

    spec = CallSpec(RMSNORM_BACKWARD.output_names,
                    lambda x, w, rstd, dy: reference.rmsnorm_backward(x, w, dy, eps=1e-6),
                    (dtype, dtype),
                    extra_atol=lambda x, w, rstd, dy: (
                        None, dw_sum_atol(dw_terms({"x": x, "rstd": rstd, "dy": dy}))),
                    max_launches=RMSNORM_BACKWARD.max_launches,
                    arg_names=("x", "weight", "rstd", "dy"))
    nbytes = traffic.ideal_backward_bytes(m, n, dtype)
    return check_bandwidth(label, fn, make_args, nbytes, spec=spec, target=target,
                           retries=retries,
                           on_cpu=on_cpu, advice="Kernel 1 should read x and dy once; give "
                           "each program enough rows that the float32 partials stay small "
                           "(a few programs per SM). Kernel 2 moves few bytes but can still "
                           "cost time: give it many narrow column strips (16 columns a "
                           "program), each loading all P partial rows at once, rather than a "
                           "few wide programs that walk the partial rows block by block.")
