"""The reference wrappers' kept launches (solutions/kernels/ready_launch.py): a second call
with the same layouts launches what the first compiled, and gives the same bits; a layout
that differs in anything Triton specialises on gets a launch of its own. GPU tests run on
the device; without one, the interpreter keeps nothing."""

import importlib

import course  # noqa: F401  (mode first)
from course import runtime

import pytest
import torch

from solutions.kernels.layernorm import layernorm
from solutions.kernels.ready_launch import hooked, launch_key, layout
from solutions.kernels.rmsnorm import add_rmsnorm, rmsnorm

# the modules themselves (the package's names rmsnorm, layernorm... are its functions)
rmsnorm_module = importlib.import_module("solutions.kernels.rmsnorm")
layernorm_module = importlib.import_module("solutions.kernels.layernorm")
column_sums_module = importlib.import_module("solutions.kernels.column_sums")
READY = (rmsnorm_module._READY_FORWARDS, rmsnorm_module._READY_BACKWARDS,
         layernorm_module._READY_FORWARDS, layernorm_module._READY_BACKWARDS,
         column_sums_module._READY)
KEPT = READY + (rmsnorm_module._KEPT_PLANS, layernorm_module._KEPT_PLANS)  # with the plans


def _forget():
    for kept in KEPT:
        kept.clear()


def test_the_interpreter_keeps_no_launch():
    if runtime.on_gpu():
        pytest.skip("on a GPU launches are kept: the GPU tests below check them")
    _forget()
    x = torch.randn(4, 64, requires_grad=True)
    w = torch.ones(64, requires_grad=True)
    rmsnorm(x, w).sum().backward()
    layernorm(x, w, w.detach().clone().requires_grad_()).sum().backward()
    add_rmsnorm(x.detach(), x.detach(), w.detach())
    assert all(len(kept) == 0 for kept in KEPT)
    assert launch_key(x, w, None, True) is None  # off the GPU, nothing is looked up


def test_a_layout_says_what_triton_specialises_on():
    x = torch.zeros(4, 64)
    assert layout(x) == (torch.Size([4, 64]), (64, 1), torch.float32, -1, True)  # -1: CPU
    assert layout(x[:, 1:])[-1] is False  # 4 bytes past a 16-byte boundary
    assert layout(x[:2]) != layout(x) and layout(x.t()) != layout(x)
    assert layout(None) is None
    assert layout([1.0])[0] == "not a tensor"


def test_a_launch_hook_counts_as_set_only_when_something_is_hooked():
    # Triton 3.4 and before: None or a callable; later: a chain of callables, never None
    # (asking for launch metadata on every call because a chain is not None cost time)
    import triton.knobs

    assert not hooked(None) and hooked(print)
    if hasattr(triton.knobs, "HookChain"):
        chain = triton.knobs.HookChain()
        assert not hooked(chain)
        chain.add(print)
        assert hooked(chain)


def test_kept_launch_c_builds_and_refuses_arguments_that_disagree():
    # Triton's own C toolchain builds it wherever Triton runs (the interpreter included);
    # its arguments are checked before the driver is looked for
    from solutions.kernels.ready_launch import _kept_launch_type

    launch = _kept_launch_type()
    assert launch is not None
    stream_of = torch.cuda.current_stream
    with pytest.raises(ValueError, match="disagree"):  # two cells, three sizes
        launch(1, (1, 1, 1), 128, 0, bytes(16), (8, 8, 8), (0,), "p", stream_of, 0)
    with pytest.raises(ValueError, match="disagree"):  # one slot, two kinds
        launch(1, (1, 1, 1), 128, 0, bytes(16), (8, 8), (0,), "pf", stream_of, 0)
    with pytest.raises(ValueError, match="more than 64"):  # each call copies them onto its stack
        launch(1, (1, 1, 1), 128, 0, bytes(8 * 65), (8,) * 65, (), "", stream_of, 0)
    with pytest.raises(TypeError):  # a grid of two
        launch(1, (1, 1), 128, 0, bytes(16), (8, 8), (0,), "p", stream_of, 0)


