"""Turning a set of case results into advice a learner can act on.

A single wrong number rarely says what is wrong; the pattern across cases does. Each rule
below looks at which kinds of case (tags) pass and which fail, and names the bug that
produces exactly that pattern.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence

from course import runtime
from course.check.compare import TOLERANCES
from course.check.runner import CaseResult, Suspect

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
    "outside_every_tensor": (
        "Your kernel loads or stores far outside every tensor it was given. The check "
        "switched those lanes off; left alone, Triton's interpreter reads and writes whatever "
        "memory lies there (Python's own: the notebook's kernel can crash), and a GPU stops "
        "with an illegal memory access. Check the grid: one program per row is grid = (M,), "
        "M the number of rows (x2.shape[0] for x2 = validation.as_rows(x)), not N, the "
        "length of a row. And check each pointer: a row of x or y starts at row * that "
        "tensor's own row stride, while the weight takes no row offset (w_ptr + cols)."),
    "input_written": ("Your kernel writes into an input. Store to the output pointer (y_ptr), "
                      "never to x_ptr or the weight."),
    "input_guard_written": ("Your kernel writes outside the input tensor's rows: check the "
                            "store's pointer and mask."),
    "output_margin_written": ("Your kernel writes outside the output tensor, past the end of a "
                              "row or of the tensor: mask the store (mask=cols < n_cols) and "
                              "check the row offset."),
    "input_read_outside": (
        "Your kernel loads past the end of an input. What it read there never reached your "
        "output, so the values are right here, but on a GPU those lanes read memory that "
        "belongs to other tensors or to no one (an illegal memory access, after which the GPU "
        "is unusable until the notebook's kernel restarts). Mask every load: the weight (and "
        "a bias) is read with the same cols as a row of x, so its load takes the same mask, "
        "tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0)."),
    "cached": ("Called twice with different inputs of the same shape, your function returned "
               "the first call's result the second time. Compute every call afresh."),
    "cached_by_address": (
        "Your function returned a result cached by the input's address: called again with "
        "the same input tensors refilled with new values, it returned the answer for the old "
        "values. A tensor's address (x.data_ptr()), shape and dtype say where its values "
        "are, not what they are: real models refill the same buffers with new values every "
        "step (static caches, CUDA graphs). Keep no results between calls, under any key: "
        "launch your kernel on every call and return what it computed from the values the "
        "tensors hold now."),
    "kept_result": (
        "Your function returned a result kept from an earlier call, most likely cached by the "
        "input's address: on one call it launched no kernel and returned a tensor that "
        "existed before that call, though it launched its kernel on the others. That call's "
        "inputs were new tensors, and a new tensor can take the memory, and so the "
        "x.data_ptr() and id(x), of one freed earlier: a lookup keyed on them finds the old "
        "answer. Keep no results between calls, under any key: launch your kernel on every "
        "call and return what it computed from the values the tensors hold now."),
    "stale_by_address": (
        "Wrong when called again with the same input tensors refilled with new values: "
        "something computed from an input on an earlier call (a converted weight, a row "
        "statistic, part of the output) was kept and looked up by the tensor (its "
        "data_ptr(), id() or shape), so it went stale when the values changed. Real models "
        "refill the same buffers every step (static caches, CUDA graphs): compute everything "
        "from the values the tensors hold now, on every call."),
    "atomics": ("Your kernels use atomics (tl.atomic_add, ...). This exercise asks for a "
                "deterministic reduction without them: each program writes its own partial "
                "sums, and a second kernel adds them up."),
}


# In Triton's interpreter the variable of `for r in range(start, end)` is a plain Python
# int; compiled for a GPU it is a tensor. Methods of a tensor called on it (r.to(tl.int64))
# work on a GPU and fail only here, with an error that points at the launch.
_LOOP_VARIABLE = re.compile(r"'int' object has no attribute '(\w+)'")


# Triton refuses a block whose length is not a power of two, in both modes: tl.arange says
# so in its words, tl.zeros (a two-pass kernel's accumulator, made first) in others.
_ARANGE = re.compile(r"arange's range must be a power of 2|Shape element \d+ must be a power "
                     r"of 2")
# PyTorch, when backward returns a gradient of another input's shape (dx and dw swapped).
_GRADIENT_SHAPE = re.compile(r"returned an invalid gradient at index (\d+) - got \[([\d, ]*)\] "
                             r"but expected shape compatible with \[([\d, ]*)\]")


def _error_hint(error: str) -> str:
    """What an error means, and what to write instead, when it is one a learner meets
    often (a block that is not a power of two, gradients in the wrong order, a known
    difference between the interpreter and a GPU); empty otherwise."""
    if _ARANGE.search(error):
        return ("\n  tl.arange(0, BLOCK_N) and tl.zeros([BLOCK_N]) need a power-of-two "
                "length, and a row's N need not be one: launch with BLOCK_N = "
                "triton.next_power_of_2(N) (a tl.constexpr; for a loop over the row, "
                "min(1024, triton.next_power_of_2(N))), and mask the columns past N, mask = "
                "cols < n_cols, in every load and store.")
    shape = _GRADIENT_SHAPE.search(error)
    if shape:
        return (f"\n  backward's value at index {shape.group(1)}, the gradient of forward's "
                f"input {shape.group(1)}, has shape [{shape.group(2)}] where that input has "
                f"shape [{shape.group(3)}]. "
                "backward returns one gradient per input of forward, in forward's order and "
                "each of its input's shape: for forward(ctx, x, weight, eps), "
                "`return dx, dw, None` (dx first, like x). Are dx and dw swapped?")
    found = _LOOP_VARIABLE.search(error)
    if found is None or not runtime.interpreted():
        return ""
    method = found.group(1)
    return (f"\n  This is a difference between Triton's interpreter and a GPU, not a bug a GPU "
            f"would show: in the interpreter, the variable of a `for row in range(first, last)` "
            f"loop is a plain Python int, while compiled for a GPU it is a tensor. So "
            f"`row.{method}(...)` (for example row.to(tl.int64)) works on a GPU and fails "
            "here. Call no tensor methods on a loop variable: make the bounds 64-bit "
            "before the loop instead (first = pid.to(tl.int64) * rows_per_program; "
            "last = tl.minimum(first + rows_per_program, n_rows)), so that row * stride is "
            "computed in 64 bits on a GPU, and in Python integers, which never overflow, here.")


def _cases(results: Sequence[CaseResult]) -> str:
    names = [r.case.label() for r in results]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _tagged(results: Sequence[CaseResult], tag: str) -> list[CaseResult]:
    return [r for r in results if tag in r.case.tags]


def _common_factor(result: CaseResult) -> float | None:
    """c when every example of the case's mismatches reads got = c * expected, to within
    the rounding of the output's dtype; None otherwise (or with no example to read)."""
    _, rtol = TOLERANCES.get(result.case.dtype, TOLERANCES[torch.float32])
    ratios = []
    for mismatch in result.mismatches:
        if not mismatch.examples:  # rows off by a tiny common factor: not this pattern
            return None
        for _, want, got in mismatch.examples:
            if not math.isfinite(got):
                return None
            if abs(want) > 1e-2:  # near zero, rounding swamps the ratio
                ratios.append(got / want)
    if not ratios or ratios[0] == 0:
        return None
    if any(abs(r / ratios[0] - 1) > 2 * rtol for r in ratios):
        return None
    return ratios[0]


