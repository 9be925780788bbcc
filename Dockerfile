# The gateway's container image: `docker build -t aggregator:0.1.0 .`
#
# Two stages: the build stage installs the package and its dependencies into a virtual
# environment; the runtime stage copies only that environment, so no build tools, caches or
# sources end up in the image. Certificates are never baked in: they are mounted from Secrets.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/aggregator
# A C compiler for the one compiled module, libnghttp2's header callback (native/h2blocks.c, built
# by setup.py with cffi): only this stage has it; the runtime stage gets the built module with the
# environment. Without it the install still succeeds and HTTP/2 collects header blocks in Python.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Only what the package build needs (.dockerignore keeps everything else out of the context).
COPY pyproject.toml README.md LICENSE setup.py ./
COPY native/ ./native/
COPY aggregator/ ./aggregator/
# The kube extra: the image runs in a cluster, where kube mode needs the kubernetes client; the
# tracing extra: --tracing-config-file works there too (about 25 MB: grpcio, protobuf).
RUN /opt/aggregator/bin/pip install '.[kube,tracing]'

FROM ${PYTHON_IMAGE}
# libnghttp2 serves HTTP/2 (aggregator/web/http2/nghttp2.py loads it; without it the gateway
# offers HTTP/1.1 only). Debian's package carries the security fixes.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnghttp2-14 \
 && rm -rf /var/lib/apt/lists/*
# A fixed, unprivileged UID/GID: the Deployment's runAsUser/runAsGroup/fsGroup name the same ids.
RUN groupadd --system --gid 65532 aggregator \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin aggregator
COPY --from=build /opt/aggregator /opt/aggregator
# No .pyc writes on a read-only root filesystem; logs go straight to the container runtime.
ENV PATH=/opt/aggregator/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["aggregator", "serve"]
