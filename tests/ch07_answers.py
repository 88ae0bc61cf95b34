"""Chapter 07's answers as a learner writes them, and the mistakes a learner makes in them.

The answers are the source notebook's own solutions (solutions/ch07_backward), loaded as a
module together with the chapter's helper cells that they call (`backward_inputs`,
`warps_for`, ...). A mistake is the same answers with a few edits in one exercise cell,
each edit a line a learner really writes wrong. `load(edits)` builds the module (Triton
needs kernels defined in a file, so it writes one); `CELLS` runs each of the chapter's
correctness test cells' checks on it.

    module = load(MISTAKES["dx_wrong_sign"].edits)
    CELLS["ex07_backward_dx"](module)      # raises AssertionError with the diagnosis
"""

from __future__ import annotations

import importlib.util
import itertools
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from course import check

import nbformat
from grader_submissions import ROOT, nbgrader_meta, solutions

CHAPTER = "ch07_backward"
SOURCE = ROOT / "solutions" / CHAPTER / f"{CHAPTER}.ipynb"
# The chapter's own cells that the exercise cells call, by cell id, in notebook order.
HELPER_CELLS = ("forward-kernel-code", "forward-helpers-code", "forward-wrapper-code",
                "dx-kernel-code", "dx-wrapper-code")
# The exercise cells, in notebook order.
EXERCISE_CELLS = ("ex07_row_dots_code", "ex07_split_programs_code", "ex07_backward_kernels",
                  "ex07_backward_wrapper", "ex07_layernorm_kernel", "ex07_layernorm_wrapper",
                  "ex07_autograd_function")
PREAMBLE = """import course
from course import reference, traffic

import torch
import triton
import triton.language as tl

DEVICE = course.DEVICE
"""

SEED = 3


def helper_sources() -> list[str]:
    nb = nbformat.read(SOURCE, as_version=4)
    by_id = {c.id: c.source for c in nb.cells}
    return [by_id[i] for i in HELPER_CELLS]


def answers(edits: dict[str, list[tuple[str, str]]] | None = None) -> dict[str, str]:
    """grade id -> the source's answer, with `edits` ((old, new) per exercise) applied."""
    found = solutions(ROOT, CHAPTER)
    for grade_id, changes in (edits or {}).items():
        for old, new in changes:
            assert old in found[grade_id], f"{grade_id} has no {old!r}"
            found[grade_id] = found[grade_id].replace(old, new)
    return found


_counter = itertools.count()
_folder = Path(tempfile.mkdtemp(prefix="ch07_answers_"))


def load(edits: dict[str, list[tuple[str, str]]] | None = None):
    """The chapter's helpers and exercise answers (with `edits`) as one imported module."""
    code = "\n\n".join([PREAMBLE, *helper_sources(),
                        *(answers(edits)[g] for g in EXERCISE_CELLS)]) + "\n"
    path = _folder / f"ch07_answer_{next(_counter)}.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The correctness test cells of the chapter: what each one's visible check calls.
CELLS: dict[str, Callable] = {
    "ex07_row_dots": lambda m: check.row_dots(m.row_dots, seed=SEED, quiet=True),
    "ex07_split_rule": lambda m: check.split_rule(m.split_programs, seed=SEED, quiet=True),
    "ex07_backward_dx": lambda m: check.rmsnorm_backward(m.rmsnorm_backward, only="dx",
                                                         seed=SEED, quiet=True),
    "ex07_backward_dw": lambda m: check.rmsnorm_backward(m.rmsnorm_backward, only="dw",
                                                         seed=SEED, quiet=True),
    "ex07_layernorm_dx": lambda m: check.layernorm_backward(m.layernorm_backward, only="dx",
                                                            seed=SEED, quiet=True),
    "ex07_layernorm_dw": lambda m: check.layernorm_backward(m.layernorm_backward, only="dw",
                                                            seed=SEED, quiet=True),
    "ex07_layernorm_db": lambda m: check.layernorm_backward(m.layernorm_backward, only="db",
                                                            seed=SEED, quiet=True),
    "ex07_autograd_correct": lambda m: check.rmsnorm_autograd(m.RMSNormFunction, seed=SEED,
                                                              quiet=True),
    "ex07_autograd_gradcheck": lambda m: check.rmsnorm_gradcheck(m.RMSNormFunction,
                                                                 seed=SEED, quiet=True),
}
# The cells that grade each exercise: a mistake in one must cost its own cell and no other
# of these.
GROUPS = {
    "ex07_row_dots_code": ("ex07_row_dots",),
    "ex07_split_programs_code": ("ex07_split_rule",),
    "ex07_backward_kernels": ("ex07_backward_dx", "ex07_backward_dw"),
    "ex07_backward_wrapper": ("ex07_backward_dx", "ex07_backward_dw"),
    "ex07_layernorm_kernel": ("ex07_layernorm_dx", "ex07_layernorm_dw", "ex07_layernorm_db"),
    "ex07_layernorm_wrapper": ("ex07_layernorm_dx", "ex07_layernorm_dw", "ex07_layernorm_db"),
    "ex07_autograd_function": ("ex07_autograd_correct", "ex07_autograd_gradcheck"),
}


