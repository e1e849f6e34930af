"""What every request model shares: strict JSON types, tagged unions, the server-wide constants."""

import re
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Discriminator, model_validator

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
DETAILS = ("low", "auto", "high")
MEDIA_TYPES = {"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg", "image/webp": "webp",
               "image/bmp": "bmp", "image/x-ms-bmp": "bmp", "image/gif": "gif"}
VIDEO_TYPES = {"video/mp4": "mp4", "video/quicktime": "mp4", "video/webm": "webm", "video/x-matroska": "webm",
               "video/avi": "avi", "video/x-msvideo": "avi"}
MAX_STOP = 4
MAX_DEPTH = 32  # JSON nesting of a request body; a chat request needs 6
MAX_JSON_VALUES = 50_000  # values in a request body (numbers, strings, objects, ...): 128 tools with
# rich schemas take some thousands; each costs the parser about 100 bytes (docs/operations.md)
MAX_STOP_CHARS = 64
MAX_TOP_LOGPROBS = 20  # OpenAI's bound
INTEGERS = ("max_tokens", "max_completion_tokens", "min_tokens", "top_k", "seed", "n", "top_logprobs")
_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON's decoder joins valid pairs, so any left is lone
_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,",
                       re.IGNORECASE)



class _In(BaseModel):
    """A request object: JSON types exactly (no "5" for 5, no true for 1), unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False,
                              json_schema_extra={"additionalProperties": True})


class _IntegralIn(_In):
    """A request object whose top-level integer fields (`INTEGER_FIELDS`) take 5.0 as 5: JSON Schema
    counts 5.0 as an integer, so the validator does too (5.5 stays refused)."""

    INTEGER_FIELDS: ClassVar[tuple[str, ...]] = INTEGERS

    @model_validator(mode="before")
    @classmethod
    def _integral(cls, body):
        if isinstance(body, dict):
            return {k: int(v) if k in cls.INTEGER_FIELDS and isinstance(v, float) and v.is_integer() else v
                    for k, v in body.items()}
        return body


def _pick(choose, error: str) -> Discriminator:
    """What makes a union of `Annotated[member, Tag(tag)]` pick its member by looking at the value (`choose`
    returns a tag or None), so a bad value gets one error, from the member it was meant to be, with its path
    (`error` otherwise): `Annotated[Union[Annotated[A, Tag("A")], ...], _pick(choose, error)]`."""
    return Discriminator(choose, custom_error_type=error, custom_error_message=error)



def _integral_float(v):
    """JSON Schema counts 61.0 as an integer, so the validator does too (61.5 stays refused)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v



def _first(*named):
    """The first (name, value) whose value is set, else (None, None): the precedence of options."""
    return next(((n, v) for n, v in named if v is not None), (None, None))
