#!/usr/bin/env python3
"""Build the repository's Dockerfile with buildah (no Docker engine), serve the image, check it.

    sudo python3 deploy/image/build.py [--tag vlservice:latest] [--record docs/bench/image.json]

Needs root, `buildah` and, when `python:3.11-slim` is neither stored nor pullable, `debootstrap`
(Debian: `apt-get install -y buildah debootstrap`). Standard library only.

1. The base. `FROM python:3.11-slim` resolves to the official image when it is stored or can be
   pulled; otherwise a local stand-in is made once and kept as `localhost/python:3.11-slim`
   (a short name's local lookup tries `localhost/` first): Debian 12 (bookworm, whose python3 is
   3.11) from `debootstrap --variant=minbase` with python3, python3-venv and ca-certificates, and
   Python laid out as the official image has it: a venv at /usr/local, so `python` and `pip` are
   /usr/local/bin's, first on PATH, and `pip install` as root works (a venv is not "externally
   managed", PEP 668). A later run finds it and skips this step (`--rebuild-base` redoes it).
2. `buildah bud --isolation chroot --network host --layers` of the Dockerfile as it is. The host's
   pip configuration is handed to its RUN steps as read-only bind mounts: the config files pip
   reads (/etc/xdg/pip/pip.conf, /etc/pip.conf at their paths, this user's at root's) and every
   local file or folder they name (cert, constraint, find-links, file:// indexes). Nothing of it
   stays in the image but empty mount points: buildah 1.28 leaves each `--volume` target it had
   to create (here /etc/pip.conf, /etc/xdg/pip/*, /root/.config/pip/pip.conf, /opt/wheels,
   /opt/pypi, /opt/pypi-more) as an empty file or folder. PIP_* environment variables are not
   passed (only `--env` could, and it would stay in the image). The Dockerfile's
   `ENV PIP_EXTRA_INDEX_URL` (PyTorch's CPU index) outranks any config file's extra-index-url;
   where that index cannot be reached pip does not hang, it fails fast (a name that does not
   resolve is retried 5 times, about 8 s, per project, then pip goes on with the other indexes).
3. Serves it: `buildah from` the image and `buildah run --isolation chroot` its ENTRYPOINT + CMD
   (`tini -- python deploy/front/launch.py`) as the image's user (uid 10001) in its WORKDIR, with
   VL_MODEL=demo, FRONT_LISTEN on a free loopback port (host network) and /data a fresh temporary
   folder; waits for /readyz, checks /readyz, the page and a chat completion about a picture, then
   stops it (SIGTERM to tini, which the launcher turns into Gunicorn's drain; what is left of the
   run's processes after a grace period is killed) and removes the working container. The one
   difference from `docker run`: the command's output goes through a pipe its own user owns (runc
   hands a container's stdio to its user, `buildah run` keeps root's, which nginx cannot reopen).
4. Reports the image's size and writes a record (`--record`, JSON): the date, the CPU, the command,
   the size, the build's seconds and the checks. Exit status 0 only when every step passed.
"""

from __future__ import annotations

import argparse
import base64
import configparser
import datetime as dt
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OFFICIAL_BASE = "docker.io/library/python:3.11-slim"
STAND_IN = "localhost/python:3.11-slim"
SUITE = "bookworm"  # Debian 12: python3 is 3.11, as in python:3.11-slim
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the official image's
PIP_PATH_KEYS = ("cert", "client-cert", "constraint", "find-links", "index-url", "extra-index-url")
READY_TIMEOUT_S = 900.0  # the first start converts the demo model's vision encoder
STOP_GRACE_S = 60.0


def log(message: str) -> None:
    print(f"[image] {message}", flush=True)


def run(cmd: list[str], *, capture: bool = False, check: bool = True, timeout: float | None = None,
        **kw) -> subprocess.CompletedProcess:
    log("$ " + shlex.join(cmd))
    kw.setdefault("stdout", subprocess.PIPE if capture else None)
    return subprocess.run(cmd, check=check, text=True, timeout=timeout, **kw)


def buildah(*args: str, capture: bool = True, check: bool = True, timeout: float | None = None) -> str:
    out = run(["buildah", *args], capture=capture, check=check, timeout=timeout)
    return (out.stdout or "").strip()


