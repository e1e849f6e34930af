"""The page and the operational endpoints: `/`, `/api/config`, `/api/stats`, `/healthz`,
`/readyz`, `/metrics`. The page itself talks only to the public API."""

from __future__ import annotations

import functools
import json
import os
from importlib import resources

from flask import Blueprint, Response, current_app, render_template

from .appstate import current
from ..engine.reclaim import heap
from ..errors import NotReady

bp = Blueprint("web", __name__)


@functools.cache
def presets() -> list[dict[str, str]]:
    """The page's preset buttons: [{"name", "en", "zh", "media"}, ...], an asset written from the
    demo model's own questions (`python -m vlservice.demo.prompts`)."""
    return json.loads(resources.files("vlservice").joinpath("assets/presets.json").read_text(encoding="utf-8"))


@bp.get("/")
def index():
    return render_template("index.html")


@bp.get("/api/config")
def config():
    ctx = current()
    s, svc = ctx.settings, ctx.service
    spec = svc.spec
    per_token = ctx.encode_ms_per_token()
    return {
        "model": svc.model_name, "demo": svc.is_demo, "demo_notice": svc.info()["demo_notice"],
        "detail_max_pixels": {d: min(s.detail_pixels(d), spec.max_pixels) for d in ("low", "auto", "high")},
        "min_pixels": spec.min_pixels, "token_factor": spec.factor, "encode_ms_per_token": per_token,
        "default_max_tokens": s.default_max_tokens, "max_tokens_cap": s.max_tokens_cap,
        "api_key_required": s.auth, "max_image_bytes": s.max_image_bytes, "max_images": s.max_images,
        "vision_backend": s.vision_backend,
        "video": {"max_bytes": s.max_video_bytes, "max_seconds": s.max_video_seconds, "max_frames": s.max_video_frames,
                  "max_videos": s.max_videos, "fps": svc.video_spec.fps, "min_frames": svc.video_spec.min_frames,
                  "detail_frame_pixels": {d: s.video_frame_pixels(d) for d in ("low", "auto", "high")},
                  "min_pixels": svc.video_spec.min_pixels, "max_pixels": svc.video_spec.max_pixels,
                  "frame_cap_pixels": svc.video_spec.max_video_tokens * svc.video_spec.factor ** 2},
        "presets": presets(),  # the demo model's own questions: the page's preset buttons
    }


@bp.get("/api/stats")
def stats():
    ctx = current()
    # pid: each Gunicorn worker has its own service, queue and counters; it says whose these are
    return {"cpu": ctx.sampler.snapshot(), "rss_bytes": ctx.sampler.rss_bytes(), "heap": heap(), **ctx.service.stats(),
            "ready": ctx.service.ready, "model": ctx.service.model_name, "pid": os.getpid()}


@bp.get("/healthz")
def healthz():
    return {"status": "ok"}


@bp.get("/readyz")
def readyz():
    ctx = current()
    if not ctx.service.ready:
        raise NotReady("the model is loading and warming up", retry_after=5)
    if ctx.service.draining:  # out of the balancer's rotation at once; running requests still finish
        raise NotReady("shutting down", code="draining", retry_after=1)
    info = ctx.service.info()
    return {"status": "ready", "model": info["model"], "demo": info["demo"], "notice": (info["demo_notice"] or {}).get("en"),
            "vision_backend": info["vision_backend"], "load_s": info["load_s"], "warmup_s": info["warmup_s"]}


@bp.get("/metrics")
def metrics():
    return Response(current().metrics.render(), mimetype="text/plain; version=0.0.4")


@bp.get("/openapi.json")
def openapi_json():
    from . import openapi

    return openapi.spec(current_app)
