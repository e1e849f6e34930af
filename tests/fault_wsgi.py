"""The real app, with one fault injected for tests: every Nth decoding step of the engine raises.

Production code has no fault hooks; this module wraps the running service's batched decode step
(the scheduler's forward pass) from outside,
the way a failing kernel or an out-of-memory error would surface. N comes from VL_TEST_FAIL_EVERY."""

import os

from app import create_app

app = create_app(start_service=os.environ.get("VL_DEFER_START", "0") != "1")
_service = app.extensions["vlservice"].service
_every = int(os.environ["VL_TEST_FAIL_EVERY"])
_step = _service.lean.decode
_calls = {"n": 0}


def _failing_step(tokens, kvs, positions):
    _calls["n"] += 1
    if _calls["n"] % _every == 0:
        raise RuntimeError("injected engine fault")
    return _step(tokens, kvs, positions)


_service.lean.decode = _failing_step
