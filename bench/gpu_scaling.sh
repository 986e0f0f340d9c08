#!/usr/bin/env bash
# The scaling suite on a GPU machine (16 cores, one H200): G = 1, 2, 4, 8 gateways, one worker,
# CPU provider and CUDA provider, `mlp` JSON and binary at 1/16/64 clients, SO_REUSEPORT vs one
# shared socket at G = 2, the CUDA provider each worker chose, NVML memory and utilisation.
#
# The device machine reaches no registry and its image (Python 3.12, onnxruntime 1.30 CPU build,
# no pyzmq/starlette/uvicorn/httptools/orjson/tritonclient, no wrk) lacks what ringserve needs, so this
# machine prepares what travels, in git-ignored folders of the checkout (64 MiB a call at most):
#
#   here:    bash bench/gpu_scaling.sh prepare
#              .gpu/        wheels for cp312 (pyzmq starlette uvicorn httptools orjson, tritonclient
#                           with the grpcio/protobuf the gateway's gRPC is built against), wrk + libluajit
#              .gpu-ort1..N onnxruntime-gpu 1.31.1 for cp312 (~244 MiB, CUDA 13) cut into 5 parts of <= 49 MiB
#
#   device, only for the CUDA provider: one call per part but the last, back to back (the machine
#   goes back after 30 s idle, and /tmp goes with it):
#            run(command="bash bench/gpu_scaling.sh stage 1", carry=[".gpu-ort1"], timeout_s=120)
#            ... up to stage 4 (parts 1-4; the 5th travels with the run call)
#   device, the measurement (one call, ~6 minutes, bounded by RUN_TIMEOUT_S=450 inside a 600 s call):
#            run(command="bash bench/gpu_scaling.sh run", carry=[".gpu", ".gpu-ort5"], timeout_s=600)
#
# Without the staging calls the run still works in one call: onnxruntime-gpu is then missing, every
# worker runs the CPU provider, and the suite leaves the cuda servers out with the reason (the JSON
# and Markdown say so); the CPU-provider numbers for G = 1, 2, 4, 8 are complete either way.
# Results land in $OUT: scaling.json, scaling.md, scaling.log, gpu.txt and the two plots.
#
# Here (no GPU), `bash bench/gpu_scaling.sh run --quick` runs the same path at --quick sizes.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/bench/results/gpu}
PARTS=${PARTS_DIR:-/tmp/ringserve-gpu-ort}
SITE=/tmp/ringserve-gpu-site
ORT_SITE=/tmp/ringserve-gpu-ort-site
IMPORT_ROOT=/tmp/ringserve-gpu-import
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-450}
ORT_WHEEL=onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
PART_MB=49

prepare() {
  local exclude
  exclude="$(git rev-parse --git-common-dir)/info/exclude"
  for p in /.gpu/ '/.gpu-ort*/'; do grep -qxF "$p" "$exclude" 2>/dev/null || echo "$p" >> "$exclude"; done
  rm -rf .gpu .gpu-ort*
  mkdir -p .gpu/wheels .gpu/bin .gpu/lib
  local platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
                   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
                   --platform manylinux1_x86_64)
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d .gpu/wheels "pyzmq>=26" "starlette>=0.40" "uvicorn>=0.30" "httptools>=0.6" "orjson>=3.10" \
    "tritonclient>=2.40" "grpcio>=1.60" "protobuf>=6.30,<7" "python-rapidjson>=0.9.1" || return 1
  local tmp
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d "$tmp" "onnxruntime-gpu==1.31.1" || return 1
  (cd "$tmp" && sha256sum "$ORT_WHEEL" > ort.sha256 && split -b ${PART_MB}m -d -a 1 "$ORT_WHEEL" part-)
  local i=1
  for part in "$tmp"/part-*; do
    mkdir -p ".gpu-ort$i" && mv "$part" ".gpu-ort$i/" && cp "$tmp/ort.sha256" ".gpu-ort$i/"
    i=$((i + 1))
  done
  rm -rf "$tmp"
  # wrk: the image has none, and aiohttp's one core caps the load at ~6-8k req/s (seen 2026-12-04: every
  # G read the same). This machine's, else Debian's package and its LuaJIT unpacked (it links only libssl3
  # and libc beside them, which the image has).
  if command -v wrk >/dev/null; then
    cp "$(command -v wrk)" .gpu/bin/
    ldd "$(command -v wrk)" | awk '/luajit/ {print $3}' | xargs -r -I{} cp -L {} .gpu/lib/
  elif command -v apt-get >/dev/null; then
    local debs
    debs=$(mktemp -d)
    (cd "$debs" && apt-get download -q wrk libluajit-5.1-2 >/dev/null 2>&1) || echo "apt-get download wrk failed: aiohttp will load" >&2
    for f in "$debs"/*.deb; do [ -f "$f" ] && dpkg -x "$f" "$debs/x"; done
    [ -x "$debs/x/usr/bin/wrk" ] && cp "$debs/x/usr/bin/wrk" .gpu/bin/ \
      && cp -L "$debs"/x/usr/lib/x86_64-linux-gnu/libluajit-5.1.so.2 .gpu/lib/
    rm -rf "$debs"
  fi
  du -sh .gpu .gpu-ort*
  echo "prepared: $((i - 1)) parts; stage 1..$((i - 2)) in separate calls, then run carrying .gpu and .gpu-ort$((i - 1))"
}

stage() {  # copy the carried part(s) to /tmp on the (warm) device machine
  mkdir -p "$PARTS"
  cp -v .gpu-ort*/part-* .gpu-ort*/ort.sha256 "$PARTS"/ 2>&1
  ls -la "$PARTS"
}

