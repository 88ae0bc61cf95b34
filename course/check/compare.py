"""Comparing a learner's output with the float64 reference, and describing the difference
in terms of rows and columns (the shape of a bug is usually its best clue)."""

from __future__ import annotations

from dataclasses import dataclass

from course import runtime
from course.check.sandbox import poison_mask

import torch

# Tolerances per output dtype: a few units in the last place of that dtype, since the
# reference is exact and the output is rounded once (plus float32 arithmetic on the way).
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {  # (atol, rtol)
    torch.float32: (1e-5, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float64: (1e-10, 1e-10),
}

# Rows at least this long are also checked for a common scale error. Rounding each output
# once leaves errors that average out along a row; statistics accumulated in low precision
# instead scale the whole row by a wrong rstd. Averaged over a long row, the first stays
# far below these bounds, the second does not.
ROW_SCALE_MIN_COLS = 1024
ROW_SCALE_TOLERANCES: dict[torch.dtype, float] = {
    torch.float32: 1e-5,
    torch.float16: 2e-4,
    torch.bfloat16: 1e-3,
    torch.float64: 1e-10,
}


@dataclass(frozen=True)
class Mismatch:
    """Where and how an output differs from the reference (viewed as rows x columns)."""

    name: str
    n_rows: int
    n_cols: int
    bad_rows: tuple[int, ...]
    bad_cols: tuple[int, ...]
    n_bad: int
    n_poison: int            # the checker's NaN where the reference is finite: never written
    poison_cols: tuple[int, ...]
    max_abs_err: float
    examples: tuple[tuple[tuple[int, int], float, float], ...]  # ((row, col), expected, got)
    row_scale_err: float = 0.0   # worst |scale - 1| of a row fitted as got = scale * expected
    vector: bool = False         # the output is 1-D (dw, say): one row, described as such
    unwritten_rows: tuple[int, ...] = ()  # rows NaN from end to end: never written
    n_computed_nan: int = 0      # NaN where the reference is finite, but not the poison

    @property
    def all_poison(self) -> bool:
        return self.n_poison == self.n_rows * self.n_cols

    @property
    def first_row_right_others_not(self) -> bool:
        """Row 0 right and most other rows wrong (a few may match by chance)."""
        return (self.n_rows > 1 and 0 not in self.bad_rows
                and 2 * len(self.bad_rows) >= self.n_rows - 1)

    def poison_tail_from(self) -> int | None:
        """If the never-written columns are exactly those from some k > 0 on, that k."""
        if not self.poison_cols:
            return None
        k = self.poison_cols[0]
        if k > 0 and self.poison_cols == tuple(range(k, self.n_cols)):
            return k
        return None

    def unwritten_rows_from(self) -> int | None:
        """If the wrong rows are exactly the rows from some k on, and none of them was ever
        written (a grid that rounds the rows down), that k."""
        if self.vector or not self.unwritten_rows:
            return None
        tail = tuple(range(self.unwritten_rows[0], self.n_rows))
        return tail[0] if self.unwritten_rows == tail == self.bad_rows else None

    def describe(self) -> str:
        if self.n_bad == 0:  # within tolerance element by element, but scaled row by row
            return (f"every element of {self.name} is within tolerance, but rows "
                    f"{_ranges(self.bad_rows)} are each off by a common factor (up to "
                    f"{100 * self.row_scale_err:.2f} %): the row statistic (rstd) is imprecise "
                    f"(statistics accumulated in 16 bits), or each row was rounded to 16 bits "
                    f"after multiplying by rstd and again after the weight")
        rows = _ranges(self.bad_rows)
        cols = _ranges(self.bad_cols)
        where = (f"indices {cols} of 0..{self.n_cols - 1}" if self.vector else
                 f"rows {rows} of 0..{self.n_rows - 1}; columns {cols} of 0..{self.n_cols - 1}")
        lines = [f"{self.n_bad} of {self.n_rows * self.n_cols} elements of {self.name} are wrong "
                 f"({where})"]
        if self.n_poison:
            lines.append(f"{self.n_poison} of them are NaN: memory your kernel never wrote (the "
                         "checker fills fresh allocations with NaN)")
        if self.n_computed_nan:
            lines.append(f"{self.n_computed_nan} of them are NaN that your code computed (not "
                         "the checker's NaN for memory never written): a 0 / 0 (a row of zeros "
                         "divided by its zero norm when eps is missing), inf - inf, or "
                         "arithmetic on a value read from memory nothing wrote")
        for (r, c), want, got in self.examples:
            index = f"{c}" if self.vector else f"{r}, {c}"
            lines.append(f"  {self.name}[{index}]: expected {want:.6g}, got {got:.6g}")
        return "\n".join(lines)


def _ranges(values: tuple[int, ...], limit: int = 6) -> str:
    if not values:
        return "none"
    spans = []
    start = prev = values[0]
    for v in values[1:]:
        if v != prev + 1:
            spans.append((start, prev))
            start = v
        prev = v
    spans.append((start, prev))
    text = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in spans[:limit])
    return text + (", ..." if len(spans) > limit else "")