def image_exists(name: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", name],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


# ---- 1. the base -------------------------------------------------------------------------------

DEBIAN_SOURCES = """\
Types: deb
URIs: {mirror}
Suites: {suite} {suite}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {security}
Suites: {suite}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def make_stand_in(mirror: str, work: Path) -> dict:
    """Debian 12 minbase + python3 as python:3.11-slim lays it out, committed as STAND_IN."""
    if shutil.which("debootstrap") is None:
        raise SystemExit("python:3.11-slim cannot be pulled and debootstrap is not installed "
                         "(apt-get install -y debootstrap)")
    rootfs = work / "rootfs"
    run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
         SUITE, str(rootfs), mirror])
    # Python as the official image has it: /usr/local/bin/python and pip first on PATH, and pip
    # installs into /usr/local as root (a venv there; Debian's own python3 stays "externally
    # managed" for its packages).
    run(["chroot", str(rootfs), "/usr/bin/python3", "-m", "venv", "/usr/local"])
    run(["chroot", str(rootfs), "/usr/local/bin/pip", "--version"])
    version = run(["chroot", str(rootfs), "/usr/local/bin/python", "-c",
                   "import platform; print(platform.python_version())"], capture=True).stdout.strip()
    # apt as in the official image: deb822 sources with the updates and security suites, no lists.
    security = re.sub(r"/debian/?$", "/debian-security", mirror.rstrip("/"))
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(
        DEBIAN_SOURCES.format(mirror=mirror, security=security, suite=SUITE))
    for junk in ("var/lib/apt/lists", "var/cache/apt/archives"):
        for p in (rootfs / junk).glob("*"):
            if p.is_file():
                p.unlink()
    for p in (rootfs / "var/cache/apt").glob("*.bin"):
        p.unlink()
    for p in (rootfs / "var/log").rglob("*"):  # debootstrap's and dpkg's logs
        if p.is_file():
            p.unlink()
    (rootfs / "etc/resolv.conf").unlink(missing_ok=True)  # buildah supplies the host's at run time
    (rootfs / "etc/hostname").write_text("localhost\n")

    ctr = buildah("from", "scratch")
    try:
        mnt = buildah("mount", ctr)
        # tar keeps owners, modes, links and device-less /dev (buildah mounts /dev, /proc, /sys).
        pack = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "--exclude=./dev/*",
                                 "--exclude=./proc/*", "--exclude=./sys/*", "-cf", "-", "."],
                                stdout=subprocess.PIPE)
        unpack = subprocess.run(["tar", "-C", mnt, "--numeric-owner", "-xpf", "-"], stdin=pack.stdout)
        pack.stdout.close()
        if pack.wait() or unpack.returncode:
            raise SystemExit("copying the stand-in's root filesystem into buildah failed")
        buildah("umount", ctr)
        buildah("config", "--env", f"PATH={PATH_ENV}", "--env", "LANG=C.UTF-8",
                "--env", f"PYTHON_VERSION={version}", "--cmd", "python3",
                "--label", f"org.opencontainers.image.description=vlservice's local stand-in for "
                           f"python:3.11-slim: Debian {SUITE} minbase, python3 {version} (venv at /usr/local)",
                ctr)
        buildah("commit", "--rm", ctr, STAND_IN)
    except BaseException:
        subprocess.run(["buildah", "rm", ctr], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        raise
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return {"python": version}


def ensure_base(args, work: Path) -> dict:
    """Which `python:3.11-slim` the build will use; made (and kept) when it cannot be had."""
    if not args.rebuild_base:
        for name, source in ((OFFICIAL_BASE, "official, stored"), (STAND_IN, "stand-in, stored")):
            if image_exists(name):
                log(f"base: {name} ({source})")
                return {"image": name, "source": source, "seconds": 0.0}
    elif image_exists(STAND_IN):
        buildah("rmi", STAND_IN, check=False)
    start = time.monotonic()
    if not args.rebuild_base and not args.no_pull:
        try:
            pulled = run(["buildah", "pull", "--quiet", "--retry", "0", OFFICIAL_BASE], check=False, timeout=180,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if pulled.returncode == 0:
                return {"image": OFFICIAL_BASE, "source": "official, pulled",
                        "seconds": round(time.monotonic() - start, 1)}
            why = (pulled.stderr or "").strip().splitlines()[-1:] or ["(no message)"]
            log(f"cannot pull {OFFICIAL_BASE}: {why[0]}")
        except subprocess.TimeoutExpired:
            log(f"cannot pull {OFFICIAL_BASE}: no answer within 180 s")
    log(f"making the stand-in {STAND_IN} (debootstrap {SUITE}; done once, kept)")
    made = make_stand_in(args.mirror, work)
    return {"image": STAND_IN, "source": "stand-in, made now: debootstrap --variant=minbase "
            f"{SUITE} + python3 python3-venv ca-certificates, venv at /usr/local",
            "python": made["python"], "seconds": round(time.monotonic() - start, 1)}


# ---- 2. the build ------------------------------------------------------------------------------

def pip_config_mounts() -> list[tuple[str, str]]:
    """The host's pip configuration for the build's RUN steps (which run as root): each config file
    pip reads here and each local file or folder they name, as (host path, path in the build).
    Global files and what they name keep their paths; this user's files go to root's."""
    xdg_dirs = [d for d in (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":") if d]
    home = Path.home()
    xdg_home = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    files = [(Path(d) / "pip" / "pip.conf", str(Path(d) / "pip" / "pip.conf")) for d in xdg_dirs]
    files += [(Path("/etc/pip.conf"), "/etc/pip.conf"),
              (home / ".pip" / "pip.conf", "/root/.pip/pip.conf"),
              (xdg_home / "pip" / "pip.conf", "/root/.config/pip/pip.conf")]
    if os.environ.get("PIP_CONFIG_FILE") or any(k.startswith("PIP_") for k in os.environ):
        log("note: PIP_* environment variables (" + ", ".join(sorted(k for k in os.environ if k.startswith("PIP_")))
            + ") are not handed to the build; only pip's config files are")
    pairs: list[tuple[str, str]] = []
    for f, inside in files:
        if not f.is_file():
            continue
        pairs.append((str(f), inside))
        parser = configparser.RawConfigParser()
        try:
            parser.read(f)
        except configparser.Error as e:
            log(f"skipping what {f} names: {e}")
            continue
        for section in parser.sections():
            for key, value in parser.items(section):
                if key.replace("_", "-") not in PIP_PATH_KEYS:
                    continue
                for item in value.split():
                    local = item[len("file://"):] if item.startswith("file://") else item
                    if local.startswith("/") and Path(local).exists():
                        # a file:// index's folder (its /simple pages link to files beside it)
                        q = Path(local)
                        q = q.parent if item.startswith("file://") and q.name == "simple" else q
                        pairs.append((str(q), str(q)))
    seen: dict[str, str] = {}
    for host, inside in pairs:
        seen.setdefault(inside, host)
    # a folder already mounted covers what lies under it
    return [(host, inside) for inside, host in seen.items()
            if not any(inside.startswith(other + "/") for other in seen if other != inside)]


def build_image(args) -> tuple[float, list[tuple[str, str]]]:
    cmd = ["buildah", "bud", "--isolation", "chroot", "--network", "host", "--layers",
           "--pull=never", "-f", str(ROOT / "Dockerfile"), "-t", args.tag]
    mounts = pip_config_mounts()
    for host, inside in mounts:
        cmd += ["--volume", f"{host}:{inside}:ro"]
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        if os.environ.get(name):  # predefined build args: seen by RUN, not kept in the image
            cmd += ["--build-arg", f"{name}={os.environ[name]}"]
    if args.no_cache:
        cmd.append("--no-cache")
    cmd.append(str(ROOT))
    start = time.monotonic()
    run(cmd)
    return round(time.monotonic() - start, 1), mounts


def image_layers(tag: str) -> list[dict]:
    """The image's layers, bottom first: their sizes as stored (uncompressed tar, from the manifest)
    and the step that made each (the history entries that are not empty layers)."""
    info = json.loads(buildah("inspect", "--type", "image", tag))
    sizes = [int(layer["size"]) for layer in json.loads(info["Manifest"])["layers"]]
    steps = [h.get("created_by", "") for h in (info.get("OCIv1") or {}).get("history", []) if not h.get("empty_layer")]
    if len(steps) != len(sizes):
        steps = [""] * len(sizes)
    return [{"size_bytes": n, "step": re.sub(r"^/bin/sh -c (#\(nop\) )?", "", step).strip()[:160]}
            for n, step in zip(sizes, steps)]


# ---- 3. serving it -----------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_png(w: int = 64, h: int = 48) -> bytes:
    """A small RGB picture (a gradient with a square), PNG-encoded with the standard library."""
    rows = b"".join(b"\x00" + bytes(
        c for x in range(w) for c in ((200, 40, 40) if 16 <= x < 40 and 12 <= y < 36 else (4 * x, 5 * y, 128)))
        for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def http(url: str, body: dict | None = None, timeout: float = 10.0) -> tuple[int, dict, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def descendants(pid: int) -> list[int]:
    """`pid`'s living descendants (from /proc), nearest first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def uid_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def stop_run(proc: subprocess.Popen) -> dict:
    """Stop a detached `buildah run`: SIGTERM to the image's PID 1 (tini, which passes it to the
    launcher: Gunicorn drains, then nginx stops), as `docker stop` does; after STOP_GRACE_S, SIGKILL
    to every process left of the run (its process group and its descendants)."""
    if proc.poll() is not None:
        return {"exit": proc.returncode, "how": "had exited"}
    tini = next((p for p in descendants(proc.pid) if comm(p) == "tini"), None)
    target = tini or proc.pid
    log(f"stopping: SIGTERM to {'tini' if tini else 'buildah run'} (pid {target})")
    os.kill(target, signal.SIGTERM)
    how = "SIGTERM to tini" if tini else "SIGTERM to buildah run"
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        how += f", then SIGKILL after {STOP_GRACE_S:g} s"
    left = descendants(proc.pid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the run was started as its own process group
    except ProcessLookupError:
        pass
    proc.wait(30)
    return {"exit": proc.returncode, "how": how}


def serve_and_check(args, work: Path) -> dict:
    config = json.loads(buildah("inspect", "--type", "image", args.tag))["OCIv1"]["config"]
    command = (config.get("Entrypoint") or []) + (config.get("Cmd") or [])
    user = config.get("User") or "root"
    data = work / "data"
    data.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ctr = buildah("from", "--pull=never", args.tag)
    server_log = work / "server.log"
    result: dict = {"command": command, "user": user, "listen": f"127.0.0.1:{port}"}
    proc = None
    try:
        uid = int(buildah("run", "--isolation", "chroot", "--user", user, ctr, "--", "id", "-u"))
        result["uid"] = uid
        os.chown(data, uid, uid)  # the image's /data, writable by its user as a named volume is
        env = {"VL_MODEL": "demo", "FRONT_LISTEN": f"127.0.0.1:{port}", "HF_HUB_OFFLINE": "1",
               "TINI_SUBREAPER": "1"}  # tini is not PID 1 without a PID namespace: be the reaper
        cmd = ["buildah", "run", "--isolation", "chroot", "--network", "host", "--user", user,
               "--volume", f"{data}:/data"]
        for k, v in env.items():
            cmd += ["--env", f"{k}={v}"]
        # The command's stdout and stderr: a pipe its user owns. Under Docker, runc hands the
        # container's stdio to its user; `buildah run` gives it root's pipes (mode 0600), which
        # nginx, as uid 10001, cannot reopen for its access log (/dev/stdout: EACCES). The image's
        # command itself runs unchanged, its output passed on by `cat`.
        cmd += [ctr, "--", "/bin/sh", "-c", '"$@" 2>&1 | cat', "sh", *command]
        log("$ " + shlex.join(cmd) + f"  > {server_log} (detached)")
        out = open(server_log, "wb")
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        ready = None
        while time.monotonic() - start < READY_TIMEOUT_S:
            if proc.poll() is not None:
                break
            try:
                status, _, _ = http(url + "/readyz", timeout=3)
                if status == 200:
                    ready = round(time.monotonic() - start, 1)
                    break
            except OSError:
                pass
            time.sleep(1)
        if ready is None:
            tail = server_log.read_text(errors="replace")[-4000:]
            raise SystemExit(f"the image's server did not become ready (exit {proc.poll()}):\n{tail}")
        result["ready_seconds"] = ready
        log(f"ready after {ready} s on {url}")
        users = {comm(p): uid_of(p) for p in descendants(proc.pid)}
        result["process_uids"] = {k: v for k, v in users.items() if k in ("tini", "python", "gunicorn", "nginx")}

        checks = {}
        status, _, body = http(url + "/readyz")
        checks["readyz"] = {"status": status, "ok": status == 200}
        status, headers, body = http(url + "/")
        ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
        checks["page"] = {"status": status, "content_type": ctype, "bytes": len(body),
                          "ok": status == 200 and ctype.startswith("text/html") and b"<html" in body.lower()}
        status, _, body = http(url + "/api/stats")  # the worker runs on the image's allocator (VL_ALLOCATOR)
        allocator = (json.loads(body).get("heap") or {}).get("allocator") if status == 200 else None
        checks["allocator"] = {"status": status, "allocator": allocator, "ok": allocator == "jemalloc"}
        png = "data:image/png;base64," + base64.b64encode(tiny_png()).decode()
        t = time.monotonic()
        status, _, body = http(url + "/v1/chat/completions", {
            "model": "demo", "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": png}},
                {"type": "text", "text": "Describe this image."}]}]}, timeout=300)
        answer = json.loads(body) if body.startswith(b"{") else {}
        choice = (answer.get("choices") or [{}])[0]
        checks["chat"] = {"status": status, "seconds": round(time.monotonic() - t, 2),
                          "finish_reason": choice.get("finish_reason"),
                          "content": (choice.get("message") or {}).get("content"),
                          "usage": answer.get("usage"),
                          "ok": status == 200 and answer.get("object") == "chat.completion"
                          and isinstance((choice.get("message") or {}).get("content"), str)}
        result["checks"] = checks
        for name, check in checks.items():
            log(f"check {name}: {'ok' if check['ok'] else 'FAILED'} {json.dumps(check)[:300]}")
    finally:
        if proc is not None:
            result["stop"] = stop_run(proc)
            log(f"stopped: {result['stop']}")
            if args.server_log:
                shutil.copy(server_log, args.server_log)
        buildah("rm", ctr, check=False)
    return result


