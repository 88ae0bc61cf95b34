"""scripts/benchmark_tables.py: docs/benchmarks.md's tables and issue #3's verdicts."""

import sys
from pathlib import Path

from course.shootout import Row

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import benchmark_tables  # noqa: E402
from benchmark_tables import verdict  # noqa: E402


def test_a_cell_is_below_every_bar_that_applies_at_its_width():
    assert verdict("rmsnorm_fwd", 512, 0.84, 0.80) == "below 85 %"
    assert verdict("rmsnorm_fwd", 512, 0.84, 0.86) == "below 85 % and below best peer"
    assert verdict("rmsnorm_fwd", 1024, 0.89, 0.50) == "below 90 %"
    assert verdict("layernorm_fwd", 65536, 0.81, 0.60) == "met"  # 80 % from 65536 on
    assert verdict("layernorm_fwd", 32768, 0.81, 0.60) == "below 90 %"
    assert verdict("rmsnorm_bwd", 65536, 0.70, 0.60) == "met"  # 85 % stops at 32768
    assert verdict("rmsnorm_bwd", 32768, 0.70, 0.60) == "below 85 %"


def test_without_a_bar_or_a_peer_to_beat_there_is_no_target():
    assert verdict("add_rmsnorm_fwd", 512, 0.50, 0.90) == "none set"
    assert verdict("layernorm_bwd", 4096, 0.50, 0.90) == "none set"
    assert verdict("rmsnorm_bwd", 256, 0.50, 0.60) == "below best peer"
    assert verdict("rmsnorm_fwd", 4096, None, 0.90) == "not measured"


def _row(impl, n, fraction, status="ok"):
    return Row("rmsnorm_fwd", impl, "bfloat16", 8, n, 4_000_000, status,
               fraction_of_copy=fraction if status == "ok" else None)


def test_best_peer_counts_only_timed_peers_and_ours_is_bold():
    rows = [_row("ours", 4096, 0.95), _row("torch.compile", 4096, 0.90),
            _row("Quack", 4096, None, "wrong: y differs")]
    lines = benchmark_tables.table(rows, "rmsnorm_fwd", "bfloat16").splitlines()
    assert lines[2] == "| M x N | ideal MB | ours | torch.compile | Quack | best peer | target |"
    assert lines[4] == "| 8 x 4096 | 4 | **95.0** | 90.0 | wrong | 90.0 | met |"


def test_the_recorded_run_gives_a_table_per_op_and_dtype():
    text = benchmark_tables.all_tables(benchmark_tables.load_rows(benchmark_tables.RECORDED_RUN))
    headings = [line for line in text.splitlines() if line.startswith("#### ")]
    assert "#### rmsnorm_fwd, bfloat16" in headings
    assert len(headings) == len(set(headings)) == 15  # 5 ops x 3 dtypes
