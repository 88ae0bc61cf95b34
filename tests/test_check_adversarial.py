"""Wrappers that cheat, or carry state between calls, in ways the checkers once missed:
launches the counter did not see, PyTorch hidden inside a launch's hooks, the course's own
kernels, answers computed elsewhere and handed to a kernel that does nothing, workspaces and
output buffers kept between calls. Also what an honest wrapper must still get: warnings kept
off stderr, and a wrong output shape reported as a failing case with the others' results."""

from __future__ import annotations

import concurrent.futures
import threading
import types
import warnings
from pathlib import Path

from course import check, reference, runtime
from course.check import sandbox
from course.check.rmsnorm import RMSNORM_FORWARD
from course.check.suite import run_exercise

import add_rmsnorm_variants
import backward_variants
import numpy as np
import pytest
import rmsnorm_variants as variants
import torch
import triton
import triton.language as tl
from backward_variants import RMSNormFunction
from torch.utils._python_dispatch import _disable_current_modes

SHIPPED = "a kernel the course ships"
UNCHANGED = "no launch changed a single element"
STATE = "state carried between calls"


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _failure(fn, checker=check.rmsnorm_forward) -> str:
    with pytest.raises(AssertionError) as failure:
        checker(fn, seed=2, quiet=True)
    return str(failure.value)


def _numpy_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xs = x.detach().cpu().double().numpy()
    ws = weight.detach().cpu().double().numpy()
    ys = xs / np.sqrt((xs * xs).mean(-1, keepdims=True) + eps) * ws
    return torch.from_numpy(ys).to(device=x.device, dtype=x.dtype)


@triton.jit
def _noop_kernel(x_ptr, y_ptr):
    pass


# ------------------------------------------------------------------ launches the counter missed

def _launch_by_run(x, weight, eps=1e-6):
    """The correct kernel, launched through .run instead of kernel[grid](...)."""
    x2 = _rows(x)
    y = torch.empty_like(x2)
    n = x2.shape[1]
    variants.rmsnorm_kernel.run(x2, weight, y, x2.stride(0), y.stride(0), n, eps,
                                BLOCK_N=triton.next_power_of_2(n), grid=(x2.shape[0],),
                                warmup=False)
    return y.view(x.shape)


def _second_launch_by_run(x, weight, eps=1e-6):
    x2 = _rows(x)
    n = x2.shape[1]
    block = triton.next_power_of_2(n)
    rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    y = torch.empty_like(x2)
    variants._sum_squares_kernel[(x2.shape[0],)](x2, rstd, x2.stride(0), n, eps, BLOCK_N=block)
    variants._scale_kernel.run(x2, weight, rstd, y, x2.stride(0), y.stride(0), n,
                               BLOCK_N=block, grid=(x2.shape[0],), warmup=False)
    return y.view(x.shape)


def test_a_launch_through_kernel_run_is_counted_and_the_interpreters_copies_stay_unseen():
    x = torch.randn(3, 16, device=runtime.DEVICE)
    w = torch.rand(16, device=runtime.DEVICE)
    with sandbox.watch() as record:
        y = _launch_by_run(x, w)
    assert record.launches == ["rmsnorm_kernel"]
    # The interpreter copies the arguments with torch ops inside the launch: not the learner's.
    assert record.forbidden_ops == [] and record.copies == []
    assert record.changed_by_launch(y) and not record.changed_by_launch(x)


def test_a_second_launch_through_kernel_run_counts_against_the_limit():
    message = _failure(_second_launch_by_run)
    assert "launched 2 Triton kernels (_sum_squares_kernel, _scale_kernel)" in message
    assert "computes with PyTorch" not in message and "never passed" not in message


def test_watching_restores_every_launch_step_it_patches():
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    before = (JITFunction.run, InterpretedFunction.run, Autotuner._bench)
    with sandbox.watch():
        assert InterpretedFunction.run is not before[1]
    assert (JITFunction.run, InterpretedFunction.run, Autotuner._bench) == before


# ------------------------------------------------------------- PyTorch hidden in launch hooks

def _torch_rmsnorm_into(x, weight, y, eps):
    xf = x.float()
    y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight).to(y.dtype))


def _pre_hook_computes(nargs):
    _torch_rmsnorm_into(nargs["x_ptr"], nargs["w_ptr"], nargs["y_ptr"], nargs["eps"])


@triton.autotune(configs=[triton.Config({}, pre_hook=_pre_hook_computes)], key=[])
@triton.jit
def _hooked_kernel(x_ptr, w_ptr, y_ptr, eps):
    pass


def _torch_in_a_pre_hook(x, weight, eps=1e-6):
    y = torch.empty_like(x)
    _hooked_kernel[(1,)](x, weight, y, eps)
    return y


def _heuristic_computes(args):
    _torch_rmsnorm_into(args["x_ptr"], args["w_ptr"], args["y_ptr"], args["eps"])
    return 1


@triton.heuristics({"UNUSED": _heuristic_computes})
@triton.jit
def _heuristic_kernel(x_ptr, w_ptr, y_ptr, eps, UNUSED: tl.constexpr):
    pass