def _power_of_two_divisor(results: Sequence[CaseResult]) -> list[tuple[CaseResult, float, int]]:
    """(case, factor, block) for every wrong case when each is the reference times one
    factor sqrt(block / N), block a power of two other than N: the row's mean divided by
    the block size instead of N. Empty when any wrong case does not fit. Cases with a
    custom eps are left out: an eps that outweighs the mean square changes the factor."""
    found = []
    for result in results:
        if "eps" in result.case.tags:
            continue
        factor = _common_factor(result)
        if factor is None or factor <= 0:
            return []
        n = result.case.n
        divisor = factor * factor * n
        if divisor < 1:  # no block holds less than one column
            return []
        block = 2 ** round(math.log2(divisor))
        _, rtol = TOLERANCES.get(result.case.dtype, TOLERANCES[torch.float32])
        if block == n or abs(divisor / block - 1) > 4 * rtol + 1e-3:
            return []
        found.append((result, factor, block))
    return found


def _value_advice(results: Sequence[CaseResult]) -> tuple[str, str] | None:
    """(rule, advice) for the pattern of wrong values across cases, or None. An exercise
    may replace a rule's advice by its key (Exercise.advice)."""
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
        return "all_poison", (
            "Every output is entirely NaN, the value the checker puts in fresh memory: your "
            "kernel never stores into the tensor you return. (Did you store to the right "
            "pointer, and return the tensor you passed to the kernel?) Without the poison, "
            "such a kernel can look right by accident: PyTorch hands a freed block back with "
            "its old contents, often a previous correct answer.")
    tails = {m.poison_tail_from() for m in first}
    if None not in tails:
        k = min(tails)
        return "tail", (
            f"Columns {k} and beyond were never written (they still hold the checker's NaN): "
            "your kernel covers only the first part of each row. Make the block cover the "
            "whole row: BLOCK_N = triton.next_power_of_2(N) passed as a tl.constexpr, or "
            "loop over the row in blocks, for start in range(0, n_cols, BLOCK_N), where each "
            "block's mask compares its columns, cols = start + tl.arange(0, BLOCK_N), with "
            "n_cols (a mask cols < BLOCK_N switches off every block after the first).")
    matrices = [m for m in first if not m.vector]
    last_rows = {m.unwritten_rows_from() for m in matrices}
    if matrices and None not in last_rows:
        return "last_rows", (
            "The last rows were left unwritten (they still hold the checker's NaN), and every "
            "row before them is right: the launch leaves the rows past a whole number of "
            "programs without one. Round up: triton.cdiv(M, rows) programs, not M // rows, "
            "and mask the rows past M in the last program.")
    if all_wrong_have("strided") and not _tagged(right, "strided"):
        return "strided", (
            "Only inputs whose rows are not contiguous fail: your kernel assumes the row "
            "stride equals N. Pass the row stride of the tensor the kernel receives, the 2-D "
            "view x2 = validation.as_rows(x): x2.stride(0) (and the output's, y.stride(0)), "
            "and use them for the row offset.")
    # With N = 1 every output is +-weight, so a wrong row can match by chance: leave it out.
    informative = [m for m in first if m.n_cols > 1] or first
    row_zero_only = all(m.first_row_right_others_not for m in informative)
    if row_zero_only and all_wrong_have("nd"):
        return "nd_row_stride", (
            "Only the 3-D input fails, and its row 0 is right: the kernel steps from row to "
            "row with a stride that is not its rows'. For x of shape (A, B, N), x.stride(0) "
            "steps over B rows at once. Launch on the 2-D view x2 = validation.as_rows(x) "
            "and pass its row stride, x2.stride(0) (and y.stride(0) for the (M, N) output "
            "you allocate).")
    if row_zero_only:
        return "row_offset", (
            "Row 0 is right but the other rows are wrong: each program must offset its "
            "pointers by its row, x_ptr + row * stride_x_row (and the same for the output), "
            "where stride_x_row is the row stride of the 2-D view the kernel receives: "
            "x2.stride(0) for x2 = validation.as_rows(x).")
    # Before the mask rule: long rows are also "odd_n", and a GPU's low-precision
    # accumulation fails only the long 16-bit rows.
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
        return "half", " ".join(parts)
    # Before the wide and mask rules: a mean divided by BLOCK_N fails exactly where N is not
    # the block size, the same cases a missing mask fails, but leaves each row a clean
    # multiple of the right one.
    divided_by_block = _power_of_two_divisor(wrong)
    if divided_by_block:
        seen = "; ".join(f"N = {r.case.n}: factor {factor:.4f} = sqrt({block} / {r.case.n})"
                         for r, factor, block in divided_by_block[:3])
        return "block_divisor", (
            "Each wrong row is the expected row times one factor, sqrt(B / N) for a power of "
            f"two B ({seen}): the sum of squares is divided by B, the block size, instead of "
            "N, the row's length. Divide by n_cols, not BLOCK_N: the lanes past the end of the "
            "row are padding (the mask loads them as 0.0), not data, so they add nothing to "
            "the sum and must not count in the mean.")
    if all_wrong_have("wide") and right and not _tagged(right, "wide"):
        return "wide", (
            "Only rows longer than one block fail: the loop over column blocks loses part of "
            "the row. Accumulate across iterations (acc += ..., from zeros set before the "
            "loop), finish the sum of squares over the whole row before normalising, and in "
            "the second loop step through every block with the same offsets and masks.")
    if all_wrong_have("odd_n", "wide") and all_right("pow2"):
        return "mask", (
            "Cases where N is a power of two pass, the others fail: the loads (and stores) "
            "past the end of the row are not masked. Use cols = tl.arange(0, BLOCK_N), "
            "mask = cols < n_cols (not <=: column n_cols is already past the end), "
            "tl.load(..., mask=mask, other=0.0) and tl.store(..., mask=mask).")
    # Without eps, a row of zeros computes 0 / 0 and a larger eps changes nothing; a row of
    # one small element (N = 1) may show it too.
    zeros_computed_nan = any(m.n_computed_nan for r in _tagged(wrong, "zeros")
                             for m in r.mismatches)
    if (zeros_computed_nan and _tagged(wrong, "eps")
            and all_wrong_have("zeros", "eps", "edge")):
        return "eps_missing", (
            "Rows of zeros come out NaN and the case with a larger eps fails: eps is missing "
            "from the square root. Add the eps argument under the root, rstd = 1 / sqrt("
            "mean(x^2) + eps) (for LayerNorm, 1 / sqrt(var + eps)): then a row of zeros gives "
            "0 * rstd = 0 instead of 0 / 0.")
    if all_wrong_have("eps"):
        return "eps", ("Only the case with a non-default eps fails: use the eps argument you "
                       "are given (pass it to the kernel), not a constant.")
    if all_wrong_have("nd"):
        return "nd", ("Only the 3-D input fails: normalise over the last dimension for any "
                      "number of leading dimensions (treat the input as x.reshape(-1, N) rows, "
                      "and return the input's shape).")
    if all_wrong_have("zeros"):
        return "zeros", ("Rows of zeros fail: with eps inside the square root, 0 * rstd is 0, "
                         "never NaN. Is eps added before the square root?")
    if all_wrong_have("edge"):
        return "edge", ("Only degenerate sizes (N = 1 or M = 1) fail: check the grid (one "
                        "program per row) and that BLOCK_N is at least N.")
    # A row of one element equals its mean, so a cancellation shows there too (on a GPU,
    # where x * rstd - mean * rstd becomes one FMA, it does): it does not count against.
    if _tagged(wrong, "mean") and all("mean" in r.case.tags or r.case.shape[-1] == 1
                                      for r in wrong):
        return "mean", (
            "Only rows with a large mean (or of one element, equal to their mean) fail: "
            "catastrophic cancellation. With a mean of 1e4 "
            "and a spread of 1, E[x^2] is about 1e8, of which float32 keeps about 7 digits, so "
            "E[x^2] - E[x]^2 (a one-pass sum and sum of squares) loses the variance entirely. "
            "Compute the mean first, then sum (x - mean)^2 in a second pass over the row (it "
            "is still in registers), or use Welford's update.")
    return "values", (f"Values are wrong on {_cases(wrong)}. Compare your formula with the "
                      "reference on the first example below.")