# ---- 4. the record -----------------------------------------------------------------------------

def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def human(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return str(n)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", default="vlservice:latest")
    ap.add_argument("--record", default=str(ROOT / "docs" / "bench" / "image.json"),
                    help="where the JSON record goes ('' for none)")
    ap.add_argument("--mirror", default="http://deb.debian.org/debian", help="Debian mirror for the stand-in")
    ap.add_argument("--no-pull", action="store_true", help="do not try to pull python:3.11-slim")
    ap.add_argument("--rebuild-base", action="store_true", help="make the stand-in base again")
    ap.add_argument("--no-cache", action="store_true", help="rebuild every layer of the image")
    ap.add_argument("--no-serve", action="store_true", help="build only")
    ap.add_argument("--server-log", default="", help="keep the served image's log here")
    ap.add_argument("--work-dir", default=None, help="for the stand-in's root filesystem and /data (default: $TMPDIR)")
    args = ap.parse_args(argv)

    if os.geteuid() != 0:
        raise SystemExit("run as root: buildah's chroot isolation and debootstrap need it")
    if shutil.which("buildah") is None:
        raise SystemExit("buildah is not installed (apt-get install -y buildah debootstrap)")
    invoked = "python3 deploy/image/build.py" + (" " + shlex.join(argv) if argv else "")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vl-image-", dir=args.work_dir) as tmp:
        work = Path(tmp)
        base = ensure_base(args, work)
        build_s, mounts = build_image(args)
        layers = image_layers(args.tag)
        size = sum(layer["size_bytes"] for layer in layers)
        if layers and layers[0]["step"] in ("", "/bin/sh"):  # a base committed with no history
            layers[0]["step"] = f"FROM python:3.11-slim: {base['image']}"
        log(f"built {args.tag} in {build_s} s: {size} bytes ({human(size)})")
        served = None if args.no_serve else serve_and_check(args, work)
    ok = served is None or all(c["ok"] for c in served["checks"].values())
    record = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
        "cpu": cpu_name(), "cores": os.cpu_count(),
        "command": invoked,
        "buildah": buildah("--version"),
        "base": base,
        "image": args.tag,
        "size_bytes": size, "size": human(size),
        "size_note": "uncompressed, as stored (what `docker images` shows): the sum of the manifest's layers",
        "layers": [{**layer, "size": human(layer["size_bytes"])} for layer in layers],
        "build_seconds": build_s,
        "build": "buildah bud --isolation chroot --network host --layers" + (" --no-cache" if args.no_cache else ""),
        "pip_config_mounted": [f"{h}:{i}:ro" for h, i in mounts],
        "served": served,
        "total_seconds": round(time.monotonic() - began, 1),
        "ok": ok,
    }
    if args.record:
        Path(args.record).parent.mkdir(parents=True, exist_ok=True)
        Path(args.record).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        log(f"record: {args.record}")
    log(f"image {args.tag}: {human(size)} ({size} bytes); build {build_s} s; checks "
        + ("skipped" if served is None else ("all passed" if ok else "FAILED")))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
