#!/usr/bin/env bash
# The smoke test of the Linux downloads (make dist-test):
# unpack the .deb into a scratch root, check its layout, run the installed `pagoda --version` and
# `pagoda --selftest` with HOME in the scratch folder, check the reply, and check that the run
# wrote nothing under /opt/pagoda (user data lives elsewhere); then unpack the tarball and run
# its --version.
# Usage: packaging/dist_test.sh DEB TARBALL VERSION
set -euo pipefail

deb=${1:?the .deb}
tarball=${2:?the .tar.gz}
version=${3:?the expected version}

scratch=$(mktemp -d "${TMPDIR:-/tmp}/pagoda-dist-test.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
root=$scratch/root
mkdir -p "$root" "$scratch/home"

fail() { echo "dist-test: FAILED: $*" >&2; exit 1; }

echo "== unpacking $deb into $root"
dpkg-deb --info "$deb" | sed -n '/Package:/,$p'
dpkg-deb -x "$deb" "$root"
for path in usr/bin/pagoda opt/pagoda/pagoda usr/share/applications/pagoda.desktop \
            usr/share/icons/hicolor/scalable/apps/pagoda.svg; do
    [[ -e $root/$path ]] || fail "the package lacks /$path"
done

pagoda=$root/usr/bin/pagoda
export HOME=$scratch/home XDG_DATA_HOME=$scratch/home/data XDG_CACHE_HOME=$scratch/home/cache
unset PAGODA_DB PAGODA_CACHE_DIR

echo "== $pagoda --version"
reported=$("$pagoda" --version)
echo "$reported"
[[ $reported == "Pagoda $version" ]] || fail "--version said '$reported', expected 'Pagoda $version'"

echo "== $pagoda --selftest"
touch "$scratch/before-selftest"
set +e
"$pagoda" --selftest > "$scratch/selftest.out" 2> "$scratch/selftest.err"
status=$?
set -e
cat "$scratch/selftest.out"
if [[ $status -ne 0 ]]; then
    tail -n 20 "$scratch/selftest.err" >&2
    fail "pagoda --selftest exited $status"
fi
grep -q '^selftest passed$' "$scratch/selftest.out" || fail "the self-test did not report success"
# Greedy decoding of the bundled SmolLM2 answers this question with "Paris".
grep -E '^  reply +.*Paris' "$scratch/selftest.out" > /dev/null \
    || fail "the reply does not name Paris"
written=$(find "$root/opt/pagoda" -newer "$scratch/before-selftest" | head -n 5)
[[ -z $written ]] || fail "the run wrote into the install folder: $written"

echo "== unpacking $tarball"
mkdir "$scratch/tar"
tar -C "$scratch/tar" -xzf "$tarball"
reported=$("$scratch/tar/pagoda/pagoda" --version)
[[ $reported == "Pagoda $version" ]] || fail "the tarball's --version said '$reported'"
echo "$reported"

echo "dist-test passed"
