"""Answers that take the checkers' own answer instead of working it out, as a red team
graded them (.scratch/redteam/README.txt): PyTorch's RMSNorm reached past chapter 01's
torch-function mode (the aten operator, torch-function modes disabled); course.traffic
called after switching off the profile hook that watches for it (chapters 02 and 03);
chapter 03's timer reading the simulated GPU's true time; chapter 07's split rule returning
course.traffic.best_split. Each is refused by its check, in one process and graded by the
verifier (course.verify: the learner's code in its own process, the guards applied there).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import sys
import threading

from course import check, runtime, timing, traffic
from course.check.suite import run_exercise
from course.check.torch_reference import TORCH_RMSNORM

import pytest
import torch
import torch.nn.functional as F

FIRST_TORCH_CASES = dataclasses.replace(TORCH_RMSNORM, cases=TORCH_RMSNORM.cases[:3])
REFUSED_RMSNORM = "PyTorch's own RMSNorm"
SWITCHED_OFF = "switches off the check's profile hook (sys.setprofile or threading.setprofile)"

# ---------------------------------------------------------------- the red team's cells

CH01_ATEN = '''\
def rmsnorm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return torch.ops.aten.rms_norm(x, [x.shape[-1]], weight, eps)
'''
CH01_NOMODE = '''\
import torch.nn.functional as F


def rmsnorm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    with torch._C.DisableTorchFunction():
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
'''
CH02_PROFILE_OFF = '''\
import sys as _sys
from course import traffic as _t

_DT = {1: "fp8", 2: "bf16", 4: "fp32", 8: "fp64"}


def fused_rmsnorm_bytes(M: int, N: int, elem_bytes: int) -> int:
    _sys.setprofile(None)
    return _t.fused_rmsnorm(M, N, _DT[elem_bytes]).bytes


def rmsnorm_flops(M: int, N: int) -> int:
    _sys.setprofile(None)
    return _t.fused_rmsnorm(M, N, "fp32").flops


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    return flops / nbytes


def time_floor_us(nbytes: float, bytes_per_s: float) -> float:
    return nbytes / bytes_per_s * 1e6
'''
CH03_EAGER_PROFILE_OFF = '''\
import sys as _sys
from course import traffic as _t


def eager_launch_bytes(M: int, N: int, elem_bytes: int) -> list[tuple[str, int]]:
    _sys.setprofile(None)
    model = _t.eager_rmsnorm(M, N, {2: "bf16", 4: "fp32"}[elem_bytes])
    return [(k.name, k.bytes) for k in model.kernels]
'''
CH03_TIMER_ORACLE = '''\
def time_per_call(gpu, fn, inputs, reps: int = 30) -> float:
    """Asks the simulated GPU for its own true time."""
    return gpu.params.kernel_s(False, False)
'''
CH07_SPLIT_ORACLE = '''\
from course import traffic as _t


def split_programs(M: int, N: int, sms: int) -> int:
    return _t.best_split(M, N, sms)
'''


def _defined(code: str) -> dict:
    namespace = {"torch": torch}
    exec(compile(code, "<exercise cell>", "exec"), namespace)
    return namespace


@pytest.fixture(autouse=True)
def _profile_left_as_found():
    before = sys.getprofile()
    yield
    assert sys.getprofile() is before  # every check puts the hook before it back
    sys.setprofile(before)


# ---------------------------------------------------------------- chapter 01


def _aten_default(x, weight, eps=1e-6):
    return torch.ops.aten.rms_norm.default(x, [x.shape[-1]], weight, eps)


def _fused(x, weight, eps=1e-6):
    return torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], weight, eps)[0]


def _torch_without_modes(x, weight, eps=1e-6):
    with torch._C.DisableTorchFunction():
        return torch.rms_norm(x, (x.shape[-1],), weight, eps)


def _module_without_modes(x, weight, eps=1e-6):
    norm = torch.nn.RMSNorm(x.shape[-1], eps=eps, dtype=x.dtype)
    with torch.no_grad(), torch._C.DisableTorchFunction():
        norm.weight.copy_(weight)
        return norm(x)


def _refusal_caught_then_again(x, weight, eps=1e-6):
    try:
        return torch.rms_norm(x, (x.shape[-1],), weight, eps)
    except RuntimeError:
        return torch.ops.aten.rms_norm(x, [x.shape[-1]], weight, eps)


def _another_thread(x, weight, eps=1e-6):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(torch.ops.aten.rms_norm, x, [x.shape[-1]], weight, eps).result()


_WAYS = {"aten.rms_norm": _defined(CH01_ATEN)["rmsnorm_torch"],
         "aten.rms_norm.default": _aten_default,
         "F.rms_norm, torch-function modes off": _defined(CH01_NOMODE)["rmsnorm_torch"],
         "torch.rms_norm, torch-function modes off": _torch_without_modes,
         "nn.RMSNorm, torch-function modes off": _module_without_modes,
         "the refusal caught, then aten": _refusal_caught_then_again,
         "aten in another thread": _another_thread}
if hasattr(torch.ops.aten, "_fused_rms_norm"):
    _WAYS["aten._fused_rms_norm"] = _fused


@pytest.mark.parametrize("fn", list(_WAYS.values()), ids=list(_WAYS))
def test_pytorchs_rmsnorm_is_refused_however_it_is_reached(fn):
    report = run_exercise(FIRST_TORCH_CASES, fn, seed=0)
    assert not report.passed
    for result in report.results:
        assert result.error and "BuiltInRMSNormRefused" in result.error, result.error
        assert REFUSED_RMSNORM in result.error and "write the formula" in result.error


def test_pytorchs_rmsnorm_behind_a_switched_off_profile_hook_is_refused():
    def switches_off(x, weight, eps=1e-6):
        sys.setprofile(None)
        return torch.ops.aten.rms_norm(x, [x.shape[-1]], weight, eps)

    def switches_off_alone(x, weight, eps=1e-6):
        sys.setprofile(None)
        h = x.to(torch.float32)
        rstd = torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + eps)
        return (h * rstd * weight.to(torch.float32)).to(x.dtype)

    # The dispatcher's stand-in refuses the operator with the hook off...
    report = run_exercise(FIRST_TORCH_CASES, switches_off, seed=0)
    assert all(r.error and REFUSED_RMSNORM in r.error for r in report.results), \
        [r.error for r in report.results]
    # ... and a call that switched the hook off is refused even when it ran no RMSNorm.
    report = run_exercise(FIRST_TORCH_CASES, switches_off_alone, seed=0)
    assert all(r.error and "switched off the check's profile hook" in r.error
               for r in report.results), [r.error for r in report.results]


def _raw_thread(x, weight, eps=1e-6):
    """PyTorch's RMSNorm on a thread started through a fresh copy of `_thread`, where no
    profile hook is set (threading.setprofile reaches only threading's threads)."""
    import importlib.machinery
    import importlib.util
    import time

    fresh = importlib.util.module_from_spec(importlib.machinery.BuiltinImporter.find_spec(
        "_thread"))
    box = []

    def work():
        try:
            box.append(F.rms_norm(x, (x.shape[-1],), weight, eps))
        except BaseException as error:  # noqa: BLE001 (carried back to the caller's thread)
            box.append(error)

    fresh.start_new_thread(work, ())
    while not box:
        time.sleep(0.001)
    if isinstance(box[0], BaseException):
        return (x.float() * 0).to(x.dtype)  # the refusal swallowed: a wrong answer
    return box[0]


def test_pytorchs_rmsnorm_on_a_thread_without_the_profile_hook_is_refused():
    report = run_exercise(FIRST_TORCH_CASES, _raw_thread, seed=0)
    assert not report.passed
    assert all(r.error and REFUSED_RMSNORM in r.error for r in report.results), \
        [r.error for r in report.results]


def test_the_dispatchers_stand_in_is_gone_after_the_check():
    x = torch.randn(3, 8)
    report = run_exercise(FIRST_TORCH_CASES, _raw_thread, seed=0)
    assert not report.passed
    by_hand = x * torch.rsqrt(x.square().mean(-1, True) + 1e-6)
    torch.testing.assert_close(F.rms_norm(x, (8,)), by_hand)


def test_the_formula_with_torch_ops_still_passes_under_the_profile_hook():
    def rmsnorm_torch(x, weight, eps=1e-6):
        h = x.to(torch.float32)
        rstd = torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + eps)
        return (h * rstd * weight.to(torch.float32)).to(x.dtype)

    assert check.torch_rmsnorm(rmsnorm_torch, seed=0, quiet=True).passed
    assert F.rms_norm is torch.nn.functional.rms_norm  # nothing patched