run() {
  mkdir -p "$OUT"
  local log="$OUT/scaling.log" info="$OUT/gpu.txt"
  : > "$info"
  local paths=""
  # What ringserve needs beside the image's packages, from carried wheels, when it is missing.
  if ! "$PY" -c 'import zmq, starlette, uvicorn, httptools, orjson, tritonclient.grpc' 2>/dev/null; then
    if ls .gpu/wheels/*.whl >/dev/null 2>&1; then
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        .gpu/wheels/*.whl >> "$info" 2>&1 || echo "carried wheels did not install" >> "$info"
      paths="$SITE"
    else
      echo "ringserve's packages are missing and no .gpu/wheels travelled (run 'prepare' here, carry .gpu)" >> "$info"
    fi
  fi
  # onnxruntime-gpu, when this onnxruntime has no CUDA provider: from the staged parts (+ the part carried
  # with this call), checked against its sha256.
  if "$PY" -c 'import onnxruntime as o, sys; sys.exit("CUDAExecutionProvider" not in o.get_available_providers())' \
      2>/dev/null; then
    echo "onnxruntime here has the CUDA provider already" >> "$info"
  elif mkdir -p "$PARTS" && { cp .gpu-ort*/part-* .gpu-ort*/ort.sha256 "$PARTS"/ 2>/dev/null; true; } \
      && [ -f "$PARTS/ort.sha256" ] && ls "$PARTS"/part-* >/dev/null 2>&1; then
    paths="$ORT_SITE${paths:+:$paths}"
    cat "$PARTS"/part-* > "$PARTS/$ORT_WHEEL"
    if (cd "$PARTS" && sha256sum -c ort.sha256 >> "$info" 2>&1); then
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$ORT_SITE" \
        "$PARTS/$ORT_WHEEL" >> "$info" 2>&1 || echo "onnxruntime-gpu did not install" >> "$info"
    else
      echo "onnxruntime-gpu: the staged parts are incomplete (stage every part but the last first): CPU only" >> "$info"
    fi
  else
    echo "onnxruntime-gpu: not staged: the image's onnxruntime (CPU build) serves, cuda cases are left out" >> "$info"
  fi
  # The checkout is the `ringserve` package: a folder holding a link to it goes on PYTHONPATH.
  mkdir -p "$IMPORT_ROOT" && ln -sfn "$ROOT" "$IMPORT_ROOT/ringserve"
  export PYTHONPATH="$IMPORT_ROOT${paths:+:$paths}${PYTHONPATH:+:$PYTHONPATH}"
  # The CUDA 13 libraries of the image's nvidia-* wheels (cublas, cudart, cudnn, curand), for ORT's provider.
  local nv
  nv=$("$PY" -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null)
  if [ -n "$nv" ]; then
    local libs
    libs=$(find "$nv/nvidia" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd: -)
    export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  if ! command -v wrk >/dev/null && [ -x .gpu/bin/wrk ]; then
    export PATH="$ROOT/.gpu/bin:$PATH" LD_LIBRARY_PATH="$ROOT/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  {
    echo "== $(date -u +%FT%TZ) $(uname -a)"; nproc
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu --format=csv 2>&1
    command -v wrk && { wrk --version 2>&1 || true; } | head -1
    "$PY" - <<'EOF' 2>&1
import onnxruntime as ort
print("python", __import__("sys").version.split()[0], "onnxruntime", ort.__version__, ort.__file__)
print("available providers", ort.get_available_providers())
from ringserve.worker.session import cuda_unavailable_reason
print("CUDA provider:", cuda_unavailable_reason() or "loads")
try:
    import pynvml
    pynvml.nvmlInit()
    print("NVML: yes, driver", pynvml.nvmlSystemGetDriverVersion())
except Exception as exc:
    print("NVML: no", exc)
EOF
  } >> "$info"
  local load=()
  if ! { wrk --version 2>&1 || true; } | grep -q '^wrk '; then  # none, or the carried one does not load here
    load=(--load aiohttp)
    echo "wrk does not run here: aiohttp generates the load (one core at most: it bounds req/s)" >> "$info"
  fi
  cat "$info"
  local args=(--gateways 1,2,4,8 --providers cpu,cuda --concurrency 1,16,64 --wrk-threads 4 --duration-s 3
              --warmup-s 1 --repeats 1 --quiet-wait-s 0 --max-foreign-pct 10000 --ready-timeout-s 120)
  if [ "${1:-}" = "--quick" ]; then  # here, without a GPU: the same path, small
    args=(--gateways 1,2 --providers cpu,cuda --quick)
  fi
  PYTHONUNBUFFERED=1 timeout -s TERM -k 30 "$RUN_TIMEOUT_S" "$PY" -m bench scaling "${args[@]}" "${load[@]}" \
    --out-dir "$OUT" --plots-dir "$OUT" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  echo "bench scaling exited $rc (124: stopped at RUN_TIMEOUT_S=$RUN_TIMEOUT_S)" | tee -a "$info"
  return "$rc"
}

case "${1:-run}" in
  prepare) prepare ;;
  stage) stage ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 prepare | stage N | run [--quick]" >&2; exit 2 ;;
esac
