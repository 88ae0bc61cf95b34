"""How `make autograde GPUS=...` shares its queue among the workers, with the task processes
stood in for (no grading: tests/test_grader_worker_deaths.py kills real ones): a worker
whose queue is empty waits while another's batch runs, since that batch may die and come
back as single submissions; singles that no GPU is left to grade are named, not dropped."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("nbgrader.api", reason="the grader tests need nbgrader")

from grader_submissions import load_instructor  # noqa: E402  (after the skip above)

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "ch02_roofline"


class FakeTask:
    """A task process that takes `seconds`, then ends with `status`; on 0 its students are
    listed as finished in its results, as a real task's are."""

    def __init__(self, finished: dict, folder: str, students: list[str], status: int,
                 seconds: float):
        self.finished, self.folder, self.students = finished, folder, students
        self.returncode, self.seconds, self.pid = status, seconds, 0

    def communicate(self, timeout=None):
        time.sleep(self.seconds)
        if self.returncode == 0:
            self.finished.setdefault(self.folder, []).extend(self.students)
        return "", None


def _grade(tmp_path, monkeypatch, dies, answers):
    """Five submissions on GPUs 0 and 1 (batches [a, c, e] and [b, d]); `dies(students)`
    says whether a task of those students dies, `answers(gpu)` whether a GPU still answers
    after one died. Returns (the batches each GPU ran, what autograde printed)."""
    instructor = load_instructor(ROOT, "instructor_queue")
    finished: dict[str, list[str]] = {}
    ran: dict[str, list[list[str]]] = {"0": [], "1": []}
    lock = threading.Lock()

    def start_task(course, command, gpu):
        students = command[command.index("--item") + 2:command.index("--cell-timeout")]
        folder = command[command.index("--task-dir") + 1]
        with lock:
            ran[gpu].append(students)
        slow = len(students) == 3  # [a, c, e] runs while the other worker's queue is empty
        return FakeTask(finished, folder, students, -9 if dies(students) else 0,
                        0.5 if slow else 0.05)

    def read_results(folder):
        return [{"chapter": CHAPTER, "student": st} for st in finished.get(str(folder), [])]

    for name, value in {"_start_task": start_task, "read_results": read_results,
                        "_gpu_answers": answers, "_verify_timeout": lambda *a: 100,
                        "merge": lambda course, say: [], "_zero_grades": lambda *a: None,
                        "current_verdict": lambda *a: None,
                        "report_chapter": lambda *a: None}.items():
        monkeypatch.setattr(instructor, name, value)
    course = SimpleNamespace(
        root=tmp_path, grader_dir=tmp_path,
        autograded_notebook=lambda st, ch: tmp_path / "autograded" / st / ch / f"{ch}.ipynb")
    plan = SimpleNamespace(todo={CHAPTER: ["a", "b", "c", "d", "e"]})
    printed: list[str] = []
    instructor.autograde_on_gpus(course, plan, ["0", "1"], force=False, cell_timeout_s=10,
                                 at_once=1, say=printed.append)
    return ran, printed


def test_a_worker_with_nothing_queued_waits_for_a_batch_that_may_come_back(tmp_path,
                                                                           monkeypatch):
    ran, printed = _grade(tmp_path, monkeypatch, dies=lambda students: len(students) == 3,
                          answers=lambda gpu: True)
    batches = ran["0"] + ran["1"]
    assert sorted(map(tuple, batches)) == [("a",), ("a", "c", "e"), ("b", "d"), ("c",), ("e",)]
    # the worker that ran [b, d] had an empty queue while [a, c, e] ran: it waited, and
    # took some of the singles that batch came back as
    other = "0" if ["b", "d"] in ran["0"] else "1"
    assert [b for b in ran[other] if len(b) == 1], ran
    assert not [line for line in printed if "NOT GRADED" in line], printed


def test_singles_no_gpu_is_left_to_grade_are_named(tmp_path, monkeypatch):
    ran, printed = _grade(tmp_path, monkeypatch, dies=lambda students: True,
                          answers=lambda gpu: False)
    # both batches died and both GPUs with them: nothing else ran
    assert sorted(map(tuple, ran["0"] + ran["1"])) == [("a", "c", "e"), ("b", "d")]
    lost = sorted(line for line in printed if "NOT GRADED" in line)
    assert lost == [f"  {st}: NOT GRADED: no GPU was left answering to grade it (log: "
                    f"logs/autograde_workers.log)" for st in "abcde"], printed
