"""Chapter 08's plots (`course.lab_plots`): the experiments draw recorded and live sweeps
with the same functions, so a live panel of a few launches, failed launches, and the small
shapes timed for the host must all come out right. The notebook's recorded branch runs in
tests/test_notebooks.py; its live branch needs a GPU, so the plots it calls are fed here
with points shaped as that branch makes them."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import course  # noqa: F401  (picks the mode before anything imports Triton)
from course import lab_plots, lab_sweeps

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "ch08_performance_lab" / "ch08_performance_lab.ipynb"
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


# ------------------------------------------------ experiment 5: calls replayed from a graph

ALL_BARS = lab_plots.HOST_BARS + lab_plots.GRAPH_BARS
SHAPE = (64, 1024)


def small_shape(timer: str, impl: str, fraction: float, n_cols: int = SHAPE[1]):
    return point(n_cols, fraction, impl=impl, timer=timer, n_rows=SHAPE[0],
                 num_warps=0 if impl == "torch.compile" else 4)


def timers_at_small_shape(*timers: str) -> list[lab_sweeps.SweepPoint]:
    fractions = {"gpu": 0.02, "call": 0.002, "graph": 0.04}
    return [small_shape(t, i, fractions[t]) for t in timers for i in ("lab", "torch.compile")]


def test_graph_bars_are_drawn_only_when_asked_so_the_first_plot_spoils_no_prediction():
    points = timers_at_small_shape("gpu", "call", "graph")
    assert "lab, CUDA graph" not in lab_plots.small_shape_times(points, SHAPE)
    times = lab_plots.small_shape_times(points, SHAPE, ALL_BARS)
    assert times["lab, CUDA graph"] == pytest.approx(times["lab, GPU time"] / 2)
    assert times["torch.compile, CUDA graph"] < times["torch.compile, launch counted"]
    fig = lab_plots.host_overhead({"H200": points}, [SHAPE])
    assert "lab, CUDA graph" not in fig.axes[0].get_legend_handles_labels()[1]
    fig = lab_plots.host_overhead({"H200": points}, [SHAPE], ALL_BARS)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels[-2:] == ["lab, CUDA graph", "torch.compile, CUDA graph"]


def test_a_gpu_whose_recording_has_no_graph_points_says_so_in_its_panel():
    with_graph = timers_at_small_shape("gpu", "call", "graph")
    without = timers_at_small_shape("gpu", "call")
    assert lab_plots.not_recorded(with_graph, [SHAPE]) == []
    assert lab_plots.not_recorded(without, [SHAPE]) == ["lab, CUDA graph",
                                                        "torch.compile, CUDA graph"]
    # a failed graph point is not a recorded figure
    failed = [*without, small_shape("graph", "lab", None)]
    assert lab_plots.not_recorded(failed, [SHAPE]) == ["lab, CUDA graph",
                                                       "torch.compile, CUDA graph"]
    fig = lab_plots.host_overhead({"H100": without, "H200": with_graph}, [SHAPE], ALL_BARS)
    h100, h200 = (ax.get_title() for ax in fig.axes[:2])
    assert "not recorded on this GPU" in h100 and "lab, CUDA graph" in h100
    assert "not recorded" not in h200


def test_the_graph_reading_is_computed_from_the_points_or_says_none_was_recorded():
    points = timers_at_small_shape("gpu", "call", "graph")
    times = lab_plots.small_shape_times(points, SHAPE, ALL_BARS)
    lab, compiled = lab_plots.graph_reading(points, SHAPE)
    assert lab.startswith(f"lab: {times['lab, CUDA graph']:.1f} us a call replayed")
    assert "0.50 x its GPU time" in lab and f"({times['lab, GPU time']:.1f} us)" in lab
    assert "took 20.0 x" in lab  # launch counted: 0.002 of copy against the graph's 0.04
    assert compiled.startswith("torch.compile: ")
    missing = lab_plots.graph_reading(timers_at_small_shape("gpu", "call"), SHAPE)
    assert missing == ["no CUDA graph's replay was recorded on this GPU"]
    half = lab_plots.graph_reading([*timers_at_small_shape("gpu", "call"),
                                    small_shape("graph", "lab", 0.04)], SHAPE)
    assert half[0].startswith("lab: ") and half[1] == (
        "torch.compile: a CUDA graph's replay was not recorded on this GPU")


def test_a_value_a_panel_lacks_is_shown_as_the_caller_says(capsys):
    measured = {"H100": {"lab, GPU time": 4.6}, "H200": {"lab, GPU time": 4.4,
                                                         "lab, CUDA graph": 2.0}}
    lab_plots.against_prediction("us", {"lab, CUDA graph": 3}, measured,
                                 show=lambda us: f"{us:.1f}", missing="not recorded")
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["lab,", "CUDA", "graph", "3", "not", "recorded", "2.0"]


def test_the_chapter_predicts_the_bars_it_plots():
    """The prediction cells' keys are the bar labels, or a prediction never meets a figure."""
    nb = json.loads(NOTEBOOK.read_text())
    cells = {c["id"]: "".join(c["source"]) for c in nb["cells"]}
    names: dict = {}
    exec(cells["e5-predict"] + "\n" + cells["e5-graph-predict"], names)
    assert set(names["predicted_us"]) <= {label for *_, label in lab_plots.HOST_BARS}
    assert set(names["predicted_graph_us"]) == {label for *_, label in lab_plots.GRAPH_BARS}
    assert "torch.cuda.graph(" in cells["e5-graph-capture"]
    assert "graph.replay()" in cells["e5-graph-capture"]


