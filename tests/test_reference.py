"""course.reference: the float64 ground truth every checker compares against."""

from __future__ import annotations

import math

from course import reference

import pytest
import torch
import torch.nn.functional as F

F64 = torch.float64


def _rand(*shape: int, seed: int = 0, dtype: torch.dtype = F64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=F64).to(dtype)


# ------------------------------------------------------------------ worked by hand

def test_rmsnorm_of_1234_divides_by_sqrt_7_5():
    # mean(x**2) = (1 + 4 + 9 + 16) / 4 = 7.5
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    y = reference.rmsnorm(x, torch.ones(4), eps=0.0)
    expected = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64) / math.sqrt(7.5)
    assert y.dtype == F64
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-15)
    rstd = reference.rmsnorm_rstd(x, eps=0.0)
    assert rstd.shape == ()
    assert rstd.item() == pytest.approx(1 / math.sqrt(7.5), rel=1e-15)


def test_rmsnorm_eps_and_weight_enter_as_defined():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    w = torch.tensor([1.0, -1.0, 0.5, 2.0])
    y = reference.rmsnorm(x, w, eps=0.5)
    expected = torch.tensor([1.0, -2.0, 1.5, 8.0], dtype=F64) / math.sqrt(8.0)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-15)


def test_layernorm_of_1234_by_hand():
    # mean 2.5, deviations -1.5 -0.5 0.5 1.5, biased variance (2.25 + 0.25) * 2 / 4 = 1.25
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    mean, rstd = reference.layernorm_stats(x, eps=0.0)
    assert mean.item() == 2.5
    assert rstd.item() == pytest.approx(1 / math.sqrt(1.25), rel=1e-15)
    y = reference.layernorm(x, torch.full((4,), 2.0), torch.full((4,), 1.0), eps=0.0)
    expected = 2 * torch.tensor([-1.5, -0.5, 0.5, 1.5], dtype=F64) / math.sqrt(1.25) + 1
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-15)


def test_add_rmsnorm_normalises_the_sum_and_returns_it():
    x = torch.tensor([[1.0, 1.0, 3.0, 3.0]])
    r = torch.tensor([[0.0, 1.0, 0.0, 1.0]])
    y, new_r = reference.add_rmsnorm(x, r, torch.ones(4), eps=0.0)
    torch.testing.assert_close(new_r, torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=F64))
    torch.testing.assert_close(y, new_r / math.sqrt(7.5), rtol=0, atol=1e-15)


def test_add_rmsnorm_rounds_the_sum_to_the_input_dtype_before_normalising():
    x = _rand(8, 64, seed=1, dtype=torch.bfloat16)
    r = _rand(8, 64, seed=2, dtype=torch.bfloat16)
    w = _rand(64, seed=3)
    y, new_r = reference.add_rmsnorm(x, r, w)
    stored = (x.double() + r.double()).to(torch.bfloat16)
    assert new_r.dtype == F64
    assert torch.equal(new_r, stored.double())
    assert torch.equal(new_r.to(torch.bfloat16), x + r)  # what torch's bf16 add stores
    torch.testing.assert_close(y, reference.rmsnorm(stored, w), rtol=0, atol=0)


# ------------------------------------------------------------------ against torch

