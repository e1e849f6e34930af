"""The WSGI entry point: `gunicorn -c gunicorn.conf.py wsgi:app`.

Built once in the Gunicorn master (`preload_app`): the weights are loaded and the ONNX files
exported before the fork, so workers share the weights' memory; each worker then starts its own
threads (see gunicorn.conf.py, which sets VL_DEFER_START for that). Without Gunicorn's hooks the
service starts here.
"""

from app import create_app
from vlservice.config import Settings

settings = Settings.from_env()
app = create_app(settings, start_service=not settings.defer_start)
