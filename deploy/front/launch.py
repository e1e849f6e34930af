"""The image's command: nginx in front of Gunicorn, in one container, as its unprivileged user.

    tini -- python deploy/front/launch.py [gunicorn arguments]

1. Renders deploy/front/nginx.conf into the run folder (FRONT_RUN_DIR, default
   /tmp/vlservice-front): nginx listens on FRONT_LISTEN (default 8000) and passes requests to
   Gunicorn's unix socket in that folder, with the shared edge limits of deploy/nginx/edge/ and a
   body limit of VL_MAX_REQUEST_BYTES. FRONT_REAL_IP_FROM (CIDRs, space or comma separated) names
   the proxies in front whose X-Forwarded-For is believed (the replicas' balancer, an ingress);
   empty: none, the peer's address is the client.
2. Checks that config (`nginx -t`), then starts Gunicorn with the README's start command
   (`gunicorn -c gunicorn.conf.py wsgi:app`, or the arguments given) bound to that socket
   (VL_BIND=unix:...), and nginx in the foreground beside it.
3. Waits. If either process ends on its own, the other is stopped and the launcher exits (non-zero
   unless Gunicorn stopped cleanly), so the container ends and its orchestrator restarts it.
4. SIGTERM (docker stop, a rollout) goes to Gunicorn alone: it drains (new requests get 503
   `draining` through nginx while the running ones finish, gunicorn.conf.py), and nginx keeps
   passing the answers on; once Gunicorn has exited, nginx is stopped gracefully and the launcher
   exits with Gunicorn's code. SIGINT and SIGQUIT go to Gunicorn as they are (its quick stop), SIGHUP
   to both (reload).

tini runs as PID 1 (it reaps orphans and passes signals on to this launcher only).
Anything here may be run on a host as well: tests/front.py starts this very file.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from vlservice.config import Settings  # noqa: E402  (cheap: no torch)

TEMPLATE = Path(__file__).resolve().with_name("nginx.conf")
EDGE_DIR = ROOT / "deploy" / "nginx" / "edge"
GUNICORN_ARGS = ["-c", "gunicorn.conf.py", "wsgi:app"]  # the README's start command, after `gunicorn`
NGINX_STOP_S = 10.0  # nginx's graceful stop, once Gunicorn is gone (nothing is left to answer)


def log(message: str) -> None:
    print(f"[front] {message}", file=sys.stderr, flush=True)


def render(template: str, values: dict[str, str]) -> str:
    """`${NAME}` replaced for exactly the names given (as envsubst does); nginx's `$name` stays."""
    names = set(re.findall(r"\$\{(\w+)\}", template))
    assert names == set(values), f"template variables {sorted(names)} vs given {sorted(values)}"
    return re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], template)


def real_ip_lines(trusted: str) -> str:
    cidrs = [c for c in re.split(r"[\s,]+", trusted.strip()) if c]
    if not cidrs:
        return "# (FRONT_REAL_IP_FROM is empty: the peer's own address is the client)"
    lines = [f"set_real_ip_from {c};" for c in cidrs]
    return "\n    ".join(lines + ["real_ip_header X-Forwarded-For;", "real_ip_recursive on;"])


def nginx_config(run_dir: Path, listen: str, settings: Settings, trusted: str) -> str:
    return render(TEMPLATE.read_text(), {
        "FRONT_USER": "user root;" if os.geteuid() == 0 else "",
        "FRONT_RUN_DIR": str(run_dir),
        "FRONT_SOCKET": str(run_dir / "gunicorn.sock"),
        "FRONT_LISTEN": listen,
        "FRONT_MAX_BODY": str(settings.max_request_bytes),
        "FRONT_REAL_IP": real_ip_lines(trusted),
        "VL_EDGE_DIR": str(EDGE_DIR),
    })


def executable(name: str) -> str:
    beside = Path(sys.executable).with_name(name)  # the venv's own, when run from one
    found = str(beside) if beside.exists() else shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if not found:
        raise SystemExit(f"[front] {name} is not installed")
    return found


def stop(proc: subprocess.Popen, sig: int, wait_s: float, name: str) -> int:
    """Signal `proc`, wait up to `wait_s`, then kill it; its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            log(f"{name} did not stop within {wait_s:g} s: killing it")
            proc.kill()
            proc.wait()
    return proc.returncode


def main(argv: list[str]) -> int:
    env = os.environ
    settings = Settings.from_env()  # a setting that does not parse stops the start here, named
    run_dir = Path(env.get("FRONT_RUN_DIR") or "/tmp/vlservice-front")
    listen = env.get("FRONT_LISTEN") or "8000"
    for sub in ("", "body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (run_dir / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    socket = run_dir / "gunicorn.sock"
    socket.unlink(missing_ok=True)  # a previous run's (a restarted container keeps /tmp)
    conf = run_dir / "nginx.conf"
    conf.write_text(nginx_config(run_dir, listen, settings, env.get("FRONT_REAL_IP_FROM", "")))

    nginx = [executable("nginx"), "-p", str(run_dir), "-e", "stderr", "-c", str(conf)]
    check = subprocess.run(nginx + ["-t", "-q"], capture_output=True, text=True)
    if check.returncode != 0:
        log(f"nginx refused its config {conf}:\n{check.stderr}")
        return 1

    procs: dict[str, subprocess.Popen] = {}
    stopping: dict[str, str] = {}

    def forward(sig, frame):
        stopping.setdefault("by", signal.Signals(sig).name)
        if "gunicorn" not in procs:  # before anything started: nothing to drain
            raise SystemExit(128 + sig)
        if procs["gunicorn"].poll() is None:
            procs["gunicorn"].send_signal(sig)
        if sig == signal.SIGHUP and procs["nginx"].poll() is None:
            procs["nginx"].send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, forward)

    # XDG_RUNTIME_DIR: Gunicorn's control socket goes in the run folder, writable under a read-only
    # root and not shared with any other Gunicorn of the same user.
    gunicorn_env = {**env, "VL_BIND": f"unix:{socket}", "XDG_RUNTIME_DIR": str(run_dir)}
    gunicorn = procs["gunicorn"] = subprocess.Popen([executable("gunicorn"), *(argv or GUNICORN_ARGS)],
                                                    cwd=ROOT, env=gunicorn_env)
    front = procs["nginx"] = subprocess.Popen(nginx)
    log(f"nginx on {listen} -> gunicorn on unix:{socket} (pids {front.pid}, {gunicorn.pid})")

    # Whichever ends first; os.wait is retried after a signal handler has run (PEP 475).
    while True:
        pid, status = os.wait()
        if pid in (gunicorn.pid, front.pid):
            break
    code = os.waitstatus_to_exitcode(status)
    rc = code if code >= 0 else 128 - code  # killed by a signal: 128 + its number, as a shell says
    if pid == gunicorn.pid:
        gunicorn.returncode = code
        why = f"after {stopping['by']}" if stopping else "on its own"
        log(f"gunicorn exited with {code} {why}: stopping nginx")
        stop(front, signal.SIGQUIT, NGINX_STOP_S, "nginx")
        return rc if stopping or rc else 1  # unasked, even a clean exit is a failure to restart on
    front.returncode = code
    log(f"nginx exited with {code}: stopping gunicorn")
    stop(gunicorn, signal.SIGTERM, settings.graceful_timeout + 10, "gunicorn")
    return rc or 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
