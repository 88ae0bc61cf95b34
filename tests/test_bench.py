"""Timing and bandwidth bookkeeping (the numbers themselves only mean something on a GPU)."""

from __future__ import annotations

import time
import weakref

from course import bench, runtime

import matplotlib
import pytest
import torch

matplotlib.use("Agg")


def test_time_fn_times_every_repetition_after_warmup():
    calls = []
    timing = bench.time_fn(lambda: calls.append(1), warmup=3, reps=7)
    assert len(calls) == 10 and len(timing.times_s) == 7
    assert timing.min_s <= timing.median_s <= timing.quantile_s(0.99)


def test_time_fn_refuses_zero_reps():
    with pytest.raises(ValueError, match="reps must be at least 1"):
        bench.time_fn(lambda: None, reps=0)


def test_rotating_inputs_are_distinct_copies_used_in_turn():
    made, seen = [], []

    def make_args():
        made.append(len(made))
        return (made[-1],)

    bench.time_rotating(seen.append, make_args, bytes_per_call=1 << 20, warmup=0, reps=6)
    assert len(made) == bench.copies_needed(1 << 20) >= 2
    assert seen[:2] == [0, 1] and len(set(seen)) == min(6, len(made))


@pytest.mark.skipif(runtime.on_gpu(), reason="without a GPU there is no L2 to outrun")
def test_without_a_gpu_two_copies_suffice_and_no_fraction_is_claimed():
    assert bench.copies_needed(10) == 2
    m = bench.measure("noop", lambda x: None, lambda: (0,), nbytes=1000, warmup=0, reps=3)
    assert m.fraction_of_copy is None and "% of copy" not in str(m)


def test_measurement_converts_time_and_bytes_into_bandwidth():
    m = bench.Measurement("k", seconds=1e-3, nbytes=2_000_000_000, copy_bytes_per_s=4e12)
    assert m.gbps == pytest.approx(2000)
    assert m.fraction_of_copy == pytest.approx(0.5)
    assert "50.0 % of copy bandwidth" in str(m)


def test_sweep_flattens_and_plot_draws_one_line_per_label():
    def run_point(n):
        return [bench.Measurement("ours", 1e-3, n * 1000, 1e10, {"N": n}),
                bench.Measurement("eager", 2e-3, n * 1000, 1e10, {"N": n})]

    ms = bench.sweep([256, 1024, 4096], run_point, desc="test")
    assert len(ms) == 6
    ax = bench.plot_fraction_of_copy(ms)
    lines = {line.get_label(): line.get_ydata().tolist() for line in ax.get_lines()}
    assert lines["ours"] == pytest.approx([2.56, 10.24, 40.96])
    assert lines["eager"] == pytest.approx([1.28, 5.12, 20.48])


def test_enough_outputs_are_held_to_outrun_l2_and_none_past_it():
    mib = 2**20
    assert bench.outputs_to_hold(16 * mib, l2_bytes=50 * mib) == 10  # 160 MiB >= 3 x L2
    assert bench.outputs_to_hold(100 * mib, l2_bytes=50 * mib) == 2
    assert bench.outputs_to_hold(150 * mib, l2_bytes=50 * mib) == 0  # one alone outruns L2
    assert bench.outputs_to_hold(1, l2_bytes=50 * mib) == 64  # capped
    assert bench.outputs_to_hold(16 * mib, l2_bytes=0) == 0  # no GPU, no L2
    assert bench.result_bytes((torch.empty(10, dtype=torch.bfloat16), None,
                               torch.empty(3, dtype=torch.float32))) == 32


def test_the_latest_outputs_stay_alive_so_no_repetition_reuses_fresh_memory(monkeypatch):
    # Outputs freed at once would come back from the allocator as the next call's output,
    # still in L2, and that call's writes would be cheaper than a real one's.
    monkeypatch.setattr(bench.hardware, "l2_bytes", lambda: 4000)  # 3 x L2 = 12 outputs
    refs, alive_before_each_call = [], []

    def fresh_output():
        alive_before_each_call.append(sum(r() is not None for r in refs))
        out = torch.empty(1000, dtype=torch.uint8)
        refs.append(weakref.ref(out))
        return out

    bench.time_fn(fresh_output, warmup=2, reps=20)
    assert alive_before_each_call == list(range(13)) + [12] * 9


def test_time_in_turn_refuses_an_unknown_timer():
    with pytest.raises(ValueError,
                       match="timer must be one of call, graph, eager, host, got 'wall'"):
        bench.time_in_turn([lambda: None], reps=1, timer="wall")
    with pytest.raises(ValueError, match="at least one call"):
        bench.time_graph([], reps=1)


@pytest.mark.skipif(runtime.on_gpu(), reason="tests the CPU stand-in for a graph")
def test_without_a_gpu_the_graph_timer_runs_the_calls_back_to_back():
    # One slow call among three: each repetition is the three calls' time over three.
    ran = []

    def slow():
        ran.append("slow")
        time.sleep(0.006)

    timing = bench.time_in_turn([slow, lambda: ran.append("a"), lambda: ran.append("b")],
                                reps=4, timer="graph")
    assert ran == ["slow", "a", "b"] * 4 and len(timing.times_s) == 4
    assert all(0.002 <= t < 0.006 for t in timing.times_s)


@pytest.mark.gpu
def test_on_a_gpu_the_graph_timer_leaves_out_each_calls_start_and_drain():
    # A short copy: timed alone, each call also pays for an idle GPU starting and draining
    # a kernel; back to back in a graph it does not, and a long copy's time barely moves.
    short = [torch.randn(4 << 20, device="cuda") for _ in range(8)]  # 16 MB each
    calls = [lambda a=a: a.clone() for a in short]
    alone = bench.time_in_turn(calls, warmup=3, reps=40, hide_launch=True).median_s
    graph = bench.time_in_turn(calls, reps=20, timer="graph").median_s
    assert graph < alone - 1e-6
    one = torch.zeros(1, device="cuda")
    tiny = [lambda: one + 1]  # a kernel with next to nothing to do
    assert bench.time_graph(tiny, reps=10).median_s < bench.time_fn(
        tiny[0], warmup=3, reps=20, hide_launch=True).median_s
    with pytest.raises(RuntimeError):  # a call that synchronises cannot be captured
        bench.time_graph([lambda: (one + 1).item()], reps=1)
    assert bench.time_graph(tiny, reps=2).median_s > 0  # and the GPU works on afterwards


@pytest.mark.gpu
def test_on_a_gpu_a_backward_whose_forward_ran_on_the_graph_stream_is_captured():
    # The bench's backward cells time torch.autograd.grad through a graph built once.
    with bench.graph_stream():
        x = torch.randn(4096, 1024, device="cuda", requires_grad=True)
        y = torch.nn.functional.rms_norm(x, (1024,))
        dy = torch.randn_like(y)
        calls = [lambda: torch.autograd.grad(y, x, dy, retain_graph=True)]
        assert bench.time_graph(calls, reps=3).median_s > 0
        (dx,) = calls[0]()
    torch.cuda.synchronize()
    assert torch.isfinite(dx).all() and dx.abs().sum() > 0


@pytest.mark.skipif(runtime.on_gpu(), reason="tests what happens without a GPU")
def test_without_a_gpu_the_graph_stream_changes_nothing():
    with bench.graph_stream():
        assert bench.time_graph([lambda: None], reps=2).median_s >= 0
