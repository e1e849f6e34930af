"""`python -m vlservice <command>` (`vlservice <command>` once installed): the command-line interface.

Commands:

- `make-test-model DIR`   write a small checkpoint of the real Qwen3-VL architecture
- `export`                build the ONNX vision encoder files for `VL_MODEL`
- `chat --image P "q"`    ask one question about images, stream the answer
- `serve`                 run the HTTP server (Gunicorn)
- `bench`, `train-demo`, `eval-demo`, `compare`, `soak`: provided by their own modules, which
  receive the remaining arguments unchanged.

Settings come from the `VL_*` environment (see `config.Settings`); the answer goes to stdout,
everything else (logs, timings, errors) to stderr. Exit codes: 0 ok, 1 engine or load failure,
2 bad usage or bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

# Commands implemented elsewhere: name -> (module, help). Imported only when run.
PASSTHROUGH = {
    "bench": ("vlservice.tools.bench", "benchmark the service (arguments go to vlservice.tools.bench)"),
    "train-demo": ("vlservice.demo.train", "train the bundled demo model (arguments go to vlservice.demo.train)"),
    "eval-demo": ("vlservice.demo.evaluate", "evaluate the demo model (arguments go to vlservice.demo.evaluate)"),
    "compare": ("vlservice.tools.compare", "compare vision backends (arguments go to vlservice.tools.compare)"),
    "soak": ("vlservice.tools.soak", "long-running load test (arguments go to vlservice.tools.soak)"),
    "edge": ("vlservice.tools.edge", "the adversarial table against direct Gunicorn and the front "
                                     "(arguments go to vlservice.tools.edge)"),
}

# Commands with packages of their own (vlservice/tools/requirements.txt), checked before they run.
TOOL_COMMANDS = (*PASSTHROUGH, "make-test-model")

EXPORT_BACKENDS = ("onnx-int8", "onnx-fp32")
NOISY_LOGGERS = ("onnx_ir", "onnxscript", "torch.onnx", "torch.export", "onnxruntime", "httpx", "urllib3",
                 "filelock")


class CLIError(Exception):
    """A message for the user and an exit code; printed as `error: <message>`."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- helpers

def _settings(**overrides):
    from .config import Settings

    try:
        return Settings.from_env(**overrides)
    except (ValueError, TypeError) as exc:
        raise CLIError(f"bad setting: {exc}") from exc


def setup_logging() -> None:
    level_name = "INFO"
    try:
        from .config import Settings

        level_name = Settings.from_env().log_level or "INFO"
    except Exception:  # a bad setting is reported by the command itself
        pass
    level = logging.getLevelName(level_name.strip().upper())
    if not isinstance(level, int):
        level = logging.INFO
    logging.basicConfig(level=level, stream=sys.stderr, format=LOG_FORMAT)
    if level > logging.DEBUG:  # the ONNX exporter logs hundreds of lines per export at INFO
        for name in NOISY_LOGGERS:
            logging.getLogger(name).setLevel(max(level, logging.WARNING))