@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 128), (2, 3, 33)])
def test_rmsnorm_matches_torch_rms_norm_in_float64(shape):
    x, w = _rand(*shape, seed=4), _rand(shape[-1], seed=5)
    expected = F.rms_norm(x, (shape[-1],), w, eps=1e-6)
    torch.testing.assert_close(reference.rmsnorm(x, w, eps=1e-6), expected,
                               rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("shape", [(1, 2), (3, 7), (5, 128), (2, 3, 33)])
def test_layernorm_matches_torch_layer_norm_in_float64(shape):
    x, w, b = _rand(*shape, seed=6), _rand(shape[-1], seed=7), _rand(shape[-1], seed=8)
    expected = F.layer_norm(x, (shape[-1],), w, b, eps=1e-5)
    torch.testing.assert_close(reference.layernorm(x, w, b, eps=1e-5), expected,
                               rtol=1e-12, atol=1e-12)


def test_low_precision_inputs_are_upcast_and_results_are_float64():
    x = _rand(4, 32, seed=9, dtype=torch.float16)
    w = _rand(32, seed=10, dtype=torch.float16)
    y = reference.rmsnorm(x, w)
    assert y.dtype == F64 and y.device == x.device
    torch.testing.assert_close(y, reference.rmsnorm(x.double(), w.double()), rtol=0, atol=0)
    b = torch.zeros(32, dtype=torch.bfloat16)
    assert reference.layernorm(x.to(torch.bfloat16), w, b).dtype == F64


def test_large_mean_layernorm_is_right_in_float64():
    # mean 1e4, std 1: float32 E[x^2] - E[x]^2 loses every digit; float64 two-pass does not.
    x = _rand(4, 1024, seed=11) + 1e4
    w, b = torch.ones(1024, dtype=F64), torch.zeros(1024, dtype=F64)
    y = reference.layernorm(x, w, b, eps=1e-5)
    centred = x - x.mean(dim=-1, keepdim=True)
    expected = centred / torch.sqrt(centred.square().mean(dim=-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y.mean(dim=-1), torch.zeros(4, dtype=F64), rtol=0, atol=1e-10)
    assert torch.all((y.var(dim=-1, unbiased=False) - 1).abs() < 1e-4)


def test_nd_input_normalises_each_row_of_the_last_dimension():
    x, w = _rand(2, 3, 4, 9, seed=12), _rand(9, seed=13)
    y = reference.rmsnorm(x, w)
    assert y.shape == x.shape
    flat = reference.rmsnorm(x.reshape(-1, 9), w).reshape(x.shape)
    torch.testing.assert_close(y, flat, rtol=0, atol=0)
    assert reference.rmsnorm_rstd(x).shape == (2, 3, 4)
    mean, rstd = reference.layernorm_stats(x)
    assert mean.shape == rstd.shape == (2, 3, 4)


def test_non_contiguous_input_gives_the_same_answer():
    x = _rand(16, 64, seed=14)[:, ::2]
    w = _rand(32, seed=15)
    assert not x.is_contiguous()
    torch.testing.assert_close(reference.rmsnorm(x, w), reference.rmsnorm(x.contiguous(), w))


# ------------------------------------------------------------------ backward

@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (4, 64), (2, 3, 17)])
def test_rmsnorm_backward_closed_form_equals_autograd(shape):
    x, w, dy = _rand(*shape, seed=16), _rand(shape[-1], seed=17), _rand(*shape, seed=18)
    dx, dw = reference.rmsnorm_backward(x, w, dy, eps=1e-6)
    ax, aw, _ = reference.autograd_backward(reference.rmsnorm, x, w, 1e-6, dy=dy)
    torch.testing.assert_close(dx, ax, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dw, aw, rtol=1e-10, atol=1e-12)
    assert dw.shape == w.shape


