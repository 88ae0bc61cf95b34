"""The reference kernels in solutions/kernels against the float64 reference.

In interpreter mode: small shapes, every dtype, odd N, strided rows, each launch path that
can run there. On a GPU (marked `gpu`): the benchmark's full shapes and the split path.
"""

from dataclasses import replace

import course  # noqa: F401  (mode first)
from course import reference, runtime
from course.check.compare import compare
from course.shootout import SHAPES, column_sum_error

import pytest
import torch

from solutions import kernels
from solutions.kernels.column_sums import SUM_ROWS, column_sums
from solutions.kernels.derived_rules import (
    RESIDUAL_SPLIT,
    RESIDUAL_SPLIT_BLOCKS,
    fused_add_long_rows,
)
from solutions.kernels.launch import H100, backward_plan, forward_plan, gpu_properties
from solutions.kernels.launch_plans import (
    BackwardPlan,
    ForwardPlan,
    Rows,
    Variant,
    stated_multiple_of,
)
from solutions.kernels.layernorm import (
    LOOP_HEAD,
    PARAMS_FIRST_MAX_N,
    SHIFTED_MAX_N,
    layernorm_backward,
)
from solutions.kernels.layernorm import _forward as layernorm_forward
from solutions.kernels.plan_tables import measured
from solutions.kernels.rmsnorm import _forward as rmsnorm_forward
from solutions.kernels.rmsnorm import rmsnorm_backward
from solutions.kernels.sibling_sync import next_power_of_2_split

DEV = runtime.DEVICE
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SMALL = [(4, 64), (7, 100), (5, 1), (1, 257), (3, 3000), (33, 48)]
# Three programs walk over the rows; pass 2 reads the row in blocks of another size, so its
# threads read values other threads stored (the fused add's residual).
LOOP_FWD = ForwardPlan(path="loop", block_n=1024, num_warps=4, programs=3, out_block=256)
WHOLE_ROW_LOOP_FWD = ForwardPlan(path="loop", block_n=8192, num_warps=8, programs=2,
                                 out_block=2048)
ROW_PER_PROGRAM_LOOP_FWD = ForwardPlan(path="loop", block_n=8192, num_warps=8, out_block=2048,
                                       max_registers=40)
# The same without loops: pass 2's four blocks unrolled, the last two past a row of 5000
ONE_ROW_LOOP_FWD = replace(ROW_PER_PROGRAM_LOOP_FWD, variant=Variant.ONE_ROW)
# A row of 5000 in five unrolled blocks of 1024, the last one part empty
ONE_ROW_BLOCKS_FWD = ForwardPlan(path="loop", block_n=1024, num_warps=4, out_block=512,
                                 variant=Variant.ONE_ROW)
LOOP_BWD = BackwardPlan(path="loop", block_n=1024, num_warps=4, programs=3)
RELOAD_BWD = BackwardPlan(path="rows", block_n=512, num_warps=4, programs=3, reload=True)
EACH_STEP_BWD = BackwardPlan(path="rows", block_m=4, block_n=512, num_warps=4, programs=3,
                             sum_each_step=True)
# 37 rows over 3 programs, 4 rows a step: the last step of each program is partial
PREFETCH_BWD = BackwardPlan(path="rows", block_m=4, block_n=512, num_warps=4, programs=3,
                            prefetch=True)
PIECES_BWD = BackwardPlan(path="pieces", block_n=256, num_warps=4, programs=3)  # 300: 256 + 64


def _x(shape, dtype, seed=0, mean=0.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) + mean).to(dtype).to(DEV)


def _w(n, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=gen) + 0.5).to(dtype).to(DEV)


def _assert_close(name, got, want, dtype):
    mismatch = compare(name, got, want, dtype)
    assert mismatch is None, mismatch.describe()


