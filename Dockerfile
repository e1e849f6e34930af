# vlservice: CPU-only image. The install steps are the README's, in the same order
# (tests/deploy/test_docker.py checks that they stay the same). It is safe to expose by itself:
# nginx (the shared edge of deploy/nginx/edge/) answers on :8000 and passes whole requests to
# Gunicorn on a unix socket (deploy/front/launch.py; README, Settings and deployment).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VL_CACHE_DIR=/data/cache \
    HF_HOME=/data/hf \
    FRONT_LISTEN=8000 \
    FRONT_RUN_DIR=/tmp/vlservice-front \
    VL_ALLOCATOR=jemalloc

WORKDIR /app

# nginx in front of Gunicorn, tini as PID 1 (reaps orphans, passes signals to the launcher), and
# jemalloc, the allocator Gunicorn starts on (VL_ALLOCATOR below): Debian's packages.
RUN apt-get update \
    && apt-get install -y --no-install-recommends nginx tini libjemalloc2 \
    && rm -rf /var/lib/apt/lists/*

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
COPY deploy/front deploy/front
COPY deploy/nginx/edge deploy/nginx/edge

RUN useradd --create-home --uid 10001 vlservice \
    && mkdir -p /data/cache /data/hf \
    && chown -R vlservice:vlservice /data
USER vlservice
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status == 200 else 1)"

# nginx on :8000 before the README's start command (Gunicorn, bound by the launcher to a unix
# socket); either one ending ends the container, SIGTERM drains Gunicorn first. Arguments after
# the script replace Gunicorn's (`-c gunicorn.conf.py wsgi:app`).
ENTRYPOINT ["tini", "--"]
CMD ["python", "deploy/front/launch.py"]
