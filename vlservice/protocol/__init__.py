"""The OpenAI Chat Completions contract, declared once: pydantic models of the request (with the
bounds of the running `Settings`) and of the answers. `parse_chat` validates a request through
them; `vlservice/http/openapi.py` generates the OpenAPI document from the same models, so the
documentation cannot promise what the validator refuses, nor the reverse.

Policy: the parameters we implement are checked strictly (JSON types as JSON Schema reads them:
5.0 is an integer, "5" is not; out of range is refused, never clamped); OpenAI parameters we
cannot honour are refused when they ask for something (`functions`, `audio`) and accepted when they
ask for nothing; names OpenAI does not define are ignored, as OpenAI's own API does.

What the models cannot say in JSON Schema is checked in the request model's last step (at most
`max_images` images in all, `min_tokens` <= `max_tokens`); what needs the bytes (a data URL's
payload is an image of the type it declares, remote URLs) is checked while building the engine's
`ChatRequest`. Every failure becomes an `InvalidRequest` naming the field (`param`, e.g.
`messages[0].content[1].image_url`), the bound and the value given.
"""

from .answers import *  # noqa: F401,F403
from .answers import ANSWERS, ChatCompletion, ChatCompletionChunk  # noqa: F401
from .base import MAX_DEPTH, MAX_STOP, MAX_TOP_LOGPROBS  # noqa: F401
from .parse import check_tree, load_body, parse_chat  # noqa: F401
from .request import request_model  # noqa: F401
