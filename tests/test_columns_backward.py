"""The columns path of the backward (a few rows, as in decode): one launch whose programs
own columns of every row, each summing the whole rows itself, and writing dW (and dB) in
the parameters' dtype, with no column sums. Against a float64 autograd reference, in the
interpreter."""

import importlib

import course  # noqa: F401  (mode first)
from course import reference, runtime
from course.check.compare import compare
from course.shootout import column_sum_error

import pytest
import torch
import torch.nn.functional as F
from triton import next_power_of_2

from solutions import kernels
from solutions.kernels import column_sums, launch
from solutions.kernels.derived_rules import COLUMNS, FEW_ROWS, FEW_ROWS_VALUES
from solutions.kernels.kept_backward import KeptPlans
from solutions.kernels.launch_plans import BackwardPlan

DEV = runtime.DEVICE
SHAPES = [(m, n) for m in (2, 5, FEW_ROWS) for n in (64, 1000, 4096)]
# the modules (the package's own names are their public functions)
rmsnorm = importlib.import_module("solutions.kernels.rmsnorm")
layernorm = importlib.import_module("solutions.kernels.layernorm")
GPUS = [launch.INTERPRETER, launch.H100, launch.KNOWN_GPUS["H200"], launch.KNOWN_GPUS["L4"]]


def _x(shape, dtype, seed=0, mean=0.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) + mean).to(dtype).to(DEV)


def _param(n, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=gen) + 0.5).to(dtype).to(DEV)


def _leaf(t):
    return t.detach().clone().requires_grad_(True) if t is not None else None


def _grads(fn, x, params, dy, dtype=None):
    """Gradients of fn(x, *params) for dy (None for a missing parameter), computed in
    `dtype` (float64 for the reference) on leaves of their own."""
    cast = (lambda t: t.to(dtype)) if dtype else (lambda t: t)
    leaves = [_leaf(cast(t)) if t is not None else None for t in (x, *params)]
    y = fn(*leaves)
    wanted = [t for t in leaves if t is not None]
    got = iter(torch.autograd.grad(y, wanted, cast(dy)))
    return [next(got) if t is not None else None for t in leaves]


def _rms64(x, w):
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
    return y * w if w is not None else y


def _ln64(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b, 1e-5)