# ------------------------------------------------ recording and adding graph points

def test_merged_replaces_a_point_recorded_again_and_adds_the_new_ones_after():
    old = timers_at_small_shape("gpu", "call")
    again = small_shape("call", "lab", 0.004)
    graph = timers_at_small_shape("graph")
    out = lab_sweeps.merged(old, [again, *graph])
    assert len(out) == len(old) + 2
    assert out[old.index(small_shape("call", "lab", 0.002))] is again
    assert out[-2:] == graph
    with pytest.raises(ValueError, match="timer is one of gpu, call, graph"):
        lab_sweeps.merged(old, [small_shape("host", "lab", 0.1)])


def test_merging_writes_the_recorded_file_back_unchanged_but_for_the_points_added(tmp_path):
    sweep_lab = _sweep_lab()
    into = tmp_path / "lab-sweep-h200.csv"
    into.write_bytes(lab_sweeps.SWEEP_FILES["H200"].read_bytes())
    nothing = tmp_path / "nothing.csv"
    lab_sweeps.write([], nothing)
    sweep_lab.merge(nothing, into)
    assert into.read_bytes() == lab_sweeps.SWEEP_FILES["H200"].read_bytes()
    new = tmp_path / "graph.csv"
    # a shape the recorded file has no point at, so that the two are added, not replacing
    graph = [dataclasses.replace(p, gpu="H200", n_rows=3) for p in timers_at_small_shape("graph")]
    lab_sweeps.write(graph, new)
    sweep_lab.merge(new, into)
    merged = list(lab_sweeps.read(into))
    assert merged[-2:] == graph
    assert len(merged) == len(lab_sweeps.load("H200")) + 2
    lab_sweeps.write([dataclasses.replace(p, gpu="H100") for p in graph], new)
    with pytest.raises(SystemExit, match="one GPU's"):
        sweep_lab.merge(new, into)


def test_the_small_shapes_are_recorded_with_every_timer_asked_for(monkeypatch):
    sweep_lab = _sweep_lab()
    monkeypatch.setattr(sweep_lab.torch, "compile", lambda fn, **_: fn)
    monkeypatch.setattr(sweep_lab.torch._dynamo, "reset", lambda: None)

    class Recorder:
        def __init__(self):
            self.asked = []

        def time(self, impl, timer, dtype, n_rows, n_cols, fields, fn):
            self.asked.append((impl, timer, n_rows, n_cols))
            return point(n_cols, 0.1, impl=impl, timer=timer, n_rows=n_rows)

    rec = Recorder()
    sweep_lab.small_shapes(rec, ("graph",), Launch, lambda *a, **k: None)
    assert sorted(rec.asked) == sorted((impl, "graph", m, n)
                                       for m, n in lab_sweeps.CALL_SHAPES
                                       for impl in ("lab", "torch.compile"))
    # on a GPU the notebook's own capture cell is run beside them, as a check of that cell
    assert sweep_lab.notebook_graph_timer().__name__ == "graph_seconds_per_call"


@dataclasses.dataclass(frozen=True)
class Launch:  # the fields of chapter 08's Launch, enough for the plan
    rows_per_tile: int = 1
    num_warps: int = 4
    num_stages: int = 1
    programs_per_sm: int = 0
    chunk_n: int = 0


def _sweep_lab():
    spec = importlib.util.spec_from_file_location("sweep_lab", ROOT / "scripts" / "sweep_lab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
