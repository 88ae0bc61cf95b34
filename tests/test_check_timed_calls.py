"""Speed checks judge every call they make, not only the first: a watched call at the timing
shape before and after timing (launch limit, no PyTorch compute, inputs unchanged), every
output kept from the timed calls compared with the reference for its own inputs, and no
time faster than a copy of the bytes.

Without a GPU the checks stop at "needs a GPU", so these tests run the part after that gate
(`timed_bandwidth_check`, `compare_with_compiled`) with a fake timer: the real rotation of
inputs and the real calls (`bench.time_rotating`, on the CPU clock), and a time chosen as a
fraction of a pretend copy bandwidth. The tests marked `gpu` run the whole check on one.
"""

from __future__ import annotations

from course import baselines, bench, check, hardware, reference, runtime
from course.check import bandwidth
from course.check.bandwidth import IMPOSSIBLE_FRACTION, CallSpec, timed_bandwidth_check
from course.check.lab import compare_with_compiled

import pytest
import rmsnorm_variants
import torch

COPY_BYTES_PER_S = 2e12  # the pretend GPU's copy bandwidth
SHAPE = (64, 256)        # the "timing shape": small enough for Triton's interpreter
NBYTES = 10**6


@pytest.fixture
def fake_timer(monkeypatch):
    """Replace `bench.measure` by the real rotation of calls plus a chosen speed.

    Returns a dict: set "fraction" (or "fraction:<label prefix>") to the fraction of copy
    bandwidth the next measurements report; "labels" lists what was timed."""
    state = {"fraction": 0.9, "labels": []}

    def measure(label, fn, make_args, nbytes, *, reps=100, warmup=10, hide_launch=False):
        bench.time_rotating(fn, make_args, nbytes, warmup=2, reps=reps)
        state["labels"].append(label)
        fraction = next((v for k, v in state.items()
                         if k.startswith("fraction:") and label.startswith(k[9:])),
                        state["fraction"])
        return bench.Measurement(label, nbytes / (fraction * COPY_BYTES_PER_S), nbytes,
                                 COPY_BYTES_PER_S)

    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(hardware, "copy_bandwidth", lambda nbytes=None: COPY_BYTES_PER_S)
    return state


def make_args():
    return (torch.randn(SHAPE, device=runtime.DEVICE),
            torch.rand(SHAPE[1], device=runtime.DEVICE) + 0.5)


def rmsnorm_spec(**kwargs) -> CallSpec:
    return CallSpec(("y",), lambda x, w: reference.rmsnorm(x, w, eps=1e-6), (torch.float32,),
                    arg_names=("x", "weight"), **kwargs)


def speed_check(fn, spec=None, **kwargs):
    return timed_bandwidth_check("rmsnorm test", fn, make_args, NBYTES, spec or rmsnorm_spec(),
                                 target=kwargs.pop("target", 0.75), reps=kwargs.pop("reps", 4),
                                 **kwargs)


def test_an_honest_kernel_passes_and_each_input_set_is_checked_against_its_own_reference(
        fake_timer):
    references = []

    def counted_reference(x, w):
        references.append(x)
        return reference.rmsnorm(x, w, eps=1e-6)

    spec = CallSpec(("y",), counted_reference, (torch.float32,))
    result = speed_check(rmsnorm_variants.correct, spec)
    assert result.passed and fake_timer["labels"] == ["rmsnorm test"]
    # Before timing (and again with its inputs refilled in place), each rotating input set
    # the timer called (at least two; its 4 repetitions reach at most 4 of the 64 a GPU's
    # L2 asks for), after timing.
    sets = min(bench.copies_needed(NBYTES), 4)
    assert len(references) == 2 + sets + 1
    assert references[1] is references[0]  # the same tensor, refilled in place
    assert len({id(x) for x in references}) == len(references) - 1


