#!/usr/bin/env bash
# The MLX engine: a pinned venv with mlx + mlx-lm (on macOS on Apple silicon the `mlx` wheel
# runs on Metal; on Linux `mlx[cpu]`), and the SmolLM2 GGUF (from model.sh) converted by
# gguf_to_hf.py into a float32 Hugging Face folder that `mlx_lm.server --model DIR` loads.
#
# Cache (${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}):
#   venv-mlx/                 the venv; python at venv-mlx/bin/python
#   models/smollm2-mlx/       the converted model (deterministic bytes)
#   hf-home/hub/              an empty HF_HOME for running mlx_lm.server offline
# Logs go to stderr; the last (only) line on stdout is the model folder:
#   MLX_MODEL=$(deploy/engines/mlx.sh)
# Serve it with:
#   HF_HOME=$CACHE/hf-home HF_HUB_OFFLINE=1 $CACHE/venv-mlx/bin/python -m mlx_lm server \
#       --model "$MLX_MODEL" --host 127.0.0.1 --port PORT
# Idempotent, safe to run concurrently (a lock), instant when cached.
# MLX's wheels need macOS >= 14 on Apple silicon, or Linux with glibc >= 2.35: elsewhere this
# script fails early.
# Env: SWITCHYARD_CACHE;
#      SWITCHYARD_MLX_PYTHON: a python of your own that has mlx and mlx-lm (and, for the
#        conversion, gguf, numpy, safetensors and tokenizers); then no venv is made;
#      PYTHON: a python3 >= 3.11 to build the venv from (default: python3, else python3.13,
#        python3.12, python3.11, the first that is new enough).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
VENV="$CACHE/venv-mlx"
OUT="$CACHE/models/smollm2-mlx"
HF_HOME_DIR="$CACHE/hf-home"
CONVERTER="$HERE/gguf_to_hf.py"
SY_NAME=mlx.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
OS=$(sy_os)

# Full pinned closure (pip freeze of a working install on Linux). Changing this
# text rebuilds the venv. On macOS the same closure less mlx[cpu] and mlx-cpu:
# there the `mlx` wheel itself carries the Metal backend.
LOCK='mlx[cpu]==0.32.4
mlx==0.32.4
mlx-cpu==0.32.4
mlx-lm==0.32.2
gguf==0.19.0
numpy==2.4.6
safetensors==0.8.0
tokenizers==0.23.3
transformers==5.24.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
click==8.5.1
filelock==4.3.1
fsspec==2026.9.0
h11==0.16.0
hf-xet==1.8.0
httpcore2==2.16.2
httpx2==2.16.2
huggingface_hub==2.4.0
idna==3.20
Jinja2==3.1.6
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mdurl==0.1.2
packaging==26.4
protobuf==7.36.2
pydantic==2.14.4
pydantic_core==2.50.5
Pygments==2.21.0
PyYAML==6.0.4
regex==2026.11.19
requests==2.34.2
rich==15.0.0
sentencepiece==0.2.3
shellingham==1.5.4
tqdm==4.70.1
truststore==0.10.5
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0'

# --- platform gate ----------------------------------------------------------
if [[ "$OS" == Darwin ]]; then
    [[ "$(uname -m)" == arm64 ]] || die "MLX runs on Apple silicon only (this Mac is $(uname -m))"
    MACOS=$(sw_vers -productVersion 2>/dev/null || true)
    [[ "${MACOS%%.*}" -ge 14 ]] 2>/dev/null ||
        die "macOS ${MACOS:-?} is older than 14, which the pinned MLX wheels require"
    LOCK=$(printf '%s\n' "$LOCK" | grep -v -e '^mlx\[cpu\]==' -e '^mlx-cpu==')
else
    GLIBC=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}' || true)
    [[ -n "$GLIBC" ]] || die "not a glibc system; MLX's Linux wheels need glibc >= 2.35"
    if [[ "$(printf '%s\n' 2.35 "$GLIBC" | sort -V | head -1)" != 2.35 ]]; then
        die "glibc $GLIBC is older than 2.35, which MLX's manylinux wheels require; MLX cannot run on this machine"
    fi
fi

LOCK_SHA=$(printf '%s\n' "$LOCK" | sy_sha256 -)
CONV_SHA=$(sy_sha256 "$CONVERTER")
MLX_PYTHON="${SWITCHYARD_MLX_PYTHON:-}"
if [[ -n "$MLX_PYTHON" ]]; then
    # A python of the user's: nothing is installed into it; the model stamp names it instead
    # of the lock.
    PY="$MLX_PYTHON"
    ENV_KEY="python $MLX_PYTHON"
    venv_ok() { true; }
else
    PY="$VENV/bin/python"
    ENV_KEY="lock $LOCK_SHA"
    venv_ok() { [[ -x "$VENV/bin/python" && "$(cat "$VENV/.switchyard-lock" 2>/dev/null)" == "$LOCK_SHA" ]]; }