def _torch_in_a_heuristic(x, weight, eps=1e-6):
    y = torch.empty_like(x)
    _heuristic_kernel[(1,)](x, weight, y, eps)
    return y


@pytest.mark.parametrize("fn", [_torch_in_a_pre_hook, _torch_in_a_heuristic],
                         ids=["autotune pre_hook", "heuristics function"])
def test_torch_ops_in_a_launch_hook_are_forbidden_ops(fn):
    message = _failure(fn)
    assert "computes with PyTorch" in message
    assert "aten.rsqrt" in message
    assert "test_check_adversarial.py, line" in message and "y.copy_((xf * torch.rsqrt" in message
    # The output also reached the kernel already final.
    assert UNCHANGED in message


@triton.jit
def _kernel_with_a_pre_run_hook(x_ptr, y_ptr, n_cols, BLOCK_N: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    tl.store(y_ptr + cols, tl.load(x_ptr + cols, mask=mask), mask=mask)


def test_torch_ops_in_a_kernels_pre_run_hook_are_forbidden_ops():
    kernel = _kernel_with_a_pre_run_hook
    kernel.add_pre_run_hook(lambda x, y, *rest, **kw: y.copy_(x * 2))
    try:
        x = torch.randn(8, device=runtime.DEVICE)
        with sandbox.watch() as record:
            y = torch.empty_like(x)
            kernel[(1,)](x, y, 8, BLOCK_N=8)
    finally:
        kernel.pre_run_hooks.clear()
    assert [u.op for u in record.forbidden_ops] == ["aten.mul.Tensor"]
    assert record.launches == ["_kernel_with_a_pre_run_hook"]


def _torch_in_a_grid_function(x, weight, eps=1e-6):
    """A grid function is the learner's code, though Triton calls it inside the launch."""
    y = torch.empty_like(x)

    def grid(meta):
        _torch_rmsnorm_into(x, weight, y, eps)
        return (1,)

    _noop_kernel[grid](x, y)
    return y


def _numpy_in_a_grid_function(x, weight, eps=1e-6):
    """The same, with the answer made where no op is seen, and copied in by the grid."""
    y = torch.empty_like(x)
    done = _numpy_rmsnorm(x, weight, eps)

    def grid(meta):
        y.copy_(done)
        return (1,)

    _noop_kernel[grid](x, y)
    return y


def test_a_grid_function_is_watched_and_what_it_writes_is_not_the_kernels():
    message = _failure(_torch_in_a_grid_function)
    assert "computes with PyTorch" in message and "aten.rsqrt" in message
    assert UNCHANGED in message
    assert UNCHANGED in _failure(_numpy_in_a_grid_function)


@triton.jit
def _noop_kernel_of_n(x_ptr, y_ptr, n_cols):
    pass


class _ComputingInt(int):
    """An int that computes the answer whenever Triton compares or converts it."""

    def __new__(cls, value, work):
        made = super().__new__(cls, value)
        made.work = work
        return made

    def _value(self):
        self.work()
        return int.__index__(self)

    def __index__(self):
        return self._value()

    __int__ = __index__

    def __ge__(self, other):
        return self._value() >= other

    def __le__(self, other):
        return self._value() <= other

    def __gt__(self, other):
        return self._value() > other

    def __lt__(self, other):
        return self._value() < other


class _PointerWithWork:
    """Not a tensor, but compiled Triton takes anything with data_ptr() as a pointer."""

    def __init__(self, t, work):
        self.t, self.work, self.dtype = t, work, t.dtype

    def data_ptr(self):
        self.work()
        return self.t.data_ptr()


def _launch_with(kind):
    def wrapper(x, weight, eps=1e-6):
        y = torch.empty_like(x)

        def work():
            _torch_rmsnorm_into(x, weight, y, eps)
        if kind == "int argument":
            _noop_kernel_of_n[(1,)](x, y, _ComputingInt(x.shape[-1], work))
        elif kind == "grid entry":
            _noop_kernel[(_ComputingInt(1, work),)](x, y)
        else:
            _noop_kernel[(1,)](x, _PointerWithWork(y, work))
        return y
    return wrapper


@pytest.mark.parametrize("kind", ["int argument", "grid entry", "pointer object"])
def test_an_argument_that_only_passes_for_a_number_or_a_tensor_is_refused(kind):
    message = _failure(_launch_with(kind))
    assert "only passes for a number or a tensor" in message
    assert "_ComputingInt" in message or "_PointerWithWork" in message


def test_a_plain_grid_function_and_plain_arguments_pass():
    x = torch.randn(4, 8, device=runtime.DEVICE)
    with sandbox.watch() as record:
        y = torch.empty_like(x)
        _kernel_with_a_pre_run_hook[lambda meta: (1,)](x, y, 8, BLOCK_N=8)
    assert record.launches == ["_kernel_with_a_pre_run_hook"]
    assert not record.forbidden_ops and not record.refused_arguments
    assert record.changed_by_launch(y)


_HANDED_OVER = []


@triton.jit
def _kernel_whose_body_computes(x_ptr, y_ptr):
    # In the interpreter a kernel's body runs as Python: this one does the work in PyTorch.
    if _HANDED_OVER:
        x, weight, y, eps = _HANDED_OVER.pop()
        _torch_rmsnorm_into(x, weight, y, eps)


def _torch_in_the_kernels_body(x, weight, eps=1e-6):
    y = torch.empty_like(x)
    _HANDED_OVER.append((x, weight, y, eps))
    _kernel_whose_body_computes[(1,)](x, y)
    return y


@pytest.mark.skipif(not runtime.interpreted(), reason="a compiled kernel's body is not Python")
def test_torch_ops_in_an_interpreted_kernels_body_are_forbidden_ops():
    message = _failure(_torch_in_the_kernels_body)
    assert "computes with PyTorch" in message and "aten.rsqrt" in message


def test_a_launch_in_another_thread_does_not_pause_interception_in_this_one():
    # Interception pauses inside a launch step for Triton's own ops. A launch running in a
    # helper thread must not open that window for the wrapper's own thread: here the helper
    # thread sits inside its launch step (in a hook Triton treats as its own) while the
    # wrapper computes.
    inside_launch, computed = threading.Event(), threading.Event()

    def triton_side_hook(*args, **kwargs):
        inside_launch.set()
        computed.wait(timeout=30)

    triton_side_hook.__module__ = "triton.runtime.fake_hook"
    kernel = _kernel_with_a_pre_run_hook
    kernel.add_pre_run_hook(triton_side_hook)
    x = torch.randn(8, device=runtime.DEVICE)
    try:
        with sandbox.watch() as record:
            y = torch.empty_like(x)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                launch = pool.submit(kernel.run, x, y, 8, BLOCK_N=8, grid=(1,), warmup=False)
                assert inside_launch.wait(timeout=30)
                x * 2
                computed.set()
                launch.result()
    finally:
        kernel.pre_run_hooks.clear()
    assert [u.op for u in record.forbidden_ops] == ["aten.mul.Tensor"]
    assert record.launches == ["_kernel_with_a_pre_run_hook"]


def _times_three(kernel_call, quantiles):
    for _ in range(3):  # what Triton's timing does: many launches of each configuration
        kernel_call()
    return [1.0, 1.0, 1.0]


@triton.autotune(configs=[triton.Config({"ROWS": 1}), triton.Config({"ROWS": 2})],
                 key=["n_rows", "n_cols"], do_bench=_times_three)
@triton.heuristics({"BLOCK_N": lambda args: triton.next_power_of_2(args["n_cols"])})
@triton.jit
def _tuned_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_rows, n_cols, eps,
                  ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    for i in range(ROWS):
        row = tl.program_id(0) * ROWS + i
        if row < n_rows:
            x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
            tl.store(y_ptr + row * stride_y_row + cols,
                     (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def _honest_tuned(x, weight, eps=1e-6):
    x2 = _rows(x)
    y = torch.empty_like(x2)
    m, n = x2.shape
    _tuned_kernel[lambda meta: (triton.cdiv(m, meta["ROWS"]),)](
        x2, weight, y, x2.stride(0), y.stride(0), m, n, eps)
    return y.view(x.shape)


def test_an_honest_autotuned_kernel_passes_with_one_launch_per_call():
    # The autotuner times both configurations on each new shape (six launches here): its
    # timing is Triton's, so only the launch that produces the answer counts.
    report = check.rmsnorm_forward(_honest_tuned, seed=4, quiet=True)
    assert report.passed
    assert all(r.launches == ("_tuned_kernel",) for r in report.results)


# ------------------------------------------------------------------ the course's own kernels

def test_the_shipped_reference_kernel_is_refused():
    from solutions.kernels import rmsnorm as shipped

    report = run_exercise(RMSNORM_FORWARD, shipped, seed=1)
    assert not report.passed
    assert all(r.finding("course_kernel") for r in report.results)
    message = report.message()
    assert SHIPPED in message and "solutions.kernels.rmsnorm" in message
    assert "not the reference solution" in message


def _copy_rows(x_ptr, y_ptr, n_cols, BLOCK_N: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    tl.store(y_ptr + cols, tl.load(x_ptr + cols, mask=mask), mask=mask)


@pytest.mark.parametrize("module, refused", [
    ("__main__", False),              # a notebook's kernels, the solution notebooks' too
    ("solutions_of_my_own", False),   # only the course's packages, not their prefix
    ("solutions.kernels.rmsnorm", True),
    ("course.baselines", True),
])
def test_kernels_are_refused_by_the_module_that_defines_them(module, refused):
    fn = types.FunctionType(_copy_rows.__code__, _copy_rows.__globals__, "_copy_rows")
    fn.__module__ = module
    fn.__annotations__ = _copy_rows.__annotations__  # BLOCK_N constexpr, as compiling needs
    kernel = triton.jit(fn)
    x = torch.randn(8, device=runtime.DEVICE)
    y = torch.empty_like(x)
    with sandbox.watch() as record:
        if refused:
            with pytest.raises(sandbox.CourseKernelRefused, match=SHIPPED):
                kernel[(1,)](x, y, 8, BLOCK_N=8)
        else:
            kernel[(1,)](x, y, 8, BLOCK_N=8)
    assert bool(record.course_kernels) == refused
    assert record.launches == ([] if refused else ["_copy_rows"])


# ------------------------------------------- answers computed elsewhere, handed to a no-op kernel

def _numpy_then_noop(x, weight, eps=1e-6):
    y = _numpy_rmsnorm(x, weight, eps)
    _noop_kernel[(1,)](x, y)
    return y


def _other_thread_then_noop(x, weight, eps=1e-6):
    # Dispatch modes are per thread: the checker's interception does not see this one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        y = pool.submit(torch.nn.functional.rms_norm, x, (x.shape[-1],), weight, eps).result()
    _noop_kernel[(1,)](x, y)
    return y


def _modes_disabled_then_noop(x, weight, eps=1e-6):
    with _disable_current_modes():
        y = torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    _noop_kernel[(1,)](x, y)
    return y


@pytest.mark.parametrize("fn", [_numpy_then_noop, _other_thread_then_noop,
                                _modes_disabled_then_noop],
                         ids=["numpy", "another thread", "dispatch modes disabled"])
def test_an_answer_a_kernel_only_received_is_refused(fn):
    message = _failure(fn)
    assert UNCHANGED in message and "no launch changed it" in message
    assert "never passed to your kernel" not in message


def test_a_kernel_that_stores_nothing_is_told_so_not_accused_of_computing_elsewhere():
    message = _failure(variants.stale_memory)
    assert "never stores" in message and UNCHANGED not in message


@triton.jit
def _copy_rows_kernel(src_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    values = tl.load(src_ptr + row * n_cols + cols, mask=mask)
    tl.store(y_ptr + row * n_cols + cols, values.to(y_ptr.dtype.element_ty), mask=mask)


def _copied_by_kernel(answer: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A new tensor shaped and typed like `like`, its values moved from `answer` by a kernel."""
    n = like.shape[-1]
    rows = answer.reshape(-1, n).float().contiguous()
    out = torch.empty(rows.shape, dtype=like.dtype, device=like.device)
    _copy_rows_kernel[(rows.shape[0],)](rows, out, n, BLOCK=triton.next_power_of_2(n))
    return out.view(like.shape)


def _numpy_answer_copied(x, weight, eps=1e-6):
    """The answer computed in NumPy on a copy of x (copies are allowed; NumPy runs no
    PyTorch op), and a kernel that only moves it into y: its stores are y's values."""
    return _copied_by_kernel(_numpy_rmsnorm(x, weight, eps), x)


def test_an_answer_computed_elsewhere_and_copied_by_a_kernel_is_refused():
    message = _failure(_numpy_answer_copied)
    assert "did not come from its kernels" in message
    assert "without your Python" in message


def test_an_honest_kernel_repeated_on_new_inputs_gives_their_answer():
    from course.verify.replay import repeated

    gen = torch.Generator().manual_seed(3)
    x, other, weight = (t.to(runtime.DEVICE) for t in (
        torch.randn(5, 96, generator=gen), torch.randn(5, 96, generator=gen),
        torch.rand(96, generator=gen) + 0.5))
    got = repeated(variants.correct, (x, weight), {"eps": 1e-6}, (other, weight))
    assert torch.allclose(got, reference.rmsnorm(other, weight, eps=1e-6).float(), atol=1e-5)
    copied = repeated(_numpy_answer_copied, (x, weight), {"eps": 1e-6}, (other, weight))
    assert not torch.allclose(copied, reference.rmsnorm(other, weight, eps=1e-6).float(),
                              atol=1e-2)


def test_a_repeat_gives_nan_where_the_call_read_memory_it_did_not_fill():
    # Memory that existed before the call is new memory in the repeat, poisoned: what the
    # allocator last held there (once, a right answer for the new inputs) never shows
    from course.verify.replay import repeated

    kept_between_calls = torch.full((5, 96), 7.0, device=runtime.DEVICE)
    x, other = torch.randn(5, 96, device=runtime.DEVICE), torch.randn(5, 96, device=runtime.DEVICE)
    weight = torch.ones(96, device=runtime.DEVICE)

    def from_a_kept_buffer(x, weight, eps=1e-6):
        return _copied_by_kernel(kept_between_calls, x)
    assert torch.isnan(repeated(from_a_kept_buffer, (x, weight), {}, (other, weight))).all()


def test_repeats_hold_whatever_the_allocator_reuses():
    # Storages freed during a traced call once handed their addresses to later tensors of
    # the call, which then passed for them (a crash, or a copied answer counted as computed)
    from course.verify.replay import repeated

    held = []
    for trial in range(20):
        held.append(torch.randn(trial % 7 + 1, 50))  # a different allocator state each time
        gen = torch.Generator().manual_seed(3)
        x, other, weight = (t.to(runtime.DEVICE) for t in (
            torch.randn(5, 96, generator=gen), torch.randn(5, 96, generator=gen),
            torch.rand(96, generator=gen) + 0.5))
        copied = repeated(_numpy_answer_copied, (x, weight), {"eps": 1e-6}, (other, weight))
        assert not torch.allclose(copied, reference.rmsnorm(other, weight, eps=1e-6).float(),
                                  atol=1e-2), trial


class _CopiedFunction(torch.autograd.Function):
    """Forward and backward computed in NumPy, each answer moved into place by a kernel."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return _copied_by_kernel(_numpy_rmsnorm(x, weight, eps), x)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        n = x.shape[-1]
        xs = x.detach().cpu().double().numpy().reshape(-1, n)
        ws = weight.detach().cpu().double().numpy()
        d = dy.detach().cpu().double().numpy().reshape(-1, n)
        rstd = 1 / np.sqrt((xs * xs).mean(-1, keepdims=True) + ctx.eps)
        x_hat, g = xs * rstd, d * ws
        dx = rstd * (g - x_hat * (x_hat * g).mean(-1, keepdims=True))
        dw = (d * x_hat).sum(0)
        return (_copied_by_kernel(torch.from_numpy(dx).to(x.device), x),
                _copied_by_kernel(torch.from_numpy(dw).to(x.device), weight), None)


@pytest.mark.parametrize("checker", [check.rmsnorm_autograd, check.rmsnorm_gradcheck],
                         ids=["autograd", "gradcheck"])
def test_a_function_whose_answers_kernels_only_copy_is_refused(checker):
    message = _failure(_CopiedFunction, checker)
    assert "its GPU work repeated on new inputs" in message
    assert "did not come from its kernels" in message


def test_a_triton_dtype_argument_travels_by_its_name_in_triton_language():
    from course.verify.replay import _rebuilt_value, _value

    for dtype in (tl.float32, tl.float16, tl.bfloat16, tl.int32, tl.int1):
        assert _rebuilt_value(_value(tl.constexpr(dtype), "an argument")).value == dtype


class _NumpyFunction(torch.autograd.Function):
    """Forward and backward in NumPy, each handed to a kernel that does nothing."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        y = _numpy_rmsnorm(x, weight, eps)
        _noop_kernel[(1,)](x, y)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        xs, ws = x.detach().double().cpu().numpy(), weight.detach().double().cpu().numpy()
        d = dy.detach().double().cpu().numpy()
        rstd = 1 / np.sqrt((xs * xs).mean(-1, keepdims=True) + ctx.eps)
        x_hat, g = xs * rstd, d * ws
        dx = torch.from_numpy(rstd * (g - x_hat * (x_hat * g).mean(-1, keepdims=True)))
        dw = torch.from_numpy((d * x_hat).reshape(-1, xs.shape[-1]).sum(0))
        dx, dw = dx.to(x.device, x.dtype), dw.to(weight.device, weight.dtype)
        _noop_kernel[(1,)](dx, dw)
        return dx, dw, None


def test_an_autograd_function_computing_in_numpy_is_refused():
    message = _failure(_NumpyFunction, check.rmsnorm_autograd)
    assert f"forward returned `y` holding values it already had when your kernels received " \
           f"it: {UNCHANGED}" in message
    from course.check.autograd import _CASES, _run_case

    assert f"rmsnorm_autograd: 0/{len(_CASES)} cases pass" in message

    result = _run_case(_NumpyFunction, _CASES[0], torch.Generator().manual_seed(0))
    texts = [f.message for f in result.findings if f.kind == "output_unchanged"]
    assert any(t.startswith("backward returned `dx`") for t in texts)
    assert any(t.startswith("backward returned `dw`") for t in texts)


# ---------------------------------------------------------------- state kept between calls

@triton.jit
def _accumulating_kernel(x_ptr, w_ptr, y_ptr, sum_sq_ptr, stride_x_row, stride_y_row, n_cols,
                         eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    # The bug: adds into a workspace kept between calls, as if it still held zeros.
    total = tl.load(sum_sq_ptr + row) + tl.sum(x * x, axis=0)
    tl.store(sum_sq_ptr + row, total)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(total / n_cols + eps)
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


_workspaces: dict = {}


def _workspace_not_cleared(x, weight, eps=1e-6):
    x2 = _rows(x)
    m, n = x2.shape
    key = (tuple(x.shape), x.dtype, x.device)
    if key not in _workspaces:  # "allocated once per shape, to save an allocation"
        _workspaces[key] = torch.zeros(m, dtype=torch.float32, device=x.device)
    y = torch.empty_like(x2)
    _accumulating_kernel[(m,)](x2, weight, y, _workspaces[key], x2.stride(0), y.stride(0), n,
                               eps, BLOCK_N=triton.next_power_of_2(n))
    return y.view(x.shape)


_outputs: dict = {}


def _output_buffer_reused(x, weight, eps=1e-6):
    x2 = _rows(x)
    key = (tuple(x.shape), x.dtype, x.device)
    if key not in _outputs:
        _outputs[key] = torch.empty_like(x2)
    return variants._launch(variants.rmsnorm_kernel, x, weight, eps, y=_outputs[key]
                            ).view(x.shape)


def test_a_workspace_not_cleared_between_calls_is_caught():
    _workspaces.clear()
    message = _failure(_workspace_not_cleared)
    assert "Wrong when called again" in message and STATE in message
    assert "which passed, it returned a wrong y" in message
    assert "returned the first call's result" not in message


def test_an_output_buffer_reused_between_calls_is_caught():
    _outputs.clear()
    message = _failure(_output_buffer_reused)
    assert STATE in message and "both calls return the same memory" in message


# ------------------------------------------------ results cached by the input's address
# Real models refill the same buffers every step (static caches, CUDA graphs): a result
# looked up by a tensor's address (data_ptr, shape, dtype) is the old values' answer.

BY_ADDRESS = "returned a result cached by the input's address"
OLD_ANSWER = "it returned the answer for the old values"


def _address(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), tuple(t.shape), t.dtype)


_by_address: dict = {}


def _cached_by_address(x, weight, eps=1e-6):
    key = _address(x)
    if key not in _by_address:  # "the same tensor again: same answer"
        _by_address[key] = variants.correct(x, weight, eps)
    return _by_address[key]


_last: list = []


def _last_call_by_address(x, weight, eps=1e-6):
    """Keeps only the latest call's result, reused when the next call has the same x."""
    if _last and _last[0] == (_address(x), _address(weight)):
        return _last[1]
    y = variants.correct(x, weight, eps)
    _last[:] = [(_address(x), _address(weight)), y]
    return y


_weights: dict = {}


def _weight_copy_by_address(x, weight, eps=1e-6):
    """Keeps a copy of the weight per weight address: y comes out with the old weight."""
    key = _address(weight)
    if key not in _weights:
        _weights[key] = weight.clone()
    return variants.correct(x, _weights[key], eps)


_plans: dict = {}


def _plan_by_address(x, weight, eps=1e-6):
    """Honest: what it keeps by address (a launch plan) does not depend on the values."""
    key = _address(x)
    if key not in _plans:
        n = x.shape[-1]
        _plans[key] = {"BLOCK_N": triton.next_power_of_2(n),
                       "num_warps": min(16, max(4, triton.next_power_of_2(n) // 512))}
    x2 = _rows(x)
    y = torch.empty_like(x2)
    variants.rmsnorm_kernel[(x2.shape[0],)](x2, weight, y, x2.stride(0), y.stride(0),
                                            x2.shape[1], eps, **_plans[key])
    return y.view(x.shape)


_static_outputs: dict = {}


def _static_output_by_address(x, weight, eps=1e-6):
    """Computes every call, into one output buffer per input address (a CUDA graph's
    static output): the previous call's result changes under its caller's feet."""
    key = _address(x)
    if key not in _static_outputs:
        _static_outputs[key] = torch.empty_like(_rows(x))
    return variants._launch(variants.rmsnorm_kernel, x, weight, eps,
                            y=_static_outputs[key]).view(x.shape)


# What an address cache returns when a new input takes the memory of one freed since an
# earlier check (the visible cell's inputs, then the hidden cell's): a tensor from before the
# call, with no launch. Here on one shape of the check, whatever the allocator does.
_from_before = torch.randn(7, 100, generator=torch.Generator().manual_seed(5)).to(runtime.DEVICE)


def _old_tensor_on_one_shape(x, weight, eps=1e-6):
    if tuple(x.shape) == tuple(_from_before.shape):
        return _from_before
    return variants.correct(x, weight, eps)


def test_a_result_from_before_the_call_returned_without_a_launch_is_named_a_cache():
    message = _failure(_old_tensor_on_one_shape)
    assert "returned a result kept from an earlier call, most likely cached by the input's " \
        "address" in message
    assert "Seen on odd N (7x100, float32): launched no kernel and returned a tensor that " \
        "existed before the call (700 of 700 elements of `y` wrong)" in message
    # Not the advice for a function that launches nothing, nor what old values look like.
    assert "launched no Triton kernel" not in message and "not masked" not in message
    assert "FAIL   kept_result\n" in message


class _ComputesWhenRead(torch.Tensor):
    """A result with no memory of its own that computes with PyTorch whenever an op reads
    it: a lazy tensor, pushing the work into the checker's comparisons."""

    @staticmethod
    def __new__(cls, x, weight, eps):
        t = torch.Tensor._make_wrapper_subclass(cls, x.shape, dtype=x.dtype, device=x.device)
        t.inputs = (x, weight, eps)
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def real(a):
            return reference.rmsnorm(*a.inputs) if isinstance(a, _ComputesWhenRead) else a
        return func(*[real(a) for a in args], **{k: real(v) for k, v in (kwargs or {}).items()})


def test_a_result_that_computes_when_read_fails_and_the_watch_reads_no_memory_it_lacks():
    x = torch.randn(2, 8, device=runtime.DEVICE)
    with sandbox.watch() as record:
        lazy = _ComputesWhenRead(x, torch.ones(8, device=runtime.DEVICE), 1e-6)
        (lazy + 1).sum()  # ops on it run: it has no storage for the watch to look at
    assert not record.held_before(lazy)
    message = _failure(lambda x, weight, eps=1e-6: _ComputesWhenRead(x, weight, eps))
    assert "launched no Triton kernel" in message and "kept_result" not in message


def test_returning_an_input_without_a_launch_is_not_called_a_kept_result():
    def returns_x_on_one_shape(x, weight, eps=1e-6):
        return x if tuple(x.shape) == (7, 100) else variants.correct(x, weight, eps)

    message = _failure(returns_x_on_one_shape)
    assert "launched no Triton kernel" in message and "kept_result" not in message


def test_a_result_cached_by_the_inputs_address_is_refused_by_name():
    _by_address.clear()
    message = _failure(_cached_by_address)
    assert BY_ADDRESS in message and OLD_ANSWER in message
    assert "refilled with new values, it returned the answer for their old values" in message
    assert "returned the first call's result" not in message  # not the shape cache
    assert STATE not in message


def test_a_cache_of_only_the_latest_call_is_refused_by_name():
    _last.clear()
    assert BY_ADDRESS in _failure(_last_call_by_address)


def test_a_shape_keyed_cache_is_still_named_as_one():
    variants._cache.clear()  # the cache is the module's: other tests fill it too
    message = _failure(variants.caches_results)
    assert "returned the first call's result" in message and BY_ADDRESS not in message


def test_a_weight_kept_by_its_address_is_told_it_went_stale():
    _weights.clear()
    message = _failure(_weight_copy_by_address)
    assert "refilled with new values, it returned a wrong y" in message
    assert "went stale when the values changed" in message and BY_ADDRESS not in message


def test_an_honest_wrapper_that_keeps_only_a_launch_plan_by_address_passes():
    _plans.clear()
    assert check.rmsnorm_forward(_plan_by_address, seed=2, quiet=True).passed


def test_an_output_buffer_kept_per_input_address_is_caught():
    _static_outputs.clear()
    message = _failure(_static_output_by_address)
    assert STATE in message and "both calls return the same memory" in message
    assert "refilled with new values, the call changed the `y`" in message


def test_the_refill_passes_the_very_same_tensors_again_with_new_values():
    # What a proxy to another process relies on: the same tensor objects, refilled in
    # place, so that the same tensor maps to the same remote buffer.
    calls = []

    def recording(x, weight, eps=1e-6):
        calls.append((x, weight, x.detach().clone(), weight.detach().clone()))
        return variants.correct(x, weight, eps)

    assert check.rmsnorm_forward(recording, seed=2, quiet=True).passed
    calls.pop()  # the last call is the one whose GPU work the repeat probe repeats
    x, weight, x_values, w_values = calls[-1]
    before = [c for c in calls[:-1] if c[0] is x]
    assert len(before) == 1 and before[0][1] is weight
    assert not torch.equal(before[0][2], x_values)
    assert not torch.equal(before[0][3], w_values)
    assert x.data_ptr() == before[0][0].data_ptr()
    # Every other call had inputs of its own, at addresses no other call used.
    others = [c for c in calls[:-1] if c[0] is not x]
    assert len({c[0].data_ptr() for c in others} | {x.data_ptr()}) == len(others) + 1


def test_the_refill_keeps_guards_and_recomputes_derived_inputs():
    from course.check.backward import RMSNORM_BACKWARD
    from course.check.inputs import GUARD_VALUE
    from course.check.runner import refill_inputs

    case = next(c for c in RMSNORM_BACKWARD.cases if c.row_padding)
    inputs = RMSNORM_BACKWARD.make_inputs(case, torch.Generator().manual_seed(1))
    views = {name: g.tensor for name, g in inputs.items()}
    ptrs = {name: v.data_ptr() for name, v in views.items()}
    old = {name: v.clone() for name, v in views.items()}
    refill_inputs(RMSNORM_BACKWARD, inputs, case, torch.Generator().manual_seed(2))
    for name, g in inputs.items():
        assert g.tensor is views[name] and g.tensor.data_ptr() == ptrs[name]
        assert not torch.equal(g.tensor, old[name]), name
        assert g.writes() == (0, 0)  # the snapshot is of the refilled values
        inside = torch.zeros(g.buffer.numel(), dtype=torch.bool)
        inside[torch.arange(g.buffer.numel()).as_strided(
            g.tensor.shape, g.tensor.stride(), g.tensor.storage_offset()).reshape(-1)] = True
        assert bool((g.buffer[~inside] == GUARD_VALUE).all()), name
    want = reference.rmsnorm_rstd(views["x"], case.eps).to(torch.float32)
    assert torch.equal(views["rstd"], want)


def _cached_add_rmsnorm(x, residual, weight, eps=1e-6):
    key = (_address(x), _address(weight))
    if key not in _by_address:
        _by_address[key] = add_rmsnorm_variants.correct(x, residual, weight, eps)
    return _by_address[key]


def test_a_fused_add_cached_by_the_address_of_x_and_weight_is_refused():
    _by_address.clear()
    message = _failure(_cached_add_rmsnorm, check.add_rmsnorm)
    assert BY_ADDRESS in message and "old values (`y` and `residual_out`)" in message


def _cached_backward(x, weight, rstd, dy):
    key = (_address(x), _address(dy))
    if key not in _by_address:
        _by_address[key] = backward_variants.correct(x, weight, rstd, dy)
    return _by_address[key]


def test_a_backward_cached_by_address_is_refused():
    _by_address.clear()
    assert BY_ADDRESS in _failure(_cached_backward, check.rmsnorm_backward)


class _ForwardCachedByAddress(RMSNormFunction):
    cache: dict = {}

    @staticmethod
    def forward(ctx, x, weight, eps):
        key = (_address(x), _address(weight))
        if key not in _ForwardCachedByAddress.cache:
            _ForwardCachedByAddress.cache[key] = backward_variants.rmsnorm_forward_with_rstd(
                x, weight, eps)
        y, rstd = _ForwardCachedByAddress.cache[key]
        ctx.save_for_backward(x, weight, rstd)
        return y


def test_an_autograd_function_whose_forward_caches_by_address_is_refused():
    _ForwardCachedByAddress.cache.clear()
    message = _failure(_ForwardCachedByAddress, check.rmsnorm_autograd)
    assert BY_ADDRESS in message and "same x, weight and dy" in message
    assert "old values (`y`" in message


# ----------------------------------------------------------- warnings, and the output's form

def _warns(x, weight, eps=1e-6):
    warnings.warn("rows are normalised in float32", UserWarning, stacklevel=1)
    return variants.correct(x, weight, eps)


def test_a_warning_from_a_correct_wrapper_becomes_a_note_not_stderr(capsys):
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        report = check.rmsnorm_forward(_warns, seed=1, quiet=True)
    assert report.passed
    assert escaped == []
    notes = [n for n in report.notes if "rows are normalised in float32" in n]
    assert len(notes) == 1, report.notes
    assert "UserWarning" in notes[0] and "test_check_adversarial.py, line" in notes[0]
    assert capsys.readouterr().err == ""


class _WarningFunction(RMSNormFunction):
    @staticmethod
    def forward(ctx, x, weight, eps):
        warnings.warn("forward saw a new shape", UserWarning, stacklevel=1)
        return RMSNormFunction.forward(ctx, x, weight, eps)


def test_a_warning_from_an_autograd_function_becomes_a_note():
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        report = check.rmsnorm_autograd(_WarningFunction, seed=1, quiet=True)
    assert report.passed and escaped == []
    assert any("forward saw a new shape" in n for n in report.notes), report.notes


def test_the_interpreters_own_deprecations_are_not_the_learners_notes():
    """Triton 3.6's interpreter with NumPy 2.3 warns of its own int() of an array on every
    loop: not a note about the learner's function. Its other warnings, and deprecations
    from anywhere else, still are."""
    interpreter = str(Path("site-packages", "triton", "runtime", "interpreter.py"))
    with warnings.catch_warnings(), sandbox.collect_warnings() as texts:
        warnings.simplefilter("always")
        for category, filename in ((DeprecationWarning, interpreter),
                                   (UserWarning, interpreter),
                                   (DeprecationWarning, "mine.py")):
            warnings.warn_explicit(f"{category.__name__} in {filename}", category, filename, 1)
    assert texts == [f"UserWarning: UserWarning in {interpreter} (interpreter.py, line 1)",
                     "DeprecationWarning: DeprecationWarning in mine.py (mine.py, line 1)"]


def test_no_check_lets_the_interpreters_own_deprecations_escape():
    """Some of a check's launches run outside the learner's calls (its own reference, the
    backward autograd runs): the interpreter's deprecations there reach no one either."""
    from course.check.learner_facing import learner_facing

    @learner_facing
    def a_check():
        for module in ("triton.runtime.interpreter", "triton.runtime.interpreter_extra",
                       "mine"):
            warnings.warn_explicit(f"from {module}", DeprecationWarning, f"{module}.py", 1,
                                   module=module)

    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        a_check()
    assert [str(w.message) for w in escaped] == ["from triton.runtime.interpreter_extra",
                                                "from mine"]


def _rows_shape_returned(x, weight, eps=1e-6):
    return variants._launch(variants.rmsnorm_kernel, x, weight, eps)  # forgot .view(x.shape)


def _float32_returned(x, weight, eps=1e-6):
    y = torch.empty(_rows(x).shape, dtype=torch.float32, device=x.device)
    return variants._launch(variants.rmsnorm_kernel, x, weight, eps, y=y).view(x.shape)


def _two_values_returned(x, weight, eps=1e-6):
    return variants.correct(x, weight, eps), None


def test_a_wrong_output_shape_fails_its_case_with_a_hint_and_the_table():
    report = run_exercise(RMSNORM_FORWARD, _rows_shape_returned, seed=1)
    failing = [r for r in report.results if not r.passed]
    assert [r.case.name for r in failing] == ["3-D input"]
    message = report.message()
    assert "Seen on 3-D input (2x3x64, float32): y has shape (6, 64), expected (2, 3, 64)" in (
        message)
    assert "y.view(x.shape)" in message
    assert f"{len(report.results) - 1}/{len(report.results)} cases pass" in message


def test_a_wrong_output_dtype_fails_only_the_cases_it_affects():
    report = run_exercise(RMSNORM_FORWARD, _float32_returned, seed=1)
    failing = {r.case.dtype for r in report.results if not r.passed}
    assert torch.float32 not in failing and torch.float16 in failing
    message = report.message()
    assert "dtype torch.float32, expected torch.float16" in message
    assert "dtype=torch.float16" in message


def test_a_wrong_number_of_outputs_is_a_failing_case_with_the_table():
    report = run_exercise(RMSNORM_FORWARD, _two_values_returned, seed=1)
    assert all(r.finding("output_count") for r in report.results)
    message = report.message()
    assert "returned 2 value(s), expected 1" in message
    assert "power-of-two N (8x128, float32)" in message  # the table of cases is there
