"""Real Redis and nginx on free loopback ports, always stopped: for the tests and for
`python -m vlservice bench --replicas`.

`RedisProcess`: Debian's `redis-server` with no persistence, stoppable and restartable on the
same port (an outage and its end). `NginxProcess`: Debian's `nginx` serving the shipped
deploy/nginx template, rendered as the nginx image renders it (envsubst of the `${VL_...}`
names it uses; nginx's own `$variables` untouched), inside a minimal nginx.conf of the test's own.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
NGINX_TEMPLATE = ROOT / "deploy" / "nginx" / "templates" / "default.conf.template"
NGINX_EDGE = ROOT / "deploy" / "nginx" / "edge"  # the shared edge files the template includes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(check, what: str, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up")


class _Process:
    """A child process with start() and stop(), usable as a context manager."""

    proc: subprocess.Popen | None = None

    def start(self):
        raise NotImplementedError

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class RedisProcess(_Process):
    """`password`: Redis requires it (`--requirepass`, as the shipped compose.scale.yaml and
    deploy/k8s/redis.yaml run it); `url` stays without it (VL_REDIS_URL, with VL_REDIS_PASSWORD
    beside it), `url_with_password` carries it."""

    def __init__(self, workdir: Path, password: str = ""):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.password = password
        self.url_with_password = f"redis://:{password}@127.0.0.1:{self.port}/0" if password else self.url
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None

    def client(self):
        import redis

        return redis.Redis(port=self.port, password=self.password or None, socket_timeout=2)

    def start(self) -> "RedisProcess":
        # allkeys-lru under maxmemory, as deploy/k8s/redis.yaml and compose.scale.yaml run it
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru", "--dir", str(self.workdir)]
            + (["--requirepass", self.password] if self.password else []),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(self._pings, "redis-server")
        return self

    def _pings(self) -> bool:
        try:
            return bool(self.client().ping())
        except Exception:
            return False


def render_nginx(values: dict) -> str:
    """The shipped template with `${NAME}` replaced for the given names, as envsubst does; every
    `${...}` it holds must be given (a new one the tests do not know fails here)."""
    text = NGINX_TEMPLATE.read_text()
    names = set(re.findall(r"\$\{(\w+)\}", text))
    assert names == set(values), f"template variables {sorted(names)} vs given {sorted(values)}"
    return re.sub(r"\$\{(\w+)\}", lambda m: str(values[m.group(1)]), text)


class NginxProcess(_Process):
    def __init__(self, workdir: Path, upstreams: list[str]):
        assert len(upstreams) == 2, "the shipped template names two replicas, as compose.scale.yaml runs them"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.values = {"VL_LISTEN": f"127.0.0.1:{self.port}", "VL_REPLICA_1": upstreams[0], "VL_REPLICA_2": upstreams[1],
                       "VL_EDGE_DIR": str(NGINX_EDGE)}
        self.proc: subprocess.Popen | None = None

    def start(self) -> "NginxProcess":
        w = self.workdir
        (w / "conf.d").mkdir(parents=True, exist_ok=True)
        (w / "conf.d" / "default.conf").write_text(render_nginx(self.values))
        # what the nginx image's own nginx.conf provides around conf.d, with paths a test may write
        # `user root`: pytest's folders are private to the user running the tests (root here), and
        # nginx's workers write request bodies larger than 16 KB into one of them; not root, the
        # directive is ignored (the workers stay that user).
        (w / "nginx.conf").write_text(f"""
daemon off;
user root;
worker_processes 1;
pid {w}/nginx.pid;
error_log {w}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {w}/access.log;
    client_body_temp_path {w}/body;
    proxy_temp_path {w}/proxy;
    fastcgi_temp_path {w}/fastcgi;
    uwsgi_temp_path {w}/uwsgi;
    scgi_temp_path {w}/scgi;
    include /etc/nginx/mime.types;
    include {w}/conf.d/*.conf;
}}
""")
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        args = [nginx, "-p", str(w), "-e", str(w / "error.log"), "-c", str(w / "nginx.conf")]
        check = subprocess.run(args + ["-t"], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen(args,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(self._answers, "nginx")
        return self

    def _answers(self) -> bool:
        try:
            requests.get(self.url + "/healthz", timeout=2)
            return True
        except requests.RequestException:
            return False

    def error_log(self) -> str:
        path = self.workdir / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""