def test_a_wrapper_honest_only_on_its_first_call_is_refused_before_timing(fake_timer):
    calls = []

    def lazy(x, w, eps=1e-6):
        calls.append(1)
        return rmsnorm_variants.correct(x, w, eps) if len(calls) == 1 else torch.empty_like(x)

    with pytest.raises(AssertionError, match="refilled with new values, your function "
                                             "returned a wrong answer"):
        speed_check(lazy)


def test_a_wrapper_honest_only_on_the_calls_before_timing_is_refused(fake_timer):
    calls = []

    def lazy(x, w, eps=1e-6):
        calls.append(1)
        return rmsnorm_variants.correct(x, w, eps) if len(calls) <= 2 else torch.empty_like(x)

    with pytest.raises(AssertionError, match="output of a timed call is wrong") as failure:
        speed_check(lazy)
    assert "right when checked before timing" in str(failure.value)
    assert "elements of y are wrong" in str(failure.value)


def test_a_wrong_output_anywhere_in_the_kept_window_is_caught(fake_timer, monkeypatch):
    # The timer keeps 3 outputs alive; call 4 of the 6 timed (2 warm-up + 4) is neither the
    # last one nor the latest of its input set, and still it is compared.
    monkeypatch.setattr(bench, "outputs_to_hold", lambda *args, **kwargs: 3)
    calls = []

    def wrong_once(x, w, eps=1e-6):
        calls.append(1)
        y = rmsnorm_variants.correct(x, w, eps)
        return y * 2 if len(calls) == 2 + 4 else y  # 2 checked calls before timing

    with pytest.raises(AssertionError, match="call 4 of the 6 made while timing"):
        speed_check(wrong_once)


def test_a_result_computed_for_other_inputs_is_refused(fake_timer):
    first_inputs = []

    def answers_its_first_question(x, w, eps=1e-6):
        if not first_inputs:
            first_inputs.append((x.clone(), w.clone()))
        return rmsnorm_variants.correct(*first_inputs[0], eps)  # fresh memory every call

    with pytest.raises(AssertionError, match="returned the answer for their old values"):
        speed_check(answers_its_first_question)


def test_a_result_cached_by_the_inputs_address_is_refused_at_the_timing_shape(fake_timer):
    cache = {}

    def by_address(x, w, eps=1e-6):
        key = (x.data_ptr(), w.data_ptr(), tuple(x.shape))
        if key not in cache:
            cache[key] = rmsnorm_variants.correct(x, w, eps)
        return cache[key]

    with pytest.raises(AssertionError, match="the answer for their old values: a result "
                                             "cached by the input's address"):
        speed_check(by_address)


def test_a_buffer_returned_again_by_later_calls_is_refused(fake_timer):
    kept = {}

    def reuses_its_output(x, w, eps=1e-6):
        y = kept.setdefault("y", torch.empty_like(x))
        return rmsnorm_variants._launch(rmsnorm_variants.rmsnorm_kernel, x, w, eps, y=y)

    with pytest.raises(AssertionError, match="returned the same memory"):
        speed_check(reuses_its_output)


@pytest.mark.parametrize("fraction", [1.5, IMPOSSIBLE_FRACTION + 0.01])
def test_a_time_faster_than_copying_the_bytes_is_refused(fake_timer, fraction):
    fake_timer["fraction"] = fraction
    with pytest.raises(AssertionError, match="faster than copying its bytes: the call "
                                             "probably skips work"):
        speed_check(rmsnorm_variants.correct)


def test_a_time_at_the_copy_bandwidth_is_accepted(fake_timer):
    fake_timer["fraction"] = IMPOSSIBLE_FRACTION - 0.01
    assert speed_check(rmsnorm_variants.correct).passed


def test_a_wrapper_that_switches_to_torch_at_the_timing_shape_is_refused_untimed(fake_timer):
    def switches(x, w, eps=1e-6):  # honest on the correctness checks' small shapes
        if x.numel() >= SHAPE[0] * SHAPE[1]:
            return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)
        return rmsnorm_variants.correct(x, w, eps)

    with pytest.raises(AssertionError) as failure:
        speed_check(switches)
    message = str(failure.value)
    assert "before timing" in message and "ran PyTorch compute ops" in message
    assert "not timed" in message and fake_timer["labels"] == []