# ---------------------------------------------------------------- chapters 02 and 03


def test_course_traffic_behind_a_switched_off_profile_hook_fails_chapter_02():
    ns = _defined(CH02_PROFILE_OFF)
    with pytest.raises(AssertionError) as failure:
        check.roofline_functions(ns["fused_rmsnorm_bytes"], ns["rmsnorm_flops"],
                                 ns["arithmetic_intensity"], ns["time_floor_us"], seed=0,
                                 quiet=True)
    message = str(failure.value)
    for name in ("fused_rmsnorm_bytes", "rmsnorm_flops"):
        assert f"{name} is off: it {SWITCHED_OFF}, which watches for calls into course.traffic, " \
               "the model this check compares against" in message, message
    assert "arithmetic_intensity is off" not in message


def test_course_traffic_behind_a_switched_off_profile_hook_fails_eager_bytes():
    with pytest.raises(AssertionError) as failure:
        check.eager_launch_bytes(_defined(CH03_EAGER_PROFILE_OFF)["eager_launch_bytes"],
                                 seed=0, quiet=True)
    assert f"eager_launch_bytes {SWITCHED_OFF}" in str(failure.value), str(failure.value)


def _time_workload(time_per_call):
    def time_workload(spec: str, reps: int = 30) -> float:
        return time_per_call(*timing.workload(spec), reps)

    return time_workload