def _assert_sums_close(name, got, want):
    problem = column_sum_error(name, got, want, got.dtype)
    assert problem is None, problem


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SMALL)
def test_rmsnorm_forward_matches_reference(shape, dtype):
    x, w = _x(shape, dtype), _w(shape[-1], dtype)
    _assert_close("y", kernels.rmsnorm(x, w, 1e-6), reference.rmsnorm(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_rmsnorm_returns_the_norm_of_the_rounded_sum(dtype):
    x, r, w = _x((6, 300), dtype), _x((6, 300), dtype, seed=5), _w(300, dtype)
    y, res = kernels.add_rmsnorm(x, r, w)
    want_y, want_res = reference.add_rmsnorm(x, r, w)
    _assert_close("residual", res, want_res, dtype)
    _assert_close("y", y, want_y, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SMALL)
def test_layernorm_forward_matches_reference(shape, dtype):
    x, w, b = _x(shape, dtype), _w(shape[-1], dtype), _x(shape[-1], dtype, seed=3)
    _assert_close("y", kernels.layernorm(x, w, b), reference.layernorm(x, w, b), dtype)


def test_layernorm_survives_a_mean_ten_thousand_times_the_spread():
    # E[x^2] - E[x]^2 in float32 would lose every digit of the variance here
    x = _x((8, 512), torch.float32, mean=1e4)
    w, b = _w(512, torch.float32), _x(512, torch.float32, seed=3)
    y = kernels.layernorm(x, w, b)
    err = (y.double() - reference.layernorm(x, w, b)).abs().max().item()
    # the input itself is rounded to float32 at 1e4 (ulp 1e-3): y can be no better than that
    assert err < 5e-3, err


@pytest.mark.parametrize("n", [300, 5000], ids=["params-first", "params-after"])
@pytest.mark.parametrize("affine", [True, False], ids=["weight-and-bias", "neither"])
def test_layernorm_rows_kernel_loads_its_parameters_before_or_after_the_reduction(n, affine):
    # Rows up to PARAMS_FIRST_MAX_N columns load w and b before x; longer ones after the
    # reduction (held through it they spill). Both orders, with and without parameters.
    block_n = 1 << (n - 1).bit_length()
    assert (block_n <= PARAMS_FIRST_MAX_N.value) == (n == 300)
    x = _x((5, n), torch.float32, mean=3.0)
    w, b = _w(n, torch.float32), _x(n, torch.float32, seed=3)
    plan = ForwardPlan(path="rows", block_m=2, block_n=block_n, num_warps=4)
    y, mean, rstd = layernorm_forward(x, w if affine else None, b if affine else None, 1e-5,
                                      True, plan)
    want_w, want_b = (w, b) if affine else (torch.ones_like(w), torch.zeros_like(b))
    _assert_close("y", y, reference.layernorm(x, want_w, want_b), torch.float32)
    want_mean, want_rstd = reference.layernorm_stats(x)
    _assert_close("mean", mean, want_mean, torch.float32)
    _assert_close("rstd", rstd, want_rstd, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [200, 512])
def test_short_16_bit_rows_summed_about_their_first_value_keep_the_variance(n, dtype):
    # Rows of up to SHIFTED_MAX_N 16-bit values are summed in one pass about x[row, 0].
    # Here the mean is 1000 times the spread, where summing about 0 loses every bit of the
    # variance, and each row's first value is as far off its mean as the rest allow
    # (about sqrt(n) spreads): the worst case for the shift, which still leaves 15 bits.
    assert n <= SHIFTED_MAX_N.value
    base = 64.0 if dtype == torch.bfloat16 else 1000.0  # large against the spread, and a
    x = (_x((6, n), torch.float32) + base)               # spread the dtype can still hold
    x[:, 0] += n ** 0.5 * 0.9
    x = x.to(dtype)
    w, b = _w(n, dtype), _x(n, dtype, seed=3)
    block_n = 1 << (n - 1).bit_length()
    for plan in (ForwardPlan(path="rows", block_m=2, block_n=block_n, num_warps=2),
                 ForwardPlan(path="rows", block_n=block_n, num_warps=1)):
        y, mean, rstd = layernorm_forward(x, w, b, 1e-5, True, plan)
        want_mean, want_rstd = reference.layernorm_stats(x)
        assert ((rstd.double() - want_rstd) / want_rstd).abs().max().item() < 2e-5
        assert ((mean.double() - want_mean) / want_mean).abs().max().item() < 1e-6
        _assert_close("y", y, reference.layernorm(x, w, b), dtype)


def _check_forwards_on_plan(x, r, w, b, dtype, plan):
    """RMSNorm (with rstd), fused add + RMSNorm and LayerNorm (with its statistics), all on
    `plan`, against the float64 reference."""
    y, _, rstd = rmsnorm_forward(x, w, 1e-6, None, True, plan)
    _assert_close("y", y, reference.rmsnorm(x, w), dtype)
    _assert_close("rstd", rstd, reference.rmsnorm_rstd(x), torch.float32)
    y, res, _ = rmsnorm_forward(x, w, 1e-6, r, False, plan)
    want_y, want_res = reference.add_rmsnorm(x, r, w)
    _assert_close("residual", res, want_res, dtype)
    _assert_close("y", y, want_y, dtype)
    y, mean, rstd = layernorm_forward(x, w, b, 1e-5, True, plan)
    _assert_close("y", y, reference.layernorm(x, w, b), dtype)
    want_mean, want_rstd = reference.layernorm_stats(x)
    _assert_close("mean", mean, want_mean, torch.float32)
    _assert_close("rstd", rstd, want_rstd, torch.float32)


@pytest.mark.parametrize("plan", [LOOP_FWD, WHOLE_ROW_LOOP_FWD, ROW_PER_PROGRAM_LOOP_FWD,
                                  ONE_ROW_LOOP_FWD, ONE_ROW_BLOCKS_FWD],
                         ids=["blocks", "whole-row", "a-program-per-row", "one-row",
                              "one-row-in-blocks"])
def test_the_loop_paths_match_reference_on_long_rows(plan):
    x, r, w = _x((3, 5000), torch.float32, mean=20.0), _x((3, 5000), torch.float32), _w(
        5000, torch.float32)
    b = _x(5000, torch.float32, seed=4)
    _check_forwards_on_plan(x, r, w, b, torch.float32, plan)


@pytest.mark.parametrize("plan", [
    ForwardPlan(path="rows", block_m=4, block_n=64, num_warps=2),
    ForwardPlan(path="rows", block_m=4, block_n=64, num_warps=2, variant=Variant.STREAM),
    ForwardPlan(path="rows", block_m=4, block_n=64, num_warps=2, variant=Variant.WEIGHT_AFTER),
    ForwardPlan(path="rows", block_m=4, block_n=64, num_warps=2, programs=2,
                variant=Variant.PREFETCH)],
                         ids=["rows", "streamed", "weight-after", "prefetch"])
def test_rows_paths_without_masks_where_rows_fill_the_tiles(plan):
    # EVEN: rows as long as the block, and whole tiles of them, so the kernels drop their
    # masks; a part tile or rows short of the block keep them
    assert plan.rows_even(12, 64) == {"EVEN": True}
    assert plan.rows_even(13, 64) == {"EVEN": False}
    assert plan.rows_even(12, 60) == {"EVEN": False}
    assert replace(plan, variant=Variant.KEEP_MASKS).rows_even(12, 64) == {"EVEN": False}
    x, r, w = _x((12, 64), torch.float32, mean=20.0), _x((12, 64), torch.float32), _w(
        64, torch.float32)
    b = _x(64, torch.float32, seed=4)
    _check_forwards_on_plan(x, r, w, b, torch.float32, plan)


@pytest.mark.parametrize("path", ["rows", "loop", "reload", "each-step", "prefetch", "pieces"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rmsnorm_backward_matches_reference(dtype, path):
    x, dy, w = _x((37, 300), dtype), _x((37, 300), dtype, seed=7), _w(300, dtype)
    rstd = reference.rmsnorm_rstd(x).float()
    plan = {"loop": LOOP_BWD, "reload": RELOAD_BWD, "each-step": EACH_STEP_BWD,
            "prefetch": PREFETCH_BWD, "pieces": PIECES_BWD}.get(path)
    dx, dw = rmsnorm_backward(x, w, rstd, dy, plan)
    want_dx, want_dw = reference.rmsnorm_backward(x, w, dy)
    _assert_close("dx", dx, want_dx, dtype)
    assert dw.dtype == w.dtype
    _assert_sums_close("dw", dw, want_dw)


@pytest.mark.parametrize("m, n, row_stride", [(9, 65, None), (9, 127, None), (9, 100, 102),
                                              (20, 1536, None)], ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backwards_in_pieces(dtype, m, n, row_stride):
    # A tail of one column (65 = 64 + 1), a tail that fills its piece (127 = 64 + 63, in a
    # piece of 64), rows two values apart from their length, and a model width.
    plan = BackwardPlan(path="pieces", block_n=1 << (n.bit_length() - 1), num_warps=2,
                        programs=4)
    _check_backwards((m, n), dtype, row_stride, plan)


def test_pieces_path_refuses_rows_its_pieces_do_not_cover():
    x = _x((4, 512), torch.float32)
    with pytest.raises(ValueError, match="rows of 257 to 512 columns .* got N = 600"):
        BackwardPlan(path="pieces", block_n=256, num_warps=4, programs=2).tail_for(600)
    with pytest.raises(ValueError, match="got N = 512"):
        rmsnorm_backward(x, None, reference.rmsnorm_rstd(x).float(), x,
                         BackwardPlan(path="pieces", block_n=512, num_warps=4, programs=2))


@pytest.mark.parametrize("path", ["rows", "loop", "each-step", "prefetch", "pieces"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layernorm_backward_matches_reference(dtype, path):
    x, dy = _x((37, 300), dtype, mean=2.0), _x((37, 300), dtype, seed=7)
    w, b = _w(300, dtype), _x(300, dtype, seed=3)
    mean, rstd = (s.float() for s in reference.layernorm_stats(x))
    plan = {"loop": LOOP_BWD, "each-step": EACH_STEP_BWD, "prefetch": PREFETCH_BWD,
            "pieces": PIECES_BWD}.get(path)
    dx, dw, db = layernorm_backward(x, w, mean, rstd, dy, plan=plan)
    want_dx, want_dw, want_db = reference.layernorm_backward(x, w, b, dy)
    _assert_close("dx", dx, want_dx, dtype)
    _assert_sums_close("dw", dw, want_dw)
    _assert_sums_close("db", db, want_db)


@pytest.mark.parametrize("prefetch", [False, True])
def test_rows_path_with_and_without_prefetch(prefetch):
    # With prefetch, 3 programs walk over the 10 row tiles (the persistent launch for short
    # rows); without, each program takes one tile in straight-line code.
    x, r, w = _x((37, 300), torch.float32), _x((37, 300), torch.float32, seed=5), _w(
        300, torch.float32)
    b = _x(300, torch.float32, seed=4)
    plan = ForwardPlan(path="rows", block_m=4, block_n=512, num_warps=2, programs=3,
                       variant=Variant.PREFETCH if prefetch else Variant.PLAIN)
    assert plan.grid(37, 300) == ((3,) if prefetch else (10,))
    y, res, rstd = rmsnorm_forward(x, w, 1e-6, r, True, plan)
    want_y, want_res = reference.add_rmsnorm(x, r, w)
    _assert_close("residual", res, want_res, torch.float32)
    _assert_close("y", y, want_y, torch.float32)
    _assert_close("rstd", rstd, reference.rmsnorm_rstd(want_res), torch.float32)
    y, mean, rstd = layernorm_forward(x + 30, w, b, 1e-5, True, plan)
    _assert_close("y", y, reference.layernorm(x + 30, w, b), torch.float32)
    _assert_close("mean", mean, reference.layernorm_stats(x + 30)[0], torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight", [True, False])
def test_rows_path_streamed_loads_the_weight_after_the_sum_and_matches(dtype, weight):
    # Variant.STREAM: evict-first loads and stores, the weight (and bias) loaded after the
    # sum. 37 rows in tiles of 4 (the last partial), 300 columns in a block of 512, strided
    # rows; LayerNorm's with a large mean.
    plan = ForwardPlan(path="rows", block_m=4, block_n=512, num_warps=2, variant=Variant.STREAM)
    x = _x((37, 320), dtype)[:, :300]
    r = _x((37, 300), dtype, seed=5)
    w = _w(300, dtype) if weight else None
    ones = torch.ones(300, dtype=dtype, device=DEV)
    y, _, rstd = rmsnorm_forward(x, w, 1e-6, None, True, plan)
    _assert_close("y", y, reference.rmsnorm(x, ones if w is None else w), dtype)
    _assert_close("rstd", rstd, reference.rmsnorm_rstd(x), torch.float32)
    y, res, _ = rmsnorm_forward(x, w, 1e-6, r, True, plan)
    want_y, want_res = reference.add_rmsnorm(x, r, ones if w is None else w)
    _assert_close("residual", res, want_res, dtype)
    _assert_close("y", y, want_y, dtype)
    b = _w(300, dtype, seed=7) if weight else None
    y, mean, rstd = layernorm_forward(x + 30, w, b, 1e-5, True, plan)
    want_y = reference.layernorm(x + 30, ones if w is None else w,
                                 torch.zeros_like(ones) if b is None else b)
    _assert_close("y", y, want_y, dtype)
    want_mean, want_rstd = reference.layernorm_stats(x + 30)
    _assert_close("mean", mean, want_mean, torch.float32)
    _assert_close("rstd", rstd, want_rstd, torch.float32)


def test_float32_short_layernorm_rows_keep_their_masks():
    # Measured faster masked (plans/h100.json); 16-bit rows and longer rows drop them
    gpu = torch.device("cuda")
    for n, keep in ((256, True), (512, True), (1024, False)):
        plan = forward_plan(32768, n, gpu, element_size=4, layernorm=True)
        assert plan.keep_masks == keep and plan.rows_even(32768, n) == {"EVEN": not keep}
    for element_size in (2, 4):
        assert not forward_plan(32768, 512, gpu, element_size=element_size).keep_masks
    assert not forward_plan(32768, 512, gpu, element_size=2, layernorm=True).keep_masks
    with pytest.raises(ValueError, match="the keep_masks variant is for the rows path"):
        ForwardPlan(path="loop", block_n=8192, num_warps=8, variant=Variant.KEEP_MASKS)


def test_one_row_plans_are_for_a_program_per_row_of_a_few_blocks():
    with pytest.raises(ValueError, match="the one_row variant is for the loop path with a "
                                         "program per row"):
        ForwardPlan(path="loop", block_n=8192, num_warps=8, programs=3, variant=Variant.ONE_ROW)
    with pytest.raises(ValueError, match="the one_row variant is for the loop path"):
        ForwardPlan(path="rows", block_n=8192, num_warps=8, variant=Variant.ONE_ROW)
    assert ONE_ROW_BLOCKS_FWD.row_blocks(5000) == {"ROW_BLOCKS": 5, "EVEN": False}
    assert ONE_ROW_BLOCKS_FWD.row_blocks(4096) == {"ROW_BLOCKS": 4, "EVEN": True}
    assert ONE_ROW_BLOCKS_FWD.row_blocks(1024) == {"ROW_BLOCKS": 1, "EVEN": False}
    assert LOOP_FWD.row_blocks(4096) == {"ROW_BLOCKS": 0, "EVEN": False}
    x, w = _x((2, 17000), torch.float32), _w(17000, torch.float32)
    with pytest.raises(ValueError, match="unrolls at most 16 blocks of block_n = 1024 "
                                         "columns; got N = 17000"):
        rmsnorm_forward(x, w, 1e-6, None, False, ONE_ROW_BLOCKS_FWD)
    with pytest.raises(ValueError, match="unrolls at most 16 blocks"):
        layernorm_forward(x, w, None, 1e-5, False, ONE_ROW_BLOCKS_FWD)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_row_plans_without_masks_match_reference(dtype):
    # Rows of 4096 fill four blocks of 1024 and eight of 512 (pass 2): EVEN, no masks.
    # Strided rows, and a large mean for LayerNorm's shift.
    x = _x((3, 5000), dtype, mean=30.0)[:, :4096]
    r, w, b = _x((3, 4096), dtype, seed=5), _w(4096, dtype), _x(4096, dtype, seed=4)
    _check_forwards_on_plan(x, r, w, b, dtype, ONE_ROW_BLOCKS_FWD)


def test_stream_plans_are_for_the_rows_path_only():
    # A plan has one variant, so a streamed plan cannot prefetch as well.
    plan = ForwardPlan(path="rows", block_m=4, block_n=512, num_warps=2, variant="stream")
    assert plan.stream and plan.weight_after_sum and not plan.prefetch
    with pytest.raises(ValueError, match="the stream variant is for the rows path"):
        ForwardPlan(path="loop", block_n=1024, num_warps=4, variant=Variant.STREAM)


@pytest.mark.parametrize("op", ["rmsnorm", "add_rmsnorm", "layernorm"])
def test_every_row_length_gets_a_plan_that_covers_it(op):
    # The launch rules are tables by row length: no N from 1 to 2**18 may fall between
    # them, and every plan must cover the row (on a GPU, where the split path exists).
    gpu = torch.device("cuda")
    lengths = sorted({n for k in range(19) for n in (2**k - 1, 2**k, 2**k + 1)} - {0})
    for element_size in (2, 4):
        for n in lengths:
            plan = forward_plan(4096, n, gpu, element_size=element_size,
                                residual=op == "add_rmsnorm", layernorm=op == "layernorm")
            where = f"{op}, N = {n}, {element_size}-byte values: {plan}"
            if plan.path == "split":
                assert plan.split * plan.block_n >= n, where
            elif plan.path == "rows":
                assert plan.block_n >= n and plan.block_m >= 1, where
                assert plan.prefetch or not plan.programs, where
            elif plan.one_row:  # unrolled blocks: enough of them, and not too many
                assert plan.row_blocks(n)["ROW_BLOCKS"] * plan.block_n >= n, where
                assert plan.out_block <= plan.block_n and not plan.programs, where
            else:
                assert plan.path == "loop" and plan.out_block <= plan.block_n, where
                if not plan.programs:  # a program per row: only where it was measured
                    dtype = "float32" if element_size == 4 else "16-bit"
                    assert plan == measured(Rows(op, 4096, n, dtype, element_size, H100)), where
            # values a thread loads at once: beyond 64 float32 they would spill
            assert plan.block_m * plan.block_n <= 64 * 32 * plan.num_warps, where
        for n in lengths[: lengths.index(65537)]:
            for dtype in DTYPES:
                bwd = backward_plan(4096, n, gpu, dtype=dtype, layernorm=op == "layernorm")
                where = f"{op} backward, N = {n}, {dtype}: {bwd}"
                if bwd.path == "pieces":  # rows below a power of two, in two pieces
                    assert n & (n - 1), where
                    assert bwd.block_n < n <= bwd.block_n + bwd.tail_for(n), where
                else:
                    assert bwd.block_n * bwd.split >= n, where


def test_fused_add_split_rows_hold_16_values_a_thread_on_about_32_programs_a_row():
    # What the split rule was measured to want (derived_rules.residual_split_plan): 16 values a
    # thread at every length, and RESIDUAL_SPLIT programs a row until a program holds the
    # most columns it may; past that, more programs rather than more values a thread. The
    # rule itself, as a GPU without a measured rule for the row gets it (the H200's table
    # has its own at some lengths).
    gpu = gpu_properties(torch.device("cuda"))
    least, most = RESIDUAL_SPLIT_BLOCKS
    for n in (40000, 65536, 131072, 131080, 262144, 524288, 1 << 20, 1 << 21):
        for element_size in (2, 4):
            dtype = "16-bit" if element_size == 2 else "float32"
            plan = fused_add_long_rows(Rows("add_rmsnorm", 512, n, dtype, element_size, gpu))
            where = f"N = {n}, {element_size}-byte values: {plan}"
            assert plan.path == "split" and not plan.reload, where
            assert plan.block_n == 16 * 32 * plan.num_warps, where
            assert least <= plan.block_n <= most, where
            assert plan.split * plan.block_n >= n, where
            assert plan.split <= RESIDUAL_SPLIT or plan.block_n == most, where


@pytest.mark.parametrize("op", ["rmsnorm", "add_rmsnorm", "layernorm"])
def test_no_row_is_split_over_more_programs_than_can_run_at_once(op):
    # A split row's programs wait for each other's sums: more of them than the GPU can hold
    # at once would wait forever (RMSNorm hung at 2**23 columns before the bound). Planned
    # for an H100's 132 SMs, rows of up to 2**24 columns.
    gpu = torch.device("cuda")
    for n in (1 << 20, 1 << 21, (1 << 21) + 1, 3_000_000, 1 << 23, 1 << 24):
        for element_size in (2, 4):
            plan = forward_plan(8, n, gpu, element_size=element_size,
                                residual=op == "add_rmsnorm", layernorm=op == "layernorm")
            assert plan.split <= 132, f"{op}, N = {n}: {plan}"
            if plan.path != "split":
                assert plan.path == "loop" and plan.programs, f"{op}, N = {n}: {plan}"
        if op != "add_rmsnorm":
            for dtype in DTYPES:
                bwd = backward_plan(8, n, gpu, dtype=dtype, layernorm=op == "layernorm")
                assert bwd.split <= 132, f"{op} backward, N = {n}, {dtype}: {bwd}"


def test_kernels_are_told_only_the_multiples_triton_cannot_see():
    # Triton notes integer arguments divisible by 16 itself; below that, the launch states
    # the largest power of two (up to 8) that divides the row length and every row stride.
    assert stated_multiple_of(4096, 4096, 0) == 1
    assert stated_multiple_of(4104, 4104) == 8
    assert stated_multiple_of(4096, 4104, 4096) == 8
    assert stated_multiple_of(4100, 4100) == 4
    assert stated_multiple_of(4098, 4112) == 2
    assert stated_multiple_of(4104, 4097) == 1


def test_backward_is_deterministic():
    x, dy, w = _x((300, 96), torch.float32), _x((300, 96), torch.float32, seed=7), _w(
        96, torch.float32)
    rstd = reference.rmsnorm_rstd(x).float()
    first = rmsnorm_backward(x, w, rstd, dy)
    for _ in range(3):
        again = rmsnorm_backward(x, w, rstd, dy)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


@pytest.mark.parametrize("plan", [PREFETCH_BWD, EACH_STEP_BWD, PIECES_BWD],
                         ids=["rows", "each-step", "pieces"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_lone_program_writes_the_parameter_sums_itself(monkeypatch, dtype, plan):
    """One program takes every row (a decode step's single row): its partial rows are the
    sums, written in the parameters' dtype, and column_sums is not launched at all."""
    from solutions.kernels import column_sums as column_sums_module

    class NoSecondLaunch:
        def __getitem__(self, grid):
            raise AssertionError("column_sums_kernel launched for one program's partial rows")
    monkeypatch.setattr(column_sums_module, "column_sums_kernel", NoSecondLaunch())
    plan = replace(plan, programs=1)
    x, dy, w = _x((5, 300), dtype, mean=2.0), _x((5, 300), dtype, seed=7), _w(300, dtype)
    b = _x(300, dtype, seed=3)
    dx, dw = rmsnorm_backward(x, w, reference.rmsnorm_rstd(x).float(), dy, plan)
    want_dx, want_dw = reference.rmsnorm_backward(x, w, dy)
    _assert_close("dx", dx, want_dx, dtype)
    assert dw.dtype == w.dtype and dw.shape == w.shape
    _assert_sums_close("dw", dw, want_dw)
    mean, rstd = (s.float() for s in reference.layernorm_stats(x))
    dx, dw, db = layernorm_backward(x, w, mean, rstd, dy, plan=plan)
    want_dx, want_dw, want_db = reference.layernorm_backward(x, w, b, dy)
    _assert_close("dx", dx, want_dx, dtype)
    assert dw.dtype == db.dtype == w.dtype and dw.shape == db.shape == w.shape
    _assert_sums_close("dw", dw, want_dw)
    _assert_sums_close("db", db, want_db)


def test_column_sums_of_more_partial_rows_than_one_step_holds():
    """The second kernel of every backward: narrow strips of columns, up to SUM_ROWS
    partial rows a step; 2 sets (dW and dB) of 2500 rows of 37 columns take three steps
    and a partial strip."""
    gen = torch.Generator().manual_seed(3)
    partials = torch.randn((2, SUM_ROWS * 2 + 452, 37), generator=gen).to(DEV)
    got = column_sums(partials, torch.float32)
    want = partials.double().sum(1)
    assert got.shape == (2, 37)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-4), (got.double() - want
                                                                       ).abs().max()


def test_strided_rows_and_3d_inputs():
    base = _x((6, 200), torch.float16)
    x = base[:, :128]                       # rows 200 apart, 128 used
    w = _w(128, torch.float16)
    _assert_close("y", kernels.rmsnorm(x, w), reference.rmsnorm(x, w), torch.float16)
    x3 = _x((2, 3, 64), torch.float32)
    w3 = _w(64, torch.float32)
    y3 = kernels.layernorm(x3, w3, None)
    assert y3.shape == x3.shape
    _assert_close("y", y3, reference.layernorm(x3, w3, torch.zeros_like(w3)), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_modules_match_torch_modules_outputs_and_gradients(dtype):
    n = 96
    x = _x((2, 5, n), dtype)
    for ours, theirs in ((kernels.RMSNorm(n, eps=1e-6), torch.nn.RMSNorm(n, eps=1e-6)),
                         (kernels.LayerNorm(n), torch.nn.LayerNorm(n))):
        ours, theirs = ours.to(DEV, dtype), theirs.to(DEV, dtype)
        with torch.no_grad():
            theirs.weight.copy_(_w(n, dtype))
            if hasattr(theirs, "bias") and theirs.bias is not None:
                theirs.bias.copy_(_x(n, dtype, seed=9))
        ours.load_state_dict(theirs.state_dict())
        xa = x.clone().requires_grad_(True)
        xb = x.clone().requires_grad_(True)
        ya, yb = ours(xa), theirs(xb)
        _assert_close("y", ya, yb.double(), dtype)
        dy = _x(x.shape, dtype, seed=11)
        ya.backward(dy)
        yb.backward(dy)
        _assert_close("dx", xa.grad, xb.grad.double(), dtype)
        for (name, pa), pb in zip(ours.named_parameters(), theirs.parameters(), strict=True):
            _assert_sums_close(name, pa.grad, pb.grad.double())


def test_default_eps_follows_torch_rmsnorm():
    x = _x((3, 16), torch.float32) * 1e-4
    ours, theirs = kernels.RMSNorm(16).to(DEV), torch.nn.RMSNorm(16).to(DEV)
    _assert_close("y", ours(x), theirs(x).double(), torch.float32)


def test_autograd_function_returns_one_gradient_per_input():
    x = _x((4, 32), torch.float32).requires_grad_(True)
    w = _w(32, torch.float32).requires_grad_(False)
    kernels.rmsnorm(x, w).sum().backward()  # expanded (stride 0) upstream gradient
    assert x.grad is not None and w.grad is None
    want_dx, _ = reference.rmsnorm_backward(x, w, torch.ones_like(x))
    _assert_close("dx", x.grad, want_dx, torch.float32)


@pytest.mark.parametrize("bad, match", [
    (lambda: kernels.rmsnorm(torch.ones(4, 8, dtype=torch.int32, device=DEV),
                             torch.ones(8, device=DEV)), "dtype torch.int32"),
    (lambda: kernels.rmsnorm(torch.ones(4, 8, device=DEV), torch.ones(9, device=DEV)),
     "length 8"),
    (lambda: kernels.rmsnorm(torch.ones(8, 4, device=DEV).t(), torch.ones(8, device=DEV)),
     "stride 1"),
    (lambda: kernels.add_rmsnorm(torch.ones(4, 8, device=DEV), torch.ones(4, 9, device=DEV),
                                 torch.ones(8, device=DEV)), "residual must have x's shape"),
    (lambda: kernels.layernorm(torch.ones(4, 8, device=DEV), None, None, eps=-1.0),
     "eps must be"),
    (lambda: kernels.LayerNorm((4, 8)), "only the last dimension"),
    (lambda: kernels.rmsnorm(torch.ones(4, 0, device=DEV)), "empty last dimension"),
])
def test_bad_inputs_are_named(bad, match):
    with pytest.raises((TypeError, ValueError), match=match):
        bad()


@pytest.mark.parametrize("head_offset", [0.0, 1e4], ids=["plain", "head-off-the-mean"])
def test_long_row_layernorm_keeps_its_precision_on_a_large_mean(head_offset):
    # The loop path sums about the mean of the row's first block (1024 values here). On a
    # mean of 1e4 and a spread of about 1, summing about 0 instead would lose every bit of
    # the variance. The second case makes the first block as far from the row's mean as it
    # can be (1e4 higher than the rest): the variance must still come out to float32
    # accuracy.
    n = 5000
    x = _x((2, n), torch.float32, mean=1e4)
    x[:, :LOOP_FWD.block_n] += head_offset
    w, b = _w(n, torch.float32), _x(n, torch.float32, seed=4)
    y, mean, rstd = layernorm_forward(x, w, b, 1e-5, True, LOOP_FWD)
    want_mean, want_rstd = reference.layernorm_stats(x)
    assert ((rstd.double() - want_rstd) / want_rstd).abs().max().item() < 1e-5
    assert ((mean.double() - want_mean) / want_mean).abs().max().item() < 1e-6
    if head_offset:  # with a spread of 1, x - mean itself is only good to 1e4 * 2**-24
        _assert_close("y", y, reference.layernorm(x, w, b), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("plan", [LOOP_FWD, ONE_ROW_BLOCKS_FWD], ids=["loop", "one-row"])
def test_long_16_bit_rows_summed_about_their_head_keep_the_variance(plan, dtype):
    # The loop path sums 16-bit rows about the mean of their first LOOP_HEAD values. Here
    # the mean is large against the spread, and those values are as far off the row's
    # mean as the rest allow (about sqrt(n / LOOP_HEAD) spreads): the worst case for the
    # shift, where log2(1 + n / LOOP_HEAD) = 7.3 of float32's 24 bits cancel.
    n, head = 5000, LOOP_HEAD.value
    base = 64.0 if dtype == torch.bfloat16 else 1000.0
    x = _x((4, n), torch.float32) + base
    x[:, :head] += (n / head) ** 0.5 * 0.9
    x = x.to(dtype)
    w, b = _w(n, dtype), _x(n, dtype, seed=3)
    y, mean, rstd = layernorm_forward(x, w, b, 1e-5, True, plan)
    want_mean, want_rstd = reference.layernorm_stats(x)
    assert ((rstd.double() - want_rstd) / want_rstd).abs().max().item() < 2 ** -15
    assert ((mean.double() - want_mean) / want_mean).abs().max().item() < 1e-6
    _assert_close("y", y, reference.layernorm(x, w, b), dtype)


# ------------------------------------------------------------------ GPU: the full shapes


def _check_forwards(shape, dtype, row_stride=None):
    """RMSNorm, LayerNorm and fused add + RMSNorm, each on the plan its launch rules pick,
    against the float64 reference; x's rows `row_stride` apart when given."""
    x, w, b = _x(shape, dtype, mean=3.0), _w(shape[1], dtype), _x(shape[1], dtype, seed=3)
    if row_stride is not None:
        x = _rows_apart(x, row_stride)
    _assert_close("y", kernels.rmsnorm(x, w), reference.rmsnorm(x, w), dtype)
    _assert_close("y", kernels.layernorm(x, w, b), reference.layernorm(x, w, b), dtype)
    r = _x(shape, dtype, seed=5)
    y, res = kernels.add_rmsnorm(x, r, w)
    want_y, want_res = reference.add_rmsnorm(x, r, w)
    _assert_close("residual", res, want_res, dtype)
    _assert_close("y", y, want_y, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_forwards_at_benchmark_shapes(shape):
    _check_forwards(shape, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("n", [512, 4096, 20000, 32768])
def test_gpu_forwards_where_the_launch_rules_depend_on_the_dtype(dtype, n):
    # Float32 rows have launch rules of their own (plans/h100.json: "dtype": "float32";
    # LayerNorm's rows of 32768 in registers); 259 rows leave a partial tile.
    _check_forwards((259, n), dtype)


def _check_backwards(shape, dtype, row_stride=None, plan=None):
    """RMSNorm's and LayerNorm's backward, each on `plan` or the plan its launch rules
    pick, against the float64 reference; x and dy rows `row_stride` apart when given."""
    x, dy, w = _x(shape, dtype, mean=1.0), _x(shape, dtype, seed=7), _w(shape[1], dtype)
    if row_stride is not None:
        x, dy = (_rows_apart(t, row_stride) for t in (x, dy))
    rstd = reference.rmsnorm_rstd(x).float()
    dx, dw = rmsnorm_backward(x, w, rstd, dy, plan)
    want_dx, want_dw = reference.rmsnorm_backward(x, w, dy)
    _assert_close("dx", dx, want_dx, dtype)
    _assert_sums_close("dw", dw, want_dw)
    b = _x(shape[1], dtype, seed=3)
    mean, rstd = (s.float() for s in reference.layernorm_stats(x))
    dx, dw, db = layernorm_backward(x, w, mean, rstd, dy, plan=plan)
    want_dx, want_dw, want_db = reference.layernorm_backward(x, w, b, dy)
    _assert_close("dx", dx, want_dx, dtype)
    _assert_sums_close("dw", dw, want_dw)
    _assert_sums_close("db", db, want_db)


def _rows_apart(t, row_stride):
    """The same values as `t` (M x N), with rows `row_stride` elements apart in memory."""
    wide = torch.full((t.shape[0], row_stride), float("nan"), dtype=t.dtype, device=t.device)
    wide[:, :t.shape[1]] = t
    return wide[:, :t.shape[1]]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[1] <= 65536],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_backwards_at_benchmark_shapes(shape):
    _check_backwards(shape, torch.bfloat16)


# Row lengths and strides that are multiples of 8, 4, 2 and 1 but not 16: the kernels are
# told the multiple (launch_plans.stated_multiple_of), on every path (rows, loop, split).
# Row lengths below a power of two take PARTIAL_BLOCK's rules (PARTIAL_BLOCK_FLOAT32's), and
# 16-bit backwards the pieces path (4097: a tail of one column; 768 to 10240: each row of
# RMS_BACKWARD_PIECES and LN_BACKWARD_PIECES).
ODD_ROWS = [(1000, 200, None), (1000, 4104, None), (1000, 4100, None), (1000, 4098, None),
            (1000, 4097, None), (300, 4104, 4120), (300, 4096, 4104), (200, 20008, None),
            (64, 131080, None), (1000, 768, None), (1000, 1536, None), (1000, 2560, None),
            (1000, 3072, None), (500, 5120, None), (500, 7168, None), (500, 10240, None)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m, n, row_stride", ODD_ROWS, ids=lambda v: str(v))
def test_gpu_rows_whose_length_or_stride_is_not_a_multiple_of_16(dtype, m, n, row_stride):
    _check_forwards((m, n), dtype, row_stride)
    if n <= 65536:
        _check_backwards((m, n), dtype, row_stride)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("split", [2, 4, 16])
@pytest.mark.parametrize("reload", [True, False], ids=["reload", "keep"])
def test_gpu_split_path_with_odd_n(dtype, split, reload):
    n = 8191 * split // 2 + 3
    x, w, b = _x((67, n), dtype, mean=50.0), _w(n, dtype), _x(n, dtype, seed=3)
    block = 1 << (-(-n // split) - 1).bit_length()
    plan = ForwardPlan(path="split", block_n=block, num_warps=8,
                       split=next_power_of_2_split(n, block), out_block=block // 4, reload=reload)
    _check_forwards_on_plan(x, _x((67, n), dtype, seed=5), w, b, dtype, plan)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, block", [(20000, 4096), (4099, 1024), (65536, 4096)])
def test_gpu_backward_split_path(dtype, n, block):
    plan = BackwardPlan(path="split", block_n=block, num_warps=8, programs=40,
                        split=next_power_of_2_split(n, block))
    _check_backwards((301, n), dtype, plan=plan)



def _split_launches(m, n, dtype, seed):
    """Every split kernel, each launch on inputs drawn from `seed`, with its float64 check."""
    x, dy = _x((m, n), dtype, seed=seed, mean=2.0), _x((m, n), dtype, seed=seed + 7)
    w, b = _w(n, dtype, seed=seed + 1), _x(n, dtype, seed=seed + 3)
    rstd = reference.rmsnorm_rstd(x).float()
    mean, ln_rstd = (s.float() for s in reference.layernorm_stats(x))

    def check_rmsnorm():
        _assert_close("y", rmsnorm_forward(x, w, 1e-6, None, False, None)[0],
                      reference.rmsnorm(x, w, 1e-6), dtype)

    def check_layernorm():
        _assert_close("y", layernorm_forward(x, w, b, 1e-5, False, None)[0],
                      reference.layernorm(x, w, b), dtype)

    def check_rmsnorm_backward():
        dx, _ = rmsnorm_backward(x, w, rstd, dy)
        _assert_close("dx", dx, reference.rmsnorm_backward(x, w, dy)[0], dtype)

    def check_layernorm_backward():
        dx, _, _ = layernorm_backward(x, w, mean, ln_rstd, dy)
        _assert_close("dx", dx, reference.layernorm_backward(x, w, b, dy)[0], dtype)

    return [check_rmsnorm, check_layernorm, check_rmsnorm_backward, check_layernorm_backward]


@pytest.mark.gpu
def test_gpu_rows_too_long_to_split_take_the_loop_paths():
    # 2**23 columns would need more programs a row than an H100 holds at once, so every
    # forward takes its loop path (RMSNorm's split hung there); the backwards do from 2**21.
    _check_forwards((2, 1 << 23), torch.bfloat16)
    _check_backwards((2, 1 << 21), torch.bfloat16)


@pytest.mark.gpu
def test_gpu_split_launch_refuses_more_programs_a_row_than_sms():
    # A plan given by hand is held to the bound too: refused with a named error, not hung.
    n = 1 << 20
    x, w, b = _x((2, n), torch.bfloat16), _w(n, torch.bfloat16), _x(n, torch.bfloat16, seed=3)
    plan = ForwardPlan(path="split", block_n=2048, num_warps=4,
                       split=next_power_of_2_split(n, 2048))
    assert plan.split > torch.cuda.get_device_properties(x.device).multi_processor_count
    with pytest.raises(ValueError, match="more than this GPU"):
        rmsnorm_forward(x, w, 1e-6, None, False, plan)
    with pytest.raises(ValueError, match="more than this GPU"):
        layernorm_forward(x, w, b, 1e-5, False, plan)


@pytest.mark.gpu
def test_gpu_split_paths_never_read_an_earlier_launchs_sums():
    # The split kernels share one buffer of tagged slots per stream and never clear it. A
    # launch that took an earlier launch's tag would find its row's slots already "full" of
    # that launch's sums, and normalise with them: each launch runs here on other inputs
    # than the one before it, and each result is checked.
    from solutions.kernels.sibling_sync import exchange_slots

    m, n = 67, 70001  # on an H100 every op takes its split path at this width
    for op in ("rmsnorm", "layernorm"):
        for backward in (False, True):
            plan = (backward_plan(m, n, torch.device(DEV), layernorm=op == "layernorm")
                    if backward else forward_plan(m, n, torch.device(DEV),
                                                  layernorm=op == "layernorm"))
            assert plan.path == "split", (op, backward, plan)
    first, second = _split_launches(m, n, torch.bfloat16, 0), _split_launches(
        m, n, torch.bfloat16, 10)
    for a, b in zip(first, second, strict=True):
        a()
        b()
        a()
        _, tag = exchange_slots(1, torch.device(DEV))
        b()
        _, next_tag = exchange_slots(1, torch.device(DEV))
        assert next_tag == tag + 2  # the launch between took a tag of its own


@pytest.mark.gpu
def test_gpu_split_path_replays_in_a_cuda_graph():
    # Under capture the slots are zeroed inside the graph and every replay uses tag 1: a
    # replay on new inputs must wait for its own sums, not take the last replay's.
    m, n = 67, 70001
    x = _x((m, n), torch.bfloat16, mean=2.0)
    w = _w(n, torch.bfloat16)
    rmsnorm_forward(x, w, 1e-6, None, False, None)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = rmsnorm_forward(x, w, 1e-6, None, False, None)[0]
    for seed in (1, 2, 3):
        x.copy_(_x((m, n), torch.bfloat16, seed=seed, mean=2.0))
        graph.replay()
        torch.cuda.synchronize()
        _assert_close("y", y, reference.rmsnorm(x, w, 1e-6), torch.bfloat16)
