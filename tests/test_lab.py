"""`make lab` really serves JupyterLab on notebooks/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from lab_server import answers, free_port, stop_session

ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 90

# The test runs the recipe exactly as a learner does (no LAB_ARGS) and configures Jupyter
# through its config directory instead: no browser, no token, loopback only, fail rather
# than move port, and run as root where the test does (containers, CI).
SERVER_CONFIG = {
    "ServerApp": {"open_browser": False, "ip": "127.0.0.1", "port_retries": 0,
                  "allow_root": hasattr(os, "geteuid") and os.geteuid() == 0},
    "IdentityProvider": {"token": ""},
}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="needs `make` on PATH")
def test_make_lab_serves_jupyterlab(tmp_path):
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "jupyter_server_config.json").write_text(json.dumps(SERVER_CONFIG))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config_dir),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"))
    port = free_port()
    log = tmp_path / "lab.log"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(["make", "lab", f"PORT={port}"], cwd=ROOT, env=env,
                                stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}/api/status"
            deadline = time.monotonic() + STARTUP_S
            while not answers(url) and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.5)
            output = log.read_text(errors="replace")[-3000:]
            assert answers(url), (f"no answer from {url} within {STARTUP_S} s "
                                  f"(exit status {proc.poll()}); output:\n{output}")
            with urllib.request.urlopen(url, timeout=5) as response:
                assert isinstance(json.loads(response.read()), dict)
            assert (ROOT / "notebooks").is_dir()
        finally:
            stop_session(proc)
    assert proc.returncode is not None
