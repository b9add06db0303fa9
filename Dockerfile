# The splitbrain image: the `splitbrain` command (this repository's wheel, with the dependency
# versions constraints.txt pins) on python:3.11-slim, run by an unprivileged user.
#
#   docker build -t splitbrain:0.1.0 .          # docker-compose.yml builds it under this tag
#   docker run --rm splitbrain:0.1.0 --help
#
# `splitbrain` is the entrypoint: the container's command is a subcommand (`worker` by default,
# `topics apply`, `page`, `leases relay`, ...). Python modules that are not subcommands (the example
# fenced destination, the demo lease worker) run with `--entrypoint python` and `-m`.
# tests/unit/test_deploy_files.py checks this file statically (stages, pins, user, entrypoint,
# healthcheck).

# ---- build: the wheel, installed with its dependencies into a virtualenv --------------------
FROM python:3.11.13-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Extras of pyproject.toml to install: rocksdb for `--store rocksdb` on the state volume, ui for
# the findings view (one image serves every process of deploy/kubernetes); add faust for
# `--runtime faust` (docker build --build-arg EXTRAS=rocksdb,ui,faust).
ARG EXTRAS=rocksdb,ui

WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY detector ./detector
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/splitbrain \
    && wheel="$(ls /wheels/splitbrain_detector-*.whl)" \
    && /opt/splitbrain/bin/pip install -c constraints.txt "${wheel}[${EXTRAS}]" \
    && /opt/splitbrain/bin/pip check

# ---- runtime: the virtualenv (the topics file is in the package), no compiler, no pip cache ---
FROM python:3.11.13-slim-bookworm

ENV PATH=/opt/splitbrain/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SPLITBRAIN_METRICS_PORT=9100

RUN groupadd --system --gid 10001 splitbrain \
    && useradd --system --uid 10001 --gid splitbrain --no-create-home \
        --home-dir /srv/splitbrain --shell /usr/sbin/nologin splitbrain \
    && mkdir -p /srv/splitbrain/var \
    && chown splitbrain:splitbrain /srv/splitbrain/var

COPY --from=build /opt/splitbrain /opt/splitbrain

# The working directory holds the default path var/state (the worker's --state-dir), on the
# volume docker-compose.yml mounts at /srv/splitbrain/var.
WORKDIR /srv/splitbrain
USER 10001:10001

# The worker serves /metrics on SPLITBRAIN_METRICS_PORT (9100 in this image): the healthcheck
# asks for it from inside the container, where the default loopback address answers.
EXPOSE 9100
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/metrics' % os.environ['SPLITBRAIN_METRICS_PORT'], timeout=4).close()"]

ENTRYPOINT ["splitbrain"]
CMD ["worker"]