fi
# The model stamp lives next to (not inside) the folder so the folder's bytes
# are exactly the converter's output.
model_stamp() { printf 'converter %s\n%s\ngguf %s\n' "$CONV_SHA" "$ENV_KEY" "$1"; }
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 # as pinned in model.sh
model_ok() { [[ -f "$OUT/model.safetensors" && "$(cat "$OUT.stamp" 2>/dev/null)" == "$(model_stamp "$GGUF_SHA")" ]]; }

if venv_ok && model_ok && [[ -d "$HF_HOME_DIR/hub" ]]; then
    log "cached: $OUT (venv $VENV)"
    echo "$OUT"
    exit 0
fi

mkdir -p "$CACHE/models"
sy_lock mlx

# --- python -----------------------------------------------------------------
new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }
if [[ -n "$MLX_PYTHON" ]]; then
    [[ -x "$MLX_PYTHON" ]] || die "SWITCHYARD_MLX_PYTHON=$MLX_PYTHON is not an executable file"
    "$MLX_PYTHON" -c 'import mlx.core, mlx_lm' >&2 ||
        die "SWITCHYARD_MLX_PYTHON=$MLX_PYTHON cannot import mlx and mlx_lm (pip install mlx-lm)"
    log "using $MLX_PYTHON (SWITCHYARD_MLX_PYTHON): mlx $("$MLX_PYTHON" -c 'import importlib.metadata as m; print(m.version("mlx"))'), mlx-lm $("$MLX_PYTHON" -c 'import importlib.metadata as m; print(m.version("mlx-lm"))'); no venv is made"
elif ! venv_ok; then
    if [[ -z "${PYTHON:-}" ]]; then
        PYTHON=python3
        for candidate in python3 python3.13 python3.12 python3.11; do
            if command -v "$candidate" >/dev/null 2>&1 && new_enough "$candidate"; then
                PYTHON=$candidate
                break
            fi
        done
    fi
    command -v "$PYTHON" >/dev/null || die "no $PYTHON (Debian: apt-get install python3; macOS: brew install python)"
    new_enough "$PYTHON" ||
        die "$PYTHON is $("$PYTHON" -V 2>&1); the pinned numpy/mlx-lm need Python >= 3.11 (macOS: brew install python, or set PYTHON)"
    if ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
        pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        sy_install "a Python with its venv module, e.g. Homebrew's python" "python$pyver-venv"
    fi
    t0=$SECONDS
    rm -rf "$VENV"
    log "creating venv $VENV with $("$PYTHON" -V 2>&1)"
    "$PYTHON" -m venv "$VENV" >&2
    printf '%s\n' "$LOCK" >"$VENV/requirements.lock"
    log "pip install -r $VENV/requirements.lock ($(grep -e '^mlx' "$VENV/requirements.lock" | tr '\n' ' ')...; wheels only)"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q --only-binary=:all: \
        -r "$VENV/requirements.lock" >&2
    "$VENV/bin/python" -c 'import mlx.core as mx, mlx_lm, gguf, safetensors, tokenizers; mx.eval(mx.ones(2) + 1)' >&2 ||
        die "the MLX venv does not import"
    printf '%s\n' "$LOCK_SHA" >"$VENV/.switchyard-lock"
    log "venv ready in $((SECONDS - t0)) s"
fi
log "MLX runs on $("$PY" -c 'import mlx.core as mx; print(mx.default_device())' 2>/dev/null || echo '?')"

mkdir -p "$HF_HOME_DIR/hub"

# --- model ------------------------------------------------------------------
if ! model_ok; then
    GGUF=$("$HERE/model.sh" | tail -n 1)
    [[ -f "$GGUF" ]] || die "model.sh did not give a file"
    t0=$SECONDS
    STAGE="$CACHE/models/.smollm2-mlx.tmp.$$"
    rm -rf "$STAGE"
    trap 'rm -rf "$STAGE"' EXIT
    log "converting $GGUF -> $OUT (float32)"
    "$PY" -c 'import gguf, numpy, safetensors, tokenizers' >&2 ||
        die "$PY cannot import what gguf_to_hf.py needs (pip install gguf numpy safetensors tokenizers)"
    "$PY" "$CONVERTER" "$GGUF" "$STAGE" >&2
    chmod 0644 "$STAGE"/*
    rm -rf "$OUT" "$OUT.stamp"
    mv "$STAGE" "$OUT"
    trap - EXIT
    model_stamp "$GGUF_SHA" >"$OUT.stamp"
    log "converted in $((SECONDS - t0)) s ($(du -sh "$OUT" | cut -f1))"
fi

log "ready: $OUT; serve with: HF_HOME=$HF_HOME_DIR HF_HUB_OFFLINE=1 $PY -m mlx_lm server --model $OUT --host 127.0.0.1 --port PORT"
echo "$OUT"
