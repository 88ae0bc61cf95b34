"""Turning a set of case results into advice a learner can act on.

A single wrong number rarely says what is wrong; the pattern across cases does. Each rule
below looks at which kinds of case (tags) pass and which fail, and names the bug that
produces exactly that pattern.
"""

from __future__ import annotations

from collections.abc import Sequence

from course import runtime
from course.check.runner import CaseResult

import torch

_CALL_FINDINGS = {
    "no_launch": ("Your function launched no Triton kernel. The exercise is to compute the "
                  "result in a @triton.jit kernel launched as kernel[grid](...)."),
    "torch_ops": ("Your wrapper computes with PyTorch instead of (or as well as) your kernel. "
                  "Only allocation (torch.empty_like), views and your kernel launch belong in the "
                  "wrapper; move the arithmetic into the kernel."),
    "output_not_from_kernel": ("The tensor you return was never passed to your kernel, so "
                               "your kernel did not compute it. Allocate the output with "
                               "torch.empty_like(x), pass it to the kernel, and return it."),
    "extra_launches": ("Your function launches more kernels than the exercise allows: a fused "
                       "kernel does all the work in one launch."),
    "input_written": ("Your kernel writes into an input. Store to the output pointer (y_ptr), "
                      "never to x_ptr or the weight."),
    "input_guard_written": ("Your kernel writes outside the input tensor's rows: check the "
                            "store's pointer and mask."),
    "output_margin_written": ("Your kernel writes outside the output tensor, past the end of a "
                              "row or of the tensor: mask the store (mask=cols < n_cols) and "
                              "check the row offset."),
    "cached": ("Called twice with different inputs of the same shape, your function returned "
               "the first call's result the second time. Compute every call afresh."),
}


def _cases(results: Sequence[CaseResult]) -> str:
    names = [r.case.label() for r in results]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _tagged(results: Sequence[CaseResult], tag: str) -> list[CaseResult]:
    return [r for r in results if tag in r.case.tags]


def _value_advice(results: Sequence[CaseResult]) -> str | None:
    checked = [r for r in results if r.error is None]
    wrong = [r for r in checked if r.mismatches]
    if not wrong:
        return None
    right = [r for r in checked if not r.mismatches]
    wrong_tags = [r.case.tags for r in wrong]

    def all_wrong_have(*tags: str) -> bool:
        return all(any(t in ts for t in tags) for ts in wrong_tags)

    def all_right(tag: str) -> bool:
        tagged = _tagged(checked, tag)
        return bool(tagged) and all(not r.mismatches for r in tagged)

    first = [m for r in wrong for m in r.mismatches]
    if len(wrong) == len(checked) and all(m.all_poison for m in first):
        return ("Every output is entirely NaN, the value the checker puts in fresh memory: your "
                "kernel never stores into the tensor you return. (Did you store to the right "
                "pointer, and return the tensor you passed to the kernel?) Without the poison, "
                "such a kernel can look right by accident: PyTorch hands a freed block back with "
                "its old contents, often a previous correct answer.")
    tails = {m.poison_tail_from() for m in first}
    if None not in tails:
        k = min(tails)
        return (f"Columns {k} and beyond were never written (they still hold the checker's NaN): "
                "your kernel covers only the first part of each row. Make the block cover the "
                "whole row: BLOCK_N = triton.next_power_of_2(N) passed as a tl.constexpr, or "
                "loop over the row in blocks.")
    if all_wrong_have("strided") and not _tagged(right, "strided"):
        return ("Only inputs whose rows are not contiguous fail: your kernel assumes the row "
                "stride equals N. Pass x.stride(-2) (and the output's row stride) to the kernel "
                "and use them for the row offset.")
    # With N = 1 every output is +-weight, so a wrong row can match by chance: leave it out.
    informative = [m for m in first if m.n_cols > 1] or first
    if all(m.first_row_right_others_not for m in informative):
        return ("Row 0 is right but the other rows are wrong: each program must offset its "
                "pointers by its row, x_ptr + row * stride_x_row (and the same for the output).")
    if all_wrong_have("odd_n", "wide") and all_right("pow2"):
        return ("Cases where N is a power of two pass, the others fail: the loads (and stores) "
                "past the end of the row are not masked. Use cols = tl.arange(0, BLOCK_N), "
                "mask = cols < n_cols, tl.load(..., mask=mask, other=0.0) and "
                "tl.store(..., mask=mask).")
    fp32 = [r for r in checked if r.case.dtype == torch.float32]
    if all_wrong_have("half") and fp32 and all(not r.mismatches for r in fp32):
        parts = ["float32 inputs pass but 16-bit inputs fail: the statistics are computed in "
                 "the input's precision. Convert what you load to float32 before squaring and "
                 "summing (tl.load(...).to(tl.float32)), and convert back only when storing."]
        if _tagged(wrong, "magnitude"):
            parts.append("With float16 values near 300, x * x exceeds float16's largest value "
                         "(65504) and becomes inf.")
        if _tagged(wrong, "bf16") and runtime.interpreted():
            parts.append("In Triton's CPU interpreter a bfloat16 tl.sum adds the raw 16-bit "
                         "patterns and returns garbage (triton-lang/triton issue 11604); on a "
                         "GPU, tl.sum keeps the input dtype, so the same kernel sums in genuine "
                         "low-precision bfloat16 and loses accuracy as N grows. The float32 "
                         "conversion fixes both.")
        elif _tagged(wrong, "bf16"):
            parts.append("On a GPU, tl.sum keeps the input dtype: a bfloat16 sum of many "
                         "squares loses accuracy as N grows.")
        return " ".join(parts)
    if all_wrong_have("eps"):
        return ("Only the case with a non-default eps fails: use the eps argument you are given "
                "(pass it to the kernel), not a constant.")
    if all_wrong_have("nd"):
        return ("Only the 3-D input fails: normalise over the last dimension for any number of "
                "leading dimensions (treat the input as x.reshape(-1, N) rows, and return the "
                "input's shape).")
    if all_wrong_have("zeros"):
        return ("Rows of zeros fail: with eps inside the square root, 0 * rstd is 0, never NaN. "
                "Is eps added before the square root?")
    if all_wrong_have("edge"):
        return ("Only degenerate sizes (N = 1 or M = 1) fail: check the grid (one program per "
                "row) and that BLOCK_N is at least N.")
    if all_wrong_have("mean"):
        return ("Rows with a large mean fail: E[x^2] - E[x]^2 cancels catastrophically. Subtract "
                "the mean first (x - mean), then square.")
    return ("Values are wrong on " + _cases(wrong) + ". Compare your formula with the reference "
            "on the first example below.")


def advise(results: Sequence[CaseResult]) -> list[str]:
    """Messages, most important first; empty when everything passed."""
    failing = [r for r in results if not r.passed]
    if not failing:
        return []
    advice = []
    errors = [r for r in failing if r.error]
    if errors:
        advice.append(f"Your function raised an error on {_cases(errors)}:\n{errors[0].error}")
    for kind, text in _CALL_FINDINGS.items():
        hits = [r for r in failing if r.finding(kind)]
        if hits:
            advice.append(f"{text}\n  Seen on {_cases(hits)}: {hits[0].finding(kind).message}.")
    value = _value_advice(results)
    if value:
        example = next(r for r in results if r.mismatches)
        detail = "\n".join(m.describe() for m in example.mismatches)
        advice.append(f"{value}\n  First wrong case, {example.case.label()}:\n{detail}")
    return advice