@contextlib.contextmanager
def stdout_to_stderr():
    """Send anything written to stdout (Python or C level: exporters print) to stderr meanwhile."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
        saved = os.dup(fd)
    except (AttributeError, OSError, ValueError):  # stdout is not a real file (captured)
        with contextlib.redirect_stdout(sys.stderr):
            yield
        return
    try:
        sys.stderr.flush()
        os.dup2(sys.stderr.fileno(), fd)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, fd)
        os.close(saved)


def _load(loader, settings):
    from .errors import ModelLoadError

    try:
        with stdout_to_stderr():
            return loader(settings)
    except ModelLoadError as exc:
        raise CLIError(str(exc), EXIT_FAIL) from exc


def read_image(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    p = Path(path).expanduser()
    if not p.exists():
        raise CLIError(f"image file not found: {path}")
    if p.is_dir():
        raise CLIError(f"image path is a directory, not a file: {path}")
    try:
        return p.read_bytes()
    except OSError as exc:
        raise CLIError(f"cannot read image file {path}: {exc.strerror or exc}") from exc


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


# --------------------------------------------------------------------------- make-test-model

def cmd_make_test_model(args) -> int:
    from .build.checkpoints import REAL, TINY, make_model

    if args.vocab_limit is not None and args.vocab_limit < 1:
        raise CLIError(f"--vocab-limit must be >= 1, got {args.vocab_limit}")
    with stdout_to_stderr():
        path = make_model(args.dir, REAL if args.real_size else TINY, seed=args.seed, vocab_limit=args.vocab_limit)
    print(Path(path).resolve())
    return EXIT_OK


# --------------------------------------------------------------------------- export

def export_files(service, backends) -> list:
    """[(backend, path, stats)] for each backend, exported/quantised if not there yet."""
    from .engine.model.vision import ensure_onnx

    out = []
    for backend in backends:
        path, stats = ensure_onnx(service.source.path, service.model.model.visual,
                                  service.settings.cache_path, backend)
        out.append((backend, path, stats))
    return out


def cmd_export(args) -> int:
    from .engine.service import VLModelService

    settings = _settings()
    if args.backend == "all":
        backends = ["onnx-fp32", "onnx-int8"]  # fp32 first: int8 is quantised from it
    else:
        backends = [args.backend or (settings.vision_backend if settings.vision_backend in EXPORT_BACKENDS
                                     else "onnx-int8")]
    settings = settings.with_(vision_backend=backends[0])
    service = _load(VLModelService, settings)
    with stdout_to_stderr():
        if len(backends) == 1:
            service.prepare_files()  # exports/quantises if needed, keeps the stats
            (backend, path, stats), = export_files(service, backends)  # now only finds the file
            results = [(backend, path, {**stats, **{k: v for k, v in service.export_stats.items() if v}})]
        else:
            results = export_files(service, backends)
    for backend, path, stats in results:
        timing = f"export {stats.get('export_s', 0.0):.1f} s, quantize {stats.get('quantize_s', 0.0):.1f} s"
        if not stats.get("export_s") and not stats.get("quantize_s"):
            timing += " (already exported)"
        print(f"{backend}: {path}  {_size(int(stats.get('file_bytes', 0)))}  {timing}", flush=True)
    if service.decoder_stats:  # VL_LLM_QUANT=int4: the 4-bit decoder graph, built when the service loaded
        from .engine.model.ortdecode import ensure_decoder

        path, stats = ensure_decoder(service.source.path, settings.cache_path)
        built = service.decoder_stats.get("export_s", 0.0)
        print(f"llm-int4: {path}  {_size(int(stats['file_bytes']))}  "
              + (f"built {built:.1f} s" if built else "(already built)"), flush=True)
    return EXIT_OK


# --------------------------------------------------------------------------- chat

def build_request(args, service):
    from .engine.types import ChatRequest, ImageInput, Message, Sampling

    images = [ImageInput(read_image(p), detail=args.detail, param=f"--image {p}") for p in args.image]
    messages = []
    if args.system:
        messages.append(Message("system", [args.system]))
    messages.append(Message("user", [*images, args.question]))
    defaults = dict(getattr(service, "generation_defaults", {}) or {})
    if args.temperature is not None:
        defaults["temperature"] = args.temperature
    max_tokens = args.max_tokens if args.max_tokens is not None else service.settings.default_max_tokens
    sampling = Sampling(max_tokens=max_tokens, seed=args.seed, **defaults)
    return ChatRequest(messages=messages, sampling=sampling, priority="interactive")


def format_timings(timings: dict, finish_reason: str | None = None) -> str:
    """One aligned line per stage (ms, 1 decimal), then token counts and rates."""
    rows = [(k[:-3], f"{float(v):.1f}", "ms") for k, v in timings.items()
            if k.endswith("_ms") and isinstance(v, (int, float))]
    if "image_tokens" in timings:
        rows.append(("image_tokens", str(timings["image_tokens"]),
                     "(cached features)" if timings.get("vision_cache_hit") else ""))
    if "prompt_n" in timings:
        rows.append(("prompt_tokens", str(timings["prompt_n"]),
                     f"({float(timings.get('prompt_per_second', 0)):.1f} tokens/s)"))
    if "predicted_n" in timings:
        rows.append(("completion_tokens", str(timings["predicted_n"]),
                     f"({float(timings.get('predicted_per_second', 0)):.1f} tokens/s)"))
    if finish_reason:
        rows.append(("finish_reason", finish_reason, ""))
    name_w = max((len(r[0]) for r in rows), default=0)
    val_w = max((len(r[1]) for r in rows), default=0)
    lines = [f"  {n:<{name_w}}  {v:>{val_w}} {u}".rstrip() for n, v, u in rows]
    return "timings:\n" + "\n".join(lines)


def run_chat(service, request, stream_to=None) -> dict:
    """Submit and collect: {'answer', 'finish_reason', 'usage', 'timings'}; deltas written as they come."""
    from .errors import EngineError

    gen = service.submit(request)
    try:
        parts = []
        for ev in gen.events():
            if ev is None:
                continue
            if ev.kind == "delta":
                parts.append(ev.text)
                if stream_to is not None:
                    stream_to.write(ev.text)
                    stream_to.flush()
            elif ev.kind == "error":
                raise ev.error
            elif ev.kind == "done":
                return {"answer": "".join(parts), "finish_reason": ev.data.get("finish_reason"),
                        "usage": ev.data.get("usage", {}), "timings": ev.data.get("timings", {})}
        raise EngineError("generation ended without a result")
    finally:
        # Let the scheduler leave the model before the interpreter exits: a process that exits
        # while a thread is inside torch aborts ("terminate called without an active exception").
        gen.cancel()
        service.close()


def cmd_chat(args) -> int:
    from .errors import APIError
    from .engine.service import load_service

    for p in args.image:  # fail fast on a bad path, before the model loads
        if p != "-" and not Path(p).expanduser().is_file():
            read_image(p)  # raises the precise message
    if args.max_tokens is not None and args.max_tokens < 1:
        raise CLIError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.temperature is not None and args.temperature < 0:
        raise CLIError(f"--temperature must be >= 0, got {args.temperature}")
    if sum(p == "-" for p in args.image) > 1:
        raise CLIError("only one --image may be read from stdin ('-')")
    settings = _settings()
    service = _load(load_service, settings)
    try:
        request = build_request(args, service)
        out = None if args.json else sys.stdout
        try:
            with contextlib.redirect_stdout(sys.stderr):  # only the answer goes to stdout
                result = run_chat(service, request, stream_to=out)
        except APIError as exc:
            if out is not None:
                out.flush()
            where = f"{exc.param}: " if exc.param and exc.param.startswith("--image") else ""
            raise CLIError(where + exc.message, EXIT_USAGE if exc.status < 500 else EXIT_FAIL) from exc
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result, ensure_ascii=False), flush=True)
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(format_timings(result["timings"], result["finish_reason"]), file=sys.stderr, flush=True)
    return EXIT_OK


# --------------------------------------------------------------------------- serve

def parse_bind(bind: str) -> str:
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise CLIError(f"--bind must be HOST:PORT (e.g. 0.0.0.0:8000), got {bind!r}")
    return bind if host else f"0.0.0.0:{port}"


NO_SERVER_FILES = ("`serve` runs the server files of a checkout (app.py, wsgi.py, gunicorn.conf.py, templates/, "
                   "static/), which the wheel does not carry: run it in the repository's folder")


def server_root() -> Path | None:
    """The folder with the server's files: the checkout this package runs from, else the current
    directory (`pip install .`, then `vlservice serve` in the checkout); None when neither has them."""
    for root in (REPO_ROOT, Path.cwd()):
        if (root / "gunicorn.conf.py").is_file():
            return root
    return None


def serve_command(args, root: Path | None = None) -> tuple[list, dict]:
    """The argv and environment `serve` execs."""
    root = root or REPO_ROOT
    env = dict(os.environ)
    if args.bind:
        env["VL_BIND"] = parse_bind(args.bind)
    if args.workers is not None:
        if args.workers < 1:
            raise CLIError(f"--workers must be >= 1, got {args.workers}")
        env["VL_WORKERS"] = str(args.workers)
        env["WEB_CONCURRENCY"] = str(args.workers)  # Gunicorn's own default for `workers`
    # wsgi.py lives in the repo root: make it importable whatever the working directory is
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    argv = [sys.executable, "-m", "gunicorn", "-c", str(root / "gunicorn.conf.py"), "wsgi:app"]
    return argv, env


def cmd_serve(args) -> int:
    root = server_root()
    argv, env = serve_command(args, root)  # a bad --bind or --workers is reported first
    if root is None:
        raise CLIError(NO_SERVER_FILES, EXIT_FAIL)
    if importlib.util.find_spec("gunicorn") is None:
        raise CLIError("gunicorn is not installed (pip install gunicorn)", EXIT_FAIL)
    os.environ.clear()
    os.environ.update(env)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)
    return EXIT_FAIL  # pragma: no cover - execvp does not return


# --------------------------------------------------------------------------- pass-through commands

def run_passthrough(name: str, rest: list) -> int:
    module_name, _ = PASSTHROUGH[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # only "this module is missing", not a missing dependency inside it
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            print(f"error: `{name}` is not available in this build", file=sys.stderr)
            return EXIT_USAGE
        raise
    code = module.main(rest)
    return code if isinstance(code, int) else EXIT_OK


# --------------------------------------------------------------------------- parser

class _HelpFormatter(argparse.HelpFormatter):
    """Room for the longest command name, so each command's help stays on its line."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=30, width=min(100, max(60, _terminal_width())))
        self._action_max_length = 4 + max(len(n) for n in ["make-test-model", *PASSTHROUGH])


