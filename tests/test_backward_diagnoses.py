"""Chapter 07's checkers name each mistake a learner makes in the backward exercises.

Each mistake (tests/ch07_answers.py) is the chapter's own answers with a line or two written
wrong, run through the correctness checks of the cells that grade that exercise: it must
fail exactly the cells it should (dx's and dW's are graded apart), with a message naming
its own bug and no other mistake's, and pass the others.
"""

from __future__ import annotations

import math

from course import check, reference, runtime, traffic
from course.check.backward import RMSNORM_BACKWARD, graded_part
from course.check.row_split import SPLIT_SHAPES, SPLIT_TOLERANCE, _random_shapes, blocks

import ch07_answers
import pytest
import torch
from ch07_answers import CELLS, MISTAKES, check_cell, load

interpreter_only = pytest.mark.skipif(runtime.on_gpu(), reason="the interpreter's own error")


@pytest.fixture(scope="module")
def correct():
    return load()


def test_the_chapters_answers_pass_every_correctness_cell(correct):
    for cell in CELLS:
        assert check_cell(correct, cell) is None, cell


def test_every_correctness_test_cell_of_the_chapter_is_covered_here():
    speed = {"ex07_backward_bandwidth", "ex07_layernorm_bandwidth"}
    hidden_only = {"ex07_autograd_hidden"}  # the autograd cell's hidden twin
    assert ch07_answers.grade_ids_of_tests() - speed - hidden_only == set(CELLS)


def _phrases() -> dict[str, str]:
    return {name: m.phrase for name, m in MISTAKES.items() if m.exclusive}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_each_mistake_fails_its_own_cells_with_its_own_message(name):
    mistake = MISTAKES[name]
    if "loop_variable" in name and runtime.on_gpu():
        pytest.skip("a GPU runs row.to(tl.int64): only the interpreter refuses it")
    module = load(mistake.edits)
    if name == "kernel_block_past_last_row" and runtime.on_gpu():
        # Only the rows-left-over case has a short last block there; what its rows past M
        # read (the guard values around x and dy) decides the message, not the sandbox.
        for cell in mistake.loses:
            assert check_cell(module, cell) is not None, f"{name} passed {cell}"
        return
    failing = set(mistake.loses) | set(mistake.also)
    for cell in mistake.checked:
        message = check_cell(module, cell)
        if cell not in failing:
            assert message is None, f"{name} ({mistake.what}) also failed {cell}:\n{message}"
            continue
        assert message is not None, f"{name} ({mistake.what}) passed {cell}"
        if cell == mistake.loses[0]:
            assert mistake.phrase in message, f"{name}, {cell}:\n{message}"
            for other, phrase in _phrases().items():
                if mistake.exclusive and phrase != mistake.phrase and other != name:
                    assert phrase not in message, (f"{name} was also blamed for {other} in "
                                                   f"{cell}:\n{message}")
        if cell in mistake.more:
            assert mistake.more[cell] in message, f"{name}, {cell}:\n{message}"


def test_a_constant_factor_is_quoted_with_what_it_is():
    module = load(MISTAKES["dx_divided_by_n"].edits)
    message = check_cell(module, "ex07_backward_dx")
    # The first wrong case has rows of 128: every dx is 1/128 of the right value.
    assert "times 0.0078125 = 1 / (N, the row's length)" in message, message


def test_dw_right_only_where_m_is_one_is_said_in_those_words():
    message = check_cell(load(MISTAKES["dw_some_partials"].edits), "ex07_backward_dw")
    assert "M = 1" in message and "not summed over all the rows" in message, message


@interpreter_only
def test_the_loop_variable_error_says_what_to_write_instead():
    message = check_cell(load(MISTAKES["row_dots_loop_variable_method"].edits),
                         "ex07_row_dots")
    assert "'int' object has no attribute 'to'" in message, message
    assert "first = pid.to(tl.int64) * rows_per_program" in message, message


def test_only_picks_the_outputs_a_cell_grades():
    assert graded_part(RMSNORM_BACKWARD, None) is RMSNORM_BACKWARD
    dx_only = graded_part(RMSNORM_BACKWARD, "dx")
    assert dx_only.graded == ("dx",) and {s.output for s in dx_only.suspects} == {"dx"}
    assert dx_only.atomics_allowed  # atomics are a rule for the sums, graded with dW
    assert not graded_part(RMSNORM_BACKWARD, "dw").atomics_allowed
    with pytest.raises(ValueError, match="only= takes"):
        graded_part(RMSNORM_BACKWARD, "db")


def test_a_dw_mistake_leaves_the_dx_cell_its_points():
    module = load(MISTAKES["dw_not_accumulated"].edits)
    report = check.rmsnorm_backward(module.rmsnorm_backward, only="dx", seed=1, quiet=True)
    assert report.passed


# --------------------------------------------------------------------------- the split rule


