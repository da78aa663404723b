#!/usr/bin/env bash
# Turn the PyInstaller folder into the two Linux downloads:
#   pagoda_<version>_<arch>.deb          installs to /opt/pagoda, /usr/bin/pagoda, menu entry, icon
#   pagoda-<version>-linux-<machine>.tar.gz   the folder itself: unpack anywhere, run pagoda/pagoda
# Usage: packaging/linux_packages.sh BUNDLE_DIR VERSION OUT_DIR   (make dist calls it)
# DEB_COMPRESSION (default zstd) is passed to dpkg-deb -Z: xz makes a 17% smaller .deb (297 MiB
# against 358) but took 11 minutes here instead of 7 s; every dpkg on a system this bundle runs on
# (glibc >= 2.36) reads zstd.
set -euo pipefail

bundle=${1:?the PyInstaller folder, e.g. dist/pagoda}
version=${2:?the version, e.g. 0.1.0}
out=${3:?the output folder, e.g. dist}
compression=${DEB_COMPRESSION:-zstd}
root=$(cd "$(dirname "$0")/.." && pwd)
arch=$(dpkg --print-architecture)
machine=$(uname -m)
# The bundle carries libraries built against this machine's glibc: that is the oldest it runs on.
glibc=$(getconf GNU_LIBC_VERSION | cut -d' ' -f2)

[[ -x $bundle/pagoda ]] || { echo "$bundle/pagoda is missing: run PyInstaller first" >&2; exit 1; }

stage=$(mktemp -d "$out/.deb-stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT

# Hard links: the staging tree costs no copy of the ~1 GB folder.
mkdir -p "$stage/opt" "$stage/usr/bin" "$stage/usr/share/applications" \
         "$stage/usr/share/icons/hicolor/scalable/apps" "$stage/DEBIAN"
cp -al "$(cd "$bundle" && pwd)" "$stage/opt/pagoda"
# Relative, so the same link works in a scratch root (dpkg -x) and when installed.
ln -s ../../opt/pagoda/pagoda "$stage/usr/bin/pagoda"
install -m 644 "$root/resources/pagoda.desktop" "$stage/usr/share/applications/pagoda.desktop"
install -m 644 "$root/resources/icons/pagoda.svg" \
        "$stage/usr/share/icons/hicolor/scalable/apps/pagoda.svg"

installed_kb=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@INSTALLED_SIZE@/$installed_kb/" \
    -e "s/@GLIBC@/$glibc/" \
    "$root/packaging/debian/control.in" > "$stage/DEBIAN/control"
chmod -R u+rwX,go+rX,go-w "$stage"

deb="$out/pagoda_${version}_${arch}.deb"
tarball="$out/pagoda-${version}-linux-${machine}.tar.gz"
dpkg-deb --root-owner-group -Z"$compression" --build "$stage" "$deb"
tar -C "$(dirname "$bundle")" --owner=0 --group=0 -czf "$tarball" "$(basename "$bundle")"

printf '%-45s %s\n' "bundle folder $bundle" "$(du -sh "$bundle" | cut -f1)"
printf '%-45s %s\n' "$deb" "$(du -h "$deb" | cut -f1)"
printf '%-45s %s\n' "$tarball" "$(du -h "$tarball" | cut -f1)"
