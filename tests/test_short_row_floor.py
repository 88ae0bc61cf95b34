"""scripts/short_row_floor.py's calls (the timing itself needs a GPU)."""

import sys
from pathlib import Path

import course  # noqa: F401  (mode first)
from course import reference, shootout
from course.check.compare import compare

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import short_row_floor  # noqa: E402


def test_every_copy_copies_and_ours_normalises():
    # 3 x 1000 values: fewer than one block of the smallest copy launch, so every copy's
    # only program is masked at the end of x.
    M, N = 3, 1000
    t = shootout.make_inputs(short_row_floor.OP, M, N, torch.float32)
    made = short_row_floor.candidates(M, N)
    copies = [name for name in made if "copy" in name]
    assert len(copies) == 1 + 2 * len(short_row_floor.COPY_LAUNCHES)
    for name in copies:
        y = made[name](t)()
        assert y.data_ptr() != t["x"].data_ptr(), name
        assert torch.equal(y, t["x"]), name
    y = made["ours (RMSNorm)"](t)()
    assert compare("y", y, reference.rmsnorm(t["x"], t["weight"], 1e-6), torch.float32) is None
    for name in made:
        if name.startswith("empty kernel"):
            assert made[name](t)() is None, name


def test_best_medians_keeps_each_names_fastest_round(monkeypatch):
    medians = iter([3.0, 5.0, 1.0, 6.0, 2.0, 4.0])  # a, b; then b, a (reversed); then a, b
    order = []

    class Timing:
        def __init__(self, s):
            self.median_s = s

    def fake_time_in_turn(calls, **kwargs):
        order.append(calls[0]())
        return Timing(next(medians))

    monkeypatch.setattr(short_row_floor.bench, "time_in_turn", fake_time_in_turn)
    best = short_row_floor.best_medians({"a": [lambda: "a"], "b": [lambda: "b"]}, rounds=3)
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert best == {"a": 2.0, "b": 1.0}