def test_a_kept_launch_packs_the_parameters_tritons_launcher_passes(monkeypatch):
    # Every argument that is not a constexpr, in order, each in an 8-byte cell at its own
    # size, then the two scratch pointers; the per-call slots left as zeros. A value out of
    # its parameter's range, or a kernel needing clusters, leaves the launch to Triton.
    from types import SimpleNamespace

    from solutions.kernels import ready_launch

    made = []
    monkeypatch.setattr(ready_launch, "_kept_launch_type", lambda: lambda *a: made.append(a))
    meta = SimpleNamespace(num_ctas=1, launch_pdl=False, launch_cooperative_grid=False,
                           global_scratch_size=0, profile_scratch_size=0, num_warps=4, shared=96)
    signature = {"x_ptr": "*bf16", "y_ptr": "*bf16", "M": "i32", "N": "constexpr",
                 "eps": "fp32", "stride": "i64"}
    compiled = SimpleNamespace(metadata=meta, src=SimpleNamespace(signature=signature),
                               function=1234)
    names, args = list(signature), [None, None, 7, 4096, None, 2**40]
    ready_launch.kept_launch(compiled, names, args, [0, 1, 4], (3, 1, 1), print, 0)
    (function, grid, block, shared, cells, sizes, slots, kinds, _, device), = made
    assert (function, grid, block, shared, device) == (1234, (3, 1, 1), 128, 96, 0)
    assert sizes == (8, 8, 4, 4, 8, 8, 8) and slots == (0, 1, 3) and kinds == "ppf"
    assert cells == (bytes(16) + (7).to_bytes(8, "little") + bytes(8)
                     + (2**40).to_bytes(8, "little") + bytes(16))
    assert ready_launch.kept_launch(compiled, names, [None, None, 2**31, 4096, None, 0],
                                    [0, 1, 4], (3, 1, 1), print, 0) is None  # M past an i32
    meta.num_ctas = 2
    assert ready_launch.kept_launch(compiled, names, args, [0, 1, 4], (3, 1, 1), print,
                                    0) is None
    assert len(made) == 1


gpu = pytest.mark.gpu


def _kept_ready_launches():
    """Every ReadyLaunch the wrappers keep now (backwards keep theirs in a tuple)."""
    launches = []
    for kept in READY:
        for value in kept.values():
            launches += [v for v in (value if isinstance(value, tuple) else (value,))
                         if hasattr(v, "kept")]
    return launches


def _layouts(N, dtype):
    """Inputs whose layouts differ in what a launch depends on, each as (name, x)."""
    base = torch.randn(64, N + 8, device="cuda", dtype=dtype)
    return [("rows", torch.randn(64, N, device="cuda", dtype=dtype)),
            ("3-d", torch.randn(4, 16, N, device="cuda", dtype=dtype)),
            ("row stride", base[:, :N]),
            ("unaligned", base[:, 1:N + 1]),  # 2 or 4 bytes past a 16-byte boundary
            ("copied", torch.randn(16, 4, N, device="cuda", dtype=dtype).transpose(0, 1))]


@gpu
@pytest.mark.parametrize("N", [256, 4096, 5120])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_kept_forward_gives_the_first_calls_bits(N, dtype):
    _forget()
    w = torch.randn(N, device="cuda", dtype=dtype)
    b = torch.randn(N, device="cuda", dtype=dtype)
    for name, x in _layouts(N, dtype):
        r = torch.randn_like(x)
        calls = {"rmsnorm": lambda x=x: rmsnorm(x, w),
                 "rmsnorm, no weight": lambda x=x: rmsnorm(x),
                 "add_rmsnorm": lambda x=x, r=r: add_rmsnorm(x, r, w),
                 "layernorm": lambda x=x: layernorm(x, w, b),
                 "layernorm, no bias": lambda x=x: layernorm(x, w)}
        for op, call in calls.items():
            first = call()
            again = call()
            for a, b_ in zip(first if isinstance(first, tuple) else (first,),
                             again if isinstance(again, tuple) else (again,), strict=True):
                assert a.shape == b_.shape == x.shape and a.is_contiguous(), (op, name)
                assert torch.equal(a, b_), f"{op}, {name}: the kept launch differs"
    kept = len(rmsnorm_module._READY_FORWARDS) + len(layernorm_module._READY_FORWARDS)
    # every layout but the copied one, for each of the five calls
    assert kept == 5 * 4
    # each launched again through kept_launch.c (Triton's launcher only for profilers)
    assert all(ready.kept is not None for ready in _kept_ready_launches())


@gpu
@pytest.mark.parametrize("N", [512, 4096, 5120])
def test_a_kept_backward_gives_the_first_calls_gradients(N):
    _forget()
    dtype = torch.bfloat16
    w0 = torch.randn(N, device="cuda", dtype=dtype)
    for name, x0 in _layouts(N, dtype):
        dy = torch.randn(x0.shape, device="cuda", dtype=dtype)
        grads = []
        for _ in range(2):
            x = x0.detach().clone().requires_grad_()
            w = w0.clone().requires_grad_()
            b = torch.zeros_like(w0, requires_grad=True)
            rmsnorm(x, w).backward(dy)
            layernorm(x, w, b).backward(dy)
            grads.append((x.grad, w.grad, b.grad))
        for a, b_ in zip(*grads, strict=True):
            assert torch.equal(a, b_), f"{name}: the kept backward differs"
    # x.clone() is contiguous whatever x0's layout: one layout a shape, 2-d or 3-d
    assert len(rmsnorm_module._READY_BACKWARDS) == 2
    assert len(layernorm_module._READY_BACKWARDS) == 2
    assert len(column_sums_module._READY) >= 1
    assert all(ready.kept is not None for ready in _kept_ready_launches())