@dataclass(frozen=True)
class Mistake:
    what: str
    edits: dict[str, list[tuple[str, str]]]
    loses: tuple[str, ...]           # the test cells it must fail
    phrase: str                      # in the first lost cell's message
    also: tuple[str, ...] = field(default=())  # cells outside its group that fail too
    more: dict[str, str] = field(default_factory=dict)  # cell -> a phrase of its message
    # Its message names no other mistake's phrase (not for the split rule, where one wrong
    # rule can give too few programs at one shape and too many at another).
    exclusive: bool = True

    @property
    def exercise(self) -> str:
        return next(iter(self.edits))

    @property
    def checked(self) -> tuple[str, ...]:
        """The cells to run: those that grade its exercise, and any it costs besides."""
        return tuple(dict.fromkeys(GROUPS[self.exercise] + self.loses + self.also))


def _one(exercise: str, *edits: tuple[str, str]) -> dict[str, list[tuple[str, str]]]:
    return {exercise: list(edits)}


ROW = "ex07_row_dots_code"
SPLIT = "ex07_split_programs_code"
K1 = "ex07_backward_kernels"
WRAP = "ex07_backward_wrapper"
LN = "ex07_layernorm_kernel"
LN_WRAP = "ex07_layernorm_wrapper"
FN = "ex07_autograd_function"
LOOP_HINT = "difference between Triton's interpreter and a GPU"
# dy's rows stepped through with x's row stride, in any of the three kernels that read dy
DY_WITH_X_STRIDE = ("dy = tl.load(dy_ptr + row * stride_dy_row",
                    "dy = tl.load(dy_ptr + row * stride_x_row")

