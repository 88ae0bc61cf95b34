"""JupyterLab for tests: served from a folder on a free port, with a token, loopback only.

    with running_lab(root_dir, tmp_path / "lab") as lab:
        page.goto(lab.notebook_url("notebooks/ch04_fused/ch04_fused.ipynb"))

Everything Jupyter writes (config, runtime files, workspaces, settings) stays under the
given work folder, so a test neither reads nor changes the user's own Jupyter setup. The
server never calls out: no update check, no news feed (the network may be closed).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

STARTUP_S = 90

# JupyterLab's own settings, as a user would set them in Settings: no news, no update
# check; and every cell of a notebook in the page (the default attaches cells as they are
# scrolled to, which a test cannot find by their text).
USER_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
        {"windowingMode": "none"},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class LabServer:
    base_url: str   # "http://127.0.0.1:PORT/"
    token: str
    log: Path

    def notebook_url(self, path: str, workspace: str = "default") -> str:
        """The page that opens `path` (relative to the served folder) in its own workspace,
        so that two pages do not restore each other's open documents."""
        return f"{self.base_url}lab/workspaces/{workspace}/tree/{path}?token={self.token}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def api(self, endpoint: str) -> object:
        """The JSON answer of the REST API's `endpoint`, e.g. "sessions"."""
        request = urllib.request.Request(f"{self.base_url}api/{endpoint}",
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def wait_for_kernel_connection(self, path: str, timeout_s: float = 120) -> None:
        """Wait until a page is connected to the kernel of the notebook at `path`. Until
        then a page's kernel indicator can read "idle" before any kernel exists."""
        deadline = time.monotonic() + timeout_s
        while True:
            sessions = self.api("sessions")
            if any(s["path"] == path and s["kernel"]["connections"] > 0 for s in sessions):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no page connected to a kernel for {path} within "
                                   f"{timeout_s} s; sessions: {sessions}\n{self.log_tail()}")
            time.sleep(0.25)


def answers(url: str, token: str = "") -> bool:
    """Whether `url` answers 200 now (with `token`, where the server wants one)."""
    headers = {"Authorization": f"token {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def stop_session(proc: subprocess.Popen) -> None:
    """Stop a process started with start_new_session=True and everything in its process
    group (make and its JupyterLab, a server and its kernels). SIGTERM lets a server shut
    its kernels down; SIGKILL only if it hangs."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextmanager
def running_lab(root_dir: Path, work_dir: Path,
                env: Mapping[str, str] | None = None) -> Iterator[LabServer]:
    """Serve `root_dir` with this interpreter's JupyterLab until the block ends. `env` adds
    to the server's environment, which its kernels inherit."""
    work_dir.mkdir(parents=True, exist_ok=True)
    config_dir = work_dir / "config"
    settings_dir = work_dir / "settings"
    for name, settings in USER_SETTINGS.items():
        path = settings_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    token = secrets.token_hex(16)
    port = free_port()
    server_config = {
        "ServerApp": {"open_browser": False, "ip": "127.0.0.1", "port": port,
                      "port_retries": 0, "root_dir": str(root_dir),
                      "allow_root": hasattr(os, "geteuid") and os.geteuid() == 0},
        "IdentityProvider": {"token": token},
        "LabApp": {"check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                   "news_url": None},
    }
    config_dir.mkdir(exist_ok=True)
    (config_dir / "jupyter_server_config.json").write_text(json.dumps(server_config))
    server_env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config_dir),
                      JUPYTER_DATA_DIR=str(work_dir / "data"),
                      JUPYTER_RUNTIME_DIR=str(work_dir / "runtime"),
                      JUPYTERLAB_WORKSPACES_DIR=str(work_dir / "workspaces"),
                      JUPYTERLAB_SETTINGS_DIR=str(settings_dir),
                      IPYTHONDIR=str(work_dir / "ipython"))
    server_env.update(env or {})
    lab = LabServer(f"http://127.0.0.1:{port}/", token, work_dir / "lab.log")
    with lab.log.open("wb") as log_file:
        # A session of its own, so that stopping it reaches JupyterLab and nothing else.
        proc = subprocess.Popen([sys.executable, "-m", "jupyterlab"], cwd=root_dir,
                                env=server_env, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + STARTUP_S
            while not answers(f"{lab.base_url}api/status", token):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not answer on port {port} within "
                                       f"{STARTUP_S} s (exit status {proc.poll()}); its "
                                       f"output:\n{lab.log_tail()}")
                time.sleep(0.5)
            yield lab
        finally:
            stop_session(proc)
