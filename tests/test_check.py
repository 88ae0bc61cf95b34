"""The RMSNorm forward checker: a correct kernel passes; each broken or dishonest kernel
fails with the message that names its own bug, and only that."""

from __future__ import annotations

from course import check, runtime
from course.check import sandbox
from course.check.rmsnorm import RMSNORM_FORWARD
from course.check.suite import run_exercise
from course.hardware import NeedsGPU

import pytest
import rmsnorm_variants as variants
import torch

# Phrases of other variants that legitimately appear too: no_triton really does compute
# with PyTorch, and torch_ops_in_wrapper really returns a tensor its kernel never saw.
ALSO_TRUE = {"no_triton": {"torch_ops_in_wrapper"},
             "torch_ops_in_wrapper": {"numpy_behind_a_dummy_launch"},
             # its picture of accesses says which rows were never written, as fixed_block's
             # message says which columns
             "rows_left_over": {"fixed_block"}}


def test_correct_kernel_passes_every_case():
    report = check.rmsnorm_forward(variants.correct, seed=7, quiet=True)
    assert report.passed
    assert len(report.results) >= 14
    assert all(r.launches == ("rmsnorm_kernel",) for r in report.results)
    shapes = {r.case.shape for r in report.results}
    assert (5, 1) in shapes and (1, 257) in shapes and (2, 3, 64) in shapes
    assert {r.case.dtype for r in report.results} >= {torch.float32, torch.float16}


def test_a_report_shows_as_one_line_under_the_cell_that_ends_with_the_check():
    """A test cell's last line is a bare checker call: Jupyter shows repr() of its value
    under the report the checker printed. One line, not the dataclass (issue #34)."""
    report = check.rmsnorm_forward(variants.correct, seed=7, quiet=True)
    text = repr(report)
    assert text == f"<rmsnorm_forward report: {len(report.results)}/{len(report.results)} " \
                   "cases pass, seed 7>"
    assert not hasattr(report, "_repr_html_")  # JupyterLab would draw the table again
    assert str(report) == report.summary()  # print(report) still shows the table


def test_the_speed_checks_results_show_as_one_line_too():
    from course import bench, traffic
    from course.check.lab import ShapeTiming
    from course.check.two_pass import ModelComparison

    def timed(label, seconds):
        return bench.Measurement(label, seconds, 10**8, 3e12)

    bandwidth = check.BandwidthResult("rmsnorm 16384x4096 bfloat16", 0.75,
                                      (timed("rmsnorm", 5e-5), timed("rmsnorm", 4e-5)))
    assert repr(bandwidth) == ("<rmsnorm 16384x4096 bfloat16: 83 % of copy, passes the 75 % "
                               "target>")
    model = ModelComparison(timed("rmsnorm_two_pass 16384x4096 bfloat16", 1e-4),
                            traffic.two_pass_rmsnorm(16384, 4096, torch.bfloat16), 8e-5)
    assert repr(model) == ("<rmsnorm_two_pass 16384x4096 bfloat16: 33 % of copy, 1.25x the "
                           "model's time>")
    race = check.CompileComparison(torch.bfloat16, (ShapeTiming(
        (4096, 4096), timed("yours", 1e-4), timed("compile", 1.2e-4), 1),))
    assert repr(race) == ("<rmsnorm vs torch.compile (bfloat16): as fast or faster; speedup "
                          "4096x4096 1.20x>")
    assert not hasattr(race, "_repr_html_")


@pytest.mark.parametrize("name", sorted(variants.BROKEN))
def test_broken_kernel_fails_with_its_own_message(name):
    fn, phrase = variants.BROKEN[name]
    variants._cache.clear()  # caches_results's, which other test files fill too
    with pytest.raises(AssertionError) as failure:
        check.rmsnorm_forward(fn, seed=3, quiet=True)
    message = str(failure.value)
    assert phrase in message, message
    for other, (_, other_phrase) in variants.BROKEN.items():
        if other != name and other not in ALSO_TRUE.get(name, set()):
            assert other_phrase not in message, f"{name} was also blamed for {other}:\n{message}"


def test_failure_message_locates_the_torch_op_in_the_learners_code():
    report = run_exercise(RMSNORM_FORWARD, variants.torch_ops_in_wrapper, seed=1)
    text = "\n".join(report.advice)
    assert "aten.pow" in text and "rmsnorm_variants.py, line" in text


