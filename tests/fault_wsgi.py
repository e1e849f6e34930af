"""The real app, with one fault injected for tests: every Nth decoding step of the engine raises.

Production code has no fault hooks; this module wraps the running service's decoder from outside,
the way a failing kernel or an out-of-memory error would surface. N comes from VL_TEST_FAIL_EVERY."""

import os

from app import create_app

app = create_app(start_service=os.environ.get("VL_DEFER_START", "0") != "1")
_service = app.extensions["vlservice"].service
_every = int(os.environ["VL_TEST_FAIL_EVERY"])
_step = _service.decoder.step
_calls = {"n": 0}


def _failing_step(token, cache):
    _calls["n"] += 1
    if _calls["n"] % _every == 0:
        raise RuntimeError("injected engine fault")
    return _step(token, cache)


_service.decoder.step = _failing_step
