"""The markdown tables of docs/benchmarks.md from a `course bench` CSV, with issue #3's bars.

    python scripts/benchmark_tables.py [path/to/bench.csv]   (default: the recorded run)

One table per op and dtype: % of copy bandwidth per implementation (ours in bold), the best
peer, and for bfloat16 which of the targets a cell misses ("met", or what it is below).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from course.shootout import RECORDED_RUN, Row, load_rows  # noqa: E402

OURS = "ours"


@dataclass(frozen=True)
class Bar:
    fraction: float          # of copy bandwidth
    min_n: int
    max_n: int | None = None

    def applies(self, n: int) -> bool:
        return n >= self.min_n and (self.max_n is None or n <= self.max_n)


@dataclass(frozen=True)
class Target:
    bars: tuple[Bar, ...]
    beat_every_peer: bool


# Issue #3's targets (H100, bfloat16, % of the copy bandwidth measured in the same run).
TARGETS = {
    "rmsnorm_fwd": Target((Bar(0.90, 1024), Bar(0.85, 256, 512)), beat_every_peer=True),
    "layernorm_fwd": Target((Bar(0.90, 1024, 32768), Bar(0.80, 65536)), beat_every_peer=True),
    "add_rmsnorm_fwd": Target((Bar(0.90, 1024),), beat_every_peer=False),
    "rmsnorm_bwd": Target((Bar(0.85, 2048, 32768),), beat_every_peer=True),
}
TARGET_DTYPE = "bfloat16"


def verdict(op: str, n: int, ours: float | None, best_peer: float | None) -> str:
    """'met', 'none set', or what the cell is below ('below 85 % and below best peer')."""
    target = TARGETS.get(op)
    bars = [bar for bar in target.bars if bar.applies(n)] if target else []
    if not bars and not (target and target.beat_every_peer):
        return "none set"
    if ours is None:
        return "not measured"
    misses = [f"below {100 * bar.fraction:.0f} %" for bar in bars if ours < bar.fraction]
    if target.beat_every_peer and best_peer is not None and ours < best_peer:
        misses.append("below best peer")
    return " and ".join(misses) or "met"


def _cell(row: Row | None) -> str:
    if row is None:
        return ""
    if row.status != "ok":
        return row.status.split(":")[0]
    return f"{100 * row.fraction_of_copy:.1f}"


def table(rows: list[Row], op: str, dtype: str) -> str:
    chosen = [r for r in rows if r.op == op and r.dtype == dtype]
    names = list(dict.fromkeys(r.impl for r in chosen))
    peers = [name for name in names if name != OURS]
    with_target = dtype == TARGET_DTYPE
    head = ["M x N", "ideal MB", *names, "best peer"] + (["target"] if with_target else [])
    lines = [f"#### {op}, {dtype}", "", "| " + " | ".join(head) + " |",
             "|---" * len(head) + "|"]
    for M, N in dict.fromkeys((r.M, r.N) for r in chosen):
        at = {r.impl: r for r in chosen if (r.M, r.N) == (M, N)}
        timed = [at[p].fraction_of_copy for p in peers if p in at and at[p].status == "ok"]
        best = max(timed) if timed else None
        ours = at.get(OURS)
        ours_fraction = ours.fraction_of_copy if ours and ours.status == "ok" else None
        cells = [f"{M} x {N}", f"{next(iter(at.values())).ideal_bytes / 1e6:.0f}"]
        cells += [f"**{_cell(at.get(name))}**" if name == OURS else _cell(at.get(name))
                  for name in names]
        cells.append(f"{100 * best:.1f}" if best is not None else "")
        if with_target:
            cells.append(verdict(op, N, ours_fraction, best))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def all_tables(rows: list[Row]) -> str:
    pairs = dict.fromkeys((r.dtype, r.op) for r in rows)
    return "\n\n".join(table(rows, op, dtype) for dtype, op in pairs)


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else RECORDED_RUN
    print(all_tables(load_rows(path)))


if __name__ == "__main__":
    main()