def test_missing_mask_names_tail_rows_and_expected_values():
    report = run_exercise(RMSNORM_FORWARD, variants.missing_mask, seed=1)
    text = report.message()
    assert "expected" in text and "got" in text
    failing = {r.case.name for r in report.results if not r.passed}
    assert "power-of-two N" not in failing and "odd N" in failing


def test_bf16_accumulation_message_explains_interpreter_and_gpu():
    report = run_exercise(RMSNORM_FORWARD, variants.low_precision_accumulation, seed=2)
    text = report.message()
    failing = {r.case.dtype for r in report.results if not r.passed}
    assert torch.float32 not in failing
    assert "float32" in text
    if runtime.interpreted():
        assert "issue 11604" in text and "on a GPU" in text


def test_seed_makes_inputs_reproducible_and_fresh_otherwise():
    case = RMSNORM_FORWARD.cases[0]
    a = RMSNORM_FORWARD.make_inputs(case, torch.Generator().manual_seed(5))["x"].tensor
    b = RMSNORM_FORWARD.make_inputs(case, torch.Generator().manual_seed(5))["x"].tensor
    c = RMSNORM_FORWARD.make_inputs(case, torch.Generator().manual_seed(6))["x"].tensor
    assert torch.equal(a, b) and not torch.equal(a, c)
    seeds = {run_exercise(RMSNORM_FORWARD, variants.correct).seed for _ in range(3)}
    assert len(seeds) > 1  # no seed given: fresh inputs every time


def test_allocations_inside_a_watched_call_are_poisoned_and_guarded():
    with sandbox.watch() as record:
        y = torch.empty(4, 8, device=runtime.DEVICE)
    assert torch.isnan(y).all()
    assert record.margin_writes() == []
    storage = record.allocations[0].buffer
    storage[record.allocations[0].margin + 32] = 1.0  # one element past the end
    (alloc, before, after), = record.margin_writes()
    assert (before, after) == (0, 1) and alloc.view_shape == (4, 8)


def test_views_and_copies_are_allowed_but_arithmetic_is_recorded():
    x = torch.randn(4, 8, device=runtime.DEVICE)
    with sandbox.watch() as record:
        x.reshape(2, 16)
        x[:, :4].contiguous()
        x * 2
    assert [u.op for u in record.forbidden_ops] == ["aten.mul.Tensor"]
    assert [u.op for u in record.copies] == ["aten.clone.default"]


def test_launch_counting_sees_every_launch_and_restores_triton():
    from triton.runtime.jit import KernelInterface

    original = KernelInterface.__getitem__
    x = torch.randn(3, 16, device=runtime.DEVICE)
    w = torch.ones(16, device=runtime.DEVICE)
    with sandbox.watch() as record:
        variants.correct(x, w)
        variants.correct(x, w)
    assert record.launches == ["rmsnorm_kernel", "rmsnorm_kernel"]
    assert KernelInterface.__getitem__ is original


def test_an_exception_in_the_learners_code_is_reported_not_raised_raw():
    def broken(x, weight, eps=1e-6):
        raise ValueError("my wrapper is unfinished")

    with pytest.raises(AssertionError, match="my wrapper is unfinished"):
        check.rmsnorm_forward(broken, seed=0, quiet=True)


def test_an_assert_in_the_learners_wrapper_is_reported_with_the_case():
    def strict(x, weight, eps=1e-6):
        assert x.is_contiguous(), "I only handle contiguous rows"
        return variants.correct(x, weight, eps)

    report = run_exercise(RMSNORM_FORWARD, strict, seed=0)
    failing = [r for r in report.results if not r.passed]
    assert [r.case.name for r in failing] == ["strided rows"]
    assert "I only handle contiguous rows" in failing[0].error


def test_wrong_output_shape_and_dtype_are_named():
    def wrong_dtype(x, weight, eps=1e-6):
        return variants.correct(x.float(), weight.float(), eps)

    with pytest.raises(AssertionError, match="dtype torch.float32, expected torch.float16"):
        check.rmsnorm_forward(wrong_dtype, seed=0, quiet=True)


def test_checker_refuses_something_that_is_not_a_function():
    with pytest.raises(TypeError, match="pass your function itself"):
        check.rmsnorm_forward("rmsnorm", seed=0)