def test_split_model_is_best_where_the_gpu_just_fills():
    for m, n, sms in ((1152000, 384, 132), (16384, 4096, 132), (512, 8192, 132), (64, 64, 4)):
        best = traffic.best_split(m, n, sms)
        times = {p: traffic.split_time(m, n, p, sms)
                 for p in {1, max(1, best // 2), best, min(m, 2 * best), m}}
        assert min(times, key=times.get) == best, (m, n, sms, times)
    # Liger's one program per SM at the study's shape is far from the best; the study's
    # 32x more programs is within the tolerance.
    best = traffic.split_time(1152000, 384, traffic.best_split(1152000, 384, 132), 132)
    assert traffic.split_time(1152000, 384, 132, 132) / best > 10
    assert traffic.split_time(1152000, 384, 32 * 132, 132) / best < SPLIT_TOLERANCE


def test_split_rule_accepts_a_rule_within_the_tolerance_and_says_which_shape_failed():
    # The best splits looked up before the check: it refuses a rule that calls course.traffic.
    best = {s: traffic.best_split(*s) for s in (*SPLIT_SHAPES, *_random_shapes(0, 8))}

    def roughly(m: int, n: int, sms: int) -> int:  # 10 % fewer programs than the best
        return math.ceil(0.9 * best[(m, n, sms)])

    assert check.split_rule(roughly, seed=0, quiet=True).passed

    def too_few(m: int, n: int, sms: int) -> int:
        return min(m, sms)

    with pytest.raises(AssertionError) as failure:
        check.split_rule(too_few, shapes=[(1152000, 384, 132)], random_shapes=0, seed=0)
    assert "At M = 1152000, N = 384 with 132 SMs your rule gives P = 132" in str(failure.value)


def test_too_few_programs_is_explained_by_the_length_of_the_rows():
    def one_per_sm(m: int, n: int, sms: int) -> int:
        return min(m, sms)

    def half_the_sms(m: int, n: int, sms: int) -> int:
        return min(m, max(1, sms // 2))

    with pytest.raises(AssertionError) as short:  # rows of 384: too few programs per SM
        check.split_rule(one_per_sm, shapes=[(1152000, 384, 132)], random_shapes=0, seed=0)
    assert "Short rows need many programs per SM" in str(short.value), short.value
    with pytest.raises(AssertionError) as long:  # rows of 16384: SMs without a program
        check.split_rule(half_the_sms, shapes=[(8192, 16384, 132)], random_shapes=0, seed=0)
    message = str(long.value)
    assert "Short rows" not in message, message
    assert "66 of the 132 SMs have no program at all" in message, message


def test_row_blocks_cover_every_row_once():
    for m in range(1, 40):
        for p in range(1, 45):
            rows, programs = blocks(m, p)
            assert programs <= p and (programs - 1) * rows < m <= programs * rows


# --------------------------------------------------------------------------- graded for real

@pytest.mark.slow
@pytest.mark.skipif(runtime.on_gpu(), reason="the points without a GPU (speed cells fail)")
@pytest.mark.parametrize("student", ["mistakes_a"])  # three mistakes, three exercises
def test_a_mistake_graded_by_the_verifier_loses_its_own_cells_only(student, tmp_path):
    from grader_submissions import ROOT, ch07_submissions, expected_points, verified

    sub = next(s for s in ch07_submissions() if s.student == student)
    verdict = verified(sub, tmp_path)
    got = {c.grade_id: c.points for c in verdict.cells}
    assert got == expected_points(ROOT, sub), (sub.what, verdict.to_json()[:4000])
    first = next(c for c in verdict.cells if c.grade_id == sub.loses[0])
    assert sub.reason in first.reason, first.reason


def test_split_time_refuses_more_programs_than_rows():
    with pytest.raises(ValueError, match="at most M = 10"):
        traffic.split_time(10, 64, 11, 4)


def test_layernorm_reference_from_saved_statistics_is_the_closed_form_for_exact_ones():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 20, generator=gen, dtype=torch.float64) * 3 + 10
    w, b = torch.rand(20, generator=gen, dtype=torch.float64), torch.randn(20, generator=gen)
    dy = torch.randn(5, 3, 20, generator=gen, dtype=torch.float64)
    mean, rstd = reference.layernorm_stats(x, 1e-5)
    for ours, closed in zip(reference.layernorm_backward_from_stats(x, w, mean, rstd, dy),
                            reference.layernorm_backward(x, w, b, dy, eps=1e-5), strict=True):
        assert torch.allclose(ours, closed, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_gpu_the_chapters_backwards_reach_their_bandwidth_targets(correct):
    rms = check.rmsnorm_backward_bandwidth(correct.rmsnorm_backward)
    ln = check.layernorm_backward_bandwidth(correct.layernorm_backward)
    assert rms.passed and ln.passed
