"""`course bench`'s machinery without a GPU: bytes, inputs, the reference check, the table,
the plot, and the recorded run shipped with the package."""

import course  # noqa: F401  (mode first)
from course import baselines, bench, peers, shootout, traffic

import pytest
import torch


def test_ideal_bytes_are_the_traffic_models_single_pass():
    bf16 = torch.bfloat16
    assert shootout.ideal_bytes("rmsnorm_fwd", 64, 256, bf16) == 2 * 64 * 256 * 2 + 256 * 2
    assert shootout.ideal_bytes("add_rmsnorm_fwd", 64, 256, bf16) == (
        traffic.fused_add_rmsnorm(64, 256, bf16).bytes)
    assert shootout.ideal_bytes("layernorm_fwd", 64, 256, bf16) == 2 * 64 * 256 * 2 + 2 * 256 * 2
    assert shootout.ideal_bytes("rmsnorm_bwd", 64, 256, bf16) == 3 * 64 * 256 * 2 + 2 * 256 * 2
    with pytest.raises(ValueError, match="unknown op"):
        shootout.ideal_bytes("softmax", 1, 1, bf16)


@pytest.mark.parametrize("op", peers.OPS)
def test_every_op_has_inputs_and_a_float64_answer(op):
    t = shootout.make_inputs(op, 8, 64, torch.float32)
    want = shootout.expected(op, t, 1e-6)
    assert all(w.dtype == torch.float64 for w in want)
    assert ("dy" in t) == op.endswith("_bwd")


def test_eager_rmsnorm_passes_the_reference_check_and_a_wrong_one_does_not():
    t = shootout.make_inputs("rmsnorm_fwd", 16, 256, torch.float32)
    want = shootout.expected("rmsnorm_fwd", t, 1e-6)
    assert shootout._first_mismatch("rmsnorm_fwd", baselines.eager_rmsnorm(
        t["x"], t["weight"]), want, torch.float32) is None
    problem = shootout._first_mismatch("rmsnorm_fwd", t["x"], want, torch.float32)
    assert problem is not None and "y" in problem


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_hf_style_double_rounding_is_accepted_but_a_scaled_row_is_not(dtype):
    # x * rstd rounded to 16 bits before the weight shifts rows by up to one unit of the
    # last place: accepted. (bf16 row scales are judged on a GPU only: the interpreter
    # truncates bf16, so on a CPU the check is off and only the first half applies.)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4096, generator=gen).to(dtype)
    w = (torch.rand(4096, generator=gen) + 0.5).to(dtype)
    want = shootout.expected("rmsnorm_fwd", {"x": x, "weight": w}, 1e-6)
    assert shootout._first_mismatch("rmsnorm_fwd", baselines.eager_rmsnorm(x, w), want,
                                     dtype) is None
    if dtype == torch.float16 or course.on_gpu():
        # every row off by a common factor within the element tolerance (0.1 % in fp16,
        # 0.5 % in bf16: what 16-bit statistics do), above the accepted shift: refused
        scaled = (want[0] * (1.001 if dtype == torch.float16 else 1.005)).to(dtype)
        assert "common factor" in shootout._first_mismatch("rmsnorm_fwd", scaled, want, dtype)


def test_column_sums_are_judged_against_their_largest_entry():
    want = torch.tensor([1000.0, 1e-3, -500.0], dtype=torch.float64)
    near = (want + torch.tensor([0.01, 0.01, 0.0], dtype=torch.float64)).float()
    assert shootout.column_sum_error("dw", near, want, torch.float32) is None
    assert "max error" in shootout.column_sum_error("dw", (want * 1.01).float(), want,
                                                    torch.float32)


def _rows():
    # 1000 bytes in 10 ns: 100 GB/s, 90 % of a 111 GB/s copy
    return [shootout.Row("rmsnorm_fwd", "ours", "bfloat16", 32768, 256, 1000, "ok", 1e-8, 100.0,
                         0.9, wall_s=2.5),
            shootout.Row("rmsnorm_fwd", "Liger", "bfloat16", 32768, 256, 1000,
                         "unavailable: not installed")]


