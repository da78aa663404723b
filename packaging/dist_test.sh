#!/usr/bin/env bash
# The smoke test of the Linux downloads (make dist-test):
# unpack the .deb into a scratch root, check its layout, run the installed `pagoda --version` and
# `pagoda --selftest` with HOME in the scratch folder, check the reply, and check that the run
# wrote nothing under /opt/pagoda (user data lives elsewhere); check that `pagoda serve` answers
# /v1/models on 127.0.0.1 (the bundle holds the API stack uvicorn imports by name) and stops on
# Ctrl-C; then unpack the tarball and run its --version.
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
# The bundle carries our C kernels compiled (packaging/pagoda.spec): users may have no compiler.
grep -E '^  kernels +([a-z0-9_]+ prebuilt, )*[a-z0-9_]+ prebuilt$' "$scratch/selftest.out" \
        | grep -E '(^| )q4_gemv prebuilt' | grep -E ' q8_gemv prebuilt' > /dev/null \
    || fail "the bundle's C kernels are not prebuilt: $(grep '^  kernels' "$scratch/selftest.out")"
written=$(find "$root/opt/pagoda" -newer "$scratch/before-selftest" | head -n 5)
[[ -z $written ]] || fail "the run wrote into the install folder: $written"

echo "== $pagoda serve --help"
"$pagoda" serve --help > "$scratch/serve-help.out" || fail "pagoda serve --help exited $?"
grep -q -- '--api-key' "$scratch/serve-help.out" || fail "pagoda serve --help lists no --api-key"

echo "== $pagoda serve --port 0"
# Job control on: a background job of a script would otherwise ignore SIGINT (Ctrl-C).
set -m
"$pagoda" serve --port 0 2> "$scratch/serve.err" &
server=$!
set +m
address=""
for _ in $(seq 1 120); do
    address=$(grep -o 'http://127\.0\.0\.1:[0-9]*/v1' "$scratch/serve.err" | head -n 1 || true)
    [[ -n $address ]] && break
    kill -0 "$server" 2> /dev/null || break
    sleep 1
done
if [[ -z $address ]] || ! models=$(curl -sf --max-time 30 "$address/models"); then
    kill "$server" 2> /dev/null || true
    tail -n 20 "$scratch/serve.err" >&2
    fail "pagoda serve did not answer GET /v1/models"
fi
echo "$models"
[[ $models == *'"object":"model"'* ]] || fail "/v1/models lists no model"
kill -INT "$server"
status=0
wait "$server" || status=$?
[[ $status -eq 0 ]] || fail "pagoda serve exited $status on Ctrl-C"

echo "== unpacking $tarball"
mkdir "$scratch/tar"
tar -C "$scratch/tar" -xzf "$tarball"
reported=$("$scratch/tar/pagoda/pagoda" --version)
[[ $reported == "Pagoda $version" ]] || fail "the tarball's --version said '$reported'"
echo "$reported"

echo "dist-test passed"