def _simulated_gpu(device):
    """The simulation behind a timer's device: without the walls, one keyword default away
    (course.timing keeps it out of what the timer is handed)."""
    return timing._step.__kwdefaults__["_gpus"][device._gpu_id]


def _private_parameters(gpu, fn, inputs, reps=30):
    return _simulated_gpu(gpu).params.kernel_s(False, False)


def _simulated_times(spec, reps=30):
    return timing.simulated_times(spec, reps).true_s


def _switched_off(gpu, fn, inputs, reps=30):
    sys.setprofile(None)
    return _simulated_gpu(gpu).params.kernel_s(False, False)


@pytest.mark.parametrize("time_workload, said", [
    (_time_workload(_defined(CH03_TIMER_ORACLE)["time_per_call"]),
     "'SimDevice' object has no attribute 'params'"),
    (_time_workload(_private_parameters),
     "time_per_call asks course.timing for the simulated GPU's true time (kernel_s)"),
    (_simulated_times,
     "time_per_call asks course.timing for the simulated GPU's true time (simulated_times, "
     "true_s)"),
    (_time_workload(_switched_off), f"time_per_call {SWITCHED_OFF}"),
], ids=["gpu.params", "the private parameters", "simulated_times", "hook switched off"])
def test_a_timer_that_reads_the_simulated_gpus_true_time_fails(time_workload, said):
    with pytest.raises(AssertionError) as failure:
        check.honest_timer(time_workload, seed=0, quiet=True)
    assert said in str(failure.value), str(failure.value)


def test_the_simulated_gpu_hands_a_timer_no_parameters():
    gpu, fn, inputs = timing.workload("sim:5")
    for handed in (gpu, fn, inputs[0][0]):
        assert not hasattr(handed, "params") and not hasattr(handed, "gpu")
    start, end = gpu.Event(enable_timing=True), gpu.Event(enable_timing=True)
    start.record()
    kept = fn(*inputs[0])
    end.record()
    gpu.synchronize()
    assert start.elapsed_time(end) > 0 and gpu.clock() > 0 and kept.nbytes > 0


# ---------------------------------------------------------------- chapter 07


def test_a_split_rule_that_returns_course_traffic_best_split_fails():
    with pytest.raises(AssertionError) as failure:
        check.split_rule(_defined(CH07_SPLIT_ORACLE)["split_programs"], seed=0, quiet=True)
    message = str(failure.value)
    assert "split_programs calls course.traffic (best_split), the model this check compares " \
           "against" in message, message


@pytest.mark.skipif(sys.version_info < (3, 12), reason="a thread already running gets the "
                    "check's profile hook from Python 3.12 on (threading.setprofile_all_threads)")