def test_table_shows_fractions_and_reasons(tmp_path):
    table = shootout.format_table(_rows(), "rmsnorm_fwd", "bfloat16")
    assert "| 32768 x 256 | 90.0 % (100; 0.0 us) | unavailable |" in table
    shootout.plot(_rows(), tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000


@pytest.mark.parametrize("timer", ["call", "graph"])
@pytest.mark.parametrize("ops", [1, 2, 3, 5], ids=lambda n: f"{n}-ops")
def test_the_plot_legend_lies_inside_the_figure(tmp_path, ops, timer):
    # Every implementation named, the timer said, and nothing of the legend cut off at the
    # figure's edge, however many panels the ops fill.
    names = ["ours", "torch.compile", "Liger", "Quack", "torch eager (op by op)"]
    rows = [shootout.Row(op, name, "bfloat16", 32768, n, 1000, "ok", 1e-8, 100.0, 0.5 + i / 20)
            for op in peers.OPS[:ops] for i, name in enumerate(names) for n in (256, 1024)]
    fig = shootout.plot(rows, tmp_path / "p.png", timer=timer)
    (legend,) = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert [t.get_text() for t in legend.get_texts()] == names
    assert legend.get_title().get_text() == shootout.TIMER_TITLES[timer]
    assert set(shootout.TIMER_TITLES) == set(bench.TIMERS)
    box, page = legend.get_window_extent(), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1


def test_a_saved_run_loads_back_and_becomes_measurements(tmp_path):
    shootout.save(_rows(), {"gpu": "test"}, tmp_path)
    rows = shootout.load_rows(tmp_path / "bench.csv")
    assert rows == _rows()
    (m,) = shootout.as_measurements(rows, "rmsnorm_fwd", "bfloat16")
    assert m.extra["N"] == 256 and m.fraction_of_copy == pytest.approx(0.9)
    # a run saved before cells recorded their wall time still loads
    lines = (tmp_path / "bench.csv").read_text().splitlines()
    (tmp_path / "old.csv").write_text("\n".join(line.rsplit(",", 1)[0] for line in lines))
    assert [r.wall_s for r in shootout.load_rows(tmp_path / "old.csv")] == [None, None]


def test_each_cell_records_its_wall_time():
    # what a cell costs the run (compiling, checking, timing), so that a run can be planned
    # to fit the GPU machine's time limit per call
    (row,) = shootout.run_point("rmsnorm_fwd", 4, 64, torch.float32, impls=["ours"], reps=2,
                                copy=1e9)
    assert row.status == "ok" and row.wall_s > 0


@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_a_recorded_run_of_each_gpu_ships_with_the_package(gpu):
    path, recorded_on = shootout.RECORDED_RUNS[gpu]
    assert gpu in recorded_on
    rows = shootout.load_rows(path)
    ours = [r for r in rows if r.impl == "ours"]
    assert ours and all(r.status == "ok" for r in ours)  # every shape checked and timed
    assert {r.op for r in ours} == set(peers.OPS)
    copy = {round(r.gbps / r.fraction_of_copy) for r in rows if r.status == "ok"}
    assert len(copy) == 1  # one run, one copy bandwidth
    assert (shootout.RECORDED_RUN, shootout.RECORDED_ON) == shootout.RECORDED_RUNS["H100"]


def test_peers_ours_first_and_missing_libraries_reported_not_dropped():
    impls = peers.implementations("rmsnorm_fwd")
    assert impls[0].name == "ours"
    assert {"torch eager (op by op)", "torch.compile", "Liger", "Quack"} <= {
        i.name for i in impls}
    t = shootout.make_inputs("rmsnorm_fwd", 4, 64, torch.float32)
    call = impls[0].prepare(t, 1e-6)
    assert shootout._first_mismatch("rmsnorm_fwd", call(), shootout.expected(
        "rmsnorm_fwd", t, 1e-6), torch.float32) is None
    liger = next(i for i in impls if i.name == "Liger")
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        with pytest.raises(peers.Unavailable, match="not installed"):
            liger.prepare(t, 1e-6)
    with pytest.raises(ValueError, match="unknown op"):
        peers.implementations("softmax")


def test_backward_adapter_returns_one_gradient_per_input():
    t = shootout.make_inputs("layernorm_bwd", 4, 64, torch.float32)
    grads = peers.implementations("layernorm_bwd")[0].prepare(t, 1e-5)()
    assert shootout._first_mismatch("layernorm_bwd", grads, shootout.expected(
        "layernorm_bwd", t, 1e-5), torch.float32) is None


@pytest.mark.skipif(course.on_gpu(), reason="tests the message shown without a GPU")
def test_bench_command_needs_a_gpu_and_names_bad_ops(capsys):
    from course import cli

    assert cli.main(["bench", "--ops", "rmsnorm_fwd"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert cli.main(["bench", "--ops", "softmax"]) == 2
    assert "unknown op(s) ['softmax']" in capsys.readouterr().out


def test_bench_command_measures_the_shapes_asked_for_in_every_dtype(capsys, monkeypatch):
    from course import cli

    assert cli.main(["bench", "--shapes", "8192x"]) == 2
    assert "--shapes wants rows x columns such as 8192x5120, not '8192x'" in (
        capsys.readouterr().out)
    calls = []
    monkeypatch.setattr(shootout, "run", lambda ops, dtypes, out, **kw: calls.append(kw))
    assert cli.main(["bench", "--shapes", "8192x5120, 4096X7168", "--out", "x"]) == 0
    assert calls[0]["shapes"] == calls[0]["subset"] == [(8192, 5120), (4096, 7168)]
    assert cli.main(["bench", "--out", "x"]) == 0
    assert "shapes" not in calls[1] and "subset" not in calls[1]  # run's own defaults
    assert calls[1]["timer"] == "call"
    assert cli.main(["bench", "--timer", "graph", "--out", "x"]) == 0
    assert calls[2]["timer"] == "graph"
    with pytest.raises(SystemExit):
        cli.main(["bench", "--timer", "wallclock"])
    assert "invalid choice: 'wallclock'" in capsys.readouterr().err


class _GradIntoGradOutput(torch.autograd.Function):
    """y = 2 x, with a backward that writes dx into the gradient it was given, as Liger's
    RMSNorm backward does by default (in_place=True)."""

    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, dy):
        return dy.mul_(2)


def test_a_backward_that_writes_into_dy_leaves_the_next_implementations_dy_alone():
    t = shootout.make_inputs("rmsnorm_bwd", 4, 64, torch.float32)
    dy_before = t["dy"].clone()
    prepare = peers._backward(lambda x, eps: _GradIntoGradOutput.apply(x), ("x",))
    call = prepare(t, 1e-6)
    for _ in range(3):
        (dx,) = call()
    assert torch.equal(t["dy"], dy_before)  # the shared inputs are untouched
    assert torch.equal(dx, 8 * dy_before)  # its own copy did change, call after call


def test_implementations_are_timed_in_alternating_rounds_keeping_their_fastest(monkeypatch):
    # No implementation is always the one timed first, and a slow round does not stand.
    def fake(name):
        def prepare(t, eps):
            def call():
                return shootout.expected("rmsnorm_fwd", t, eps)[0].to(t["x"].dtype)
            call.impl = name
            return call
        return peers.Impl(name, "rmsnorm_fwd", prepare)

    monkeypatch.setattr(peers, "implementations", lambda op: [fake("a"), fake("b")])
    order, medians = [], iter([3.0, 1.0, 2.0, 4.0])

    def time_in_turn(calls, **timing):
        order.append(calls[0].impl)
        return bench.Timing((next(medians),))

    monkeypatch.setattr(bench, "time_in_turn", time_in_turn)
    rows = shootout.run_point("rmsnorm_fwd", 4, 64, torch.float32, impls=None, reps=2, copy=1e9)
    assert order == ["a", "b", "b", "a"]
    assert [(r.impl, r.seconds, r.status) for r in rows] == [("a", 3.0, "ok"), ("b", 1.0, "ok")]


def test_the_timer_asked_for_times_every_implementation(monkeypatch):
    timers = []

    def time_in_turn(calls, **timing):
        timers.append(timing["timer"])
        return bench.Timing((1.0,))

    monkeypatch.setattr(bench, "time_in_turn", time_in_turn)
    shootout.run_point("rmsnorm_fwd", 4, 64, torch.float32, impls=["ours", "torch F.rms_norm"],
                       reps=2, copy=1e9, timer="graph")
    assert timers == ["graph"] * 4  # two implementations, two rounds


def test_decode_shapes_are_asked_for_by_name():
    assert shootout.parse_shapes("decode,2x512") == [*shootout.DECODE_SHAPES, (2, 512)]
    assert (1, 4096) in shootout.DECODE_SHAPES and (64, 8192) in shootout.DECODE_SHAPES


def test_the_host_timer_makes_the_calls_back_to_back_and_times_each():
    made = []
    calls = [lambda: made.append("a"), lambda: made.append("b")]
    timing = bench.time_in_turn(calls, warmup=4, reps=25, timer="host")
    # 25 reps come to 5 timed runs of 100 calls, after 4 warm-up calls, taken in turn
    assert len(timing.times_s) == 5 and len(made) == 4 + 5 * 100
    assert made[:6] == ["a", "b", "a", "b", "a", "b"]
    assert all(t > 0 for t in timing.times_s)
