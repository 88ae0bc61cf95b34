"""The tamper check's snapshot keeps the course's settings, not only its functions: a red
team rebound the names chapter 01's refusal of PyTorch's RMSNorm looks for, emptied the
packages whose kernels count as the course's, and filled the cache of fingerprints seen,
all unnoticed (course.verify.tamper). Honest runs change a few settings, which stay quiet."""

from __future__ import annotations

import dataclasses

import course.check  # noqa: F401  (every checker module, as the learner's process has them)
from course import gpu_lock, kernel_records
from course.check import guards, sandbox, torch_reference
from course.verify import tamper

import pytest


def _found(snapshot: tamper.Snapshot) -> list[str]:
    return [str(c) for c in snapshot.changes()]


@pytest.mark.parametrize("what, patch", [
    ("course.check.torch_reference._NAMES",
     lambda m: m.setattr(torch_reference, "_NAMES", frozenset({"rms_norm"}))),
    ("course.check.torch_reference._WATCHED_CODE",
     lambda m: m.setattr(torch_reference, "_WATCHED_CODE", frozenset())),
    ("course.check.torch_reference._OPERATOR_IDS",
     lambda m: m.setattr(torch_reference, "_OPERATOR_IDS", frozenset())),
    ("course.check.sandbox.COURSE_PACKAGES",
     lambda m: m.setattr(sandbox, "COURSE_PACKAGES", ())),
    ("course.check.guards.NAMES", lambda m: m.delattr(guards, "NAMES")),
])
def test_a_rebound_setting_of_the_checks_is_named(monkeypatch, what, patch):
    snapshot = tamper.Snapshot.take()
    patch(monkeypatch)
    found = _found(snapshot)
    assert any(c.startswith(what + " was") for c in found), found


def test_a_setting_changed_in_place_is_named(monkeypatch):
    snapshot = tamper.Snapshot.take()
    monkeypatch.setitem(course.check.runner.ADVICE, "course_kernel", "")
    found = _found(snapshot)  # other checkers hold the same dict, and are named too
    assert "course.check.runner.ADVICE was changed in place " \
        "(a setting the checks read)" in found, found


def test_a_frozen_exercise_changed_under_its_frozen_fields_is_named():
    exercise = torch_reference.TORCH_RMSNORM
    field = dataclasses.fields(exercise)[0].name
    snapshot = tamper.Snapshot.take()
    old = getattr(exercise, field)
    object.__setattr__(exercise, field, "something else")
    try:
        found = _found(snapshot)
    finally:
        object.__setattr__(exercise, field, old)
    assert "course.check.torch_reference.TORCH_RMSNORM was changed in place " \
        "(a setting the checks read)" in found, found
    assert _found(snapshot) == []


def test_a_planted_record_that_a_reference_kernel_is_no_copy_is_named():
    import importlib

    module, _, name = sorted(kernel_records.shipped_fingerprints().values())[0].rpartition(".")
    kernel = getattr(importlib.import_module(module), name)
    function = getattr(kernel, "fn", kernel)  # a JITFunction's Python function
    assert kernel_records.copied_from(function) is not None  # a reference kernel's own
    snapshot = tamper.Snapshot.take()
    kernel_records._seen[function] = (function.__code__, None)
    try:
        found = _found(snapshot)
    finally:
        kernel_records._seen.pop(function, None)
    assert any(c.startswith(f"course.kernel_records._seen: the entry for '{name}'")
               for c in found), found


def test_the_fingerprints_the_records_hold_emptied_are_named(monkeypatch):
    snapshot = tamper.Snapshot.take()
    fingerprints = kernel_records.shipped_fingerprints()
    kept = dict(fingerprints)
    fingerprints.clear()
    try:
        found = _found(snapshot)
    finally:
        fingerprints.update(kept)
    assert "course.kernel_records.shipped_fingerprints() was changed in place " \
        "(a setting the checks read)" in found, found


def test_the_snapshot_changed_in_place_says_so():
    snapshot = tamper.Snapshot.take()
    entries = tuple(e for e in snapshot._entries if e[0] != "course.check.rmsnorm_forward")
    object.__setattr__(snapshot, "_entries", entries)
    found = _found(snapshot)
    assert "the tamper check's own snapshot was changed after it was taken" in found, found


def test_what_honest_runs_change_is_not_tampering(monkeypatch):
    import rmsnorm_variants as kernels

    snapshot = tamper.Snapshot.take()
    # A check fills the fingerprints seen, and pushes and pops the watches and guards.
    course.check.rmsnorm_forward(kernels.correct, quiet=True)
    with guards.guarded(guards.REFUSE_BUILT_IN_RMSNORM):
        pass
    # A timing on a GPU counts its wait for the lock, and keeps the lock's file open.
    monkeypatch.setitem(gpu_lock.waited, "shared", gpu_lock.waited["shared"] + 1.5)
    monkeypatch.setitem(gpu_lock._files, "/tmp/a-lock-file", -1)
    assert _found(snapshot) == []


def test_a_watch_left_running_is_named():
    snapshot = tamper.Snapshot.take()
    guards._ACTIVE.append((guards.REFUSE_BUILT_IN_RMSNORM, None))
    try:
        found = _found(snapshot)
    finally:
        guards._ACTIVE.pop()
    assert "course.check.guards._ACTIVE was changed in place " \
        "(a setting the checks read)" in found, found


def test_every_setting_left_out_is_one_the_course_has():
    import course.verify.learner  # noqa: F401  (what the learner's process imports)

    for name in tamper.CHANGING_SETTINGS:
        module, _, attr = name.rpartition(".")
        assert hasattr(__import__(module, fromlist=[attr]), attr), name
