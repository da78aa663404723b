#!/usr/bin/env bash
# One prepared GPU check for a lent machine (an H200): about 11 minutes at most, every stage
# time-limited, a failing stage reported while the others still run.
#   bash bench/gpu_check.sh [OUT_DIR]      (default: $OUT, else ./gpu_check_out)
# Needs torch, triton and transformers on the machine's python (pytest for the kernel tests);
# no .venv, no network. The engine also imports gguf, platformdirs and xxhash, which the lent H200
# lacks: carry them as wheels (pip download --no-deps ... -d .whl gguf platformdirs xxhash, then
# pip install --no-index --target /tmp/site .whl/*.whl and PYTHONPATH=/tmp/site), see the device README.
# Writes OUT_DIR/gpu_check.json and OUT_DIR/gpu_check.md (the table for docs/BENCHMARKS.md), plus
# one log per stage: 20 files, more than a lent machine sends back, so write to /tmp and tar them.
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-gpu_check_out}}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET PAGODA_KERNEL_BACKEND

stage() {  # stage NAME SECONDS COMMAND...: run, log, record the exit code
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
    local rc=$?
    echo "$rc" >"$OUT_DIR/$name.status"
    echo "[$name] exit $rc after $((SECONDS - start)) s (limit $limit s)"
    if [ "$rc" -ne 0 ]; then tail -n 5 "$OUT_DIR/$name.log"; fi
}

stage environment 20 "$PY" bench/gpu_bench.py environment --out "$OUT_DIR"
# Kernel tests on CUDA tensors, compiled (no interpreter), bf16 included; root conftest skipped.
# Includes tests/kernels/test_triton_quant.py (about 60 kernel variants to compile).
stage kernel_tests 110 "$PY" -m pytest -q -p no:cacheprovider --confcutdir=tests/kernels \
    tests/kernels
stage parity 75 "$PY" bench/gpu_bench.py parity --out "$OUT_DIR"
stage decode 60 "$PY" bench/gpu_bench.py decode --out "$OUT_DIR"
stage quant 90 "$PY" bench/gpu_bench.py quant --out "$OUT_DIR"
stage throughput 120 "$PY" bench/gpu_bench.py throughput --out "$OUT_DIR"
stage disk_cache 150 "$PY" bench/gpu_bench.py disk_cache --out "$OUT_DIR"
stage spec_cost 60 "$PY" bench/gpu_bench.py spec_cost --out "$OUT_DIR"
"$PY" bench/gpu_bench.py report --out "$OUT_DIR"