def _explaining(results: Sequence[CaseResult], suspects: Sequence[Suspect]
                ) -> list[tuple[Suspect, list[tuple[CaseResult, str]]]]:
    """The known wrong answers that explain the failures, each with the cases it matched
    (and their details). A suspect counts when it matches at least half the cases where its
    output is wrong (a stray case, such as N = 1, may fail differently); the first that
    counts explains its output."""
    found, explained = [], set()
    for suspect in suspects:
        if suspect.output in explained:
            continue
        if suspect.across is not None and not suspect.across(results):
            continue
        wrong = [r for r in results if r.error is None
                 and any(m.name == suspect.output for m in r.mismatches)]
        hits = [(r, d) for r in wrong for n, d in r.hints if n == suspect.name]
        if not hits or 2 * len(hits) < len(wrong):
            continue
        explained.add(suspect.output)
        found.append((suspect, hits))
    return found


def _suspect_advice(results: Sequence[CaseResult], suspects: Sequence[Suspect]
                    ) -> tuple[list[str], set[str]]:
    """Advice for the known wrong answers that explain the failures, and the outputs they
    explain."""
    advice, explained = [], set()
    for suspect, hits in _explaining(results, suspects):
        explained.add(suspect.output)
        first, detail = hits[0]
        mismatch = next(m for m in first.mismatches if m.name == suspect.output)
        seen = f"\n  Seen on {_cases([r for r, _ in hits])}" + (f": {detail}" if detail else "")
        advice.append(f"{suspect.advice}{seen}\n  First wrong case, {first.case.label()}:\n"
                      f"{mismatch.describe()}")
    return advice, explained


