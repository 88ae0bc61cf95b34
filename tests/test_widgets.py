"""The widgets: controls moved programmatically, every number checked against
`course.traffic` and `course.hardware` computed here independently."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported anywhere: no display in a test run

from course import hardware, runtime, traffic  # noqa: E402
from course.widgets import (  # noqa: E402
    VARIANTS,
    reduction_schedule,
    reduction_visualiser,
    roofline_explorer,
    traffic_calculator,
)
from course.widgets.common import format_bytes, format_seconds  # noqa: E402
from course.widgets.traffic_calculator import NO_GPU_LABEL  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

H100 = hardware.lookup("H100 SXM")
PNG_MAGIC = b"\x89PNG"
cpu_only = pytest.mark.skipif(runtime.on_gpu(), reason="checks the no-GPU behaviour")


def mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.2f} MB"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


def lines_labelled(figure, label: str):
    return [line for line in figure.axes[0].lines if line.get_label() == label]


# ---------------------------------------------------------------- traffic calculator


def test_unknown_kernel_is_refused_with_the_valid_names():
    with pytest.raises(ValueError, match="unknown kernel 'rmsnrom'") as info:
        traffic_calculator("rmsnrom")
    for name in ("eager_rmsnorm", "fused_add_rmsnorm", "layernorm_backward"):
        assert name in str(info.value)


@pytest.mark.parametrize("kwargs, exc, phrase", [
    ({"dtype": "float64"}, ValueError, "dtype must be one of float32, float16, bfloat16"),
    ({"dtype": "int8"}, ValueError, "dtype must be one of"),
    ({"M": 0}, ValueError, "M must be a positive int"),
    ({"N": 2.5}, ValueError, "N must be a positive int"),
    ({"gpu": "Z80"}, ValueError, "no GPU called 'Z80'"),
    ({"fn": 3}, TypeError, "fn must be your kernel's wrapper"),
])
def test_bad_arguments_are_refused_naming_the_problem(kwargs, exc, phrase):
    with pytest.raises(exc, match=phrase):
        traffic_calculator("fused_rmsnorm", **kwargs)


def test_fused_rmsnorm_shows_the_models_bytes_time_and_intensity():
    calc = traffic_calculator("fused_rmsnorm", gpu="H100 SXM")
    calc.m_slider.value = 4096
    calc.n_slider.value = 8192
    calc.dtype.value = "bfloat16"
    expected = traffic.fused_rmsnorm(4096, 8192, torch.bfloat16)
    assert calc.current_traffic.bytes == expected.bytes
    assert calc.current_traffic == expected
    text = calc.summary_text
    assert f"{mb(expected.bytes)} in 1 launch(es)" in text
    assert "moves 1.00x that" in text           # the fused kernel is the ideal single pass
    assert f"arithmetic intensity {expected.intensity:.3f} FLOP/byte" in text
    assert f"(3350 GB/s): {us(expected.bytes / 3350e9)}" in text
    # The summary widget shows the same text.
    assert mb(expected.bytes) in calc.summary.value


def test_dtype_and_gpu_controls_recompute_bytes_and_time():
    calc = traffic_calculator("two_pass_rmsnorm", M=4096, N=8192)
    calc.dtype.value = "float32"
    calc.gpu.value = "A100 80GB"
    expected = traffic.two_pass_rmsnorm(4096, 8192, torch.float32)
    ideal = traffic.fused_rmsnorm(4096, 8192, torch.float32)
    assert calc.current_traffic.bytes == expected.bytes
    assert calc.ideal_bytes == ideal.bytes
    assert f"moves {expected.bytes / ideal.bytes:.2f}x that" in calc.summary_text
    assert calc.predicted_at_peak_s == pytest.approx(expected.bytes / 2039e9)
    assert f"A100 80GB's peak HBM bandwidth (2039 GB/s): {us(expected.bytes / 2039e9)}" \
        in calc.summary_text


@pytest.mark.parametrize("dtype, launches", [("bfloat16", 8), ("float32", 6)])
def test_eager_lists_each_of_its_launches(dtype, launches):
    calc = traffic_calculator("eager_rmsnorm", M=1024, N=2048)
    calc.dtype.value = dtype
    expected = traffic.eager_rmsnorm(1024, 2048, dtype)
    assert expected.launches == launches
    assert calc.current_traffic.launches == launches
    assert calc.table_html.count("<tr") == launches + 2   # header and total rows
    for kernel in expected.kernels:
        assert f">{kernel.name}</td>" in calc.table_html
        assert f">{format_bytes(kernel.bytes_read)}</td>" in calc.table_html
        assert f">{format_bytes(kernel.bytes_written)}</td>" in calc.table_html
    assert f"in {launches} launch(es)" in calc.summary_text
    ideal = traffic.fused_rmsnorm(1024, 2048, dtype).bytes
    assert f"moves {expected.bytes / ideal:.2f}x that" in calc.summary_text


@pytest.mark.parametrize("kernel", list(VARIANTS))
def test_every_variant_matches_its_model_and_moves_at_least_the_ideal(kernel):
    calc = traffic_calculator(kernel, M=96, N=640, dtype="float16")
    model = getattr(traffic, kernel)
    assert calc.current_traffic == model(96, 640, torch.float16)
    assert calc.current_traffic.bytes >= calc.ideal_bytes
    assert calc.plot.image.value[:4] == PNG_MAGIC


def test_variant_options_reach_the_model():
    calc = traffic_calculator("fused_add_rmsnorm", M=512, N=1024)
    assert set(calc.options) == {"save_rstd", "write_residual"}
    calc.options["write_residual"].value = False
    calc.options["save_rstd"].value = True
    expected = traffic.fused_add_rmsnorm(512, 1024, "bf16", save_rstd=True,
                                         write_residual=False)
    assert calc.current_traffic.bytes == expected.bytes
    assert calc.ideal_bytes == expected.bytes    # the fused kernel is the ideal of its job

    layer = traffic_calculator("layernorm", M=512, N=1024)
    layer.options["save_stats"].value = False
    assert layer.current_traffic.bytes == traffic.layernorm(512, 1024, "bf16",
                                                            save_stats=False).bytes

    backward = traffic_calculator("rmsnorm_backward", M=512, N=1024)
    backward.options["partial_rows"].value = 4
    expected = traffic.rmsnorm_backward(512, 1024, "bf16", partial_rows=4)
    assert backward.current_traffic.bytes == expected.bytes
    assert backward.ideal_bytes == traffic.ideal_backward_bytes(512, 1024, "bf16")

    weight = traffic_calculator("eager_rmsnorm", M=512, N=1024)
    weight.weight_dtype.value = "float32"
    assert weight.current_traffic.bytes == traffic.eager_rmsnorm(512, 1024, "bf16",
                                                                 "float32").bytes


def test_n_slider_spans_one_to_262144_on_a_log_scale():
    calc = traffic_calculator("fused_rmsnorm")
    options = list(calc.n_slider.options)
    assert options[0] == 1 and options[-1] == 262144
    assert all(b > a for a, b in zip(options, options[1:], strict=False))
    assert max(b / a for a, b in zip(options, options[1:], strict=False)) <= 2
    calc.n_slider.value = 262144
    assert calc.current_traffic.bytes == traffic.fused_rmsnorm(16384, 262144, "bf16").bytes


def test_a_shape_off_the_scale_is_added_to_the_slider():
    calc = traffic_calculator("fused_rmsnorm", M=1000, N=4097)
    assert calc.shape == (1000, 4097)
    assert calc.current_traffic == traffic.fused_rmsnorm(1000, 4097, "bf16")


def test_plot_marks_the_current_point_and_follows_the_slider():
    calc = traffic_calculator("fused_rmsnorm", M=4096, N=1024, gpu="H100 SXM")
    calc.n_slider.value = 8192
    (marker,) = lines_labelled(calc.figure, "N = 8192")
    expected_us = 1e6 * traffic.fused_rmsnorm(4096, 8192, "bf16").bytes / H100.hbm_bytes_per_s
    assert list(marker.get_xdata()) == [8192]
    assert marker.get_ydata()[0] == pytest.approx(expected_us)
    # The fused kernel moves the ideal bytes: one line says so, no ideal line hides under it.
    (curve,) = lines_labelled(calc.figure, "this variant (= ideal single pass), H100 SXM peak")
    assert list(curve.get_xdata()) == list(calc.n_slider.options)
    assert lines_labelled(calc.figure, "ideal single pass, peak") == []
    assert calc.plot.image.value[:4] == PNG_MAGIC
    two_pass = traffic_calculator("two_pass_rmsnorm", M=4096, N=1024, gpu="H100 SXM")
    assert len(lines_labelled(two_pass.figure, "this variant, H100 SXM peak")) == 1
    assert len(lines_labelled(two_pass.figure, "ideal single pass, peak")) == 1


def test_moving_controls_redraws_one_figure_and_leaves_no_pyplot_figures():
    before = plt.get_fignums()
    calc = traffic_calculator("eager_rmsnorm", M=256, N=256)
    figure = calc.figure
    for n in (512, 1024, 2048, 4096):
        calc.n_slider.value = n
    calc.dtype.value = "float16"
    assert calc.figure is figure and len(figure.axes) == 1
    assert plt.get_fignums() == before


def test_display_hands_over_to_the_ipywidgets_container():
    calc = traffic_calculator("fused_rmsnorm")
    bundle = calc._repr_mimebundle_()
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == calc.widget.model_id


@cpu_only
@pytest.mark.parametrize("fn", [None, lambda x, weight, eps: x])
def test_measure_button_is_disabled_without_a_gpu_and_says_why(fn):
    calc = traffic_calculator("fused_rmsnorm", fn=fn, M=64, N=64)
    assert calc.measure_button.disabled
    assert calc.measure_label.value == NO_GPU_LABEL
    assert calc.measure_label.value == "measuring needs a GPU (predictions above still hold)"
    assert "needs a GPU" in calc.summary_text
    with pytest.raises(hardware.NeedsGPU):
        calc.measure()
    calc.measure_button.click()                 # from code, a disabled button still fires
    assert calc.measure_button.disabled
    assert calc.measure_label.value == NO_GPU_LABEL
    assert calc.measurement is None


@cpu_only
def test_default_gpu_is_the_h100_sxm_without_a_gpu():
    assert traffic_calculator("fused_rmsnorm").gpu.value == "H100 SXM"
    assert roofline_explorer().gpu.value == "H100 SXM"


@pytest.mark.gpu
def test_measure_button_times_the_kernel_and_plots_the_point():
    import rmsnorm_variants

    without_fn = traffic_calculator("fused_rmsnorm", M=256, N=1024)
    assert without_fn.measure_button.disabled
    assert "pass your kernel" in without_fn.measure_label.value

    calc = traffic_calculator("fused_rmsnorm", fn=rmsnorm_variants.correct, M=256, N=1024,
                              dtype="float16")
    assert not calc.measure_button.disabled
    assert calc.measurement is None
    calc.measure_button.click()
    measured = calc.measurement
    assert measured is not None, calc.measure_label.value
    assert measured.nbytes == traffic.fused_rmsnorm(256, 1024, "fp16").bytes
    assert 0 < measured.fraction_of_copy
    assert f"{100 * measured.fraction_of_copy:.1f} % of copy bandwidth" in calc.summary_text
    assert f"{100 * measured.fraction_of_copy:.1f} % of copy bandwidth" \
        in calc.measure_label.value
    (point,) = lines_labelled(calc.figure, "measured (your kernel)")
    assert list(point.get_xdata()) == [1024]
    assert point.get_ydata()[0] == pytest.approx(measured.seconds * 1e6)
    # Another N: the summary drops the measurement, the plot keeps the point.
    calc.n_slider.value = 2048
    assert calc.measurement is None
    assert len(lines_labelled(calc.figure, "measured (your kernel)")) == 1


@pytest.mark.gpu
def test_a_kernel_that_raises_is_reported_and_the_button_stays_usable():
    def broken(x, weight, eps):
        raise RuntimeError("BLOCK_N must be a power of two")

    calc = traffic_calculator("fused_rmsnorm", fn=broken, M=64, N=64)
    calc.measure_button.click()
    assert calc.measure_label.value == ("measurement failed: RuntimeError: BLOCK_N must be "
                                        "a power of two")
    assert not calc.measure_button.disabled
    assert calc.measurement is None


@pytest.mark.parametrize("value, text", [
    (999, "999 B"), (1500, "1.50 kB"), (134_234_112, "134.23 MB"), (2.42e9, "2.42 GB"),
])
def test_bytes_are_shown_in_decimal_units(value, text):
    assert format_bytes(value) == text


@pytest.mark.parametrize("value, text", [
    (3e-9, "3.0 ns"), (4.5e-5, "45.0 us"), (2.5e-3, "2.50 ms"), (1.5, "1.50 s"),
])
def test_times_are_shown_in_a_readable_unit(value, text):
    assert format_seconds(value) == text


# ---------------------------------------------------------------- roofline explorer


@pytest.mark.parametrize("gpu, dtype", [("H100 SXM", "bfloat16"), ("H100 SXM", "float32"),
                                        ("A100 80GB", "float16"), ("T4", "bfloat16")])
def test_roofline_states_the_distance_from_the_ridge(gpu, dtype):
    roof = roofline_explorer(M=8192, N=4096)
    roof.gpu.value = gpu
    roof.dtype.value = dtype
    spec = hardware.lookup(gpu)
    model = traffic.fused_rmsnorm(8192, 4096, dtype)
    distance = traffic.distance_from_ridge(model, spec, dtype)
    ridge = traffic.ridge_point(spec, dtype)
    assert f"{round(distance)}x left of the ridge" in roof.summary_text
    assert f"ridge point for {dtype}: {ridge:.1f} FLOP/byte" in roof.summary_text
    floor = traffic.time_floor_at_peak(model, spec)
    assert f"time floor at peak: {us(floor)}" in roof.summary_text
    assert roof.distance == pytest.approx(distance)


def test_roofline_ridge_on_the_h100_in_bf16_is_about_295():
    roof = roofline_explorer(gpu="H100 SXM", dtype="bfloat16")
    assert roof.ridge == pytest.approx(989e12 / 3350e9)
    assert "295x left of the ridge" in roof.summary_text  # bf16 fused RMSNorm: 1 FLOP/byte


@pytest.mark.parametrize("kernel, model", [
    ("rmsnorm", traffic.fused_rmsnorm), ("layernorm", traffic.layernorm),
    ("add_rmsnorm", traffic.fused_add_rmsnorm), ("backward", traffic.rmsnorm_backward),
])
def test_roofline_kernel_choice_places_the_models_intensity(kernel, model):
    roof = roofline_explorer(M=2048, N=2048, dtype="float16", gpu="A100 40GB")
    roof.kernel.value = kernel
    expected = model(2048, 2048, "fp16")
    assert roof.current_traffic == expected
    assert f"{expected.intensity:.3f} FLOP/byte" in roof.summary_text
    point = next(line for line in roof.figure.axes[0].lines
                 if line.get_label().endswith("FLOP/B"))
    assert point.get_xdata()[0] == pytest.approx(expected.intensity)
    spec = hardware.lookup("A100 40GB")
    ridge = traffic.ridge_point(spec, "fp16")
    ridge_markers = [line for line in roof.figure.axes[0].lines
                     if list(line.get_xdata()) == [ridge]]
    assert ridge_markers and ridge_markers[0].get_ydata()[0] == spec.peak_flops(torch.float16)


def test_roofline_shape_sliders_reach_the_model():
    roof = roofline_explorer()
    roof.m_slider.value = 3
    roof.n_slider.value = 12
    assert roof.current_traffic == traffic.fused_rmsnorm(3, 12, "bf16")


def test_roofline_refuses_an_unknown_kernel():
    with pytest.raises(ValueError, match="unknown kernel 'softmax'.*rmsnorm, layernorm"):
        roofline_explorer(kernel="softmax")


# ---------------------------------------------------------------- reduction


ROW = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]  # 15 values: not a power of two


@pytest.mark.parametrize("mode", ["tree", "shuffle"])
@pytest.mark.parametrize("threads", [2, 4, 8, 16, 32, 64])
def test_reduction_ends_with_the_rows_sum_in_log2_steps(mode, threads):
    steps = reduction_schedule(ROW, threads, mode)
    assert steps[-1].after[0] == sum(ROW)
    assert sum(step.combines for step in steps) == int(math.log2(threads))
    # Step 0: thread t summed elements t, t + threads, ... (zeros past the end of the row).
    assert list(steps[0].after) == [sum(ROW[t::threads]) for t in range(threads)]


@pytest.mark.parametrize("threads", [2, 8, 32, 64])
def test_tree_needs_a_barrier_after_the_writes_and_after_every_level(threads):
    steps = reduction_schedule(ROW, threads, "tree")
    assert sum(step.barrier for step in steps) == int(math.log2(threads)) + 1


@pytest.mark.parametrize("threads, barriers", [(2, 0), (8, 0), (32, 0), (64, 2)])
def test_shuffles_need_no_barrier_within_a_warp_and_two_across_warps(threads, barriers):
    steps = reduction_schedule(ROW, threads, "shuffle")
    assert sum(step.barrier for step in steps) == barriers


@pytest.mark.parametrize("mode", ["tree", "shuffle"])
@pytest.mark.parametrize("threads", [2, 32, 64])
def test_every_thread_ends_with_the_total_as_a_norm_needs(mode, threads):
    steps = reduction_schedule(ROW, threads, mode)
    assert list(steps[-1].after) == [sum(ROW)] * threads
    if threads > 32 or mode == "tree":
        # The total reaches the other threads through shared memory, read after a barrier.
        assert not steps[-1].combines and set(steps[-1].edges) == {(0, t) for t in
                                                                    range(threads)}


def test_tree_level_adds_the_upper_half_into_the_lower_half():
    steps = reduction_schedule(ROW, 8, "tree")
    first = [sum(ROW[t::8]) for t in range(8)]
    assert list(steps[1].after[:4]) == [first[t] + first[t + 4] for t in range(4)]
    assert steps[1].live == (True,) * 4 + (False,) * 4
    assert set(steps[1].edges) == {(t, t) for t in range(4)} | {(t + 4, t) for t in range(4)}


def test_butterfly_leaves_the_warps_sum_in_every_lane():
    steps = reduction_schedule(ROW, 16, "shuffle")
    first = [sum(ROW[t::16]) for t in range(16)]
    assert list(steps[1].after) == [first[lane] + first[lane ^ 8] for lane in range(16)]
    assert list(steps[-1].after) == [sum(ROW)] * 16


@pytest.mark.parametrize("kwargs, phrase", [
    ({"threads": 3, "mode": "tree"}, "threads must be a power of two"),
    ({"threads": 1, "mode": "tree"}, "threads must be a power of two, at least 2"),
    ({"threads": 8, "mode": "atomic"}, "mode must be one of tree, shuffle"),
])
def test_reduction_schedule_refuses_bad_arguments(kwargs, phrase):
    with pytest.raises(ValueError, match=phrase):
        reduction_schedule(ROW, **kwargs)


def test_visualiser_steps_through_to_the_rows_sum():
    viz = reduction_visualiser(length=16, threads=8, mode="tree", seed=1)
    row = viz.row
    assert len(row) == 16
    assert viz.levels == 3 and viz.barriers == 4
    assert "barriers (__syncthreads): 4" in viz.summary_text
    assert viz.step.max == 4
    viz.next_button.click()
    viz.next_button.click()
    assert viz.step.value == 2
    viz.prev_button.click()
    assert viz.step.value == 1
    viz.step.value = viz.step.max
    assert viz.partials_at(viz.step.max)[0] == sum(row)
    assert f"lane 0 holds {sum(row)}, which equals the row's sum {sum(row)}" \
        in viz.summary_text
    # The numbers are drawn: every value of the last step appears in a box.
    shown = {text.get_text() for text in viz.figure.axes[0].texts}
    assert {str(v) for v in viz.partials_at(viz.step.max)} <= shown


def test_visualiser_shuffle_mode_reports_no_barrier_in_one_warp_and_two_for_two():
    viz = reduction_visualiser(length=40, threads=32, mode="tree")
    viz.mode.value = "shuffle"
    assert viz.barriers == 0 and viz.levels == 5
    assert "barriers (__syncthreads): 0" in viz.summary_text
    viz.threads.value = 64
    assert viz.barriers == 2 and viz.levels == 6
    assert "one before every thread reads the total back" in viz.summary_text
    viz.step.value = viz.step.max
    assert viz.result == sum(viz.row)


def test_visualiser_controls_rebuild_the_schedule():
    viz = reduction_visualiser(length=16, threads=16)
    viz.step.value = viz.step.max
    viz.threads.value = 2                      # fewer steps: the step slider is clamped
    assert viz.step.max == 2 and viz.step.value == 2
    viz.length.value = 64
    assert len(viz.row) == 64 and viz.result == sum(viz.row)
    old_row = viz.row
    viz.new_row_button.click()
    assert viz.row != old_row and viz.result == sum(viz.row)
    with pytest.raises(ValueError, match="step must be from 0 to 2"):
        viz.partials_at(5)


@pytest.mark.parametrize("kwargs, phrase", [
    ({"length": 7}, "length must be an int from 8 to 64"),
    ({"threads": 128}, "threads must be one of"),
    ({"mode": "warp"}, "mode must be one of tree, shuffle"),
])
def test_visualiser_refuses_bad_arguments(kwargs, phrase):
    with pytest.raises(ValueError, match=phrase):
        reduction_visualiser(**kwargs)
