"""Chapters 06 to 08: the LayerNorm checker names a variance that counts the padding lanes,
the traffic calculator opens with the options a chapter gives it, and chapter 08's model
solution launches short rows one program per tile."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported anywhere: no display in a test run

import course  # noqa: E402,F401  (sets the execution mode before any kernel is defined)
from course import check, reference, traffic  # noqa: E402
from course.check.cases import Case  # noqa: E402
from course.check.layernorm import LAYERNORM_FORWARD, SUSPECTS  # noqa: E402
from course.widgets import VARIANTS, traffic_calculator  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PADDING_ADVICE = "d = tl.where(mask, x - mean, 0.0)"


# ---------------------------------------------------------------- chapter 06: the checker


@triton.jit
def _layernorm_unmasked_centre_kernel(x_ptr, w_ptr, b_ptr, y_ptr, stride_x_row, stride_y_row,
                                      n_cols, eps, BLOCK_N: tl.constexpr):
    # The learner's bug: loads and stores masked, but d = x - mean left unmasked, so the
    # padding lanes (loaded as 0) hold -mean and add mean^2 each to the sum of squares.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = x - mean
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols, (d * rstd * w + b).to(y_ptr.dtype.element_ty),
             mask=mask)


def layernorm_unmasked_centre(x, weight, bias, eps=1e-5):
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    n = x2.shape[1]
    _layernorm_unmasked_centre_kernel[(x2.shape[0],)](
        x2, weight, bias, y, x2.stride(0), y.stride(0), n, eps,
        BLOCK_N=triton.next_power_of_2(n))
    return y.view(x.shape)


def _padding_suspect():
    return next(s for s in SUSPECTS if s.name == "padding_in_variance")


def _padded_block_layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float
                            ) -> torch.Tensor:
    """The buggy kernel's arithmetic, lane by lane in float64: the row padded with zeros to
    the next power of two, every lane centred, the variance over all lanes divided by N."""
    n = x.shape[-1]
    block = triton.next_power_of_2(n)
    padded = torch.nn.functional.pad(x.double(), (0, block - n))
    mean = padded.sum(dim=-1, keepdim=True) / n
    d = padded - mean
    rstd = torch.rsqrt((d * d).sum(dim=-1, keepdim=True) / n + eps)
    return (d * rstd)[..., :n] * w.double() + b.double()


@pytest.mark.parametrize("n", [100, 257, 3000])
def test_padding_suspect_expects_the_padded_blocks_arithmetic(n):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(5, n, generator=gen) + 0.5  # a clear mean, so the padding shows
    w, b = torch.rand(n, generator=gen) + 0.5, torch.randn(n, generator=gen)
    case = Case("odd", (5, n), torch.float32, frozenset({"odd_n"}), eps=1e-5)
    t = {"x": x, "weight": w, "bias": b}
    expected = _padding_suspect().expected(t, case)
    torch.testing.assert_close(expected, _padded_block_layernorm(x, w, b, 1e-5),
                               rtol=1e-12, atol=1e-12)
    # ...and it is a wrong answer, not the reference under another name.
    assert (expected - reference.layernorm(x, w, b, eps=1e-5)).abs().max() > 1e-3


def test_padding_suspect_stays_silent_where_n_is_a_power_of_two():
    x = torch.randn(3, 256) + 1.0
    case = Case("pow2", (3, 256), torch.float32, frozenset({"pow2"}), eps=1e-5)
    t = {"x": x, "weight": torch.ones(256), "bias": torch.zeros(256)}
    assert _padding_suspect().expected(t, case) is None


@pytest.mark.parametrize("seed", [1, 3])
def test_unmasked_centred_values_are_named_not_blamed_on_the_loads(seed):
    with pytest.raises(AssertionError) as failure:
        check.layernorm_forward(layernorm_unmasked_centre, seed=seed, quiet=True)
    message = str(failure.value)
    assert PADDING_ADVICE in message and "padding lanes" in message, message
    # Neither the generic mask rule nor the unbiased-variance suspect takes the blame.
    assert "past the end of the row are not masked" not in message, message
    assert "divide the sum of squared deviations by N - 1" not in message, message


def test_the_padding_advice_is_not_given_to_an_unbiased_variance():
    # Unbiased: every case with N > 1 fails, power-of-two N included, so the padding
    # suspect (silent where N is a power of two) cannot explain most of them.
    import layernorm_variants

    with pytest.raises(AssertionError) as failure:
        check.layernorm_forward(layernorm_variants.unbiased_variance, seed=3, quiet=True)
    message = str(failure.value)
    assert "N - 1" in message and PADDING_ADVICE not in message, message


def test_the_padding_suspect_is_registered_with_the_exercise():
    assert any(s.name == "padding_in_variance" for s in LAYERNORM_FORWARD.suspects)


# ---------------------------------------------------------------- the traffic calculator


def test_calculator_opens_with_the_options_given():
    calc = traffic_calculator("layernorm", M=512, N=1024, options={"save_stats": False})
    assert calc.options["save_stats"].value is False
    no_stats = traffic.layernorm(512, 1024, "bf16", save_stats=False)
    assert calc.current_traffic.bytes == no_stats.bytes
    assert calc.ideal_bytes == no_stats.bytes
    # Ticking it again adds the 8 bytes a row that the forward saves for the backward.
    calc.options["save_stats"].value = True
    assert calc.current_traffic.bytes == no_stats.bytes + 8 * 512


def test_calculator_without_options_keeps_the_variants_defaults():
    traffic_calculator("layernorm", M=512, N=1024, options={"save_stats": False})
    assert VARIANTS["layernorm"].options == {"save_stats": True}  # not changed in place
    calc = traffic_calculator("layernorm", M=512, N=1024)
    assert calc.options["save_stats"].value is True
    assert calc.current_traffic.bytes == traffic.layernorm(512, 1024, "bf16").bytes


def test_rows_per_program_option_opens_the_dropdown_there():
    calc = traffic_calculator("rmsnorm_backward", M=4096, N=1024,
                              options={"partial_rows": 64})
    assert calc.options["partial_rows"].value == 64
    assert calc.current_traffic.bytes == traffic.rmsnorm_backward(
        4096, 1024, "bf16", partial_rows=64).bytes
    auto = traffic_calculator("rmsnorm_backward", M=4096, N=1024,
                              options={"partial_rows": None})
    assert auto.option_values == {"partial_rows": None}


@pytest.mark.parametrize("kernel, options, exc, phrase", [
    ("layernorm", {"save_rstd": False}, ValueError,
     "'layernorm' has no option 'save_rstd'; its options: save_stats"),
    ("eager_rmsnorm", {"save_rstd": True}, ValueError, "its options: none"),
    ("layernorm", {"save_stats": "no"}, TypeError, "pass True or False, got 'no'"),
    ("layernorm", {"save_stats": 0}, TypeError, "pass True or False"),
    ("rmsnorm_backward", {"partial_rows": 3}, ValueError,
     "partial_rows must be None \\(auto\\) or a power of two from 1 to 4096, got 3"),
    ("rmsnorm_backward", {"partial_rows": 8192}, ValueError, "got 8192"),
    ("rmsnorm_backward", {"partial_rows": True}, ValueError, "got True"),
    ("layernorm", [("save_stats", False)], TypeError, "options must be a dict"),
])
def test_options_the_controls_cannot_show_are_refused(kernel, options, exc, phrase):
    with pytest.raises(exc, match=phrase):
        traffic_calculator(kernel, options=options)


# ---------------------------------------------------------------- chapter 08: the solution


def _cell_sources(chapter: str, *cell_ids: str) -> list[str]:
    path = ROOT / "solutions" / chapter / f"{chapter}.ipynb"
    cells = {c.get("id"): "".join(c["source"]) for c in json.loads(path.read_text())["cells"]}
    return [cells[i] for i in cell_ids]


def _chapter_08_choose_launch():
    launch_class, exercise = _cell_sources("ch08_performance_lab", "launch-class",
                                           "exercise-code")
    scope = {"triton": triton, "torch": torch}
    exec(compile(launch_class, "ch08 launch-class", "exec"), scope)
    exec(compile(exercise, "ch08 exercise-code", "exec"), scope)
    return scope["choose_launch"]


@pytest.mark.parametrize("n_cols", [1, 33, 96, 256])
@pytest.mark.parametrize("element_size", [2, 4])
def test_model_solution_runs_short_rows_one_program_per_tile(n_cols, element_size):
    # Measured on an H100 (the chapter's sweep at 524288 x 256): one program per tile ahead
    # of every persistent, pipelined launch.
    launch = _chapter_08_choose_launch()(524288, n_cols, element_size)
    assert launch.programs_per_sm == 0 and launch.num_stages == 1 and launch.chunk_n == 0
    assert launch.rows_per_tile * triton.next_power_of_2(n_cols) <= 4096  # a few KB a tile