def _without(results: Sequence[CaseResult], outputs: set[str]) -> list[CaseResult]:
    """The results with the mismatches of some outputs left out."""
    if not outputs:
        return list(results)
    return [dataclasses.replace(r, mismatches=tuple(m for m in r.mismatches
                                                    if m.name not in outputs))
            for r in results]


def _finding_advice(failing: Sequence[CaseResult], overrides: Mapping[str, str]) -> list[str]:
    """One message per distinct advice. Kinds this module knows come first, in its order;
    an exercise may say more about one input ("input_written:dy"); a kind only an exercise
    knows uses the exercise's text, or else the finding's own message."""
    kinds = list(_CALL_FINDINGS)
    kinds += [f.kind for r in failing for f in r.findings if f.kind not in kinds]
    by_text: dict[str, list[tuple[CaseResult, str]]] = {}
    for kind in dict.fromkeys(kinds):
        for r in failing:
            for f in r.findings:
                if f.kind != kind:
                    continue
                text = (overrides.get(f"{kind}:{f.subject}") or overrides.get(kind)
                        or _CALL_FINDINGS.get(kind) or "")
                by_text.setdefault(text, []).append((r, f.message))
    advice = []
    for text, pairs in by_text.items():
        cases: list[CaseResult] = []
        for r, _ in pairs:
            if not any(r is c for c in cases):
                cases.append(r)
        head = f"{text}\n  " if text else ""
        advice.append(f"{head}Seen on {_cases(cases)}: {pairs[0][1]}.")
    return advice