def test_more_launches_than_the_exercise_allows_are_refused(fake_timer):
    with pytest.raises(AssertionError, match="launched 2 Triton kernels .*allows 1"):
        speed_check(rmsnorm_variants.two_launches)
    assert fake_timer["labels"] == []
    # The same function within a limit of two launches is timed.
    assert speed_check(rmsnorm_variants.two_launches, rmsnorm_spec(max_launches=2)).passed


def test_a_wrapper_that_writes_into_its_input_is_refused(fake_timer):
    with pytest.raises(AssertionError, match="changed its input `x`"):
        speed_check(rmsnorm_variants.writes_into_input)


def test_a_wrapper_that_turns_to_torch_after_its_first_call_is_refused_after_timing(
        fake_timer):
    calls = []

    def honest_once(x, w, eps=1e-6):
        calls.append(1)
        if len(calls) == 1:
            return rmsnorm_variants.correct(x, w, eps)
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)  # right, but torch

    with pytest.raises(AssertionError) as failure:
        speed_check(honest_once)
    message = str(failure.value)
    assert "after timing" in message and "ran PyTorch compute ops" in message
    assert fake_timer["labels"] == ["rmsnorm test"]  # its timed outputs were right


def test_a_wrong_kernel_is_not_timed(fake_timer):
    with pytest.raises(AssertionError, match="wrong output at the timing shape .*not timed"):
        speed_check(rmsnorm_variants.wrong_row_offset)
    assert fake_timer["labels"] == []


def test_call_spec_refuses_outputs_without_dtypes_and_a_zero_launch_limit():
    with pytest.raises(ValueError, match="2 output names but 1 dtypes"):
        CallSpec(("y", "r"), reference.rmsnorm, (torch.float32,))
    with pytest.raises(ValueError, match="max_launches must be at least 1"):
        CallSpec(("y",), reference.rmsnorm, (torch.float32,), max_launches=0)


def test_the_log_keeps_the_latest_output_of_every_input_set_when_the_timer_keeps_none(
        monkeypatch):
    monkeypatch.setattr(bench, "outputs_to_hold", lambda *args, **kwargs: 0)
    log = bandwidth.TimedOutputs()
    identity = log.wrap(lambda a: a.clone())
    sets = [torch.full((4,), float(i)) for i in range(3)]
    for i in range(7):
        identity(sets[i % 3])
    assert log.calls == 7 and log.input_sets == 3
    assert [call for call, _, _ in log.kept()] == [5, 6, 7]


# ------------------------------------------------------------------ beats_torch_compile

def compare_small(fn, **kwargs):
    return compare_with_compiled(fn, baselines.eager_rmsnorm, [SHAPE], dtype=torch.float32,
                                 retries=kwargs.pop("retries", 1), reps=4, tolerance=0.02,
                                 **kwargs)


def test_lab_times_an_honest_kernel_against_the_compiler(fake_timer):
    fake_timer["fraction:yours"] = 0.9
    fake_timer["fraction:torch.compile"] = 0.8
    result = compare_small(rmsnorm_variants.correct)
    assert result.passed and fake_timer["labels"] == ["yours 64x256", "torch.compile 64x256"]


def test_lab_refuses_a_wrapper_honest_only_on_its_first_call(fake_timer):
    calls = []

    def lazy(x, w, eps=1e-6):
        calls.append(1)
        return rmsnorm_variants.correct(x, w, eps) if len(calls) == 1 else torch.empty_like(x)

    with pytest.raises(AssertionError, match="yours 64x256: the output of a timed call is "
                                             "wrong"):
        compare_small(lazy)


def test_lab_refuses_a_wrapper_that_switches_to_the_compiler_on_large_inputs(fake_timer):
    def switches(x, w, eps=1e-6):
        if x.numel() >= SHAPE[0] * SHAPE[1]:
            return baselines.eager_rmsnorm(x, w, eps)  # torch.compile of it, on a GPU
        return rmsnorm_variants.correct(x, w, eps)

    with pytest.raises(AssertionError, match="ran PyTorch compute ops"):
        compare_small(switches)
    assert fake_timer["labels"] == []


