#!/usr/bin/env bash
# nginx for the side-by-side benchmark (tests/bench/perf): Debian's `nginx` package.
# Prints the nginx binary's path as the last line on stdout; logs go to stderr.
#
# When nginx is not installed and we are root, installs it with apt-get WITHOUT starting or
# enabling Debian's nginx service (a policy-rc.d that refuses service starts is in place for the
# duration of the install, and the unit is disabled where systemd runs): the benchmark runs its
# own nginx, with its own configuration, on a free loopback port. Idempotent, safe to run
# concurrently (flock), instant when installed.
# Env: SWITCHYARD_CACHE (for the lock), NGINX (use this binary instead).
set -euo pipefail

CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
log() { printf '[nginx.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

found() {
    if [[ -n "${NGINX:-}" ]]; then
        [[ -x "$NGINX" ]] && { echo "$NGINX"; return 0; }
        die "NGINX=$NGINX is not executable"
    fi
    local p
    for p in "$(command -v nginx 2>/dev/null || true)" /usr/sbin/nginx; do
        [[ -n "$p" && -x "$p" ]] && { echo "$p"; return 0; }
    done
    return 1
}

if found; then exit 0; fi

[[ $(id -u) -eq 0 ]] || die "nginx is not installed; as root: apt-get install nginx (or set NGINX)"
command -v apt-get >/dev/null || die "nginx is not installed and there is no apt-get (set NGINX)"

mkdir -p "$CACHE/locks"
exec 9>"$CACHE/locks/nginx.lock"
if ! flock -n 9; then
    log "another run holds $CACHE/locks/nginx.lock; waiting"
    flock 9
fi
if found; then exit 0; fi

policy=/usr/sbin/policy-rc.d
ours=""
if [[ ! -e "$policy" ]]; then
    # Debian's documented switch for "install, but start no service" (invoke-rc.d, deb-systemd-invoke).
    printf '#!/bin/sh\n# switchyard tests/bench/nginx.sh: no service starts while nginx installs\nexit 101\n' >"$policy"
    chmod 0755 "$policy"
    ours=1
    trap 'rm -f "$policy"' EXIT
fi
log "apt-get install nginx (its service is not started)"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq --no-install-recommends nginx </dev/null >&2; then
    apt-get update -qq </dev/null >&2
    apt-get install -y -qq --no-install-recommends nginx </dev/null >&2
fi
if [[ -n "$ours" ]]; then rm -f "$policy"; trap - EXIT; fi
if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
    systemctl disable --now nginx >&2 2>/dev/null || true
fi
found || die "nginx installed but not found"
