"""Checkers for chapter 05's exercise: residual add fused with RMSNorm.

The learner writes `add_rmsnorm(x, residual, weight, eps=1e-6) -> (y, residual_out)`, out
of place and in one launch: residual_out = x + residual in x's dtype, y = RMSNorm of that
sum (see `course.reference.add_rmsnorm`). Both inputs must be left untouched.

"Of that sum" means the sum as stored, rounded to x's dtype, as eager PyTorch's add
followed by a norm computes it. Normalising the unrounded float32 sum instead changes only
the last bit of a few elements, well within any tolerance, so one case compares bits: on
the elements where the two answers round differently, y must side with the stored sum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from course import reference, runtime, traffic
from course.check import rmsnorm as rmsnorm_suspects
from course.check.bandwidth import BandwidthResult, CallSpec, check_bandwidth
from course.check.cases import Case, row_shape_cases
from course.check.compare import Mismatch
from course.check.learner_facing import learner_facing
from course.check.report import Report
from course.check.runner import CaseResult, Exercise, Inputs, Suspect, Tensors

import torch

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16

# The tag of the cases whose y is also compared bit by bit with the norm of the stored sum.
STORED_SUM = "stored_sum"


def _cases() -> tuple[Case, ...]:
    cases = [
        *row_shape_cases(),
        # x contiguous, the residual's rows padded: each input needs its own row stride.
        Case("residual laid out unlike x", (6, 128), f32, frozenset({"own_strides", "pow2"})),
        Case("3-D input", (2, 3, 64), f32, frozenset({"nd", "pow2"})),
        # x + residual is zero on these rows: the norm must give 0, not NaN.
        Case("sums of zeros", (6, 64), f32, frozenset({"zeros", "pow2"}), zero_rows=(1, 4)),
        Case("custom eps", (4, 64), f32, frozenset({"eps", "pow2"}), scale=0.05, eps=0.01),
        Case("float16", (8, 256), f16, frozenset({"half", "pow2"})),
        Case("float16, odd N", (9, 300), f16, frozenset({"half", "odd_n"})),
        Case("bfloat16, long rows", (4, 4096), bf16, frozenset({"half", "bf16", "long"}),
             offset=1.0, scale=0.5),
        # Float16, not bfloat16: the interpreter truncates to bfloat16 where PyTorch rounds.
        # About half of these sums need rounding, and the norms of the stored and of the
        # exact sum round differently in about a fifth of the elements of y.
        Case("float16, y of the stored sum", (16, 1024), f16,
             frozenset({"half", "pow2", STORED_SUM})),
        # Wider than every case above: a BLOCK_N fixed at 4096 (or 8192) covers those.
        Case("rows wider than 8192", (2, 10007), f32, frozenset({"wide", "odd_n"})),
    ]
    if runtime.on_gpu():
        cases += [
            Case("bfloat16, very long rows", (32, 65536), bf16,
                 frozenset({"half", "bf16", "long"}), offset=1.0, scale=0.5),
            Case("large M", (4099, 1024), bf16, frozenset({"half", "bf16", "pow2"})),
        ]
    return tuple(cases)


def _inputs(case: Case, gen: torch.Generator) -> Inputs:
    # On the case's zero rows both x and the residual are zero, so their sum is too.
    return {"x": case.make_input(gen),
            "residual": case.make_like_input(gen, scale=case.scale, zero_rows=True,
                                             row_padding=24 if "own_strides" in case.tags
                                             else None),
            "weight": case.make_vector(gen)}


def _call(fn: Callable, t: Tensors, case: Case) -> object:
    return fn(t["x"], t["residual"], t["weight"], eps=case.eps)


def _expected(t: Tensors, case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    return reference.add_rmsnorm(t["x"], t["residual"], t["weight"], eps=case.eps)


def _all_nan(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    return "" if bool(torch.isnan(got).all()) else None


def _norm_of_stored_and_exact_sum(t: Tensors, case: Case
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """y as it must be (the norm of the sum rounded to x's dtype) and as a kernel that
    normalises its unrounded float32 sum returns it, both rounded to x's dtype."""
    stored = _expected(t, case)[0]
    exact = reference.rmsnorm(t["x"].to(torch.float64) + t["residual"].to(torch.float64),
                              t["weight"], eps=case.eps)
    return stored.to(case.dtype), exact.to(case.dtype)


def _sides_with_exact_sum(t: Tensors, case: Case, got: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """On the elements where the norms of the stored and of the exact sum differ: which
    ones `got` takes from the exact sum's (a bool mask), the stored sum's answer, and how
    many it takes from the stored sum's. None when it sides with the stored sum at least as
    often, as a correct kernel does (nearly always)."""
    stored, exact = _norm_of_stored_and_exact_sum(t, case)
    got = got.detach().to(case.dtype).reshape(stored.shape)
    differ = stored != exact
    from_exact = differ & (got == exact)
    from_stored = int((differ & (got == stored)).sum())
    if int(from_exact.sum()) <= from_stored:
        return None
    return from_exact, stored, from_stored


def _unrounded_sum_mismatch(t: Tensors, case: Case, got: torch.Tensor) -> Mismatch | None:
    """A Mismatch of the elements of y that come from the norm of the unrounded sum, on the
    cases tagged STORED_SUM; None elsewhere or when y is the norm of the stored sum."""
    if STORED_SUM not in case.tags:
        return None
    sided = _sides_with_exact_sum(t, case, got)
    if sided is None:
        return None
    from_exact, stored, _ = sided
    n_cols = case.n
    wrong = from_exact.reshape(-1, n_cols)
    want = stored.to(torch.float64).reshape(-1, n_cols)
    have = got.detach().to(torch.float64).reshape(-1, n_cols)
    indices = wrong.nonzero()
    examples = tuple(((r, c), float(want[r, c]), float(have[r, c]))
                     for r, c in dict.fromkeys(map(tuple, indices[[0, len(indices) // 2, -1]]
                                                   .tolist())))
    return Mismatch(name="y", n_rows=want.shape[0], n_cols=n_cols,
                    bad_rows=tuple(wrong.any(dim=1).nonzero().flatten().tolist()),
                    bad_cols=tuple(wrong.any(dim=0).nonzero().flatten().tolist()),
                    n_bad=int(wrong.sum()), n_poison=0, poison_cols=(),
                    max_abs_err=float((have - want)[wrong].abs().max()), examples=examples)


def _normalises_unrounded_sum(t: Tensors, case: Case, got: torch.Tensor) -> str | None:
    if STORED_SUM not in case.tags:
        return None
    sided = _sides_with_exact_sum(t, case, got)
    if sided is None:
        return None
    from_exact, _, from_stored = sided
    return (f"where the norms of the stored and of the exact sum round differently, y takes "
            f"the exact sum's {int(from_exact.sum())} times and the stored sum's "
            f"{from_stored} times")


def _norm_without_weight(t: Tensors, case: Case) -> torch.Tensor:
    return _expected(dict(t, weight=torch.ones_like(t["weight"])), case)[0]


def _of_the_sum(suspect: Callable) -> Callable:
    """One of chapter 04's RMSNorm suspects (course.check.rmsnorm), on the stored sum h
    instead of x: the same slip in the norm of chapter 05's kernel."""
    def on_the_sum(t: Tensors, case: Case, *got: torch.Tensor):
        return suspect(dict(t, x=_expected(t, case)[1]), case, *got)
    return on_the_sum


def _residual_out_holds_y(results: Sequence[CaseResult]) -> bool:
    return any(name == "residual_out_is_y" for r in results for name, _ in r.hints)


class _AddRMSNormExercise(Exercise):
    """The exercise's comparison, plus the bit-level test on the STORED_SUM cases that no
    tolerance can make: y must be the norm of the sum as stored."""

    def compare(self, name: str, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype,
                inputs: Tensors, case: Case) -> Mismatch | None:
        mismatch = super().compare(name, got, want, dtype, inputs, case)
        if mismatch is None and name == "y":
            mismatch = _unrounded_sum_mismatch(inputs, case, got)
        return mismatch


SUSPECTS = (
    Suspect("outputs_swapped", "y",
            "The two outputs are swapped: y holds the sum x + residual and residual_out holds "
            "the normalised output. Return (y, residual_out), in that order, each stored "
            "through its own pointer.",
            expected=lambda t, c: _expected(t, c)[1], across=_residual_out_holds_y),
    Suspect("weight_not_applied", "y",
            "y lacks the weight: y is h * rstd * weight, one weight per column. Load the "
            "weight with the same column offsets and mask as x, and multiply by it before "
            "converting y to its dtype.", expected=_norm_without_weight),
    Suspect("sum_instead_of_mean", "y",
            "y is about sqrt(N) times too small: rstd is computed from the *sum* of the "
            "squares of h. RMSNorm uses their mean: divide the sum of squares by N (n_cols) "
            "before adding eps and taking the square root.",
            expected=_of_the_sum(rmsnorm_suspects.sum_not_mean)),
    Suspect("eps_outside_sqrt", "y",
            "eps is added outside the square root: you divide by sqrt(mean(h^2)) + eps. "
            "RMSNorm adds it inside, rstd = 1 / sqrt(mean(h^2) + eps). With the default eps "
            "the two barely differ, so only rows with a small mean square or a larger eps "
            "show it.", expected=_of_the_sum(rmsnorm_suspects.eps_outside_sqrt)),
    Suspect("rstd_not_inverse_sqrt", "y",
            "rstd is not 1 / sqrt(mean(h^2) + eps): y is h scaled by 1 / (mean(h^2) + eps) "
            "(the square root left out) or by sqrt(mean(h^2) + eps) (the root mean square "
            "multiplied by instead of divided by). Compute rstd = 1.0 / tl.sqrt(tl.sum(h * h, "
            "axis=0) / n_cols + eps) and y = h * rstd * w.",
            matches=_of_the_sum(partial(rmsnorm_suspects.rstd_misshapen, of="h"))),
    Suspect("constant_eps", "y",
            "eps is a constant of your own: use the eps argument you are given (pass it on "
            "to the kernel at the launch). With a small eps the two barely differ, so only "
            "rows with a small mean square (N = 1) or a non-default eps show it.",
            matches=_of_the_sum(rmsnorm_suspects.constant_eps)),
    Suspect("variance_not_mean_square", "y",
            "rstd comes from the variance of h, the squares of h - mean(h), as in LayerNorm. "
            "RMSNorm subtracts no mean: rstd = 1 / sqrt(mean(h^2) + eps).",
            expected=_of_the_sum(rmsnorm_suspects.variance_not_mean_square)),
    Suspect("layernorm_without_bias", "y",
            "y is LayerNorm's (h - mean) * rstd * weight of the sum: RMSNorm subtracts no "
            "mean, neither in the statistic nor in y. y = h * rstd * weight, with rstd = "
            "1 / sqrt(mean(h^2) + eps).",
            expected=_of_the_sum(rmsnorm_suspects.layernorm_without_bias)),
    Suspect("weight_row_offset", "y",
            "y's first row is right, but each later row is scaled by memory past the start "
            "of the weight: the weight is loaded with a row offset (weight_ptr + row * "
            "stride + cols). The weight is one row of N entries that every row shares: load "
            "it at weight_ptr + cols, with the row's mask, the same in every program.",
            matches=_of_the_sum(rmsnorm_suspects.weight_row_offset)),
    Suspect("padding_of_ones", "y",
            "The masked lanes' fill value enters the sum: x (or the residual) is loaded with "
            "other=1.0, so every lane past the end of the row holds h = 1 there and adds to "
            "the sum of squares of h, and rows whose N is not a power of two get a wrong "
            "rstd. The mask is right; its fill is not. Load both with other=0.0: the padding "
            "must add nothing to sum(h * h).",
            matches=_of_the_sum(rmsnorm_suspects.padding_of_ones)),
    Suspect("norm_of_x", "y",
            "y is the RMSNorm of x alone. Normalise the sum h = x + residual (the same h you "
            "store as residual_out): that is what the next layer needs.",
            expected=lambda t, c: reference.rmsnorm(t["x"], t["weight"], eps=c.eps)),
    Suspect("norm_of_residual", "y",
            "y is the RMSNorm of the residual alone. Normalise the sum h = x + residual.",
            expected=lambda t, c: reference.rmsnorm(t["residual"], t["weight"], eps=c.eps)),
    Suspect("norm_of_unrounded_sum", "y",
            "y is the RMSNorm of the exact float32 sum x + residual, not of the sum you store "
            "in residual_out (rounded to x's dtype). Both are accurate, but they differ in the "
            "last bit of about a fifth of the elements, and the next layer reads the stored "
            "residual: normalise what you store, as eager PyTorch's add followed by a norm "
            "does. Round the sum to the output's dtype, store it, and convert that back to "
            "float32 for the statistics and for y: h = (x + r).to(residual_out_ptr.dtype."
            "element_ty), then h = h.to(tl.float32).",
            matches=_normalises_unrounded_sum),
    Suspect("residual_out_never_written", "residual_out",
            "residual_out is never written (it still holds the checker's NaN): store the sum "
            "h = x + residual into residual_out in the same kernel, next to y.",
            matches=_all_nan),
    Suspect("residual_out_is_residual", "residual_out",
            "residual_out holds the residual you were given, unchanged: it must be the new "
            "residual, h = x + residual, stored by your kernel.",
            expected=lambda t, c: t["residual"].to(torch.float64)),
    Suspect("residual_out_is_x", "residual_out",
            "residual_out holds x: it must be the sum h = x + residual.",
            expected=lambda t, c: t["x"].to(torch.float64)),
    Suspect("residual_out_is_y", "residual_out",
            "residual_out holds the normalised output y: it must be the sum before the norm, "
            "h = x + residual.",
            expected=lambda t, c: _expected(t, c)[0]),
)

ADD_RMSNORM = _AddRMSNormExercise(
    name="add_rmsnorm",
    signature="add_rmsnorm(x, residual, weight, eps=1e-6) -> (y, residual_out)",
    cases=_cases(),
    make_inputs=_inputs,
    call=_call,
    expected=_expected,
    output_names=("y", "residual_out"),
    max_launches=1,
    suspects=SUSPECTS,
    advice={
        "row_offset": (
            "Row 0 is right but the other rows are wrong: each program must offset its "
            "pointers by its row, and each tensor by its own row stride. x, the residual "
            "and the two outputs can be laid out differently (one of the checks pads the "
            "residual's rows but not x's). Pass the row stride of each 2-D view the kernel "
            "receives: x_rows.stride(0) for x_rows = validation.as_rows(x), "
            "residual_rows.stride(0) for residual_rows = validation.check_same_rows(x, "
            "residual, \"residual\"), and y.stride(0), residual_out.stride(0) for the "
            "outputs."),
        "nd_row_stride": (
            "Only the 3-D input fails, and its row 0 is right: a tensor's row stride is not "
            "that of the rows your kernel reads. For a tensor of shape (A, B, N), "
            ".stride(0) steps over B rows at once, so residual.stride(0) or x.stride(0) of "
            "the 3-D tensors is wrong. Launch on the 2-D views and pass their row strides: "
            "x_rows = validation.as_rows(x) and residual_rows = "
            "validation.check_same_rows(x, residual, \"residual\") return (M, N) views; "
            "pass x_rows, residual_rows, x_rows.stride(0) and residual_rows.stride(0) (and "
            "the outputs' y.stride(0), residual_out.stride(0))."),
        "input_written:residual": (
            "Your kernel writes x + residual into `residual`, in place. Inference stacks "
            "(vLLM's fused_add_rms_norm) do that on purpose, but this exercise is out of "
            "place: allocate residual_out = torch.empty_like(x), store the sum there, and "
            "leave both inputs untouched."),
        "input_written:x": (
            "Your kernel writes into `x`. Store y and the sum into tensors you allocate "
            "(torch.empty_like(x)), and leave both inputs untouched."),
        "extra_launches": (
            "Your function launches more than one kernel. The point of the fusion is one "
            "launch: add, store the sum, and normalise it while it is still in registers, so "
            "the sum never makes a round trip through memory before the norm reads it."),
        "output_not_from_kernel": (
            "A tensor you return was never passed to your kernel, so your kernel did not "
            "compute it. Allocate y and residual_out with torch.empty_like(x), pass both to "
            "the kernel, and return them."),
    },
)


@learner_facing
def add_rmsnorm(fn: Callable, *, seed: int | None = None, quiet: bool = False) -> Report:
    """Check a learner's `add_rmsnorm(x, residual, weight, eps=1e-6)` on every case; raise
    AssertionError with advice on failure, return the report (printed unless quiet). In
    Triton's interpreter one case's loads are recorded, as chapter 04's are: a weight loaded
    past its end without a mask fails there, though its values come out right."""
    from course.check.address_pictures import check_with_pictures  # imports Triton

    return check_with_pictures(ADD_RMSNORM, fn, seed=seed, quiet=quiet)


@learner_facing
def add_rmsnorm_bandwidth(fn: Callable, *, target: float = 0.75,
                          shape: tuple[int, int] = (16384, 4096),
                          dtype: torch.dtype | None = None, retries: int = 3,
                          on_cpu: str = "skip") -> BandwidthResult | None:
    """On a GPU: check both outputs at `shape`, require one load of each element of x and
    of the residual (as rmsnorm_forward_bandwidth does of x) and none of either output
    (`add_rmsnorm_call_spec`), then `target` of the copy bandwidth (ideal bytes: x, residual
    and the weight read once, y and residual_out written once). Without a GPU the loads are
    counted in Triton's interpreter, on four rows, before the check says it cannot time."""
    if dtype is None:
        dtype = bf16 if runtime.supports_bf16() else f16
    m, n = shape
    label = f"add_rmsnorm {m}x{n} {str(dtype).replace('torch.', '')}"

    def make_args(rows: int = m):
        return (torch.randn((rows, n), dtype=dtype, device=runtime.DEVICE),
                torch.randn((rows, n), dtype=dtype, device=runtime.DEVICE),
                torch.rand(n, dtype=dtype, device=runtime.DEVICE) + 0.5)

    spec = add_rmsnorm_call_spec(dtype)
    nbytes = traffic.fused_add_rmsnorm(m, n, dtype).bytes
    return check_bandwidth(label, fn, make_args, nbytes, spec=spec, target=target,
                           retries=retries, small_args=lambda: make_args(4),
                           on_cpu=on_cpu, advice="One launch reads x and the residual once "
                           "and writes y and residual_out once: keep the sum in registers "
                           "between the add and the norm, BLOCK_N = next_power_of_2(N), and "
                           "choose num_warps by block size.")


def add_rmsnorm_call_spec(dtype: torch.dtype) -> CallSpec:
    """What makes one call of chapter 05's `add_rmsnorm` right at a timing shape: y and
    residual_out, one launch, no element of x or of the residual loaded twice, and no
    element of either output, or of any other buffer the call allocates, loaded at all."""
    # Both inputs counted: a kernel may keep x and read the residual again to add it anew.
    # The outputs too: a kernel may store the sum and load it back from residual_out, or
    # from a scratch buffer the wrapper allocates and does not return.
    return CallSpec(ADD_RMSNORM.output_names,
                    lambda x, residual, w: reference.add_rmsnorm(x, residual, w, eps=1e-6),
                    (dtype, dtype), max_launches=ADD_RMSNORM.max_launches,
                    arg_names=("x", "residual", "weight"), read_once=("x", "residual"),
                    read_once_advice=ONE_READ_ADVICE, write_only=("residual_out", "y"),
                    read_back_advice=READ_BACK_ADVICE, scratch_advice=SCRATCH_ADVICE)


ONE_READ_ADVICE = (
    "Chapter 05 asks for one read of x and of the residual: add them once, keep the sum in "
    "registers (BLOCK_N = triton.next_power_of_2(N)), and compute the sum of squares and y "
    "from those values.")

READ_BACK_ADVICE = (
    "Chapter 05 writes y and residual_out once and reads neither back: keep h in registers. "
    "After tl.store(residual_out_ptr + ..., h, mask=mask), where h = (x + r) rounded to "
    "x's dtype, compute the sum of squares and y from h.to(tl.float32), the value you "
    "already hold, instead of loading residual_out again with tl.load.")

SCRATCH_ADVICE = (
    "Chapter 05 keeps the sum in registers, never in a buffer of your own to load back: "
    "allocate y and residual_out only, and after tl.store(residual_out_ptr + ..., h, "
    "mask=mask), where h = (x + r) rounded to x's dtype, compute the sum of squares and y "
    "from h.to(tl.float32), the value you already hold, instead of loading the sum again "
    "with tl.load.")