DEFAULT_DTYPE_REASON = ("the input's dtype: compute in float32 inside the kernel, store in "
                        "the output's dtype")


def _shape_text(shape: tuple[int, ...]) -> str:
    return f"({shape[0]},)" if len(shape) == 1 else str(shape)


def layout_problem(name: str, got: object, expected: torch.Tensor, dtype: torch.dtype,
                   dtype_reason: str = DEFAULT_DTYPE_REASON,
                   dtype_fix: str | None = None) -> str | None:
    """What is wrong with `got` before its values can be compared (not a tensor, a wrong
    shape, dtype or device), with what to change; None when nothing is. `dtype_fix` says
    how to fix a wrong dtype where the kernel's store is not the place (plain PyTorch)."""
    if not isinstance(got, torch.Tensor):
        return f"{name} should be a torch.Tensor, got {type(got).__name__}"
    have, want = tuple(got.shape), tuple(expected.shape)
    if have != want:
        text = f"{name} has shape {_shape_text(have)}, expected {_shape_text(want)}"
        if got.numel() == expected.numel():
            return (f"{text}: the right number of elements in another shape. Return it in "
                    f"the expected shape, {name}.view({_shape_text(want)}) (for an output "
                    f"shaped like the input x, {name}.view(x.shape))")
        return (f"{text}: {got.numel()} elements instead of {expected.numel()}. Allocate it "
                "with the expected shape (torch.empty_like(x) for an output shaped like x)")
    if got.dtype != dtype:
        if dtype_fix is None:
            dtype_fix = (f"Allocate it with dtype={dtype} and let the kernel convert when it "
                         "stores (.to(y_ptr.dtype.element_ty))")
        return f"{name} has dtype {got.dtype}, expected {dtype} ({dtype_reason}). {dtype_fix}"
    if got.device != expected.device:
        return (f"{name} is on {got.device}, expected {expected.device}: allocate it on the "
                "input's device (device=x.device)")
    return None


