# vlservice: CPU-only image. The install steps are the README's, in the same order
# (tests/test_docker.py checks that they stay the same).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VL_CACHE_DIR=/data/cache \
    HF_HOME=/data/hf \
    VL_BIND=0.0.0.0:8000

WORKDIR /app

# PyPI's default torch wheel for Linux is a CUDA build; this index offers the CPU build of the
# same version (2.13.0+cpu), which pip prefers. Nothing else changes.
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu

# The README's install steps, verbatim: CPU torch first, then the pinned requirements.
COPY requirements.txt .
RUN pip install torch==2.13.0
RUN pip install -r requirements.txt

COPY app.py wsgi.py gunicorn.conf.py ./
COPY templates templates
COPY static static
COPY vlservice vlservice

RUN useradd --create-home --uid 10001 vlservice \
    && mkdir -p /data/cache /data/hf \
    && chown -R vlservice:vlservice /data
USER vlservice
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status == 200 else 1)"

# The README's start command.
CMD ["gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"]
