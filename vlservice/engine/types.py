"""What a request is, inside the engine: messages of text and images, sampling, priority; and the
events a running request reports. No HTTP here: the protocol layer builds these."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field

from ..errors import APIError

PRIORITIES = {"interactive": 0, "default": 1, "batch": 2}


@dataclass
class Sampling:
    max_tokens: int = 256
    min_tokens: int = 0
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0  # over prompt and answer (vLLM, llama.cpp)
    frequency_penalty: float = 0.0  # OpenAI's: per occurrence in the answer so far
    presence_penalty: float = 0.0  # OpenAI's: once for any token the answer so far holds
    seed: int | None = None
    stop: tuple = ()
    logprobs: int | None = None  # None: off; else report each token's log probability and this many alternatives
    grammar: str | None = None  # `response_format`: the answer is constrained to this llguidance grammar

    @property
    def greedy(self) -> bool:
        # Below this, dividing the logits by the temperature overflows to inf and sampling fails;
        # vLLM treats such temperatures as greedy too (_SAMPLING_EPS).
        return self.temperature < 1e-5



@dataclass
class ImageInput:
    data: bytes
    detail: str = "auto"
    param: str = "image"  # where it came from in the request, for error messages
    max_pixels: int | None = None  # the resolved pixel budget (None: `detail`'s)
    min_pixels: int | None = None  # scaled up to at least this (None: the model's minimum)


@dataclass
class VideoInput:
    data: bytes
    detail: str = "auto"
    fps: float | None = None  # frames sampled per second (None: the model's, 2)
    max_frames: int | None = None  # at most this many sampled frames (None: VL_MAX_VIDEO_FRAMES)
    param: str = "video"
    min_frames: int | None = None  # at least this many sampled frames (None: the model's, 4)
    max_pixels: int | None = None  # each sampled frame's budget (None: `detail`'s)


@dataclass
class Message:
    role: str  # system | user | assistant | tool
    parts: list  # str (text), ImageInput or VideoInput, in order
    tool_calls: list = field(default_factory=list)  # an assistant turn's calls: {"name", "arguments" (JSON text)}


@dataclass
class ChatRequest:
    messages: list
    sampling: Sampling = field(default_factory=Sampling)
    priority: str = "default"
    result_cache: bool = True  # an identical greedy request may be answered from the result cache
    tools: list = field(default_factory=list)  # OpenAI's tool objects, rendered by the chat template
    tenant: str = ""  # the API key's tenant ("" without keys): its fair share, its own caches and cancels
    raw_prompt: str | None = None  # /v1/completions: this text is the whole prompt (no chat template), as text
    choices: int = 1  # answers wanted (OpenAI's `n`): one prefill, then each its own sequence in the batch
    gone: threading.Event = field(default_factory=threading.Event, repr=False)  # its client left during submit

    def cancel(self) -> None:
        """Its client left before a Generation existed: submission stops its media work."""
        self.gone.set()
    id: str = field(default_factory=lambda: "chatcmpl-" + uuid.uuid4().hex[:24])

    @property
    def media(self) -> list:
        """Images and videos in prompt order (their features go into the prompt in this order)."""
        return [p for m in self.messages for p in m.parts if isinstance(p, (ImageInput, VideoInput))]


@dataclass
class Event:
    kind: str  # queued | started | stage | delta | choice_done (several choices only) | done | error
    text: str = ""
    data: dict = field(default_factory=dict)
    error: APIError | None = None
    choice: int = 0  # the answer a `delta` or `choice_done` belongs to (0 to `ChatRequest.choices` - 1)
