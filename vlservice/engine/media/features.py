"""Where a request's image and video features come from: the feature cache, else the vision encoder.

The scheduler is given one `FeatureSource` and calls it on its encoder thread for the media a
prompt still needs; the source tells the request's `Generation` when it starts encoding and checks
its cancel between media. It holds no request state: the cache (memory, disk, Redis tiers) and
the encoder are the service's, made after the fork (`VLModelService.start`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ...errors import Cancelled
from . import video as vid
from ..caches import FeatureCache, FeatureShape
from .prepare import media_tokens
from ..types import Event

if TYPE_CHECKING:
    from ..batching.generation import Generation
    from .images import ImageSpec
    from ..model.vision import Encoder


class FeatureSource:
    def __init__(self, cache: FeatureCache, encoder: Encoder, spec: ImageSpec, video_spec: vid.VideoSpec,
                 width: tuple[int, int]):
        self.cache, self.encoder = cache, encoder
        self.spec, self.video_spec = spec, video_spec
        self.width = width  # (features per token, deepstack levels): what a cached entry must match
        self.calls = 0  # encoder runs (cache misses)

    def shape(self, prepared) -> FeatureShape:
        """What the encoder's features of one prepared image or clip are (a cached entry read back
        from disk or Redis is checked against it before use)."""
        spec = self.video_spec if isinstance(prepared, vid.PreparedVideo) else self.spec
        return FeatureShape.of(prepared.grid_thw, spec.merge_size, *self.width)

    def __call__(self, gen: Generation, timings: dict, needed: list[int]) -> list:
        """Features of the media `needed` (indices into the request's prepared media), in order;
        what it cost goes into `timings`."""
        work = gen.work
        feats, hit_all, lookup_s, encode_s = [], True, 0.0, 0.0
        for i in needed:
            p, key = work.prepared[i], work.keys[i]
            t = time.perf_counter()
            f = self.cache.get(key, self.shape(p)) if key else None
            lookup_s += time.perf_counter() - t
            if f is None:
                hit_all = False
                gen.queue.put(Event("stage", data={"stage": "vision_encode"}))
                t = time.perf_counter()
                f = self.encoder(p.pixel_values, p.grid_thw)
                self.calls += 1
                encode_s += time.perf_counter() - t
                if key:
                    self.cache.put(key, f)
            feats.append(f)
            if gen.cancelled.is_set():
                raise Cancelled("the request was cancelled")
        timings["cache_lookup_ms"] = lookup_s * 1e3
        timings["vision_encode_ms"] = encode_s * 1e3
        timings["vision_cache_hit"] = bool(work.prepared) and hit_all
        timings.update(media_tokens(work.prepared))
        return feats
