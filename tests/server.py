"""`ServerProcess`: the real server, started exactly as users start it, and always stopped.

`gunicorn -c gunicorn.conf.py wsgi:app` as a subprocess on a free port with the given `VL_*`
settings; `start()` waits for /readyz, `stop()` terminates it (and its workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import requests

from vlservice.tools.services import free_port

ROOT = Path(__file__).resolve().parent.parent


class ServerProcess:
    def __init__(self, env: dict, log_path: Path, workers: int = 1, app: str = "wsgi:app"):
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "VL_BIND": f"127.0.0.1:{self.port}", "VL_WORKERS": str(workers),
                    "HF_HUB_OFFLINE": "1", "VL_LOG_LEVEL": "INFO", **{k: str(v) for k, v in env.items()}}
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180.0) -> "ServerProcess":
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py",
                                      "--pythonpath", str(ROOT / "tests"), self.app],
                                     cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        from conftest import wait_until

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            try:
                return requests.get(self.url + "/readyz", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        try:
            wait_until(ready, "the server ready (/readyz 200)", timeout=timeout, interval=0.3)
        except AssertionError:
            self.stop()
            raise RuntimeError("server did not become ready:\n" + self.log_text()[-3000:]) from None
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if getattr(self, "log", None):
            self.log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
