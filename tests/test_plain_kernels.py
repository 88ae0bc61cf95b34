"""The plain reference kernels (solutions/kernels/plain_rmsnorm.py, plain_layernorm.py): forward
and backward against the float64 reference, through their autograd Functions, with the
tolerances the checkers use; their input checks; and their fingerprints, so that a pasted
copy is refused like any other reference kernel's."""

from __future__ import annotations

import inspect

import course  # noqa: F401  (the execution mode is chosen before any kernel is defined)
from course import kernel_records, reference, runtime
from course.check.backward import dw_sum_atol
from course.check.compare import compare
from course.check.layernorm import mean_error_atol

import pytest
import torch

from solutions.kernels import plain_layernorm, plain_rmsnorm

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (name, shape of x, how x is laid out): odd N, N = 1, one row, 3-D, rows padded in memory
SHAPES = [("odd N", (7, 37), "contiguous"), ("N = 1", (4, 1), "contiguous"),
          ("one row", (1, 64), "contiguous"), ("3-D", (2, 3, 40), "contiguous"),
          ("strided rows", (5, 24), "strided")]


def _inputs(shape: tuple[int, ...], layout: str, dtype: torch.dtype, seed: int, offset: float = 0.0
            ) -> tuple[torch.Tensor, ...]:
    """x (its rows `layout`: contiguous, or slices of rows 16 columns longer), a weight near 1,
    a bias and dy, on the course's device."""
    gen = torch.Generator().manual_seed(seed)
    n = shape[-1]
    wide = torch.randn(*shape[:-1], n + (16 if layout == "strided" else 0), generator=gen)
    x = (offset + wide).to(dtype).to(runtime.DEVICE)[..., :n]
    w = (0.5 + torch.rand(n, generator=gen)).to(dtype).to(runtime.DEVICE)
    b = torch.randn(n, generator=gen).to(dtype).to(runtime.DEVICE)
    dy = torch.randn(shape, generator=gen).to(dtype).to(runtime.DEVICE)
    return x, w, b, dy


def _assert_matches(name: str, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype,
                    extra_atol: torch.Tensor | None = None) -> None:
    assert got.dtype == dtype and got.shape == want.shape, (name, got.dtype, got.shape)
    mismatch = compare(name, got, want, dtype, extra_atol=extra_atol)
    assert mismatch is None, mismatch.describe()