MISTAKES: dict[str, Mistake] = {
    # ---- the warm-up
    "row_dots_no_loop": Mistake(
        "each program computes the first row of its block only",
        _one(ROW, ("for row in range(first, last):", "for row in range(first, first + 1):")),
        ("ex07_row_dots",), "the loop over the rows runs once"),
    "row_dots_rounded_down": Mistake(
        "rows per program M // P, and P programs: the remainder rows belong to nobody",
        _one(ROW, ("rows_per_program = triton.cdiv(M, programs)\n"
                   "    programs = triton.cdiv(M, rows_per_program)  # every program has rows",
                   "rows_per_program = max(1, M // programs)\n"
                   "    programs = min(programs, M)")),
        ("ex07_row_dots",), "Round the rows per program up"),
    "row_dots_sum_not_mean": Mistake(
        "the row's sum, not its mean",
        _one(ROW, ("tl.sum(x_hat * dy * w, axis=0) / n_cols)", "tl.sum(x_hat * dy * w, axis=0))")),
        ("ex07_row_dots",), "where its mean belongs"),
    "row_dots_loop_variable_method": Mistake(
        "row.to(tl.int64) on the loop variable: fine on a GPU, an error in the interpreter",
        _one(ROW, ("first = pid.to(tl.int64) * rows_per_program", "first = pid * rows_per_program"),
             ("        x = tl.load(x_ptr + row * stride_x_row",
              "        row = row.to(tl.int64)\n        x = tl.load(x_ptr + row * stride_x_row")),
        ("ex07_row_dots",), LOOP_HINT),
    "row_dots_dy_read_with_x_stride": Mistake(
        "dy's rows stepped through with x's row stride",
        _one(ROW, DY_WITH_X_STRIDE),
        ("ex07_row_dots",), "dy's N + 20"),
    "row_dots_c_at_pid": Mistake(
        "c stored at c_ptr + pid: each program writes all its rows' c into one place",
        _one(ROW, ("tl.store(c_ptr + row,", "tl.store(c_ptr + pid,")),
        ("ex07_row_dots",), "store it at c_ptr + row"),
    # ---- the split rule
    "split_two_per_sm": Mistake(
        "two programs per SM whatever N: too few for short rows",
        _one(SPLIT, ("return min(M, max(sms, triton.cdiv(traffic.ELEMENTS_IN_FLIGHT_PER_SM * "
                     "sms, N)))", "return min(M, 2 * sms)")),
        ("ex07_split_rule",), "too few programs", exclusive=False),
    "split_without_one_per_sm": Mistake(
        "no max(sms, ...): long rows get fewer programs than SMs",
        _one(SPLIT, ("return min(M, max(sms, triton.cdiv(traffic.ELEMENTS_IN_FLIGHT_PER_SM * "
                     "sms, N)))",
                     "return min(M, triton.cdiv(traffic.ELEMENTS_IN_FLIGHT_PER_SM * sms, N))")),
        ("ex07_split_rule",), "long rows need at least one program per SM", exclusive=False),
    "split_one_row_each": Mistake(
        "one program per row",
        _one(SPLIT, ("return min(M, max(sms, triton.cdiv(traffic.ELEMENTS_IN_FLIGHT_PER_SM * "
                     "sms, N)))", "return M")),
        ("ex07_split_rule",), "too many programs", exclusive=False),
    "split_float": Mistake(
        "a float, not an int",
        _one(SPLIT, ("return min(M, max(sms, triton.cdiv(traffic.ELEMENTS_IN_FLIGHT_PER_SM * "
                     "sms, N)))",
                     "return min(M, max(sms, traffic.ELEMENTS_IN_FLIGHT_PER_SM * sms / N))")),
        ("ex07_split_rule",), "as a Python int", exclusive=False),
    # ---- exercise 1: dx
    "dx_without_projection": Mistake(
        "dx = rstd * g, without the term through rstd",
        _one(K1, ("dx = (g - x_hat * c) * rstd", "dx = g * rstd")),
        ("ex07_backward_dx",), "misses the term that flows through rstd",
        also=("ex07_autograd_correct", "ex07_autograd_gradcheck"),
        more={"ex07_autograd_gradcheck": "not orthogonal to x"}),
    "dx_wrong_sign": Mistake(
        "dx = rstd * (x_hat * c - g)",
        _one(K1, ("dx = (g - x_hat * c) * rstd", "dx = (x_hat * c - g) * rstd")),
        ("ex07_backward_dx",), "dx has the wrong sign"),
    "dx_divided_by_n": Mistake(
        "dx divided by N once more",
        _one(K1, ("dx = (g - x_hat * c) * rstd", "dx = (g - x_hat * c) * rstd / n_cols")),
        ("ex07_backward_dx",), "1 / (N, the row's length)"),
    "dx_mean_over_block": Mistake(
        "c = sum(x_hat * g) / BLOCK_N: the padding lanes counted in the mean",
        _one(K1, ("c = tl.sum(x_hat * g, axis=0) / n_cols",
                  "c = tl.sum(x_hat * g, axis=0) / BLOCK_N")),
        ("ex07_backward_dx",), "divided by BLOCK_N, the padded block"),
    "kernel_loop_variable_method": Mistake(
        "row.to(tl.int64) on kernel 1's loop variable",
        _one(K1, ("first = pid.to(tl.int64) * rows_per_program      # int64: row * stride may "
                  "pass 2**31", "first = pid * rows_per_program"),
             ("        x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0)"
              ".to(tl.float32)\n        dy = tl.load(dy_ptr + row * stride_dy_row",
              "        row = row.to(tl.int64)\n        x = tl.load(x_ptr + row * stride_x_row + "
              "cols, mask=mask, other=0.0).to(tl.float32)\n        dy = tl.load(dy_ptr + row * "
              "stride_dy_row")),
        ("ex07_backward_dx", "ex07_backward_dw"), LOOP_HINT),
    "kernel_block_past_last_row": Mistake(
        "kernel 1's block ends at first + rows_per_program, not clamped to n_rows: the short "
        "last block runs past row M - 1 (in interpreter mode 37 rows go to 8 programs; on a "
        "GPU, the rows-left-over case: 20003 rows in blocks of 2 on 132 SMs)",
        _one(K1, ("last = tl.minimum(first + rows_per_program, n_rows)",
                  "last = first + rows_per_program")),
        ("ex07_backward_dx", "ex07_backward_dw"), "stop each program's block of rows at row"),
    # ---- exercise 1: dW
    "dw_not_accumulated": Mistake(
        "dw_acc = dy * x_hat: each partial row holds its block's last row",
        _one(K1, ("dw_acc += dy * x_hat", "dw_acc = dy * x_hat")),
        ("ex07_backward_dw",), "not summed over the rows of each program"),
    "dw_first_partial_only": Mistake(
        "kernel 2 adds up the first partial row only",
        _one(K1, ("mask = (rows < n_partials)[:, None] & col_mask[None, :]",
                  "mask = (rows < 1)[:, None] & col_mask[None, :]")),
        ("ex07_backward_dw",), "holds the sum of only some rows"),
    "dw_some_partials": Mistake(
        "kernel 2 adds up every other partial row",
        _one(K1, ("mask = (rows < n_partials)[:, None] & col_mask[None, :]",
                  "mask = ((rows < n_partials) & (rows % 2 == 0))[:, None] & col_mask[None, :]")),
        ("ex07_backward_dw",), "right only where there is one row (M = 1)"),
    "dw_padded_partials": Mistake(
        "kernel 2's tile without its row mask: the padding rows are summed",
        _one(K1, ("mask = (rows < n_partials)[:, None] & col_mask[None, :]",
                  "mask = col_mask[None, :]")),
        ("ex07_backward_dw",), "padding", also=("ex07_layernorm_dw", "ex07_layernorm_db")),
    "dw_workspace_not_cleared": Mistake(
        "kernel 1 adds each row into its partial row in memory, never cleared",
        _one(K1, ("        dw_acc += dy * x_hat\n",
                  "        partial = tl.load(dw_partial_ptr + pid * n_cols + cols, mask=mask)\n"
                  "        tl.store(dw_partial_ptr + pid * n_cols + cols, partial + dy * x_hat,"
                  " mask=mask)\n"),
             ("    tl.store(dw_partial_ptr + pid * n_cols + cols, dw_acc, mask=mask)\n", "")),
        ("ex07_backward_dw",), "was never cleared"),
    "dw_averaged": Mistake(
        "kernel 2 averages the partial rows instead of adding them",
        _one(K1, ("tl.store(dw_ptr + cols, tl.sum(acc, axis=0).to(",
                  "tl.store(dw_ptr + cols, (tl.sum(acc, axis=0) / n_partials).to(")),
        ("ex07_backward_dw",), "dW is off by a constant factor",
        also=("ex07_layernorm_dw", "ex07_layernorm_db")),
    "dw_partial_row_at_pid": Mistake(
        "kernel 1 stores its partial row at + pid, not + pid * n_cols: the rows overlap",
        _one(K1, ("tl.store(dw_partial_ptr + pid * n_cols + cols, dw_acc",
                  "tl.store(dw_partial_ptr + pid + cols, dw_acc")),
        ("ex07_backward_dw",), "which makes the programs' rows overlap", exclusive=False),
    "dw_rms_from_x": Mistake(
        "dW summed from x, not x_hat",
        _one(K1, ("dw_acc += dy * x_hat\n    tl.store", "dw_acc += dy * x\n    tl.store")),
        ("ex07_backward_dw",), "un-normalised x"),
    "dw_from_g": Mistake(
        "dW summed from g = weight * dy, not dy",
        _one(K1, ("dw_acc += dy * x_hat\n    tl.store", "dw_acc += g * x_hat\n    tl.store")),
        ("ex07_backward_dw",), "dW is summed from g = weight * dy"),
    "dy_read_with_x_stride": Mistake(
        "dy's rows stepped through with x's row stride",
        _one(K1, DY_WITH_X_STRIDE),
        ("ex07_backward_dx", "ex07_backward_dw"), "dy's N + 20"),
    # ---- exercise 2: LayerNorm
    "ln_dx_without_weight": Mistake(
        "LayerNorm's g = dy, without the weight",
        _one(LN, ("g = dy * w  ", "g = dy  ")),
        ("ex07_layernorm_dx",), "in all three places it appears"),
    "ln_x_hat_not_centred": Mistake(
        "x_hat = x * rstd: the saved mean never subtracted",
        _one(LN, ("x_hat = (x - tl.load(mean_ptr + row)) * rstd", "x_hat = x * rstd")),
        ("ex07_layernorm_dx", "ex07_layernorm_dw"), "dx uses x * rstd where x_hat",
        more={"ex07_layernorm_dw": "dW is summed from x * rstd"}),
    "ln_dy_read_with_x_stride": Mistake(
        "LayerNorm's dy rows stepped through with x's row stride",
        _one(LN, DY_WITH_X_STRIDE),
        ("ex07_layernorm_dx", "ex07_layernorm_dw", "ex07_layernorm_db"), "dy's N + 20"),
    "ln_without_mean_g": Mistake(
        "LayerNorm's dx without -mean(g)",
        _one(LN, ("dx = (g - g_mean - x_hat * c) * rstd", "dx = (g - x_hat * c) * rstd")),
        ("ex07_layernorm_dx",), "misses -mean(g)"),
    "ln_cancellation": Mistake(
        "x_hat = x * rstd - mean * rstd: cancellation on rows with a large mean",
        _one(LN, ("x_hat = (x - tl.load(mean_ptr + row)) * rstd",
                  "x_hat = x * rstd - tl.load(mean_ptr + row) * rstd")),
        ("ex07_layernorm_dx",), "Subtract first", also=("ex07_layernorm_dw",),
        more={"ex07_layernorm_dw": "Subtract first"}),
    "ln_dw_from_x": Mistake(
        "dW summed from x, not x_hat",
        _one(LN, ("dw_acc += dy * x_hat", "dw_acc += dy * x")),
        ("ex07_layernorm_dw",), "un-normalised x"),
    "ln_means_over_block": Mistake(
        "mean(g) and mean(x_hat * g) divided by BLOCK_N: the padding lanes counted",
        _one(LN, ("g_mean = tl.sum(g, axis=0) / n_cols", "g_mean = tl.sum(g, axis=0) / BLOCK_N"),
             ("c = tl.sum(x_hat * g, axis=0) / n_cols", "c = tl.sum(x_hat * g, axis=0) / BLOCK_N")),
        ("ex07_layernorm_dx",), "divided by BLOCK_N, the padded block"),
    "ln_db_sums_g": Mistake(
        "dB summed from g = weight * dy",
        _one(LN, ("db_acc += dy\n", "db_acc += g\n")),
        ("ex07_layernorm_db",), "db sums g = weight * dy"),
    "ln_db_missing": Mistake(
        "dB never computed: kernel 2 launched for dW only",
        _one(LN_WRAP, ("for partial, out in ((partials[0], dw), (partials[1], db)):",
                       "for partial, out in ((partials[0], dw),):")),
        ("ex07_layernorm_db",), "dB is never computed"),
    # ---- exercise 3
    "function_dy_not_contiguous": Mistake(
        "backward hands dy to the kernels as it comes: strides 0 for the gradient of y.sum()",
        _one(FN, ("dy.contiguous()", "dy")),
        ("ex07_autograd_correct",), "call .contiguous() first"),
    "function_drops_eps": Mistake(
        "forward calls rmsnorm_forward(x, weight): the eps it was given is dropped",
        _one(FN, ("y, rstd = rmsnorm_forward(x, weight, eps)",
                  "y, rstd = rmsnorm_forward(x, weight)")),
        ("ex07_autograd_correct",), "does not reach your forward kernel"),
    "function_saves_y": Mistake(
        "forward saves y where the backward needs x",
        _one(FN, ("ctx.save_for_backward(x, weight, rstd)",
                  "ctx.save_for_backward(y, weight, rstd)")),
        ("ex07_autograd_gradcheck", "ex07_autograd_correct"),
        "disagrees with finite differences of your own forward"),
}


def check_cell(module, cell: str) -> str | None:
    """Run a test cell's check on `module`: None if it passes, its message if it fails."""
    try:
        CELLS[cell](module)
    except AssertionError as failure:
        return str(failure)
    return None


def grade_ids_of_tests() -> set[str]:
    nb = nbformat.read(SOURCE, as_version=4)
    return {nbgrader_meta(c)["grade_id"] for c in nb.cells
            if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")}