@gpu
def test_a_kept_launch_runs_on_a_thread_with_no_cuda_context():
    # kept_launch.c makes the device's primary context current on a thread that has none,
    # as Triton's launcher does (the stream it launches on: the CUDA graph test below)
    import ctypes
    import threading

    _forget()
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    want = rmsnorm(x, w)
    (ready,) = rmsnorm_module._READY_FORWARDS.values()
    assert ready.kept is not None
    y = torch.empty_like(x)
    cuda = ctypes.CDLL("libcuda.so.1")
    contexts = []

    def launch_without_a_context():
        context = ctypes.c_void_p()
        cuda.cuCtxSetCurrent(None)
        cuda.cuCtxGetCurrent(ctypes.byref(context))
        contexts.append(context.value)
        ready.run(x, y, w, y, y, y, 1e-6)  # the wrapper's order: x, residual, weight, y...
        cuda.cuCtxGetCurrent(ctypes.byref(context))
        contexts.append(context.value)

    thread = threading.Thread(target=launch_without_a_context)
    thread.start()
    thread.join()
    torch.cuda.synchronize()
    assert contexts[0] is None and contexts[1] is not None
    assert torch.equal(y, want)


@gpu
def test_a_kept_backward_keeps_its_column_sums_launch():
    # A kept backward launches its column sums through the launch it kept with it, not by
    # looking their layout up again: with every kept column-sums launch forgotten after the
    # first call, the second gives the same gradients and keeps no new one
    _forget()
    x0 = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w0, dy = torch.randn_like(x0[0]), torch.randn_like(x0)
    grads = []
    for call in range(2):
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, torch.zeros_like(w0)))
        rmsnorm(x, w).backward(dy)
        layernorm(x, w, b).backward(dy)
        grads.append((x.grad, w.grad, b.grad))
        if call == 0:
            assert len(rmsnorm_module._READY_BACKWARDS) == 1
            assert len(layernorm_module._READY_BACKWARDS) == 1
            assert len(column_sums_module._READY) >= 1
            column_sums_module._READY.clear()
    assert len(column_sums_module._READY) == 0, "the kept backward looked its sums up again"
    for a, b_ in zip(*grads, strict=True):
        assert torch.equal(a, b_), "the kept backward's column sums differ"


@gpu
@pytest.mark.parametrize("N", [4096, 5120])
def test_a_one_row_backward_is_one_launch_first_and_kept(N):
    # A decode step's single row: its one program writes dW (and dB) in the parameters'
    # dtype, so the column sums are never launched, neither the first time nor when kept
    from course import reference
    from course.check.compare import compare
    from course.shootout import column_sum_error

    _forget()
    dtype = torch.bfloat16
    x0 = torch.randn(1, N, device="cuda", dtype=dtype)
    w0, b0 = torch.rand(N, device="cuda", dtype=dtype) + 0.5, torch.randn_like(x0[0])
    dy = torch.randn_like(x0)
    for _ in range(2):
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
        rmsnorm(x, w).backward(dy)
        want_dx, want_dw = reference.rmsnorm_backward(x0, w0, dy)
        assert compare("dx", x.grad, want_dx, dtype) is None
        assert w.grad.dtype == dtype and column_sum_error("dw", w.grad, want_dw, dtype) is None
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
        layernorm(x, w, b).backward(dy)
        want_dx, want_dw, want_db = reference.layernorm_backward(x0, w0, b0, dy)
        assert compare("dx", x.grad, want_dx, dtype) is None
        assert column_sum_error("dw", w.grad, want_dw, dtype) is None
        assert column_sum_error("db", b.grad, want_db, dtype) is None
    assert len(rmsnorm_module._READY_BACKWARDS) == len(layernorm_module._READY_BACKWARDS) == 1
    assert len(column_sums_module._READY) == 0


@gpu
def test_kept_launches_match_the_reference_and_run_inside_a_cuda_graph():
    from course import reference
    from course.check.compare import compare

    _forget()
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    rmsnorm(x, w)  # kept now
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        y = rmsnorm(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert compare("y", y, reference.rmsnorm(x, w), torch.bfloat16) is None


@gpu
def test_a_kept_launch_calls_tritons_launch_hooks():
    # Profilers (Proton) hook Triton's launches: a kept launch must call them as Triton does
    from triton import knobs

    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    rmsnorm(x)
    seen = []
    knobs.runtime.launch_enter_hook = lambda metadata: seen.append(metadata.get()["name"])
    try:
        rmsnorm(x)
    finally:
        knobs.runtime.launch_enter_hook = None
    assert seen == ["rmsnorm_fwd_rows_kernel"]
