"""`python -m course doctor`: the environment report a learner runs first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from course import cli, runtime

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _doctor(env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "course", "doctor"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_doctor_exits_zero_and_reports_mode_and_triton_version():
    import triton

    result = _doctor()
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"triton         {triton.__version__}" in out
    if runtime.on_gpu():
        assert "kernels run on the GPU" in out
    else:
        assert "interpreter" in out
        assert "none visible" in out
    assert "OK: the course is ready." in out


@pytest.mark.slow
def test_doctor_names_triton_when_it_cannot_be_imported(tmp_path):
    fake = tmp_path / "triton"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise ImportError("simulated broken triton install")\n')
    pythonpath = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    result = _doctor({"PYTHONPATH": pythonpath})
    assert result.returncode == 1, result.stdout + result.stderr
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED:")]
    assert len(failed) == 1, result.stdout
    assert "triton cannot be imported" in failed[0]
    assert "simulated broken triton install" in failed[0]
    assert "make clean && make test" in failed[0]
    assert "Traceback" not in result.stderr


def test_doctor_fails_with_one_line_when_the_kernel_gives_a_wrong_result(monkeypatch, capsys):
    def wrong() -> None:
        raise cli.DoctorFailure("the test kernel gave wrong results: row sums [0.0]")

    monkeypatch.setattr(cli, "run_tiny_kernel", wrong)
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: the test kernel gave wrong results" in out
    assert "the course is ready" not in out


def test_doctor_turns_a_kernel_crash_into_one_line(monkeypatch, capsys):
    def crash() -> None:
        raise RuntimeError("out of resources")

    monkeypatch.setattr(cli, "run_tiny_kernel", crash)
    assert cli.main(["doctor"]) == 1
    assert "FAILED: RuntimeError: out of resources" in capsys.readouterr().out


def test_tiny_kernel_runs_in_process():
    cli.run_tiny_kernel()  # raises DoctorFailure on a wrong result


def test_a_command_is_required_and_unknown_ones_are_refused(capsys):
    with pytest.raises(SystemExit) as missing:
        cli.main([])
    assert missing.value.code == 2
    with pytest.raises(SystemExit):
        cli.main(["no-such-command"])
    err = capsys.readouterr().err
    assert "invalid choice" in err
    for command in ("doctor", "bench", "grade"):
        assert command in err
