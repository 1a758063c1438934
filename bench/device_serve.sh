#!/usr/bin/env bash
# `moesq serve --device cuda` on the device in one call. Steps (STEPS, space-separated; SYNTH=1 adds
# `synthetic` to the default):
#   tiny       the server on the tiny model with the GPU engine: deterministic serving
#              (bench/serve_determinism.py: 64 concurrent requests vs `moesq generate` alone),
#              `moesq bench serve` with --deterministic on and off, SIGTERM → exit 0;
#   synthetic  `serve --synthetic qwen3-30b-a3b` (all 48 layers, SYNTH_LAYERS to change) for each of
#              SYNTH_EXPERTS (sparse-w4a4 bf16) and `bench serve` on the target workloads: reference
#              (1,024 in / 256 out, REF_N 128 requests, concurrency 64), decode (384 / 128, DEC_N 500
#              requests, all in flight), prefill (4,096 / 1, PRE_N 64 requests, concurrency 32); then
#              the sparse ÷ bf16 ratios. KV slots are fixed-size (no paged cache yet), so each backend
#              runs two servers sized for their workloads: 64 slots × 4,352 tokens (reference, prefill)
#              and 500 slots × 512 tokens (decode): at 96 KiB of bf16 K/V per token (48 layers × K and
#              V × 4 KV heads × 128 × 2 bytes) that is 25.5 and 23.4 GiB, beside 61.06 GB (bf16) /
#              13.05 GB (sparse-w4a4) of weights (bench e2e, bench/NOTES.md).
#              E2E=1 adds `bench e2e` at batch 64 on the reference shape (TPOT vs the server's).
#              Every wait is capped so that the step ends within SYNTH_BUDGET_S (480) seconds;
#              REF_N / DEC_N / PRE_N make it shorter.
# The H200 image has no cpp-httplib package: carry upstream's header-only httplib.h (v0.11.4, the
# Debian version) in build-httplib/ and configure with MOESQ_HTTPLIB_HEADER_DIR (done here).
#   BUILD_DIR=/tmp/b bash bench/device_serve.sh     (reuses a build of bench/device_refine.sh when given)
#   STEPS=synthetic bash bench/device_serve.sh      (the real-shape serving numbers only)
#   STEPS=build BUILD_DIR=build-device bash bench/device_serve.sh, then STEPS=synthetic with the same
#                                                   BUILD_DIR in a second call (ignored build-* dirs stay)
#   DEV=cpu STEPS="tiny synthetic" bash bench/device_serve.sh   (a dry run: the synthetic step only
#                                                   checks that the server refuses --device cpu)
# Writes $OUT/serve_summary.txt (and each run's JSON and logs beside it).
set -uo pipefail
O=${OUT:-/tmp/moesq_serve}; mkdir -p "$O"; S="$O/serve_summary.txt"; : > "$S"
log() { echo "$*" | tee -a "$S"; }
export PATH="/usr/local/cuda/bin:$PATH"
ROOT=$(pwd); B=${BUILD_DIR:-$(mktemp -d)/b}; M=$ROOT/models/tiny-qwen3-moe; DEV=${DEV:-cuda}  # DEV=cpu: a dry run of this script
STEPS=${STEPS:-tiny}; [ "${SYNTH:-0}" = 1 ] && STEPS="$STEPS synthetic"
t0=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESQ_PYTHON=OFF -DMOESQ_HTTPLIB_HEADER_DIR="$ROOT/build-httplib" > "$O/serve_cfg.log" 2>&1 &&
  cmake --build "$B" -j16 --target moesq > "$O/serve_build.log" 2>&1 || { log "FAIL: build"; tail -30 "$O/serve_build.log" | tee -a "$S"; exit 1; }
grep -q "cpp-httplib 1\|cpp-httplib ON" "$O/serve_cfg.log" || log "WARNING: configured without cpp-httplib"
log "build $(( $(date +%s) - t0 )) s; steps: $STEPS"

# Seconds left of the budget of the running step (DEADLINE, epoch seconds; none: 3600): every wait
# below is capped by it, so a slow or stuck run still ends (and writes its summary) inside the
# device's per-call limit.
DEADLINE=$(( $(date +%s) + 3600 ))
cap() { local left=$(( DEADLINE - $(date +%s) )); [ $left -lt 1 ] && left=1; echo $(( $1 < left ? $1 : left )); }
spent() { [ $(date +%s) -ge $DEADLINE ] && log "skipped $1: the step's time budget is spent"; }

# start_server NAME WAIT_S ARGS...: `moesq serve ARGS --port 0` in the background, its stderr in
# $O/serve_NAME.log; sets PID and URL (URL empty when it did not start within WAIT_S seconds).
start_server() {
  local name=$1 wait_s=$(cap $2) port=""; shift 2
  URL=""; spent "serve $name" && return
  "$B/moesq" serve "$@" --port 0 2> "$O/serve_$name.log" &
  PID=$!
  for i in $(seq 1 $(( wait_s * 10 ))); do
    port=$(grep -oE 'listening on http://127\.0\.0\.1:[0-9]+' "$O/serve_$name.log" | grep -oE '[0-9]+$' | head -1)
    [ -n "$port" ] && break
    kill -0 $PID 2>/dev/null || break
    sleep 0.1
  done
  URL=""
  if [ -n "$port" ]; then URL=http://127.0.0.1:$port; log "serve $name: $(grep 'moesq serve: model' "$O/serve_$name.log")"
  else log "FAIL: serve $name did not start"; tail -5 "$O/serve_$name.log" | tee -a "$S"; kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null; fi
  command -v nvidia-smi > /dev/null && [ -n "$URL" ] && log "  GPU memory used: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader | head -1)"
}
stop_server() { kill -TERM $PID; wait $PID; log "serve $1: SIGTERM -> exit $?"; }