def test_lab_refuses_a_time_faster_than_a_copy(fake_timer):
    fake_timer["fraction:yours"] = 3.0
    with pytest.raises(AssertionError, match="faster than copying its bytes"):
        compare_small(rmsnorm_variants.correct)


# ------------------------------------------------------------------ on a GPU

def _lazy_after_first_call():
    calls = []

    def lazy(x, w, eps=1e-6):  # the audit's wrapper: 6872 % of copy before this check
        calls.append(1)
        return rmsnorm_variants.correct(x, w, eps) if len(calls) == 1 else torch.empty_like(x)
    return lazy


# A lazy wrapper is refused as wrong: when its inputs are refilled and it is called again
# before timing (#28), or else when a timed output is checked.
REFUSED_AS_WRONG = "returned a wrong answer|output of a timed call is wrong"


@pytest.mark.gpu
def test_gpu_honest_kernel_passes_and_lazy_wrappers_are_refused():
    assert check.rmsnorm_forward_bandwidth(rmsnorm_variants.correct, target=0.75).passed
    with pytest.raises(AssertionError, match=REFUSED_AS_WRONG):
        check.rmsnorm_forward_bandwidth(_lazy_after_first_call())
    seen = set()

    def lazy_on_big_shapes_seen_before(x, w, eps=1e-6):
        key = (tuple(x.shape), x.dtype)
        if x.numel() >= 1 << 25 and key in seen:
            return torch.empty_like(x)
        seen.add(key)
        return rmsnorm_variants.correct(x, w, eps)

    with pytest.raises(AssertionError, match=REFUSED_AS_WRONG):
        check.rmsnorm_forward_bandwidth(lazy_on_big_shapes_seen_before, shape=(8192, 8192),
                                        dtype=torch.float16)


@pytest.mark.gpu
def test_gpu_a_wrapper_that_switches_to_torch_on_large_inputs_is_refused():
    def switches(x, w, eps=1e-6):
        if x.numel() >= 1 << 25:
            return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)
        return rmsnorm_variants.correct(x, w, eps)

    with pytest.raises(AssertionError, match="ran PyTorch compute ops"):
        check.rmsnorm_forward_bandwidth(switches)


@pytest.mark.gpu
def test_gpu_beats_torch_compile_refuses_a_compiled_or_lazy_wrapper():
    compiled = torch.compile(baselines.eager_rmsnorm, dynamic=False)

    def switches(x, w, eps=1e-6):
        return compiled(x, w, eps) if x.numel() >= 1 << 25 else rmsnorm_variants.correct(x, w,
                                                                                         eps)

    with pytest.raises(AssertionError, match="not timed"):
        check.beats_torch_compile(switches, shapes=[(32768, 4096)], quiet=True)
    calls = []

    def honest_every_61st_call(x, w, eps=1e-6):
        calls.append(1)
        if (len(calls) - 1) % 61 == 0:
            return rmsnorm_variants.correct(x, w, eps)
        return torch.empty_like(x)

    # Recycled memory may hold a right answer by chance; then the time gives it away.
    with pytest.raises(AssertionError,
                       match="output of a timed call is wrong|faster than copying its bytes"):
        check.beats_torch_compile(honest_every_61st_call, shapes=[(32768, 4096)], quiet=True)


def test_a_warning_while_timed_goes_to_stdout_not_stderr(fake_timer, capsys):
    # Under nbgrader a cell that writes to stderr loses its points, warning or not.
    import warnings

    def warns(x, w, eps=1e-6):
        warnings.warn("this wrapper is chatty", UserWarning, stacklevel=2)
        return rmsnorm_variants.correct(x, w, eps)

    assert speed_check(warns).passed
    out, err = capsys.readouterr()
    assert "this wrapper is chatty" not in err
    assert "raised a warning while timed: UserWarning: this wrapper is chatty" in out
