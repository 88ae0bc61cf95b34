"""The reference wrappers' backward nodes in C++ (solutions/kernels/kept_backward.py and
kept_backward.cpp): once a layout's backward has kept its launches, later forwards of that
layout get a C++ node that launches them, and gives the Function's gradients bit for bit.
The build and the node's wiring (edges, saved tensors, the Python backward for other
gradients) are tested here without a GPU; the launches on the device."""

import importlib
from types import SimpleNamespace

import course  # noqa: F401  (mode first)
from course import runtime

import pytest
import torch
import torch.nn.functional as F

from solutions.kernels import kept_backward
from solutions.kernels.layernorm import layernorm
from solutions.kernels.rmsnorm import rmsnorm

rmsnorm_module = importlib.import_module("solutions.kernels.rmsnorm")
layernorm_module = importlib.import_module("solutions.kernels.layernorm")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The module, built from source here; where no C++ compiler is found the wrappers keep
    their Functions, and these tests say so."""
    import os
    import shutil

    if shutil.which(os.environ.get("CXX") or "c++") is None:
        pytest.skip("no C++ compiler: the wrappers' backwards stay torch.autograd.Functions")
    return kept_backward.build(tmp_path_factory.mktemp("kept_backward"))


def _python_rmsnorm_backward(calls):
    def backward(x, weight, rstd, dy):
        calls.append((x.shape, weight is None, rstd.shape, dy.is_contiguous()))
        xx = x.detach().requires_grad_()
        ww = weight.detach().requires_grad_() if weight is not None else None
        with torch.enable_grad():
            y = F.rms_norm(xx, (x.shape[-1],), ww, 1e-6)
            grads = torch.autograd.grad(y, [t for t in (xx, ww) if t is not None], dy)
        return grads if weight is not None else (grads[0], None)
    return backward


def _cpu_plan(built, calls, stats=1, name="RMSNormBackward (test)"):
    """A plan whose launches are never run: off the GPU every gradient goes to the Python
    backward (`stats` 2: LayerNorm's edges and statistics, with RMSNorm's backward)."""
    from solutions.kernels import ready_launch
    from solutions.kernels.kept_backward import Source

    assert ready_launch._kept_launch_type() is not None  # kept_launch.c: its launch_raw
    never = SimpleNamespace(kept=object(), device=0)  # a ReadyLaunch never launched
    saved = [torch.empty(4, 8), torch.empty(8)] + [torch.empty(4)] * stats
    inputs = saved[:2] + [torch.empty(8)] * (stats - 1)  # x, the weight (, the bias)
    backward = _python_rmsnorm_backward(calls)
    return built.Plan(never, never, None, ready_launch._kept_launch_module.launch_raw,
                      [Source.X, Source.Y, Source.WEIGHT, Source.Y, Source.Y, Source.STAT0,
                       Source.EPS],
                      [Source.X, Source.WEIGHT, Source.GRAD, Source.STAT0, Source.DX,
                       Source.PARTIALS], inputs, saved, torch.empty(4, 8), [1, 8],
                      torch.float32, torch.float32,
                      lambda x, w, *rest: backward(x, w, rest[0], rest[-1]), name)


def _attached(plan, x, w):
    with torch.no_grad():
        y = F.rms_norm(x, (x.shape[-1],), w, 1e-6)
    stats = torch.ones(1, *x.shape[:-1])  # (statistics, rows), as the forward keeps them
    return plan.attach(y, x, w, None, stats)


def test_the_node_carries_gradients_to_its_inputs(built):
    calls = []
    plan = _cpu_plan(built, calls)
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    y = _attached(plan, x, w)
    assert y.requires_grad and y.grad_fn.name() == "RMSNormBackward (test)"
    dy = torch.randn(4, 8)
    got = torch.autograd.grad(y, (x, w), dy, retain_graph=True)
    want = torch.autograd.grad(F.rms_norm(x, (8,), w, 1e-6), (x, w), dy)
    assert all(torch.equal(g, h) for g, h in zip(got, want, strict=True))
    assert calls == [((4, 8), False, (4,), True)]  # the saved tensors, as they were saved
    y.sum().backward()  # an expanded gradient: still the Python backward's
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


def test_the_node_gives_only_the_gradients_asked_for(built):
    plan = _cpu_plan(built, [])
    x = torch.randn(2, 8, requires_grad=True)
    w = torch.randn(8)  # not a leaf that wants a gradient: no edge
    y = _attached(plan, x, w)
    (gx,) = torch.autograd.grad(y, (x,), torch.ones(2, 8))
    assert gx.shape == x.shape
    w.requires_grad_()
    y = _attached(plan, x, w)
    (gw,) = torch.autograd.grad(y, (w,), torch.ones(2, 8))
    assert gw.shape == w.shape


def test_the_node_lets_go_of_its_tensors_and_sees_them_changed(built):
    plan = _cpu_plan(built, [])
    x = torch.randn(2, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    y = _attached(plan, x, w)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="second time"):
        y.sum().backward()
    leaf = torch.randn(2, 8, requires_grad=True)
    x = leaf * 1  # saved, then changed in place before the backward
    y = _attached(plan, x, w)
    x.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def _packed(call):
    """The shape and dtype of each tensor `call` saves for the backward, in order."""
    packed = []

    def pack(t):
        packed.append((tuple(t.shape), t.dtype))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        call()
    return packed


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm"])
def test_the_node_saves_what_the_function_saves(built, op):
    # Checkpointing compares what a forward saved with what its recomputation saves: the
    # first may run through the Function, the second through the node, or the reverse
    device = "cuda" if runtime.on_gpu() else "cpu"  # where the Function's kernels run
    x = torch.randn(4, 8, device=device, requires_grad=True)
    w = torch.randn(8, device=device, requires_grad=True)
    stats = 1 if op == "rmsnorm" else 2
    plan = _cpu_plan(built, [], stats=stats)
    by_function = _packed(lambda: rmsnorm(x, w) if op == "rmsnorm" else layernorm(x, w, w))
    by_node = _packed(lambda: plan.attach(x.detach() * 1, x, w, w if stats == 2 else None,
                                          torch.ones(stats, 4, device=device)))
    assert by_node == by_function == [((4, 8), torch.float32), ((8,), torch.float32)] + \
        [((4,), torch.float32)] * stats


def test_plans_find_nothing_for_what_no_plan_was_kept_for(built):
    plans = built.Plans()
    x = torch.randn(4, 8, requires_grad=True)
    assert plans.forward(x, None, None, 1e-6) is None and not plans.has(x, None, None)
    assert plans.forward("not a tensor", None, None, 1e-6) is None  # the Function says why
    with pytest.raises(RuntimeError, match="kept for CUDA tensors"):
        plans.add(_cpu_plan(built, []))  # no key off the GPU
    assert len(plans) == 0
    kept = kept_backward.KeptPlans()  # before its first plan: no module needed
    assert kept.forward(x, None, None, 1e-6) is None and not kept.has(x, None, None)


def test_a_retained_graphs_second_backward_gives_every_gradient_again():
    # course bench's first step keeps its graph; the Function's backward keeps the plan's key
    device = "cuda" if runtime.on_gpu() else "cpu"
    x, w, b = (torch.randn(*shape, device=device, requires_grad=True)
               for shape in ((4, 8), (8,), (8,)))
    y = layernorm(x, w, b)
    first = torch.autograd.grad(y, (x, w, b), torch.ones_like(y), retain_graph=True)
    second = torch.autograd.grad(y, (x, w, b), torch.ones_like(y))
    assert all(torch.equal(f, g) for f, g in zip(first, second, strict=True))


def test_the_c_paths_step_aside_for_profilers_forward_ad_and_compiled_autograd(monkeypatch):
    from triton import knobs

    assert kept_backward.usable()
    with torch.autograd.forward_ad.dual_level():
        assert not kept_backward.usable()
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", print)
    assert not kept_backward.usable()
    monkeypatch.undo()
    import torch._dynamo.compiled_autograd as compiled

    monkeypatch.setattr(compiled, "compiled_autograd_enabled", True)
    assert not kept_backward.usable()


gpu = pytest.mark.gpu
CASES = {"rmsnorm": lambda x, w, b: rmsnorm(x, w),
         "rmsnorm, no weight": lambda x, w, b: rmsnorm(x),
         "layernorm": lambda x, w, b: layernorm(x, w, b),
         "layernorm, no bias": lambda x, w, b: layernorm(x, w),
         "layernorm, bias only": lambda x, w, b: layernorm(x, None, b)}


def _forget():
    for module in (rmsnorm_module, layernorm_module):
        module._KEPT_PLANS.clear()
        module._READY_FORWARDS.clear()
        module._READY_BACKWARDS.clear()


def _leaves(x0, w0, b0):
    return tuple(t.detach().clone().requires_grad_() for t in (x0, w0, b0))


@gpu
@pytest.mark.parametrize("M,N", [(1, 4096), (64, 4096), (64, 512), (4, 5120)])
def test_a_node_gives_the_functions_gradients_bit_for_bit(M, N):
    assert kept_backward.module(wait=True) is not None, "kept_backward.cpp did not build"
    _forget()
    dtype = torch.bfloat16
    x0 = torch.randn(M, N, device="cuda", dtype=dtype)
    w0, b0 = torch.randn(N, device="cuda", dtype=dtype), torch.randn(N, device="cuda", dtype=dtype)
    dy = torch.randn_like(x0)
    for name, call in CASES.items():
        grads, names = [], []
        for _ in range(3):  # the Function (which keeps a plan), then the C++ forward and node
            x, w, b = _leaves(x0, w0, b0)
            y = call(x, w, b)
            names.append(y.grad_fn.name())
            y.backward(dy)
            grads.append([y.detach()] + [t.grad for t in (x, w, b)])
        assert "kept_backward.cpp" not in names[0], (name, names)
        assert "kept_backward.cpp" in names[1], (name, names)
        for first, later in zip(grads[0], grads[2], strict=True):
            assert (first is None) == (later is None), name
            assert first is None or torch.equal(first, later), f"{name}: the node's differ"


def _rmsnorm_with_a_kept_plan():
    """(x, w) whose layouts have run forward and backward through RMSNormFunction, so that
    rmsnorm now keeps a plan for them."""
    kept_backward.module(wait=True)
    _forget()
    x0 = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w0 = torch.rand(4096, device="cuda", dtype=torch.bfloat16) + 0.5
    for _ in range(2):
        x, w, _b = _leaves(x0, w0, w0)
        rmsnorm(x, w).backward(torch.randn_like(x0))
    assert rmsnorm_module._KEPT_PLANS, "no plan was kept"
    return x0, w0


@gpu
def test_a_plan_serves_only_the_layouts_it_was_kept_for():
    x0, w0 = _rmsnorm_with_a_kept_plan()
    x, w, _b = _leaves(x0, w0, w0)
    assert "kept_backward.cpp" in rmsnorm(x, w).grad_fn.name()
    flat = torch.randn(x0.numel() + 8, device="cuda", dtype=x0.dtype)
    others = {"another dtype": (x.float(), w.float()), "no weight": (x, None),
              "fewer rows": (x[:32], w), "rows apart": (torch.cat([x, x], 1)[:, :4096], w),
              "not 16-byte aligned": (flat[1:1 + x0.numel()].view_as(x0).requires_grad_(), w)}
    for what, (xo, wo) in others.items():
        y = rmsnorm(xo, wo)
        assert y.grad_fn.name() == "RMSNormFunctionBackward", what


@gpu
def test_a_plan_is_kept_under_the_layouts_its_launches_were_made_for():
    # Under save_on_cpu the Function's backward gets x back dense, where its forward ran on
    # rows 3 * 1024 apart: no plan may pair that dense key with the strided forward launch
    kept_backward.module(wait=True)
    _forget()
    base = torch.randn(64, 3 * 1024, device="cuda", dtype=torch.bfloat16)
    w0 = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    b0 = torch.randn_like(w0)
    dy = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    for op, call in (("rmsnorm", lambda x, w, b: rmsnorm(x, w)),
                     ("layernorm", lambda x, w, b: layernorm(x, w, b))):
        for _ in range(2):
            x, w, b = _leaves(base, w0, b0)
            with torch.autograd.graph.save_on_cpu():
                call(x[:, :1024], w, b).backward(dy)
        x, w, b = _leaves(base[:, :1024].contiguous(), w0, b0)
        assert "kept_backward.cpp" not in call(x, w, b).grad_fn.name(), op


@gpu
def test_a_node_hands_other_gradients_to_the_python_backward():
    from course import reference
    from course.check.compare import compare

    x0, w0 = _rmsnorm_with_a_kept_plan()
    x, w, _b = _leaves(x0, w0, w0)
    y = rmsnorm(x, w)
    assert "kept_backward.cpp" in y.grad_fn.name()
    dy = torch.randn(4096, 64, device="cuda", dtype=torch.bfloat16).t()  # not contiguous
    y.backward(dy)
    want_dx, want_dw = reference.rmsnorm_backward(x0, w0, dy)
    assert compare("dx", x.grad, want_dx, torch.bfloat16) is None
    assert torch.allclose(w.grad.float(), want_dw.float(), rtol=2e-2, atol=1.0)


@gpu
def test_a_launch_hook_set_between_a_forward_and_its_backward_sees_the_backwards_launches(
        monkeypatch):
    # A profiler started after the forward: the node's C++ launches would not call its hook
    from course import reference
    from course.check.compare import compare

    from triton import knobs

    x0, w0 = _rmsnorm_with_a_kept_plan()
    x, w, _b = _leaves(x0, w0, w0)
    y = rmsnorm(x, w)
    assert "kept_backward.cpp" in y.grad_fn.name()
    launched = []
    chain = knobs.runtime.launch_enter_hook  # a chain of hooks from Triton 3.4, before a hook
    if hasattr(chain, "calls"):  # a new list: undo puts the chain's own back
        monkeypatch.setattr(chain, "calls", [*chain.calls, launched.append])
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", launched.append)
    dy = torch.randn_like(x0)
    y.backward(dy)
    assert launched, "the backward launched without calling the profiler's hook"
    monkeypatch.undo()
    want_dx, want_dw = reference.rmsnorm_backward(x0, w0, dy)
    assert compare("dx", x.grad, want_dx, torch.bfloat16) is None
    assert torch.allclose(w.grad.float(), want_dw.float(), rtol=2e-2, atol=1.0)
    x, w, _b = _leaves(x0, w0, w0)
    y = rmsnorm(x, w)  # with the hook gone, the node again
    assert "kept_backward.cpp" in y.grad_fn.name()


@gpu
def test_a_node_launches_on_the_current_stream_inside_a_cuda_graph():
    # Captured on a side stream: a launch on any other stream fails the capture
    from course import reference
    from course.check.compare import compare

    x0, w0 = _rmsnorm_with_a_kept_plan()
    dy = torch.randn_like(x0)
    x, w, _b = _leaves(x0, w0, w0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = rmsnorm(x, w)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
    assert "kept_backward.cpp" in y.grad_fn.name()
    with torch.no_grad():
        x.copy_(torch.randn_like(x0))
    graph.replay()
    torch.cuda.synchronize()
    want_dx, want_dw = reference.rmsnorm_backward(x.detach(), w0, dy)
    assert compare("dx", dx, want_dx, torch.bfloat16) is None
    assert torch.allclose(dw.float(), want_dw.float(), rtol=2e-2, atol=1.0)


@gpu
def test_saved_tensors_given_back_laid_out_otherwise_go_to_the_python_backward():
    # A saved-tensor hook (offloading, save_on_cpu) may give x back as a dense copy: the
    # kept launch read x's rows at the stride it was made for, so such a copy must not reach it
    from course import reference
    from course.check.compare import compare

    kept_backward.module(wait=True)
    _forget()
    base = torch.randn(64, 3 * 1024, device="cuda", dtype=torch.bfloat16)
    w0 = torch.rand(1024, device="cuda", dtype=torch.bfloat16) + 0.5
    dy = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)

    def leaves():
        x = base.detach().clone().requires_grad_()
        return x, x[:, :1024], w0.detach().clone().requires_grad_()  # rows 3 * 1024 apart
    for _ in range(2):
        _, x, w = leaves()
        rmsnorm(x, w).backward(dy)
    assert rmsnorm_module._KEPT_PLANS, "no plan was kept"
    leaf, x, w = leaves()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        y = rmsnorm(x, w)
    assert "kept_backward.cpp" in y.grad_fn.name()
    y.backward(dy)
    want_dx, _ = reference.rmsnorm_backward(x.detach(), w0, dy)
    assert compare("dx", leaf.grad[:, :1024], want_dx, torch.bfloat16) is None