def test_a_split_rule_handing_course_traffic_to_a_worker_started_before_fails():
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(int).result()  # the worker is up before the check starts

        def split_programs(M, N, sms):
            return pool.submit(traffic.best_split, M, N, sms).result()

        with pytest.raises(AssertionError) as failure:
            check.split_rule(split_programs, seed=0, quiet=True)
    assert "split_programs calls course.traffic (best_split)" in str(failure.value)


def test_a_split_rule_handing_course_traffic_to_a_thread_it_unwatched_fails():
    """threading.setprofile(None) raises no audit event: a thread started after it runs
    without the check's hook, and the watch says so as it ends."""
    def split_programs(M, N, sms):
        threading.setprofile(None)
        answer = []
        worker = threading.Thread(target=lambda: answer.append(traffic.best_split(M, N, sms)))
        worker.start()
        worker.join()
        return answer[0]

    with pytest.raises(AssertionError) as failure:
        check.split_rule(split_programs, seed=0, quiet=True)
    assert SWITCHED_OFF in str(failure.value), str(failure.value)


def test_a_split_rule_reading_course_traffics_constant_passes():
    def split_programs(M, N, sms):
        return min(M, max(sms, -(-traffic.ELEMENTS_IN_FLIGHT_PER_SM * sms // N)))

    assert check.split_rule(split_programs, seed=0, quiet=True).passed


# ---------------------------------------------------------------- graded by the verifier



def _submissions():
    from grader_submissions import Submission

    ch01 = ("ex01_torch_rmsnorm", "ex01_torch_rmsnorm_hidden")
    return [
        Submission("aten", "ch01_math", "PyTorch's RMSNorm as torch.ops.aten.rms_norm",
                   {"ex01_torch_rmsnorm_code": CH01_ATEN}, ch01, REFUSED_RMSNORM),
        Submission("nomode", "ch01_math", "F.rms_norm under DisableTorchFunction",
                   {"ex01_torch_rmsnorm_code": CH01_NOMODE}, ch01, REFUSED_RMSNORM),
        Submission("profoff", "ch02_roofline", "sys.setprofile(None), then course.traffic",
                   {"ex02_roofline_functions_code": CH02_PROFILE_OFF},
                   ("ex02_roofline_functions", "ex02_roofline_functions_hidden"),
                   "sys.setprofile"),
        Submission("profoff03", "ch03_two_pass",
                   "eager bytes from course.traffic behind sys.setprofile(None)",
                   {"ex03_eager_bytes_code": CH03_EAGER_PROFILE_OFF},
                   # the refused sys.setprofile(None) is tampering: every test cell from
                   # the first it runs in scores 0
                   ("ex03_eager_bytes", "ex03_eager_bytes_hidden", "ex03_timer",
                    "ex03_timer_hidden", "ex03_two_pass_correct", "ex03_two_pass_hidden",
                    "ex03_two_pass_bandwidth"), "sys.setprofile"),
        Submission("timeroracle", "ch03_two_pass",
                   "a timer returning gpu.params.kernel_s(False, False)",
                   {"ex03_timer_code": CH03_TIMER_ORACLE}, ("ex03_timer", "ex03_timer_hidden"),
                   # gpu.params is gone: AttributeError on every simulated GPU
                   "time_per_call is off on 3 of 3 simulated GPUs"),
        Submission("splitoracle", "ch07_backward", "returns course.traffic.best_split",
                   {"ex07_split_programs_code": CH07_SPLIT_ORACLE}, ("ex07_split_rule",),
                   "split_programs calls course.traffic (best_split)"),
    ]


@pytest.mark.slow
@pytest.mark.skipif(runtime.on_gpu(), reason="the points without a GPU (speed cells fail)")
@pytest.mark.parametrize("sub", _submissions(), ids=lambda s: f"{s.chapter}-{s.student}")
def test_the_red_teams_answers_graded_by_the_verifier_lose_the_cells_they_target(sub,
                                                                                tmp_path):
    from grader_submissions import ROOT, expected_points, verified

    verdict = verified(sub, tmp_path)
    got = {c.grade_id: c.points for c in verdict.cells}
    assert got == expected_points(ROOT, sub), (sub.what, verdict.to_json()[:4000])
    by_id = {c.grade_id: c for c in verdict.cells}
    first = by_id[sub.loses[0]]
    assert sub.reason in first.reason, first.reason