def _terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size((100, 24)).columns


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        # `vlservice` when run as the installed command (pyproject.toml's [project.scripts])
        prog="vlservice" if Path(sys.argv[0]).name == "vlservice" else "python -m vlservice",
        description="vlservice: a CPU-first server for Qwen3-VL. Settings come from VL_* environment variables.",
        formatter_class=_HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>", title="commands")

    p = sub.add_parser("make-test-model", help="write a small random checkpoint of the real Qwen3-VL architecture",
                       description="Write a checkpoint of the real Qwen3-VL architecture (random weights) "
                                   "with tokenizer and preprocessor files; prints its path.")
    p.add_argument("dir", metavar="DIR", help="output directory (created if needed)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the weights (default 0)")
    p.add_argument("--real-size", action="store_true", help="the real Qwen3-VL-2B sizes instead of tiny ones")
    p.add_argument("--vocab-limit", type=int, default=None, metavar="N",
                   help="keep only the first N tokenizer entries (smaller embedding)")
    p.set_defaults(func=cmd_make_test_model)

    p = sub.add_parser("export", help="export the vision encoder of VL_MODEL to ONNX (and INT8)",
                       description="Load VL_MODEL and build the ONNX vision encoder files under VL_CACHE_DIR "
                                   "(with VL_LLM_QUANT=int4, the 4-bit decoder graph too); prints path, size and "
                                   "export/quantize seconds.")
    p.add_argument("--backend", choices=[*EXPORT_BACKENDS, "all"], default=None,
                   help="which files to build (default: VL_VISION_BACKEND, or onnx-int8)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("chat", help="ask one question about images; streams the answer",
                       description="Load VL_MODEL, ask one question about the images and stream the answer to "
                                   "stdout; timings go to stderr.")
    p.add_argument("question", help="the question (text after the images)")
    p.add_argument("--image", action="append", default=[], metavar="PATH",
                   help="image file (repeatable, in order; '-' reads stdin)")
    p.add_argument("--detail", choices=("low", "auto", "high"), default="auto", help="image resolution budget")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="most tokens to generate (default VL_DEFAULT_MAX_TOKENS)")
    p.add_argument("--temperature", type=float, default=None, metavar="T",
                   help="0 = greedy (default: the model's generation config)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed")
    p.add_argument("--system", default=None, metavar="TEXT", help="a system message")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object {answer, finish_reason, usage, timings} instead")
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("serve", help="run the HTTP server (Gunicorn with gunicorn.conf.py)",
                       description="Exec Gunicorn with the repository's gunicorn.conf.py and wsgi:app (the "
                                   "checkout this package runs from, else the current directory).")
    p.add_argument("--bind", default=None, metavar="HOST:PORT", help="address to listen on (sets VL_BIND)")
    p.add_argument("--workers", type=int, default=None, metavar="N", help="worker processes (sets VL_WORKERS)")
    p.set_defaults(func=cmd_serve)

    for name, (_, text) in PASSTHROUGH.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: list | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    if argv and argv[0] in TOOL_COMMANDS:  # before the tool is imported: one line, not a traceback
        from .tools import unmet

        message = unmet(argv[0])
        if message:
            print(message, file=sys.stderr)
            return EXIT_USAGE
    if argv and argv[0] in PASSTHROUGH:  # everything after the name belongs to that command
        return run_passthrough(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(args)
    except CLIError as exc:
        sys.stdout.flush()
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
