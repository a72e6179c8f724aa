#!/usr/bin/env bash
# Vendors the dashboard's one front-end library, uPlot (MIT), into proxy/ui/vendor/uplot/, from
# which the switchyard binary compiles it in (include_str!): the dashboard loads nothing from a
# CDN and works offline.
#
#   deploy/ui/update-vendor.sh            # the version pinned in proxy/ui/vendor/uplot/VERSION
#   deploy/ui/update-vendor.sh 1.6.32     # another version; review the diff, then commit
#
# It fetches the package with `npm pack` (the registry's tarball, checked against the registry's
# integrity hash by npm), copies the built files and the licence untouched, and records the
# version and the tarball's SHA-256.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="$repo/proxy/ui/vendor/uplot"
version="${1:-$(cat "$dest/VERSION")}"
command -v npm >/dev/null 2>&1 || { echo "update-vendor.sh: needs npm (Debian: apt-get install npm)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "uplot@$version" >/dev/null)
tarball="$(ls "$work"/uplot-*.tgz)"
tar -xzf "$tarball" -C "$work"
mkdir -p "$dest"
cp "$work/package/dist/uPlot.iife.min.js" "$work/package/dist/uPlot.min.css" "$work/package/LICENSE" "$dest/"
printf '%s\n' "$version" >"$dest/VERSION"
if command -v sha256sum >/dev/null 2>&1; then
    (cd "$work" && sha256sum "$(basename "$tarball")") >"$dest/SHA256SUMS"
else
    (cd "$work" && shasum -a 256 "$(basename "$tarball")") >"$dest/SHA256SUMS"
fi
echo "uplot $version vendored into ${dest#"$repo"/}" >&2
