#!/usr/bin/env bash
# `moesq serve --device cuda` on the device in one call: the server on the tiny model with the GPU
# engine, deterministic serving (bench/serve_determinism.py: 64 concurrent requests vs `moesq
# generate` alone), `moesq bench serve` with --deterministic on and off, SIGTERM → exit 0.
# The H200 image has no cpp-httplib package: carry upstream's header-only httplib.h (v0.11.4, the
# Debian version) in build-httplib/ and configure with MOESQ_HTTPLIB_HEADER_DIR (done here).
#   BUILD_DIR=/tmp/b bash bench/device_serve.sh     (reuses a build of bench/device_refine.sh when given)
# Writes $OUT/serve_summary.txt.
set -uo pipefail
O=${OUT:-/tmp/moesq_serve}; mkdir -p "$O"; S="$O/serve_summary.txt"; : > "$S"
log() { echo "$*" | tee -a "$S"; }
export PATH="/usr/local/cuda/bin:$PATH"
ROOT=$(pwd); B=${BUILD_DIR:-$(mktemp -d)/b}; M=$ROOT/models/tiny-qwen3-moe; DEV=${DEV:-cuda}  # DEV=cpu: a dry run of this script
t0=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESQ_PYTHON=OFF -DMOESQ_HTTPLIB_HEADER_DIR="$ROOT/build-httplib" > "$O/serve_cfg.log" 2>&1 &&
  cmake --build "$B" -j16 --target moesq > "$O/serve_build.log" 2>&1 || { log "FAIL: build"; tail -30 "$O/serve_build.log" | tee -a "$S"; exit 1; }
grep -q "cpp-httplib 1\|cpp-httplib ON" "$O/serve_cfg.log" || log "WARNING: configured without cpp-httplib"
log "build $(( $(date +%s) - t0 )) s"
for det in $([ $DEV = cuda ] && echo on off || echo on); do
  "$B/moesq" serve "$M" --device $DEV --port 0 --max-num-seqs 16 --max-model-len 128 --deterministic $det 2> "$O/serve_$det.log" &
  pid=$!
  port=""
  for i in $(seq 1 600); do
    port=$(grep -oE 'listening on http://127\.0\.0\.1:[0-9]+' "$O/serve_$det.log" | grep -oE '[0-9]+$' | head -1)
    [ -n "$port" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$port" ] || { log "FAIL: serve --deterministic $det did not start"; tail -20 "$O/serve_$det.log" | tee -a "$S"; continue; }
  log "serve --deterministic $det: $(head -1 "$O/serve_$det.log")"
  URL=http://127.0.0.1:$port
  if [ $det = on ]; then
    timeout 300 python3 bench/serve_determinism.py --url $URL --moesq "$B/moesq" --model "$M" --device $DEV \
      --requests 64 --offline 8 2>&1 | tail -12 | tee -a "$S"
  fi
  for conc in 1 16; do
    timeout 300 "$B/moesq" bench serve --url $URL --input-len 64 --output-len 48 --num-requests 64 --concurrency $conc \
      --json > "$O/bench_serve_${det}_c$conc.json" 2> "$O/bench_serve_${det}_c$conc.err"
    log "bench serve det=$det concurrency=$conc rc=$? $(python3 -c "
import json,sys; j=json.load(open(sys.argv[1]))
print('req %d ok %d fail; out %.0f tok/s; TTFT mean %.2f ms; TPOT mean %.3f ms p99 %.3f; ITL median %.3f ms; E2E mean %.1f ms' % (
 j['completed'], j['failed'], j['output_throughput'], j['ttft_ms']['mean'], j['tpot_ms']['mean'], j['tpot_ms']['p99'], j['itl_ms']['median'], j['e2e_latency_ms']['mean']))" "$O/bench_serve_${det}_c$conc.json" 2>&1)"
  done
  kill -TERM $pid; wait $pid; log "serve --deterministic $det: SIGTERM -> exit $?"
done
log "total $(( $(date +%s) - t0 )) s"