def _grads(fn, x: torch.Tensor, params: tuple[torch.Tensor, ...], dy: torch.Tensor):
    """y and the gradients of (y * dy).sum() for x and params, through autograd."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, *params)]
    y = fn(*leaves)
    y.backward(dy)
    return y.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("name", "shape", "layout"), SHAPES, ids=[s[0] for s in SHAPES])
def test_plain_rmsnorm_forward_and_backward_match_float64(name, shape, layout, dtype):
    x, w, _, dy = _inputs(shape, layout, dtype, seed=len(name))
    x_before = x.clone()
    y, (dx, dw) = _grads(plain_rmsnorm.rmsnorm, x, (w,), dy)
    assert torch.equal(x, x_before)
    _assert_matches("y", y, reference.rmsnorm(x, w), dtype)
    dx_want, dw_want = reference.rmsnorm_backward(x, w, dy)
    _assert_matches("dx", dx, dx_want, dtype)
    terms = (dy.double() * x.double() * reference.rmsnorm_rstd(x).unsqueeze(-1))
    _assert_matches("dw", dw, dw_want, dtype,
                    extra_atol=dw_sum_atol(terms.reshape(-1, shape[-1])))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("name", "shape", "layout"), SHAPES, ids=[s[0] for s in SHAPES])
def test_plain_layernorm_forward_and_backward_match_float64(name, shape, layout, dtype):
    x, w, b, dy = _inputs(shape, layout, dtype, seed=len(name), offset=2.0)
    y, (dx, dw, db) = _grads(plain_layernorm.layernorm, x, (w, b), dy)
    _assert_matches("y", y, reference.layernorm(x, w, b), dtype)
    dx_want, dw_want, db_want = reference.layernorm_backward(x, w, b, dy)
    mean, rstd = reference.layernorm_stats(x)
    x_hat = (x.double() - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    rows = (-1, shape[-1])
    _assert_matches("dx", dx, dx_want, dtype)
    _assert_matches("dw", dw, dw_want, dtype,
                    extra_atol=dw_sum_atol((dy.double() * x_hat).reshape(rows)))
    _assert_matches("db", db, db_want, dtype, extra_atol=dw_sum_atol(dy.double().reshape(rows)))


def test_plain_layernorm_centres_rows_whose_mean_dwarfs_their_spread():
    """Mean 1e4, spread 1: E[x^2] - E[x]^2 would keep no digit of the variance in float32."""
    x, w, b, _ = _inputs((6, 100), "contiguous", torch.float32, seed=3, offset=1e4)
    y, mean, rstd = plain_layernorm.layernorm_forward(x, w, b)
    want_mean, want_rstd = reference.layernorm_stats(x)
    torch.testing.assert_close(rstd.double(), want_rstd, rtol=1e-4, atol=0)
    torch.testing.assert_close(mean.double(), want_mean, rtol=1e-6, atol=0)
    _assert_matches("y", y, reference.layernorm(x, w, b), torch.float32,
                    extra_atol=mean_error_atol(x, w, 1e-5))


def test_the_statistics_the_forwards_save_are_float32_one_a_row():
    x, w, b, _ = _inputs((2, 3, 40), "contiguous", torch.bfloat16, seed=5)
    _, rstd = plain_rmsnorm.rmsnorm_forward(x, w)
    _, mean, ln_rstd = plain_layernorm.layernorm_forward(x, w, b)
    for stat in (rstd, mean, ln_rstd):
        assert stat.dtype == torch.float32 and stat.shape == (2, 3)
    torch.testing.assert_close(rstd.double(), reference.rmsnorm_rstd(x), rtol=1e-5, atol=0)


def test_bad_input_is_refused_with_a_message_that_names_it():
    x, w, b, dy = _inputs((3, 8), "contiguous", torch.float32, seed=6)
    with pytest.raises(TypeError, match="weight is None"):
        plain_rmsnorm.rmsnorm(x, None)
    with pytest.raises(TypeError, match="weight and bias"):
        plain_layernorm.layernorm(x, w, None)
    with pytest.raises(ValueError, match="weight must be 1-D with one entry per column"):
        plain_rmsnorm.rmsnorm(x, w[:5])
    with pytest.raises(TypeError, match="int64"):
        plain_layernorm.layernorm(x.long(), w, b)
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        plain_rmsnorm.rmsnorm(x.t(), torch.ones(3, device=x.device))
    with pytest.raises(ValueError, match="eps must be a non-negative number"):
        plain_rmsnorm.rmsnorm(x, w, eps=-1.0)
    with pytest.raises(ValueError, match="rstd must be float32 with one value per row"):
        plain_rmsnorm.rmsnorm_backward(x, w, torch.ones(2, device=x.device), dy)
    with pytest.raises(ValueError, match="dy must have x's shape"):
        plain_layernorm.layernorm_backward(x, w, *torch.ones(2, 3, device=x.device), dy[:2])
    too_long = plain_rmsnorm.MAX_N + 1
    with pytest.raises(ValueError, match=f"rows of {too_long} columns do not fit"):
        plain_rmsnorm.rmsnorm(torch.ones(1, too_long, device=x.device),
                              torch.ones(too_long, device=x.device))


PLAIN_KERNELS = [plain_rmsnorm.plain_rmsnorm_fwd_kernel, plain_rmsnorm.plain_rmsnorm_bwd_kernel,
                 plain_layernorm.plain_layernorm_fwd_kernel,
                 plain_layernorm.plain_layernorm_bwd_kernel]


@pytest.mark.parametrize("kernel", PLAIN_KERNELS, ids=lambda k: k.fn.__name__)
def test_a_pasted_renamed_copy_of_a_plain_kernel_is_known_by_its_fingerprint(kernel):
    """The learner's package ships the fingerprints (scripts/reference_records.py writes them
    from every file in solutions/kernels/), and the checkers refuse a launch of a kernel that
    has one: tests/test_reference_records.py shows the refusal itself."""
    name = kernel.fn.__name__
    source = inspect.getsource(kernel.fn)
    pasted = source.replace(f"def {name}(", "def my_own_norm_kernel(").replace("# ", "# mine: ")
    assert pasted != source
    shipped = kernel_records.shipped_fingerprints()
    assert shipped.get(kernel_records.fingerprint(pasted)) == f"{kernel.fn.__module__}.{name}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(4096, 4096), (1000, 5000), (64, 32768)], ids=str)
def test_plain_kernels_on_a_gpu_at_model_sizes(shape, dtype):
    """Row lengths from a common model width to the longest row the plain kernels hold;
    on the GPU the rows of 1024 columns and more are also checked for a common scale error
    (compare's row-scale test), which low-precision statistics would show."""
    if dtype == torch.bfloat16 and not runtime.supports_bf16():
        pytest.skip("this GPU has no bfloat16")
    x, w, b, dy = _inputs(shape, "contiguous", dtype, seed=shape[1])
    y, (dx, dw) = _grads(plain_rmsnorm.rmsnorm, x, (w,), dy)
    _assert_matches("y", y, reference.rmsnorm(x, w), dtype)
    dx_want, dw_want = reference.rmsnorm_backward(x, w, dy)
    _assert_matches("dx", dx, dx_want, dtype)
    terms = dy.double() * x.double() * reference.rmsnorm_rstd(x).unsqueeze(-1)
    _assert_matches("dw", dw, dw_want, dtype, extra_atol=dw_sum_atol(terms))
    y, (dx, dw, db) = _grads(plain_layernorm.layernorm, x, (w, b), dy)
    _assert_matches("y", y, reference.layernorm(x, w, b), dtype)
    dx_want, dw_want, db_want = reference.layernorm_backward(x, w, b, dy)
    mean, rstd = reference.layernorm_stats(x)
    x_hat = (x.double() - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    _assert_matches("dx", dx, dx_want, dtype)
    _assert_matches("dw", dw, dw_want, dtype, extra_atol=dw_sum_atol(dy.double() * x_hat))
    _assert_matches("db", db, db_want, dtype, extra_atol=dw_sum_atol(dy.double()))