# bench_serve NAME TIMEOUT_S ARGS...: `moesq bench serve --url $URL ARGS --json` into
# $O/bench_serve_NAME.json, and one summary line.
bench_serve() {
  local name=$1 tmo=$(cap $2); shift 2
  spent "bench serve $name" && return
  timeout "$tmo" "$B/moesq" bench serve --url "$URL" "$@" --json > "$O/bench_serve_$name.json" 2> "$O/bench_serve_$name.err"
  local rc=$?
  [ -s "$O/bench_serve_$name.json" ] || { log "bench serve $name rc=$rc (no JSON; timeout ${tmo} s): $(tail -1 "$O/bench_serve_$name.err")"; return; }
  log "bench serve $name rc=$rc $(python3 -c "
import json,sys; j=json.load(open(sys.argv[1])); t=j['ttft_ms']; p=j['tpot_ms']
print('req %d ok %d fail; %.1f s; out %.0f tok/s, total %.0f tok/s; TTFT mean %.1f median %.1f p99 %.1f ms; TPOT mean %.2f median %.2f p99 %.2f ms; ITL median %.2f ms' % (
 j['completed'], j['failed'], j['duration_s'], j['output_throughput'], j['total_token_throughput'], t['mean'], t['median'], t['p99'],
 p['mean'], p['median'], p['p99'], j['itl_ms']['median']))" "$O/bench_serve_$name.json" 2>&1 | tail -1)"
}

step_tiny() {
  for det in $([ $DEV = cuda ] && echo on off || echo on); do
    start_server "tiny_$det" 60 "$M" --device $DEV --max-num-seqs 16 --max-model-len 128 --deterministic $det
    [ -n "$URL" ] || continue
    if [ $det = on ]; then
      timeout 300 python3 bench/serve_determinism.py --url $URL --moesq "$B/moesq" --model "$M" --device $DEV \
        --requests 64 --offline 8 2>&1 | tail -12 | tee -a "$S"
    fi
    for conc in 1 16; do
      bench_serve "${det}_c$conc" 300 --input-len 64 --output-len 48 --num-requests 64 --concurrency $conc
    done
    stop_server "tiny_$det"
  done
}

step_synthetic() {
  local layers=${SYNTH_LAYERS:-0} experts=${SYNTH_EXPERTS:-sparse-w4a4 bf16}
  DEADLINE=$(( $(date +%s) + ${SYNTH_BUDGET_S:-480} ))
  local syn=(--synthetic qwen3-30b-a3b --layers "$layers" --device "$DEV")
  if [ $DEV != cuda ]; then  # dry run: the refusal only
    "$B/moesq" serve "${syn[@]}" --experts sparse-w4a4 --port 0 2> "$O/serve_synthetic_dry.log"
    log "synthetic (dry run, DEV=$DEV): serve exit $? ($(tail -1 "$O/serve_synthetic_dry.log"))"
    return
  fi
  for e in $experts; do
    local ts=$(date +%s)
    start_server "syn_${e}_64" 180 "${syn[@]}" --experts "$e" --max-num-seqs 64 --max-model-len 4352 --max-queue 512
    if [ -n "$URL" ]; then
      bench_serve "syn_${e}_reference" 240 --workload reference --num-requests "${REF_N:-128}" --concurrency 64
      bench_serve "syn_${e}_prefill" 180 --workload prefill --num-requests "${PRE_N:-64}" --concurrency 32
      stop_server "syn_${e}_64"
    fi
    start_server "syn_${e}_500" 180 "${syn[@]}" --experts "$e" --max-num-seqs 500 --max-model-len 512 --max-queue 512
    if [ -n "$URL" ]; then
      bench_serve "syn_${e}_decode" 240 --workload decode --num-requests "${DEC_N:-500}" --concurrency "${DEC_N:-500}"
      stop_server "syn_${e}_500"
    fi
    log "synthetic $e: $(( $(date +%s) - ts )) s"
  done
  if [ "${E2E:-0}" = 1 ]; then
    timeout $(cap 300) "$B/moesq" bench e2e --synthetic qwen3-30b-a3b --layers "$layers" --experts "${experts// /,}" --batch 64 \
      --prompt-len 1024 --gen 256 --json > "$O/e2e_reference.json" 2> "$O/e2e_reference.err"
    log "bench e2e B=64 1024/256 rc=$?: $(grep -oE '\[bench e2e\].*TPOT +[0-9.]+ ms' "$O/e2e_reference.err" | tr '\n' ';')"
  fi
  python3 - "$O" >> "$S" 2>&1 <<'EOF'
import json, os, sys
o = sys.argv[1]
def get(e, w):
    p = os.path.join(o, f"bench_serve_syn_{e}_{w}.json")
    return json.load(open(p)) if os.path.exists(p) and os.path.getsize(p) else None
for w, key, label in [("reference", "output_throughput", "output tok/s"), ("decode", "output_throughput", "output tok/s"),
                      ("prefill", "total_token_throughput", "total tok/s")]:
    s, b = get("sparse-w4a4", w), get("bf16", w)
    if s and b and b[key] > 0:
        print(f"ratio {w}: sparse-w4a4 / bf16 {label} = {s[key]:.0f} / {b[key]:.0f} = {s[key] / b[key]:.2f}x; "
              f"TPOT mean {s['tpot_ms']['mean']:.2f} / {b['tpot_ms']['mean']:.2f} ms")
EOF
}

for st in $STEPS; do
  case $st in
    tiny) step_tiny ;;
    synthetic) step_synthetic ;;
    build) ;;  # the build above only
    *) log "FAIL: unknown step '$st' (build, tiny, synthetic)" ;;
  esac
done
log "total $(( $(date +%s) - t0 )) s"