@pytest.mark.skipif(runtime.on_gpu(), reason="checks the message shown without a GPU")
def test_bandwidth_check_without_gpu_says_it_needs_one(capsys):
    with pytest.raises(NeedsGPU, match="needs a GPU"):
        check.rmsnorm_forward_bandwidth(variants.correct, on_cpu="fail")
    assert check.rmsnorm_forward_bandwidth(variants.correct, on_cpu="skip") is None
    assert "needs a GPU" in capsys.readouterr().out


@pytest.mark.gpu
def test_gpu_correct_kernel_passes_the_gpu_case_list():
    report = check.rmsnorm_forward(variants.correct, seed=11, quiet=True)
    assert any(r.case.shape == (64, 65536) for r in report.results)


@pytest.mark.gpu
def test_gpu_bandwidth_of_a_fused_kernel_meets_the_chapter_target():
    result = check.rmsnorm_forward_bandwidth(variants.correct, target=0.75)
    assert result.passed and result.best.fraction_of_copy >= 0.75


@pytest.mark.gpu
def test_gpu_bandwidth_is_the_kernels_time_not_the_python_around_its_launch():
    # A slow host (nbgrader's kernel spent 71 us per call on an H100 host) must not cost a
    # fast kernel its points: 150 us of Python before each launch, longer than the kernel.
    import time

    def slow_host(x, w, eps=1e-6):
        deadline = time.perf_counter() + 150e-6
        while time.perf_counter() < deadline:
            pass
        return variants.correct(x, w, eps)

    result = check.rmsnorm_forward_bandwidth(slow_host, target=0.75)
    assert result.passed and result.best.seconds < 150e-6, result


@pytest.mark.gpu
def test_gpu_bandwidth_check_fails_a_kernel_below_its_target_with_numbers():
    with pytest.raises(AssertionError, match="% of copy bandwidth"):
        check.rmsnorm_forward_bandwidth(variants.correct, target=1.05, retries=1)


@pytest.mark.gpu
def test_gpu_bandwidth_check_refuses_a_two_pass_kernel_for_its_second_read():
    with pytest.raises(AssertionError, match="reads each row of `x` twice"):
        check.rmsnorm_forward_bandwidth(variants.two_pass_slow, target=0.75, retries=2)


@pytest.mark.gpu
def test_gpu_low_precision_accumulation_is_caught_on_long_bf16_rows():
    report = run_exercise(RMSNORM_FORWARD, variants.low_precision_accumulation, seed=4)
    failing = [r.case for r in report.results if not r.passed]
    assert failing and all(c.dtype != torch.float32 for c in failing)
    assert any(c.dtype == torch.bfloat16 and "long" in c.tags for c in failing)


def test_two_pass_kernel_is_correct_and_launches_once():
    report = check.rmsnorm_forward(variants.two_pass_slow, seed=5, quiet=True)
    assert report.passed and all(len(r.launches) == 1 for r in report.results)


def test_a_row_scaled_by_a_wrong_rstd_is_caught_even_within_elementwise_tolerance():
    from course.check.compare import compare

    gen = torch.Generator().manual_seed(0)
    want = torch.randn(4, 2048, generator=gen, dtype=torch.float64)
    rounded = want.to(torch.float16)
    assert compare("y", rounded, want, torch.float16) is None  # rounding alone passes
    scaled = (want * 1.001).to(torch.float16)  # 0.1 %: inside fp16's elementwise tolerance
    mismatch = compare("y", scaled, want, torch.float16)
    assert mismatch is not None and mismatch.n_bad == 0
    assert mismatch.bad_rows == (0, 1, 2, 3)
    assert "off by a common factor" in mismatch.describe()


def test_a_failed_check_shows_the_learner_its_message_not_the_checkers_frames():
    import traceback

    with pytest.raises(AssertionError) as caught:
        check.rmsnorm_forward(variants.BROKEN["missing_mask"][0], seed=5, quiet=True)
    frames = traceback.extract_tb(caught.value.__traceback__)
    inside = [f for f in frames if "/course/check/" in f.filename.replace("\\", "/")]
    # Only the wrapper's own frame is left (IPython always shows the frame that raised).
    assert [f.name for f in inside] == ["wrapper"], [f"{f.filename}:{f.name}" for f in frames]
    assert caught.value.__suppress_context__
    assert "rmsnorm_forward check failed" in str(caught.value)


def test_a_misused_checker_keeps_its_whole_traceback():
    with pytest.raises(TypeError) as caught:
        check.rmsnorm_forward("rmsnorm")
    import traceback

    names = [f.name for f in traceback.extract_tb(caught.value.__traceback__)]
    assert "run_exercise" in names, names