class _Launches:
    """A kernel whose launches (their grids) are counted, launching it as it is."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]

    def __getattr__(self, name):  # arg_names, fn: what ready_launch reads of a kernel
        return getattr(self.kernel, name)


class _NoLaunch:
    def __getitem__(self, grid):
        raise AssertionError("column_sums_kernel launched for the columns path")


@pytest.fixture
def columns_launches(monkeypatch):
    """The columns kernels, counted, and column sums that must not run; nothing kept from
    before (on a GPU a kept launch or plan would skip the Python launch)."""
    monkeypatch.setattr(column_sums, "column_sums_kernel", _NoLaunch())
    spies = {}
    for module, name in ((rmsnorm, "rmsnorm_bwd_columns_kernel"),
                         (layernorm, "layernorm_bwd_columns_kernel")):
        spies[module.__name__.rsplit(".", 1)[1]] = spy = _Launches(getattr(module, name))
        monkeypatch.setattr(module, name, spy)
        monkeypatch.setattr(module, "_READY_BACKWARDS", {})
        monkeypatch.setattr(module, "_KEPT_PLANS", KeptPlans())
    return spies


def _assert_grads(names, got, want, dtype):
    for name, g, w in zip(names, got, want, strict=True):
        assert (g is None) == (w is None), name
        if g is None:
            continue
        if name == "dx":
            mismatch = compare(name, g, w, dtype)
            assert mismatch is None, mismatch.describe()
        else:  # a sum over the rows
            assert g.dtype == dtype and g.shape == w.shape, (name, g.dtype, g.shape)
            problem = column_sum_error(name, g, w, dtype)
            assert problem is None, problem


@pytest.mark.parametrize("gpu", GPUS, ids=lambda gpu: gpu.name.split(",")[0])
@pytest.mark.parametrize("layernorm_op", [False, True], ids=["rmsnorm", "layernorm"])
def test_a_few_rows_take_the_columns_path_and_others_do_not(gpu, layernorm_op):
    def plan(m, n, dtype=torch.bfloat16):
        return launch.backward_plan(m, n, torch.device(DEV), dtype=dtype,
                                    layernorm=layernorm_op, gpu=gpu)
    for dtype in (torch.float32, torch.bfloat16):
        most = [(FEW_ROWS, FEW_ROWS_VALUES // FEW_ROWS), (2, FEW_ROWS_VALUES // 2)]
        for m, n in SHAPES + most + [(2, 1), (3, 5120)]:
            got = plan(m, n, dtype)
            assert got.path == "columns", (m, n, dtype, got)
            assert got.programs == 1 and got.rows_per_program(m) == m
            assert 1 <= got.columns <= COLUMNS and got.block_n <= next_power_of_2(n)
    # one row keeps its one rows program; more rows, or longer ones, keep their paths
    for m, n in ((1, 1000), (FEW_ROWS + 1, 1000), (FEW_ROWS + 1, 64),
                 (4, FEW_ROWS_VALUES // 4 + 1)):
        assert plan(m, n).path != "columns", (m, n, plan(m, n))


def test_a_columns_plan_owns_columns_in_one_row_of_sums():
    plan = BackwardPlan(path="columns", block_m=4, block_n=1024, num_warps=4, programs=1,
                        columns=256)
    assert plan.column_grid(3, 1000) == plan.column_grid(4, 1024) == (4,)
    assert plan.column_grid(1, 1025) == (5,)
    with pytest.raises(ValueError, match="holds every row at once"):
        plan.column_grid(5, 1000)  # more rows than its tile holds
    with pytest.raises(ValueError, match="the columns path, and no other"):
        BackwardPlan(path="columns", block_n=1024, num_warps=4, programs=1)
    with pytest.raises(ValueError, match="the columns path, and no other"):
        BackwardPlan(path="columns", block_n=1024, num_warps=4, programs=3, columns=256)
    with pytest.raises(ValueError, match="the columns path, and no other"):
        BackwardPlan(path="rows", block_n=1024, num_warps=4, programs=3, columns=256)


@pytest.mark.parametrize("with_weight", [True, False], ids=["weight", "no-weight"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_rmsnorm_backward_of_a_few_rows(columns_launches, shape, with_weight):
    dtype = torch.float32
    x, dy = _x(shape, dtype, mean=1.0), _x(shape, dtype, seed=7)
    w = _param(shape[1], dtype, seed=1) if with_weight else None
    got = _grads(kernels.rmsnorm, x, [w], dy)
    _assert_grads(("dx", "dw"), got, _grads(_rms64, x, [w], dy, torch.float64), dtype)
    assert columns_launches["rmsnorm"].grids == [(-(-shape[1] // min(COLUMNS, shape[1])),)]
    again = _grads(kernels.rmsnorm, x, [w], dy)
    assert all(a is b or torch.equal(a, b) for a, b in zip(got, again, strict=True))


@pytest.mark.parametrize("params", ["weight+bias", "weight", "bias", "neither"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_layernorm_backward_of_a_few_rows(columns_launches, shape, params):
    dtype = torch.float32
    x, dy = _x(shape, dtype, mean=2.0), _x(shape, dtype, seed=7)
    w = _param(shape[1], dtype, seed=1) if "weight" in params else None
    b = _x(shape[1], dtype, seed=3) if "bias" in params else None
    got = _grads(kernels.layernorm, x, [w, b], dy)
    _assert_grads(("dx", "dw", "db"), got, _grads(_ln64, x, [w, b], dy, torch.float64), dtype)
    assert len(columns_launches["layernorm"].grids) == 1
    again = _grads(kernels.layernorm, x, [w, b], dy)
    assert all(a is b or torch.equal(a, b) for a, b in zip(got, again, strict=True))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_16_bit_rows_write_the_parameter_sums_in_their_dtype(columns_launches, dtype):
    # Rows of x 1030 apart and of dy 1040 apart, of 1000 columns: the row strides reach the
    # kernels, and the last program's columns are part empty.
    shape = (5, 1000)
    wide = _x((shape[0], 1030), dtype, mean=1.0)
    x, dy = wide[:, :1000], _x((shape[0], 1040), dtype, seed=7)[:, :1000]
    w = _param(1000, dtype, seed=1)
    rstd = reference.rmsnorm_rstd(x).float()
    dx, dw = rmsnorm.rmsnorm_backward(x, w, rstd, dy)
    _assert_grads(("dx", "dw"), (dx, dw), reference.rmsnorm_backward(x, w, dy), dtype)
    mean, ln_rstd = (s.float() for s in reference.layernorm_stats(x))
    got = layernorm.layernorm_backward(x, w, mean, ln_rstd, dy)
    _assert_grads(("dx", "dw", "db"), got, reference.layernorm_backward(x, w, w, dy), dtype)
    assert len(columns_launches["rmsnorm"].grids) == len(columns_launches["layernorm"].grids)
    assert columns_launches["rmsnorm"].grids == [(-(-1000 // COLUMNS),)]


def test_rows_summed_in_several_blocks_and_programs_of_few_columns(columns_launches):
    # A plan by hand: each row's sums over eight blocks of 128 (the last part empty), and
    # 16 programs of 64 columns, so every program's sums must agree with the others'.
    plan = BackwardPlan(path="columns", block_m=4, block_n=128, num_warps=2, programs=1,
                        columns=64)
    dtype = torch.float32
    x, dy, w = _x((3, 1000), dtype, mean=1.0), _x((3, 1000), dtype, seed=7), _param(
        1000, dtype, seed=1)
    rstd = reference.rmsnorm_rstd(x).float()
    got = rmsnorm.rmsnorm_backward(x, w, rstd, dy, plan)
    _assert_grads(("dx", "dw"), got, reference.rmsnorm_backward(x, w, dy), dtype)
    mean, ln_rstd = (s.float() for s in reference.layernorm_stats(x))
    got = layernorm.layernorm_backward(x, w, mean, ln_rstd, dy, plan=plan)
    _assert_grads(("dx", "dw", "db"), got, reference.layernorm_backward(x, w, w, dy), dtype)
    assert columns_launches["rmsnorm"].grids == columns_launches["layernorm"].grids == [(16,)]


@pytest.mark.gpu
@pytest.mark.parametrize("N", [4096, 5120])
def test_gpu_a_few_rows_backward_is_one_launch_kept_and_replayed_by_the_node(
        columns_launches, N):
    # As a one-row backward: the kept launch's partial rows are the sums, (sets, N) in the
    # parameters' dtype, so the C++ node replays it with no column sums, bit for bit.
    from solutions.kernels import kept_backward
    assert kept_backward.module(wait=True) is not None, "kept_backward.cpp did not build"
    dtype = torch.bfloat16
    x0, dy = _x((5, N), dtype, mean=1.0), _x((5, N), dtype, seed=7)  # 8 rows, 3 masked
    w0, b0 = _param(N, dtype, seed=1), _x(N, dtype, seed=3)
    for fn, params in ((kernels.rmsnorm, [w0]), (kernels.layernorm, [w0, b0])):
        grads, names = [], []
        for _ in range(3):  # the Function (which keeps a plan), then the C++ forward and node
            leaves = [_leaf(t) for t in (x0, *params)]
            y = fn(*leaves)
            names.append(y.grad_fn.name())
            y.backward(dy)
            grads.append([t.grad for t in leaves])
        assert "kept_backward.cpp" not in names[0] and "kept_backward.cpp" in names[2], names
        assert all(torch.equal(a, b) for a, b in zip(grads[0], grads[2], strict=True))
    for module in (rmsnorm, layernorm):
        (ready, shape, partials_dtype, _), = module._READY_BACKWARDS.values()
        assert tuple(shape) in ((1, N), (2, N)) and partials_dtype == dtype
    assert len(columns_launches["rmsnorm"].grids) == len(columns_launches["layernorm"].grids) == 1
