"""`FrontProcess`: the Docker image's front (nginx before Gunicorn), started on this host exactly as
the image starts it, and always stopped.

The image runs `tini -- python deploy/front/launch.py`; so does this (tini when installed, as in the
image; Debian's nginx), with the run folder and the port the image would take from
FRONT_RUN_DIR/FRONT_LISTEN set to a private folder and a free loopback port. `start()` waits for
/readyz through nginx; `stop()` sends SIGTERM, as `docker stop` does (Gunicorn drains, then nginx
stops), and kills what is left after `stop_timeout`.

    with FrontProcess({"VL_MODEL": "demo", "VL_CACHE_DIR": ...}, ARTIFACTS / "front.log") as front:
        requests.get(front.url + "/healthz")
        status, head, body, seconds = exchange(front.port, b"GET / HTTP/1.1\\r\\n...")
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from vlservice.tools.services import free_port

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "deploy" / "front" / "launch.py"


class FrontProcess:
    def __init__(self, env: dict, log_path: Path, workers: int = 1, app: str = "wsgi:app",
                 real_ip_from: str = ""):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # A short private path: a unix socket's path must stay under 108 bytes.
        self.run_dir = Path(tempfile.mkdtemp(prefix="vl-front-"))
        self.socket = self.run_dir / "gunicorn.sock"
        self.app = app
        self.env = {**os.environ, "VL_WORKERS": str(workers), "HF_HUB_OFFLINE": "1", "VL_LOG_LEVEL": "INFO",
                    "FRONT_LISTEN": f"127.0.0.1:{self.port}", "FRONT_RUN_DIR": str(self.run_dir),
                    "FRONT_REAL_IP_FROM": real_ip_from, **{k: str(v) for k, v in env.items()}}
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def command(self) -> list[str]:
        """What the image's ENTRYPOINT + CMD run (with the test app's folder on Gunicorn's path)."""
        tini = shutil.which("tini")
        gunicorn_args = ["-c", "gunicorn.conf.py", "--pythonpath", str(ROOT / "tests"), self.app]
        return ([tini, "--"] if tini else []) + [sys.executable, str(LAUNCHER), *gunicorn_args]

    def start(self, timeout: float = 180.0) -> "FrontProcess":
        from conftest import wait_until

        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"front exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            try:
                return requests.get(self.url + "/readyz", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        try:
            wait_until(ready, "the front ready (/readyz 200 through nginx)", timeout=timeout, interval=0.3)
        except AssertionError:
            self.stop()
            raise RuntimeError("front did not become ready:\n" + self.log_text()[-3000:]) from None
        return self

    def log_text(self) -> str:
        """The launcher's, Gunicorn's and nginx's output (nginx's error log and its own answers)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def nginx_pid(self) -> int:
        return int((self.run_dir / "nginx.pid").read_text())

    def gunicorn_pid(self) -> int:
        """Gunicorn's master (from its "Listening at: unix:... (pid)" line)."""
        m = re.search(rf"Listening at: unix:{re.escape(str(self.socket))} \((\d+)\)", self.log_text())
        assert m, "Gunicorn has not said it is listening"
        return int(m.group(1))

    def stop(self, stop_timeout: float = 60.0) -> int | None:
        """SIGTERM, as `docker stop` does; the launcher's exit code (None if it had to be killed)."""
        code = None
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(stop_timeout)
            except subprocess.TimeoutExpired:
                pass
        elif self.proc:
            code = self.proc.returncode
        if self.proc:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # anything left of its group
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        if getattr(self, "log", None):
            self.log.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        return code

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def exchange(port: int, data: bytes, timeout: float = 5.0, host: str = "127.0.0.1"):
    """Send `data` raw on a new connection and read until the peer closes or `timeout` passes.
    (status or None, head text, body bytes, seconds until the answer's first byte or the close)."""
    started = time.monotonic()
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(data)
        got, first = b"", None
        try:
            while True:
                chunk = s.recv(65536)
                if first is None:
                    first = time.monotonic() - started
                if not chunk:
                    break
                got += chunk
                if b"\r\n\r\n" in got and _whole(got):
                    break
        except (socket.timeout, ConnectionResetError):
            pass
    head, _, body = got.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    return (int(m.group(1)) if m else None, head.decode("latin-1"), body,
            first if first is not None else time.monotonic() - started)


def _whole(got: bytes) -> bool:
    head, _, body = got.partition(b"\r\n\r\n")
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return bool(m) and len(body) >= int(m.group(1))