def advise(results: Sequence[CaseResult], suspects: Sequence[Suspect] = (),
           overrides: Mapping[str, str] | None = None) -> list[str]:
    """Messages, most important first; empty when everything passed.

    `suspects` are an exercise's known wrong answers (see runner.Suspect); `overrides`
    replace the generic advice for a finding kind or a value rule, by key.
    """
    failing = [r for r in results if not r.passed]
    if not failing:
        return []
    overrides = overrides or {}
    advice = []
    errors = [r for r in failing if r.error]
    if errors:
        advice.append(f"Your function raised an error on {_cases(errors)}:\n{errors[0].error}"
                      + _error_hint(errors[0].error))
    advice += _finding_advice(failing, overrides)
    suspect_advice, explained = _suspect_advice(results, suspects)
    advice += suspect_advice
    remaining = _without(results, explained)
    value = _value_advice(remaining)
    if value:
        key, text = value
        text = overrides.get(key, text)
        example = next(r for r in remaining if r.mismatches)
        detail = "\n".join(m.describe() for m in example.mismatches)
        advice.append(f"{text}\n  First wrong case, {example.case.label()}:\n{detail}")
    return advice


# Diagnoses about addresses, which elements a kernel loads and stores: a picture of its
# accesses shows them (course.check.address_pictures).
ADDRESS_RULES = frozenset({"all_poison", "tail", "last_rows", "strided", "nd_row_stride",
                           "row_offset", "wide", "mask", "edge"})
ADDRESS_FINDINGS = frozenset({"input_written", "input_guard_written", "output_margin_written",
                              "input_read_outside", "outside_every_tensor"})
ADDRESS_SUSPECTS = frozenset({"weight_row_offset", "whole_blocks_stored"})


def address_failure(results: Sequence[CaseResult], suspects: Sequence[Suspect] = ()
                    ) -> CaseResult | None:
    """The case to picture when the failures are diagnosed as a matter of addresses: the
    example case of an address rule (the one `advise` shows), else the first case an
    address suspect matched, else the first case with an address finding; None when no
    diagnosis is about addresses."""
    explaining = _explaining(results, suspects)
    remaining = _without(results, {suspect.output for suspect, _ in explaining})
    value = _value_advice(remaining)
    if value is not None and value[0] in ADDRESS_RULES:
        example = next(r for r in remaining if r.mismatches)
        return next(r for r in results if r.case == example.case)
    for suspect, hits in explaining:
        if suspect.name in ADDRESS_SUSPECTS:
            return hits[0][0]
    return next((r for r in results if not r.passed
                 and any(f.kind in ADDRESS_FINDINGS for f in r.findings)), None)
