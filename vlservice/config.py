"""Settings, read once from the environment into one frozen object.

Every knob of the service lives here with its default, so the README's settings table, the
code and the tests agree (tests/unit/test_settings_table.py holds them to it). Nothing else reads
`os.environ` for a `VL_*` name, not even gunicorn.conf.py or wsgi.py: `Settings` is built by
`Settings.from_env()` and passed explicitly. Importing this module stays cheap (no torch), since
Gunicorn imports it to read its own settings.

One parser turns text into values, for the environment and for tools' `KEY=VALUE` overrides
(`Settings.parse_overrides`): a value that is not what its field needs is an error naming the
variable, never a silent default (`VL_WARMUP=flase` does not quietly mean False).

Why not pydantic-settings (issue 32; a prototype with `env_prefix="VL_"` passed tests/unit/test_config.py,
at about this length): it would take only the name mapping (`queue_size` <- `VL_QUEUE_SIZE`, one line
below) off our hands. Its booleans take "y", "t", "n" and "f", and its errors name the field and
say "Input should be a valid integer", so the switch words and a translation of every error into
"VL_X must be ..., got '...'" stay ours; `from_env(env=...)` (the tests, the deploy manifests'
check) has no public source for a given mapping (it needs the private `_load_env_vars`); a bare
`Settings()` would read `os.environ` unless the sources are cut down to init-only; and `Settings`
would stop being a dataclass (`dataclasses.fields`/`replace` are used by tests and tools). It also
costs: importing this module went from ~70 ms to ~640 ms and `from_env` from 0.16 ms to 2.6 ms
(medians on the 2-core dev box), and it read "2.0" as an integer and lower-case `vl_*` names.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

# OpenCV reads this once, when cv2 is first imported: it is the decoder's own guard against
# decompression bombs. Set it before anything imports cv2 (images.py also checks the header).
os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(64 * 1024 * 1024))

DEFAULT_HUB_MODEL = "Qwen/Qwen3-VL-2B-Instruct"
VISION_BACKENDS = ("onnx-int8", "onnx-fp32", "torch")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def _physical_cores() -> int:
    try:
        import psutil

        return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)
    except Exception:  # pragma: no cover - psutil is a dependency, this is belt and braces
        return max(1, os.cpu_count() or 1)


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "vlservice")


@dataclass(frozen=True)
class Settings:
    """All settings. Field name `foo_bar` is read from env `VL_FOO_BAR`."""

    model: str = ""  # VL_MODEL: hub id, local dir or "demo"; empty = default hub model, else demo
    cache_dir: str = field(default_factory=_default_cache_dir)
    vision_backend: str = "onnx-int8"
    llm_quant: str = ""  # "" (float32), opt-in "int8" (engine/model/quant.py) or "int4" (engine/model/ortdecode.py)
    llm_prepack: bool = True  # float32 LLM: weights reordered once for oneDNN (faster small-batch products)
    threads: int = 0  # 0 = physical cores / workers
    workers: int = 1  # Gunicorn worker processes (read here to split the cores between them)
    max_batch: int = 4  # requests decoded together, one forward pass per token for all (1: one at a time)
    # prompt tokens of a new request carried by each pass beside the running streams' tokens; 0: as
    # many as keep the pass within about three decode steps (measured as the server runs)
    prefill_chunk: int = 0
    queue_size: int = 8  # callers allowed to wait for a slot (beyond the VL_MAX_BATCH running)
    queue_timeout_s: float = 120.0  # a queued request that waits longer gets a timeout error
    media_decodes: int = 2  # images and clips decoded at once per worker (the rest wait their turn, after admission)
    max_tokens_cap: int = 1024  # largest max_tokens a request may ask for
    default_max_tokens: int = 256
    max_context_tokens: int = 8192  # prompt + completion
    max_images: int = 4  # per request
    max_image_bytes: int = 20 * 1024 * 1024  # encoded size of one image
    max_request_bytes: int = 64 * 1024 * 1024  # whole HTTP body (MAX_CONTENT_LENGTH)
    max_image_pixels: int = 40_000_000  # decoded width*height (checked from the header first)
    max_aspect_ratio: float = 200.0  # the model's own processor refuses more than 200:1
    detail_low_pixels: int = 256 * 32 * 32  # about 256 image tokens
    detail_auto_pixels: int = 768 * 32 * 32  # about 768 image tokens
    detail_high_pixels: int = 2048 * 32 * 32  # about 2048 image tokens
    max_videos: int = 1  # per request
    max_video_bytes: int = 32 * 1024 * 1024  # encoded size of one video
    max_video_seconds: float = 120.0  # duration read from the container, before decoding
    max_video_frames: int = 64  # sampled frames per video (the model takes them in pairs)
    video_detail_low_pixels: int = 64 * 32 * 32  # per sampled frame: about 64 tokens per frame pair
    video_detail_auto_pixels: int = 256 * 32 * 32  # about 256 tokens per frame pair
    video_detail_high_pixels: int = 768 * 32 * 32  # the reference processor's own per-frame cap
    feature_cache_mb: int = 512  # memory tier
    kv_cache_mb: int = 1024  # conversations' KV caches kept for follow-ups; 0 turns reuse off
    result_cache_entries: int = 256  # identical greedy requests answered at once; 0 turns it off
    # /v1/responses kept for previous_response_id and GET, per tenant, in each worker's memory (0 entries: none)
    responses_store_entries: int = 256
    responses_store_mb: int = 64
    responses_store_ttl_s: int = 3600  # from creation; 0: no age bound
    disk_cache_mb: int = 2048  # disk tier; 0 turns it off
    # Several replicas (README "Several replicas"): the caches' shared tier, and who answered.
    redis_url: str = ""  # redis://host:6379/0; empty: no shared tier (each replica caches alone)
    # Redis' `requirepass` (AUTH), kept out of the URL so it is never shown; a password in the URL works too
    redis_password: str = field(default="", repr=False)
    redis_timeout_s: float = 0.25  # a whole Redis call (not per socket op); slower is an outage (local caches only)
    redis_ttl_s: int = 86400  # shared entries expire after this (0: never; Redis' maxmemory LRU still bounds them)
    replica_name: str = ""  # the X-Served-By header; empty: the host name (the pod's name in Kubernetes)
    warmup: bool = True
    malloc_trim: bool = True  # return freed heap to the system when the model goes idle (glibc)
    malloc_trim_busy_s: float = 0.0  # also while the model is busy, at most this often; 0: only when idle
    # the memory allocator Gunicorn starts on (vlservice/allocator.py): auto = jemalloc when installed
    allocator: str = "auto"
    api_key: str = ""  # empty: no auth on /v1/*; comma separated for several keys (each a tenant)
    api_keys: str = ""  # named tenants' keys, "name:key,name:key" (beside or instead of api_key)
    priority_tenants: str = ""  # tenants whose X-Request-Priority is honoured ("*": all); without keys, all
    cors_origins: str = ""  # comma separated; empty: CORS off
    remote_images: str = ""  # comma separated https host allowlist; empty: remote URLs refused
    remote_image_timeout_s: float = 5.0
    log_level: str = "INFO"
    # Gunicorn's (read by gunicorn.conf.py; `workers` above is one of them too)
    bind: str = "0.0.0.0:8000"
    http_threads: int = 16  # threads per worker: the page, stats and health answer during a generation
    worker_timeout: int = 120  # stuck-worker timeout (a long generation does not trip it)
    graceful_timeout: int = 30  # seconds a worker gets to finish its requests on shutdown
    access_log: str = "-"  # "-" = stdout, or a file path
    # Set by gunicorn.conf.py, not by users: wsgi.py builds the app before the fork without
    # starting the service; each worker starts it after the fork (post_worker_init).
    defer_start: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> "Settings":
        """Settings from `env` (default: the process environment; empty values mean the default),
        then `overrides` (typed values), validated."""
        env = os.environ if env is None else env
        values = {}
        for f in fields(cls):
            raw = env.get("VL_" + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = _parse(f.name, f.type, raw)
        values.update(overrides)
        settings = cls(**values)
        settings.validate()
        return settings

    @classmethod
    def parse_overrides(cls, pairs) -> dict:
        """`KEY=VALUE` texts (the name with or without `VL_`, any case) to typed field values, through
        the same parser as the environment; an unknown name or a bad value is a ValueError."""
        types = {f.name: f.type for f in fields(cls)}
        out = {}
        for pair in pairs:
            key, sep, raw = pair.partition("=")
            name = key.strip().lower().removeprefix("vl_")
            if not sep or not name:
                raise ValueError(f"expected KEY=VALUE, got {pair!r}")
            if name not in types:
                raise ValueError(f"unknown setting {key.strip()!r} (known: {', '.join(sorted(types))})")
            out[name] = _parse(name, types[name], raw)
        return out

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)

    def validate(self) -> None:
        if self.vision_backend not in VISION_BACKENDS:
            raise ValueError(
                f"VL_VISION_BACKEND must be one of {', '.join(VISION_BACKENDS)}, got {self.vision_backend!r}"
            )
        if self.llm_quant not in ("", "none", "int8", "int4"):
            raise ValueError(f"VL_LLM_QUANT must be empty, int8 or int4, got {self.llm_quant!r}")
        if self.allocator not in ("auto", "jemalloc", "tcmalloc", "glibc"):
            raise ValueError(f"VL_ALLOCATOR must be auto, jemalloc, tcmalloc or glibc, got {self.allocator!r}")
        for f in fields(self):  # no count, size or timeout means anything below zero
            if f.type in ("int", "float") and getattr(self, f.name) < 0:
                raise ValueError(f"VL_{f.name.upper()} must be >= 0, got {getattr(self, f.name)}")
        for name in ("workers", "http_threads", "media_decodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"VL_{name.upper()} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.default_max_tokens <= self.max_tokens_cap:
            raise ValueError("VL_DEFAULT_MAX_TOKENS must be between 1 and VL_MAX_TOKENS_CAP")

    @property
    def auth(self) -> bool:
        """API keys are set: /v1/* (and the stats) need one."""
        return bool(self.api_key.strip(", ") or self.api_keys.strip(", "))

    @property
    def num_threads(self) -> int:
        # Each worker runs its own scheduler: two workers' steps may run at once, so the cores are
        # split between workers instead of oversubscribed.
        return self.threads if self.threads > 0 else max(1, _physical_cores() // max(1, self.workers))

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir)

    def video_frame_pixels(self, detail: str) -> int:
        return {
            "low": self.video_detail_low_pixels,
            "auto": self.video_detail_auto_pixels,
            "high": self.video_detail_high_pixels,
        }[detail]

    def detail_pixels(self, detail: str) -> int:
        return {
            "low": self.detail_low_pixels,
            "auto": self.detail_auto_pixels,
            "high": self.detail_high_pixels,
        }[detail]


def _parse(name: str, type_: object, raw: str):
    """The value of field `name` (annotated `type_`) from its text; ValueError naming `VL_<NAME>`.
    `type_` is a dataclass field's `type`: the annotation's text ("int"), since this module's
    annotations are postponed, which is what it is compared with."""
    var = "VL_" + name.upper()
    text = raw.strip()
    if type_ == "bool":
        if text.lower() in TRUE_WORDS:
            return True
        if text.lower() in FALSE_WORDS:
            return False
        raise ValueError(f"{var} must be one of {'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}, got {raw!r}")
    if type_ == "int":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{var} must be an integer, got {raw!r}") from None
    if type_ == "float":
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise ValueError(f"{var} must be a number, got {raw!r}")
        return value
    return raw