@pytest.mark.parametrize("shape", [(1, 2), (3, 7), (4, 64), (2, 3, 17)])
def test_layernorm_backward_closed_form_equals_autograd(shape):
    n = shape[-1]
    x, dy = _rand(*shape, seed=19), _rand(*shape, seed=20)
    w, b = _rand(n, seed=21), _rand(n, seed=22)
    dx, dw, db = reference.layernorm_backward(x, w, b, dy, eps=1e-5)
    ax, aw, ab, _ = reference.autograd_backward(reference.layernorm, x, w, b, 1e-5, dy=dy)
    torch.testing.assert_close(dx, ax, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dw, aw, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(db, ab, rtol=1e-10, atol=1e-12)


def test_closed_forms_also_equal_autograd_through_torch_functional():
    x, w, b, dy = _rand(5, 24, seed=23), _rand(24, seed=24), _rand(24, seed=25), _rand(5, 24)
    ax, aw = reference.autograd_backward(
        lambda x, w: F.rms_norm(x, (24,), w, eps=1e-6), x, w, dy=dy)
    dx, dw = reference.rmsnorm_backward(x, w, dy)
    torch.testing.assert_close(dx, ax, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dw, aw, rtol=1e-10, atol=1e-12)
    ax, aw, ab = reference.autograd_backward(
        lambda x, w, b: F.layer_norm(x, (24,), w, b, eps=1e-5), x, w, b, dy=dy)
    dx, dw, db = reference.layernorm_backward(x, w, b, dy)
    for got, want in ((dx, ax), (dw, aw), (db, ab)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_backward_accepts_low_precision_inputs():
    x = _rand(3, 16, seed=26, dtype=torch.bfloat16)
    w = _rand(16, seed=27, dtype=torch.bfloat16)
    dy = _rand(3, 16, seed=28, dtype=torch.bfloat16)
    dx, dw = reference.rmsnorm_backward(x, w, dy)
    assert dx.dtype == dw.dtype == F64
    ex, ew = reference.rmsnorm_backward(x.double(), w.double(), dy.double())
    torch.testing.assert_close((dx, dw), (ex, ew), rtol=0, atol=0)


def test_autograd_backward_handles_add_rmsnorm_two_outputs():
    x, r, w = _rand(3, 8, seed=29), _rand(3, 8, seed=30), _rand(8, seed=31)
    dy, dres = _rand(3, 8, seed=32), torch.zeros(3, 8, dtype=F64)
    gx, gr, gw, _ = reference.autograd_backward(reference.add_rmsnorm, x, r, w, 1e-6,
                                                dy=(dy, dres))
    dx, dw = reference.rmsnorm_backward(x + r, w, dy)
    torch.testing.assert_close(gx, dx)
    torch.testing.assert_close(gr, dx)   # the sum's gradient flows to both addends
    torch.testing.assert_close(gw, dw)


def test_gradcheck_passes_on_the_forward_functions():
    x = _rand(3, 6, seed=33).requires_grad_()
    w = _rand(6, seed=34).requires_grad_()
    b = _rand(6, seed=35).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: reference.rmsnorm(x, w), (x, w))
    assert torch.autograd.gradcheck(lambda x, w, b: reference.layernorm(x, w, b), (x, w, b))


# ------------------------------------------------------------------ validation

def test_mismatched_weight_names_both_shapes():
    with pytest.raises(ValueError, match=r"x\.shape=\(4, 8\).*weight\.shape=\(7,\)"):
        reference.rmsnorm(torch.ones(4, 8), torch.ones(7))


def test_mismatched_bias_names_both_shapes():
    with pytest.raises(ValueError, match=r"x\.shape=\(2, 5\).*bias\.shape=\(4,\)"):
        reference.layernorm(torch.ones(2, 5), torch.ones(5), torch.ones(4))


def test_two_dimensional_weight_is_refused():
    with pytest.raises(ValueError, match=r"weight must be 1-D.*\(1, 8\)"):
        reference.rmsnorm(torch.ones(4, 8), torch.ones(1, 8))


def test_mismatched_residual_and_dy_are_refused():
    with pytest.raises(ValueError, match="residual must have the shape of x"):
        reference.add_rmsnorm(torch.ones(4, 8), torch.ones(4, 7), torch.ones(8))
    with pytest.raises(ValueError, match="dy must have the shape of x"):
        reference.rmsnorm_backward(torch.ones(4, 8), torch.ones(8), torch.ones(8))


def test_scalar_and_integer_inputs_are_refused():
    with pytest.raises(ValueError, match="at least one dimension"):
        reference.rmsnorm_rstd(torch.tensor(1.0))
    with pytest.raises(TypeError, match="floating-point"):
        reference.rmsnorm(torch.ones(2, 4, dtype=torch.int32), torch.ones(4))
