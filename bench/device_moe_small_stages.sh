#!/usr/bin/env bash
# Issue 15 goal 1 device check of the MoE layer's small stages: the GPU tests of the kernels touched
# (gemm_bf16 small-M path, moe_combine, act_dispatch, swiglu_quant), test_engine's batch-invariance
# tests (bf16 on the tiny model; sparse W4A4 / W4A16 on a compressed one), compute-sanitizer memcheck on
# the combine and small-M GEMM tests, then bench_moe_layer and its torch peer (the NOTES command).
# Binaries: BIN (default build-devbin/, built elsewhere for sm_90a; BUILD=1 builds them here when they do
# not load). The binaries find the tiny model at their build checkout's path: a link to this one is made.
# Writes to OUT: summary.txt and logs.tgz.
# Usage (repository root on the device): bench/device_moe_small_stages.sh [OUT]
set -uo pipefail
OUT=${1:-${OUT:-/tmp/moesq_moe_small}}
W=/tmp/moesq_moe_small_work
mkdir -p "$OUT" "$W"
export PATH="/usr/local/cuda/bin:$PATH" MOESQ_QUIET=1
export MOESQ_DEFAULT_MODEL="$PWD/models/tiny-qwen3-moe" MOESQ_FIXTURES="$PWD/tests/fixtures"
S="$OUT/summary.txt"
# Binaries built in another checkout look for the tiny model and fixtures at that checkout's path.
for src in ${SRC_CHECKOUT:-/work/w15s}; do [ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; }; done
: > "$S"
BIN=${BIN:-build-devbin}
TARGETS=(test_engine_ops test_act_dispatch test_swiglu_quant test_engine bench_moe_layer moesq)
ok=1
for t in "${TARGETS[@]}"; do
  [ -x "$BIN/$t" ] && ! ldd "$BIN/$t" | grep -q "not found" || ok=0
done
if [ $ok -eq 0 ]; then  # build here instead (BUILD=1), or report what does not load
  if [ "${BUILD:-0}" = 1 ]; then
    BIN=build-dev
    t0=$(date +%s)
    { cmake -S . -B $BIN -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESQ_PYTHON=OFF &&
      cmake --build $BIN -j16 --target "${TARGETS[@]}"; } > "$W/build.log" 2>&1 || { tail -40 "$W/build.log" | tee -a "$S"; }
    echo "build $(( $(date +%s) - t0 )) s" | tee -a "$S"
  else
    for t in "${TARGETS[@]}"; do ldd "$BIN/$t" 2>&1 | grep "not found" | sed "s|^|$t: |"; done | tee -a "$S"
    echo "SUMMARY: the binaries in $BIN do not load (BUILD=1 builds them here)" | tee -a "$S"
    exit 1
  fi
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader >> "$S" 2>&1

step() {  # step NAME TIMEOUT COMMAND...
  local name=$1 limit=$2; shift 2
  local s=$(date +%s)
  timeout "$limit" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  echo "$([ $rc -eq 0 ] && echo PASS || echo "FAIL rc=$rc") $name ($(( $(date +%s) - s )) s)" | tee -a "$S"
  [ $rc -eq 0 ] || grep -E "Failure|FAILED|error|Expected|Which is|actual" "$W/$name.log" | head -20 >> "$S"
}
step engine_ops 120 "$BIN/test_engine_ops"
step act_dispatch 120 "$BIN/test_act_dispatch"
step swiglu_quant 120 "$BIN/test_swiglu_quant"
if python3 -c "import torch" 2>/dev/null; then
  step peer 200 python3 bench/peer_moe_layer.py --out "$W/peer.json" --batch 1,64,512 --layers 4 --reps 100
fi
PEER=(); [ -f "$W/peer.json" ] && PEER=(--peer-json "$W/peer.json")
step bench 240 "$BIN/bench_moe_layer" --experts sparse-w4a4,sparse-w4a16,bf16 --batch 1,64,512 --layers 4 --reps 100 \
  "${PEER[@]}" --out "$W/moe_layer.json"
cat "$W/bench.log" >> "$S"
step memcheck_combine_gemm 150 compute-sanitizer --tool memcheck "$BIN/test_engine_ops" \
  --gtest_filter='*MoeCombine*:*SmallM*'
grep -h "ERROR SUMMARY" "$W/memcheck_combine_gemm.log" >> "$S"
rm -rf "$W/tiny_sgptq"
"$BIN/moesq" compress models/tiny-qwen3-moe --method sgptq --out "$W/tiny_sgptq" --calib-samples 32 --threads 16 \
  > "$W/compress.log" 2>&1 || echo "compress failed" >> "$S"
step engine 200 env MOESQ_TINY_COMPRESSED="$W/tiny_sgptq" "$BIN/test_engine"
grep -h "^\[engine\]" "$W/engine.log" | head -20 >> "$S"
tar -czf "$OUT/logs.tgz" -C "$W" --exclude tiny_sgptq .
