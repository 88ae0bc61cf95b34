"""Chapter 08's plots (`course.lab_plots`): the experiments draw recorded and live sweeps
with the same functions, so a live panel of a few launches, failed launches, and the small
shapes timed for the host must all come out right. The notebook's recorded branch runs in
tests/test_notebooks.py; its live branch needs a GPU, so the plots it calls are fed here
with points shaped as that branch makes them."""

from __future__ import annotations

import math

import course  # noqa: F401  (picks the mode before anything imports Triton)
from course import lab_plots, lab_sweeps

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ENV = dict(gpu="this GPU", device_name="a GPU", torch="t", triton="t", date="d",
           dtype="bfloat16", copy_gbps=3000.0)


def point(n_cols: int, fraction: float | None, *, impl: str = "lab", timer: str = "gpu",
          n_rows: int | None = None, **launch) -> lab_sweeps.SweepPoint:
    """A sweep point as the notebook's live_point makes it; fraction None: a failed launch."""
    n_rows = lab_sweeps.rows_for(n_cols) if n_rows is None else n_rows
    fields = lab_sweeps.normalized(lab_sweeps.launch(**launch))
    values = dict(ENV, impl=impl, timer=timer, n_rows=n_rows, n_cols=n_cols, **fields)
    if fraction is None:
        return lab_sweeps.nan_point(**values, status="failed: OutOfResources")
    nbytes = 2 * (2 * n_rows * n_cols + n_cols)
    return lab_sweeps.SweepPoint(**values, seconds=nbytes / (fraction * 3e12),
                                 fraction_of_copy=fraction, status="ok")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_the_fastest_launch_is_chosen_and_small_shapes_are_not_mistaken_for_it():
    points = [point(4096, 0.90, num_warps=4), point(4096, 0.97, num_warps=8),
              # a call on 1 row takes microseconds: fastest in seconds, not a sweep point
              point(4096, 0.02, n_rows=1, num_warps=16), point(4096, None, num_warps=32)]
    best = lab_plots.best_one_per_tile(points, 4096)
    assert (best.num_warps, best.fraction_of_copy) == (8, 0.97)
    assert lab_plots.best_chunked(points, 4096) is None
    assert lab_plots.best_persistent(points, 4096) is None


def test_persistent_and_chunked_launches_are_told_apart_from_one_program_per_tile():
    points = [point(256, 0.98, rows_per_tile=16, num_warps=16),
              point(256, 0.94, rows_per_tile=16, num_warps=16, programs_per_sm=2, num_stages=3),
              point(65536, 0.33, num_warps=16), point(65536, 0.66, num_warps=16, chunk_n=8192,
                                                      num_stages=3)]
    assert lab_plots.best_one_per_tile(points, 256).programs_per_sm == 0
    assert lab_plots.best_persistent(points, 256).programs_per_sm == 2
    assert lab_plots.best_chunked(points, 65536).chunk_n == 8192
    assert lab_plots.best_one_per_tile(points, 65536).chunk_n == 0


def test_a_failed_launch_is_drawn_on_the_axis_not_left_out():
    points = [point(16384, 0.33, num_warps=2), point(16384, 0.91, num_warps=4),
              point(16384, None, num_warps=8)]
    fig = lab_plots.warps({"this GPU": points}, [16384])
    (ax,) = fig.axes
    timed, failed = ax.lines
    assert list(timed.get_xdata()) == [2, 4] and list(timed.get_ydata()) == [33, 91]
    assert list(failed.get_xdata()) == [8] and list(failed.get_ydata()) == [0]
    assert failed.get_marker() == "x" and failed.get_color() == timed.get_color()


def test_every_experiment_draws_a_panel_per_gpu_even_when_a_live_panel_has_few_points():
    recorded = [point(n, 0.9, rows_per_tile=r, num_warps=w)
                for n in (256, 1024, 4096, 16384, 65536) for r in (1, 2) for w in (4, 8)]
    recorded += [point(n, 0.7, num_warps=16, chunk_n=8192, num_stages=3)
                 for n in (16384, 65536)]
    recorded += [point(256, 0.9, rows_per_tile=2, num_warps=4, programs_per_sm=p,
                       num_stages=s) for p in (1, 2) for s in (1, 3)]
    recorded += [point(n, 0.95, impl="torch.compile", num_warps=0) for n in (256, 65536)]
    recorded += [point(4096, f, impl=i, timer=t, n_rows=64, num_warps=w)
                 for i, w in (("lab", 4), ("torch.compile", 0))
                 for t, f in (("gpu", 0.1), ("call", 0.01))]
    live = [point(1024, 0.95, num_warps=4)]  # a learner who ran one cell on their GPU
    panels = {"H100": recorded, "this GPU": live}
    figures = [lab_plots.warps(panels, [1024, 16384]), lab_plots.rows_per_tile(panels, [256]),
               lab_plots.persistent(panels, 256), lab_plots.whole_vs_chunked(panels, 0, 0.67),
               lab_plots.host_overhead(panels, [(64, 4096)]),
               lab_plots.compile_vs_lab(panels, 1024)]
    for fig in figures:
        titles = [ax.get_title() for ax in fig.axes]
        assert [t.splitlines()[0] for t in titles] == ["H100", "this GPU"], titles
    assert lab_plots.small_shape_times(live, (64, 4096)) == {}
    times = lab_plots.small_shape_times(recorded, (64, 4096))
    assert set(times) == {"bytes at copy bandwidth", *(bar for *_, bar in lab_plots.HOST_BARS)}
    assert times["bytes at copy bandwidth"] < times["lab, GPU time"] < times["lab, launch counted"]


def test_no_panel_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="at least one panel"):
        lab_plots.warps({}, [1024])


def test_a_prediction_is_set_beside_each_gpu_and_an_empty_one_is_pointed_out(capsys):
    best = {"H100": {1024: point(1024, 0.97, num_warps=2)},
            "H200": {1024: point(1024, 0.96, num_warps=4)}}
    show = lambda p: f"{p.num_warps} ({lab_plots.percent(p)})"  # noqa: E731
    lab_plots.against_prediction("best num_warps", {1024: 8, 4096: None}, best, show=show)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["best", "num_warps", "you", "H100", "H200"]
    assert lines[1].split() == ["1024", "8", "2", "(97.0", "%)", "4", "(96.0", "%)"]
    assert lines[2].split() == ["4096", "-", "-", "-"]
    lab_plots.against_prediction("best num_warps", {1024: None}, best, show=show)
    assert "no prediction written" in capsys.readouterr().out


def test_percent_says_why_a_point_has_no_figure():
    assert lab_plots.percent(None) == "not timed"
    assert lab_plots.percent(point(1024, None)) == "failed"
    assert lab_plots.percent(point(1024, 0.5)) == "50.0 %"
    assert math.isnan(point(1024, None).fraction_of_copy)
