"""The WSGI entry point: `gunicorn -c gunicorn.conf.py wsgi:app`.

Built once in the Gunicorn master (`preload_app`): the weights are loaded and the ONNX files
exported before the fork, so workers share the weights' memory; each worker then starts its own
threads (see gunicorn.conf.py). Without Gunicorn's hooks the service starts on first use.
"""

import os

from app import create_app

app = create_app(start_service=os.environ.get("VL_DEFER_START", "0") != "1")