def compare(name: str, got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, *,
            extra_atol: float | torch.Tensor | None = None,
            bf16_truncated: bool | None = None,
            row_scale_tolerance: float | None = None,
            dtype_reason: str = DEFAULT_DTYPE_REASON,
            dtype_fix: str | None = None) -> Mismatch | None:
    """None when `got` matches the float64 `expected` within `dtype`'s tolerance.

    `extra_atol` (a number, or a tensor broadcastable to `expected`) widens the absolute
    tolerance by the error a correct float32 computation may add beyond rounding the output
    once: a sum over many rows, a mean that dwarfs the spread. The check for rows scaled by a
    common factor is then left out, since such errors are not a pure scale.
    `bf16_truncated` says whether the output went through Triton's interpreter, which
    truncates to bfloat16 (default: whenever the interpreter is in use).
    `row_scale_tolerance` replaces ROW_SCALE_TOLERANCES[dtype] for this comparison.

    Shape, dtype and device problems raise AssertionError straight away: they are not a
    matter of tolerance. (The exercise runner asks `layout_problem` first, so that they
    fail one case instead of the whole check.)
    """
    problem = layout_problem(name, got, expected, dtype, dtype_reason, dtype_fix)
    if problem is not None:
        raise AssertionError(problem)
    atol, rtol = TOLERANCES[dtype]
    n_cols = expected.shape[-1] if expected.dim() else 1
    want = expected.detach().to(torch.float64).reshape(-1, n_cols)
    have = got.detach().to(torch.float64).reshape(-1, n_cols)
    limit = atol + rtol * want.abs()
    if extra_atol is not None:
        if isinstance(extra_atol, torch.Tensor):
            extra_atol = torch.broadcast_to(extra_atol.to(torch.float64), expected.shape
                                            ).reshape(-1, n_cols)
        limit = limit + extra_atol
    err = (have - want).abs()
    bad = ~(err <= limit)  # NaN counts as bad
    if not bool(bad.any()):
        if extra_atol is not None:
            return None
        if bf16_truncated is None:
            bf16_truncated = runtime.interpreted()
        return _row_scale_mismatch(name, have, want, dtype, bf16_truncated,
                                   row_scale_tolerance)
    # The poison is read on got's own bits: converting to float64 loses a NaN's payload.
    nan = torch.isnan(have) & ~torch.isnan(want)
    poison = nan & poison_mask(got.detach()).reshape(-1, n_cols)
    # Three examples, first, middle and last, without listing every bad index in Python
    # (millions of them when a whole large output is wrong).
    bad_idx = bad.nonzero()
    picks = bad_idx[[0, len(bad_idx) // 2, -1]].tolist()
    examples = []
    for r, c in dict.fromkeys(map(tuple, picks)):
        examples.append(((r, c), float(want[r, c]), float(have[r, c])))
    finite_err = err[bad & torch.isfinite(err)]
    return Mismatch(
        name=name,
        n_rows=want.shape[0],
        n_cols=n_cols,
        bad_rows=tuple(bad.any(dim=1).nonzero().flatten().tolist()),
        bad_cols=tuple(bad.any(dim=0).nonzero().flatten().tolist()),
        n_bad=int(bad.sum()),
        n_poison=int(poison.sum()),
        poison_cols=tuple(poison.any(dim=0).nonzero().flatten().tolist()),
        max_abs_err=float(finite_err.max()) if finite_err.numel() else float("inf"),
        examples=tuple(examples),
        vector=expected.dim() == 1,
        unwritten_rows=tuple(poison.all(dim=1).nonzero().flatten().tolist()),
        n_computed_nan=int((nan & ~poison).sum()),
    )


def _row_scale_mismatch(name: str, have: torch.Tensor, want: torch.Tensor, dtype: torch.dtype,
                        bf16_truncated: bool, tolerance: float | None = None
                        ) -> Mismatch | None:
    """A Mismatch when long rows are scaled by a common wrong factor, else None."""
    n_rows, n_cols = want.shape
    if n_cols < ROW_SCALE_MIN_COLS:
        return None
    if dtype == torch.bfloat16 and bf16_truncated:
        # Triton's interpreter converts float32 to bfloat16 by truncation, not rounding: a
        # correct kernel's rows then shrink by ~0.3 % on average. Only a GPU can tell here
        # (and in the interpreter a bfloat16 tl.sum is garbage, caught element by element).
        return None
    energy = (want * want).sum(dim=1)
    rows = energy > 0  # a zero row has no scale
    scale = (have * want).sum(dim=1)[rows] / energy[rows]
    err = (scale - 1).abs()
    limit = ROW_SCALE_TOLERANCES[dtype] if tolerance is None else tolerance
    if not bool((err > limit).any()):
        return None
    row_ids = rows.nonzero().flatten()[err > limit]
    return Mismatch(name=name, n_rows=n_rows, n_cols=n_cols,
                    bad_rows=tuple(row_ids.tolist()), bad_cols=(), n_bad=0, n_poison=0,
                    poison_cols=(), max_abs_err=float((have - want).abs().max()), examples=(),
                    row_scale_err=float(err.max()))
