"""course.verify.strays: what a submission's code leaves running ends with its process.

Each test runs its verifier stand-in in a process of its own: a subreaper adopts every
orphan below it, which pytest's own process should not do.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="child subreapers are Linux's")

ROOT = Path(__file__).resolve().parents[1]

# A daemon as a submission would start one: fork, setsid, fork again, the middle process
# exits, so that the grandchild has no parent left and a session of its own: its pid is `daemon`.
DAEMON = textwrap.dedent("""
    import os, sys, time
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            quiet = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(quiet, fd)
            os.write(w, str(os.getpid()).encode()); os.close(w)
            time.sleep(120)
        os._exit(0)
    os.close(w)
    daemon = int(os.read(r, 32))
    os.waitpid(middle, 0)
""")


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def run_stand_in(*parts: str, tmp_path: Path) -> dict:
    """Run `parts` (each dedented) in a fresh process that has imported course.verify.strays;
    they leave their findings in a dict named `found`, returned here."""
    out = tmp_path / "found.json"
    script = "\n".join(["import json, os, subprocess, sys, time",
                        "from course.verify import strays", "found = {}",
                        *(textwrap.dedent(part) for part in parts),
                        f"open({str(out)!r}, 'w').write(json.dumps(found))"])
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def test_a_detached_daemon_is_adopted_and_ended_but_kept_and_own_children_are_not(tmp_path):
    found = run_stand_in(DAEMON, """
        found['early'] = daemon  # started before adopting: its parent is init now
        found['adopted'] = strays.adopt_strays()
        """, DAEMON, """
        found['late'] = daemon  # started after: it came to this process
        kept = subprocess.Popen(["sleep", "120"], start_new_session=True)
        own = subprocess.Popen(["sleep", "120"])  # in this session: one of its own
        found['ended'] = strays.end_strays(keep={kept.pid})
        found['kept'], found['own'] = kept.poll() is None, own.poll() is None
        kept.kill(); own.kill()
        """, tmp_path=tmp_path)
    assert found["adopted"]
    assert running(found["early"])  # out of reach: what a subreaper cannot do
    subprocess.run(["kill", "-9", str(found["early"])])
    assert found["ended"] == [found["late"]]
    assert not running(found["late"])
    assert found["kept"] and found["own"]


def test_nothing_is_ended_without_adopting(tmp_path):
    found = run_stand_in(DAEMON, """
        found['ended'] = strays.end_strays()
        found['daemon'] = daemon
        """, tmp_path=tmp_path)
    assert found["ended"] == []
    assert running(found["daemon"])
    subprocess.run(["kill", "-9", str(found["daemon"])])


@pytest.mark.parametrize("how", ["daemon", "child"])
def test_what_a_learners_code_leaves_running_ends_with_its_process(tmp_path, how):
    """A cell that leaves a process running, detached or its plain child: once the
    learner's process is closed, that process is gone, and the learner's log says so."""
    if how == "daemon":
        cell = DAEMON + "open('left.txt', 'w').write(str(daemon))\n"
    else:
        # forked, not a program started: the walls refuse a cell that starts one
        # (course.verify.walls); a fork keeps them, and is left running all the same
        cell = ("import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(120)\n"
                "    os._exit(0)\nopen('left.txt', 'w').write(str(pid))\n")
    found = run_stand_in(f"""
        from course.verify.proxy import Learner, LearnerProcess
        found['adopted'] = strays.adopt_strays()
        where = {str(tmp_path)!r}
        process = LearnerProcess(cwd=where, env=dict(os.environ, COURSE_GRADING='1'),
                                 log_path=os.path.join(where, 'learner.log'))
        process.start()
        Learner(process).run_cell({cell!r}, 'leaves a process')
        found['left'] = int(open(os.path.join(where, 'left.txt')).read())
        found['running_before'] = os.path.exists(f"/proc/{{found['left']}}")
        process.close()
        """, tmp_path=tmp_path)
    assert found["adopted"] and found["running_before"]
    deadline = time.monotonic() + 10
    while running(found["left"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(found["left"]), "the process the cell left outlived its learner"
    said = (tmp_path / "learner.log").read_text()
    assert "left 1 process(es) running" in said and f"killed ([{found['left']}])" in said


def test_the_verifier_ends_what_a_submission_leaves_running(tmp_path):
    """End to end (`python -m course.verify`): a submission whose cell starts a detached
    daemon keeps its points, and the daemon is gone once the verifier is done."""
    nbformat = pytest.importorskip("nbformat", reason="the verifier reads notebooks")
    from test_verify import ADD, MUL, _chapter

    source = tmp_path / "source" / "ch99_small.ipynb"  # a folder the walls refuse
    source.parent.mkdir()
    nbformat.write(_chapter(ADD, MUL), source)
    leaves = ADD + DAEMON + f"open({str(tmp_path / 'left.txt')!r}, 'w').write(str(daemon))\n"
    submitted = tmp_path / "submitted.ipynb"
    nbformat.write(_chapter(leaves, MUL), submitted)
    done = subprocess.run([sys.executable, "-m", "course.verify", str(source), "--submission",
                           str(submitted), str(tmp_path / "verdict.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    left = int((tmp_path / "left.txt").read_text())
    deadline = time.monotonic() + 10
    while running(left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(left), "the daemon outlived the verifier"
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert [(c["points"], c["max_points"]) for c in verdict["cells"]] == [(2, 2), (3, 3)]
