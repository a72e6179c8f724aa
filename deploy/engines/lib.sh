# shellcheck shell=bash
# Helpers shared by the engine scripts, for macOS (bash 3.2, BSD tools) and Linux alike:
# no flock(1), sha256sum, ldd, readlink -f or GNU-only flags; apt-get only where it exists.
# Source it after setting SY_NAME (the prefix of log lines) and CACHE:
#   SY_NAME=model.sh; CACHE=...; . "$HERE/lib.sh"
# Bash 3.2 notes for whoever edits these scripts: no associative arrays, mapfile, ${v,,},
# {fd}> or |&; and "${a[@]}" of an empty array is an error under `set -u`, so write
# ${a[@]+"${a[@]}"}.

log() { printf '[%s] %s\n' "$SY_NAME" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The platform: Darwin or Linux (uname -s).
sy_os() { uname -s; }

# The SHA-256 of a file (or of standard input, for -), as 64 hex digits: sha256sum where it
# exists (Linux), else `shasum -a 256` (macOS; Perl's, also on Debian).
sy_sha256() {
    local out
    if command -v sha256sum >/dev/null 2>&1; then
        out=$(sha256sum "$1") || return 1
    elif command -v shasum >/dev/null 2>&1; then
        out=$(shasum -a 256 "$1") || return 1
    else
        die "neither sha256sum nor shasum is installed"
    fi
    printf '%s\n' "${out%% *}"
}

# Takes an exclusive lock on $CACHE/locks/NAME.lock (or on NAME, when it is a path) for the
# rest of the script (or subshell), waiting for whoever holds it. The lock is flock(2) on file descriptor 9, taken by Perl (in macOS, and in
# Debian's essential perl-base): it is the same lock flock(1) takes, so older copies of these
# scripts exclude these, and the kernel drops it when the holder dies, so it is never stale.
sy_lock() {
    local file="$CACHE/locks/$1.lock"
    case "$1" in */*) file=$1 ;; esac
    command -v perl >/dev/null 2>&1 || die "perl is needed for the lock on $file"
    mkdir -p "$(dirname "$file")"
    exec 9>>"$file"
    if ! _sy_flock 1; then
        log "another run holds $file; waiting"
        _sy_flock 0 || die "could not lock $file"
    fi
}
_sy_flock() {
    perl -MFcntl=:flock -e '
        open(my $fh, ">&=", 9) or die "fd 9: $!\n";
        flock($fh, $ARGV[0] ? LOCK_EX | LOCK_NB : LOCK_EX) or exit 1;
    ' "$1"
}

# Installs missing Debian packages with apt-get: only where apt-get exists, as root or with
# sudo. Elsewhere (macOS) it stops and says what is missing, with HINT (how to get it there).
#   sy_install "Homebrew: brew install cmake" cmake build-essential
_sy_apt_updated=0
sy_install() {
    local hint=$1
    shift
    if [[ "$(sy_os)" != Linux ]] || ! command -v apt-get >/dev/null 2>&1; then
        die "missing: $*; install it first (${hint})"
    fi
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null 2>&1 || die "need root or sudo to apt-get install $*"
        sudo=(sudo)
    fi
    if [[ $_sy_apt_updated -eq 0 ]]; then
        log "apt-get update"
        ${sudo[@]+"${sudo[@]}"} apt-get update -qq >&2
        _sy_apt_updated=1
    fi
    log "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive ${sudo[@]+"${sudo[@]}"} \
        apt-get install -y -qq --no-install-recommends "$@" >&2
}

# What `llama-server --version` says, on one line, less its leading "version: " ("6100
# (abc1234) built with ..."; empty if it does not run).
sy_llama_version() {
    "$1" --version 2>&1 </dev/null | tr '\n' ' ' | sed 's/^version: //; s/  */ /g; s/ *$//' || true
}

# Where a llama-server path printed by llama-server.sh came from, for people: the pinned build
# (its BUILD_INFO beside bin/), or a binary of the user's with its version.
sy_llama_origin() {
    local bin=$1 info pkg version backend=CPU from=PATH
    info="$(dirname "$(dirname "$bin")")/BUILD_INFO"
    if [[ -f "$info" ]]; then
        pkg=$(sed -n 's/^package: \([^ ]*\).*/\1/p' "$info" | sed -n 1p)
        version=${pkg##*==}
        if grep -q 'GGML_METAL=ON' "$info"; then backend=Metal; fi
        printf 'built from llama.cpp b%s (PyPI %s, %s) at %s; provenance in %s\n' \
            "${version%%.*}" "${pkg:-?}" "$backend" "$(dirname "$info")" "$info"
        return 0
    fi
    case "${SWITCHYARD_LLAMA_SERVER:-}" in
        "" | build) ;;
        */*) from=SWITCHYARD_LLAMA_SERVER ;;
        *) from="SWITCHYARD_LLAMA_SERVER, on PATH" ;;
    esac
    printf '%s, version %s\n' "$from" "$(sy_llama_version "$bin")"
}
