#!/usr/bin/env bash
# Sessions 16–17's device call: build; the GPU tests of the large-M gemm_bf16 path, of static activation
# scales, of chunked prefill and of the paged KV cache (test_engine_ops PagedKvEqualsContiguousBitwise,
# test_engine PagedKvBlocksDoNotChangeBits) (+ compute-sanitizer memcheck); bench_gemm_bf16 (tile kernel vs gemm_bf16 vs cuBLAS, same run);
# `moesq bench e2e` at Qwen3-30B-A3B shapes (TTFT of 64 × 1,024-token prompts and TPOT at B = 64, the
# numbers of bench/NOTES.md "Serving at real shapes v1"). Everything lands in $OUT: summary.txt first.
# Session 18 added test_mla_ops and the MLA engine tests (test_engine Families* now includes DeepSeek-V3),
# and the `kimi` step: `bench e2e --synthetic kimi-k2.5` (MLA + 384 experts) at 2 layers (1 dense + 1 MoE)
# for bf16 vs sparse-w4a4 in the same run, and 8 layers sparse-w4a4 alone (per-layer figures); prefill in
# 1,024-token forwards (activations and [T, 163,840] logits stay small; the MoE block runs in its own
# slices of ≈ 900 tokens, EngineOptions::moe_tokens). Its JSON rows carry per-layer decode times and the
# 61-layer extrapolation (linear in layers, an upper bound, stated as such).
# Session 19 added the `compress` step: compression's GPU layer forward for multi-head latent attention
# (test_layer_cuda: the MLA ops vs their twins bitwise, attention with narrower values, the DeepSeek-V3
# fixture's MLA layer vs the CPU mixer; memcheck) and `bench compress --synthetic kimi-k2.5` (the dense
# first layer + one MoE layer of 384 experts, KIMI_CALIB × 128 calibration tokens, sgptq and moesq).
#   KIMI_CALIB=256  KIMI_METHODS=sgptq,moesq  KIMI_TIMEOUT=330  KIMI_THREADS=16  MEMCHECK_LAYER=1
#   KIMI_EXTRA="--num-experts 16" (session 25): more bench compress flags for the kimi run
#   LAYER_TESTS=0 (session 24): the compress step without test_layer_cuda, the Kimi bench alone
#   KIMI_LAYERS=8 (the sparse-only kimi run; 6 fits an 80 GB H100 with room)
#   KIMI_RUNS="bf16,sparse-w4a4:2 sparse-w4a4:8" (experts:layers)  KIMI_BATCH=1,64
#   BASE_TAR=.dev/base.tar (carry it): the kimi runs also with a build of the tree with those files put back
#   TEST_TIMEOUT=400 (session 30): seconds per GPU test binary; one that times out (rc 124) is not rerun
#   STEPS="tests bench e2e kimi" (default all four; also small_m, compress, compress_q3, next, q35, ep, ncu_decode, layer, pdl)  GPU_TESTS="test_engine_ops ..."  E2E_GEN=64
set -uo pipefail
O=${OUT:-/tmp/moesq_gemm}; mkdir -p "$O"
W=$(mktemp -d); S="$O/summary.txt"; : > "$S"
export PATH="/usr/local/cuda/bin:$PATH"
STEPS=${STEPS:-tests bench e2e kimi}
has() { [[ " $STEPS " == *" $1 "* ]]; }
log() { echo "$*" | tee -a "$S"; }
GPU_TESTS=${GPU_TESTS:-test_mla_ops test_engine_ops test_act_dispatch test_swiglu_quant test_engine_reference_layout test_engine test_moe_layer_gpu}
MEMCHECK=${MEMCHECK:-test_mla_ops test_act_dispatch test_swiglu_quant test_engine_ops test_engine_reference_layout test_moe_layer_gpu}
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$S"
B=${BUILD_DIR:-build-dev}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESQ_PYTHON=OFF -DMOESQ_BENCH=ON > "$W/cfg.log" 2>&1 &&
  cmake --build "$B" -j16 --target moesq bench_gemm_bf16 $(has tests && echo $GPU_TESTS) $(has compress && echo test_layer_cuda) > "$W/build.log" 2>&1 ||
  { log "FAIL: build"; grep -E "error" "$W/build.log" | head -20 | tee -a "$S"; tail -20 "$W/build.log" >> "$S"; exit 1; }
log "build $(( $(date +%s) - t0 )) s"
# BASE_TAR (a tar of source files, relative to the repo root): the same-run baseline. A copy of the
# tree with those files put back is built (moesq only) and every kimi run below runs with it first.
BB=""
if [ -n "${BASE_TAR:-}" ]; then
  mkdir -p "$W/base" && tar -c --exclude='./build*' --exclude=./.git . | tar -x -C "$W/base" && tar -xf "$BASE_TAR" -C "$W/base" &&
    cmake -S "$W/base" -B "$W/base/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESQ_PYTHON=OFF > "$W/cfg_base.log" 2>&1 &&
    cmake --build "$W/base/build" -j16 --target moesq > "$W/build_base.log" 2>&1 && BB="$W/base/build/moesq"
  log "baseline build ($BASE_TAR): ${BB:-FAILED} $(( $(date +%s) - t0 )) s"
fi
finish() { (cd "$W" && tar czf "$O/logs.tgz" *.log 2>/dev/null); log "total $(( $(date +%s) - t0 )) s"; }
trap finish EXIT

if has tests; then
  C=$W/tiny-sgptq
  "$B/moesq" compress models/tiny-qwen3-moe --method sgptq --calib-samples 32 --out "$C" > "$W/compress.log" 2>&1
  log "compress tiny sgptq rc=$?"
  export MOESQ_TINY_COMPRESSED=$C
  "$B/moesq" compress tests/fixtures/families/tiny-gpt-oss --method sgptq --calib-samples 32 --out "$W/gpt-oss-sgptq" \
    > "$W/compress_gpt_oss.log" 2>&1
  log "compress tiny-gpt-oss sgptq rc=$?"
  export MOESQ_GPT_OSS_COMPRESSED=$W/gpt-oss-sgptq
  # Session 28: the tests run with PDL and the routes kernel on (both off by default until measured);
  # a failing test runs again with both off.
  export MOESQ_PDL=${TEST_PDL:-1} MOESQ_SPARSE_ROUTES=${TEST_ROUTES:-1}
  log "tests with MOESQ_PDL=$MOESQ_PDL MOESQ_SPARSE_ROUTES=$MOESQ_SPARSE_ROUTES"
  for t in $GPU_TESTS; do
    timeout ${TEST_TIMEOUT:-400} "$B/$t" > "$W/$t.log" 2>&1; rc=$?
    log "$t rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]' "$W/$t.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Z]|Failure|error|\[static act\]' "$W/$t.log" | head -20 | sed 's/^/  /' >> "$S"
    if [ $rc != 0 ] && [ $rc != 124 ]; then  # (a hang is not rerun: session 30) session 28: the same binary with every kernel launched plainly (core/cuda/pdl.cuh)
      MOESQ_PDL=0 MOESQ_SPARSE_ROUTES=0 timeout ${TEST_TIMEOUT:-400} "$B/$t" > "$W/$t.nopdl.log" 2>&1
      log "  $t with MOESQ_PDL=0 MOESQ_SPARSE_ROUTES=0: rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]' "$W/$t.nopdl.log" | tr '\n' ' ')"
    fi
    # Session 31: the tiny models' GEMMs make too few CTAs for gemm_bf16's decode path; the engine tests
    # run again with it forced on every call that fits (MOESQ_DECODE_GEMM_MIN_CTAS=1).
    if [ "$t" = test_engine ] && [ "${DECODE_FORCED:-1}" = 1 ]; then
      MOESQ_DECODE_GEMM_MIN_CTAS=1 timeout ${TEST_TIMEOUT:-400} "$B/$t" > "$W/$t.decode.log" 2>&1
      log "  $t with MOESQ_DECODE_GEMM_MIN_CTAS=1: rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]' "$W/$t.decode.log" | tr '\n' ' ')"
    fi
    [[ " $MEMCHECK " == *" $t "* ]] || continue
    filter=""; [ "$t" = test_engine_ops ] && filter="--gtest_filter=*Gemm*:*Paged*:*Router*:*DenseSwiglu*:*SlidingWindow*:*RouteRows*:*SynthPack*"
    [ "$t" = test_engine_expert_parallel ] && filter="--gtest_filter=*Synthetic*:*Refused*"
    [ "$t" = test_sparse_gemm ] && filter="--gtest_filter=*Routes*:*IntegerValued*"
    timeout 300 compute-sanitizer --tool memcheck "$B/$t" $filter > "$W/memcheck.$t.log" 2>&1
    log "memcheck $t: $(grep -E 'ERROR SUMMARY' "$W/memcheck.$t.log" | tail -1)"
  done
  # RACECHECK="binary:gtest-filter …": compute-sanitizer racecheck (shared-memory hazards) of those tests.
  for rc_spec in ${RACECHECK:-}; do
    rb=${rc_spec%%:*}; rf=${rc_spec#*:}
    timeout 300 compute-sanitizer --tool racecheck "$B/$rb" --gtest_filter="$rf" > "$W/racecheck.$rb.log" 2>&1
    log "racecheck $rb ($rf): $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$W/racecheck.$rb.log" | tail -1)"
  done
  unset MOESQ_PDL MOESQ_SPARSE_ROUTES
  log "tests $(( $(date +%s) - t0 )) s"
fi

if has compress && [ "${LAYER_TESTS:-1}" = 1 ]; then
  timeout 200 "$B/test_layer_cuda" > "$W/test_layer_cuda.log" 2>&1
  log "test_layer_cuda rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]' "$W/test_layer_cuda.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]|Failure|\[mla' "$W/test_layer_cuda.log" | head -20 | sed 's/^/  /' >> "$S"
  if [ "${MEMCHECK_LAYER:-1}" = 1 ]; then
    timeout 200 compute-sanitizer --tool memcheck "$B/test_layer_cuda" --gtest_filter='LayerOpsGpu.*:*Mla*' \
      > "$W/memcheck.test_layer_cuda.log" 2>&1
    log "memcheck test_layer_cuda (LayerOpsGpu, Mla): $(grep -E 'ERROR SUMMARY' "$W/memcheck.test_layer_cuda.log" | tail -1)"
  fi
fi
if has compress; then
  timeout "${KIMI_TIMEOUT:-330}" "$B/moesq" bench compress --synthetic kimi-k2.5 --layers 2 --calib-samples "${KIMI_CALIB:-256}" \
    --seq-len 128 --methods "${KIMI_METHODS:-sgptq,moesq}" --device cuda --threads "${KIMI_THREADS:-16}" ${KIMI_EXTRA:-} --json > "$O/bench_compress_kimi.json" \
    2> "$W/bench_compress_kimi.log"
  log "bench compress kimi-k2.5 rc=$?"; grep -vE '^\[compress\] layer [0-9]+/[0-9]+: [0-9]+/' "$W/bench_compress_kimi.log" | tail -12 | tee -a "$S"
fi

# Session 23: the kept expert outputs (DeviceStates::expert_outputs) against the sampled free memory, at
# Qwen3-30B-A3B shapes over Q3_LAYERS layers: layer 1 recomputes (nothing sampled yet), the later
# layers reuse the error stage's outputs; the per-layer propagation times are in the log's layer lines.
if has compress_q3; then
  for bin in ${BB:+base:$BB} "new:$B/moesq"; do  # BASE_TAR: the baseline build first, same run
    tag=${bin%%:*}; exe=${bin#*:}
    timeout "${Q3_TIMEOUT:-240}" "$exe" bench compress --synthetic qwen3-30b-a3b --layers "${Q3_LAYERS:-3}" \
      --methods "${Q3_METHODS:-moesq}" --device cuda --threads 16 --json > "$O/bench_compress_q3_$tag.json" 2> "$W/bench_compress_q3_$tag.log"
    log "bench compress qwen3-30b-a3b layers ${Q3_LAYERS:-3} ($tag) rc=$?"
    grep -vE '^\[compress\] layer [0-9]+/[0-9]+: [0-9]+/' "$W/bench_compress_q3_$tag.log" | tail -16 | tee -a "$S"
  done
fi

if has bench; then
  timeout 300 "$B/bench_gemm_bf16" --out "$O/bench_gemm_bf16.json" > "$O/bench_gemm_bf16.txt" 2>&1
  log "bench_gemm_bf16 rc=$?"; cat "$O/bench_gemm_bf16.txt" >> "$S"
fi

# Session 31: the decode regime of gemm_bf16 (M = 1, 8, 64; every path against cuBLAS, bitwise checks first).
if has small_m; then
  timeout ${SMALL_M_TIMEOUT:-240} "$B/bench_gemm_bf16" --small-m --reps ${SMALL_M_REPS:-10} --out "$O/small_m.json" > "$O/small_m.txt" 2>&1
  log "bench_gemm_bf16 --small-m rc=$?"; cat "$O/small_m.txt" >> "$S"
  # NCU_SMALL_M="qkv:64:16 qkv:64:32:2" (shape:M:columns per warp[:warp rows]): Nsight Compute on gemm_bf16's
  # decode kernel there, in that layout.
  for sm in ${NCU_SMALL_M:-}; do
    IFS=: read -r shape m wc wr <<< "$sm"
    MOESQ_DECODE_GEMM_WARP_COLS=$wc MOESQ_DECODE_GEMM_WARP_ROWS=${wr:-1} timeout 120 ncu --kernel-name regex:gemm_bf16_decode --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
      --section ComputeWorkloadAnalysis --section SchedulerStats \
      "$B/bench_gemm_bf16" --small-m --reps 1 --only $shape --m $m > "$O/ncu_small_m_${shape}_${m}_${wc}x${wr:-1}.txt" 2>&1
    log "ncu $sm rc=$?"
  done
fi

if has e2e; then
  # --deterministic on,off: the same engine with cuBLAS for q|k|v, o_proj, router and lm_head is the peer.
  for ex in sparse-w4a4 bf16; do
    timeout 240 "$B/moesq" bench e2e --synthetic qwen3-30b-a3b --experts $ex --batch 1,64 --prompt-len 1024 \
      --gen "${E2E_GEN:-64}" --deterministic on,off --json > "$O/e2e_$ex.json" 2> "$O/e2e_$ex.err"
    log "bench e2e $ex B=1,64 1024/${E2E_GEN:-64} rc=$?"; grep -E '\[bench e2e\]' "$O/e2e_$ex.err" | tee -a "$S"
  done
fi

# Session 25: the hybrid Qwen3-Next-80B-A3B (Gated DeltaNet + gated attention) at real shapes, NEXT_LAYERS
# layers (8: six GDN, two attention), bf16 vs sparse-w4a4 experts in the same run.
# Session 27: NEXT_GDN="walk parallel" runs it once per Gated DeltaNet prefill form (the same bits), the
# walk first: the parallel form's peer in the same call.
if has next; then
  for form in ${NEXT_GDN:-parallel}; do
    timeout 300 "$B/moesq" bench e2e --synthetic qwen3-next-80b-a3b --layers "${NEXT_LAYERS:-8}" --experts "${NEXT_EXPERTS:-bf16,sparse-w4a4}" \
      --batch "${NEXT_BATCH:-1,64}" --prompt-len 1024 --prefill-tokens 4096 --gen "${E2E_GEN:-64}" --deterministic on \
      --gdn-prefill $form --json > "$O/e2e_next_$form.json" 2> "$W/e2e_next_$form.err"
    log "bench e2e qwen3-next-80b-a3b layers ${NEXT_LAYERS:-8} --gdn-prefill $form rc=$?"; grep -E '\[bench e2e\]|rror' "$W/e2e_next_$form.err" | tee -a "$S"
  done
fi

# Session 26: the expert-parallel engine (docs/PARALLEL.md), its protocol on this one GPU: the threads
# test (2 and 3 ranks = one GPU bitwise), then `mpirun -np 2 moesq eval --device cuda` against the plain
# process (nats must be equal to the last digit), then 2 ranks of bench e2e at Qwen3-30B-A3B shapes.
if has ep; then
  cmake --build "$B" -j16 --target test_engine_expert_parallel test_device_collectives > "$W/build_ep.log" 2>&1 || log "FAIL: build test_engine_expert_parallel"
  timeout 120 "$B/test_device_collectives" > "$W/test_device_collectives.log" 2>&1
  log "test_device_collectives (NCCL, one rank) rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]|SKIPPED' "$W/test_device_collectives.log" | tr '\n' ' ')"
  grep -E 'NCCL' "$W/cfg.log" | head -2 | sed 's/^/  /' >> "$S"
  [[ " $GPU_TESTS " == *" test_engine_expert_parallel "* ]] ||  # already run (and memchecked) above
  { timeout 400 "$B/test_engine_expert_parallel" > "$W/test_engine_expert_parallel.log" 2>&1
  log "test_engine_expert_parallel rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]' "$W/test_engine_expert_parallel.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]|Failure|\[ep\]' "$W/test_engine_expert_parallel.log" | head -20 | sed 's/^/  /' >> "$S"; }
  MPI="mpirun --allow-run-as-root --oversubscribe -np 2"
  data=$(ls corpus/*.txt 2>/dev/null | head -2 | tr '\n' ' '); [ -n "$data" ] || { head -c 20000 README.md > "$W/ep.txt"; data="$W/ep.txt"; }
  for np in 1 2; do
    pre=""; [ $np = 2 ] && pre="$MPI"
    timeout 300 $pre "$B/moesq" eval models/tiny-qwen3-moe --data $data --seq-len 128 --device cuda --json \
      > "$O/eval_ep$np.json" 2> "$W/eval_ep$np.err"
    log "eval --device cuda, $np rank(s): rc=$? $(grep -o '"nats_per_token": [0-9.e-]*' "$O/eval_ep$np.json" | tail -1)"
  done
  cmp -s <(grep -vE 'expert_parallel_ranks|expert_exchange|"seconds"' "$O/eval_ep1.json") <(grep -vE 'expert_parallel_ranks|expert_exchange|"seconds"' "$O/eval_ep2.json") \
    && log "eval: 2 ranks = 1 rank, byte for byte (but the ranks and seconds keys)" || log "eval: 2 ranks DIFFER from 1 rank"
  # Two ranks on one GPU with the NCCL exchange forced: NCCL refuses; every rank must end with the reason.
  timeout 120 $MPI "$B/moesq" eval models/tiny-qwen3-moe --data $data --seq-len 128 --device cuda --expert-exchange nccl \
    > /dev/null 2> "$W/eval_ep_nccl.err"
  log "eval 2 ranks --expert-exchange nccl on one GPU: rc=$? (expect non-zero, not 124) $(grep -m1 -i 'error' "$W/eval_ep_nccl.err" | head -c 300)"
  if [ "${EP_E2E:-1}" = 1 ]; then  # EP_E2E=0: without the 2-rank bench e2e
    timeout 300 $MPI "$B/moesq" bench e2e --synthetic qwen3-30b-a3b --layers 4 --experts sparse-w4a4 --batch 1,64 \
      --prompt-len 512 --gen 16 --json > "$O/e2e_ep2.json" 2> "$W/e2e_ep2.err"
    log "bench e2e 2 ranks rc=$?"; grep -E '\[bench e2e\]|rror' "$W/e2e_ep2.err" | tee -a "$S"
  fi
fi

# Session 26: Qwen3.5-397B-A17B (hidden 4,096, 64 GDN value heads, 32 × 256 gated attention), Q35_LAYERS layers.
if has q35; then
  timeout 300 "$B/moesq" bench e2e --synthetic qwen3.5-397b-a17b --layers "${Q35_LAYERS:-4}" --experts bf16,sparse-w4a4 \
    --batch "${NEXT_BATCH:-1,64}" --prompt-len 1024 --prefill-tokens 4096 --gen "${E2E_GEN:-64}" --deterministic on --json \
    > "$O/e2e_q35.json" 2> "$W/e2e_q35.err"
  log "bench e2e qwen3.5-397b-a17b layers ${Q35_LAYERS:-4} rc=$?"; grep -E '\[bench e2e\]|rror' "$W/e2e_q35.err" | tee -a "$S"
fi

# Session 27: where a decode step's time goes, per kernel (ncu serializes the launches: durations, not gaps).
# bench e2e at Qwen3-30B-A3B shapes, NCU_LAYERS layers, B = 1, a 1,024-token prompt, 8 steps; the
# by-kernel sums cover the prefill too (its kernels are the large-M GEMMs and the prefill attention).
if has ncu_decode; then
  timeout 400 ncu --clock-control none --graph-profiling node --launch-count ${NCU_COUNT:-1500} --metrics gpu__time_duration.sum,dram__bytes.sum \
    --csv "$B/moesq" bench e2e --synthetic ${NCU_MODEL:-qwen3-30b-a3b} --layers ${NCU_LAYERS:-2} --experts ${NCU_EXPERTS:-sparse-w4a4} --batch ${NCU_BATCH:-1} \
    --prompt-len 1024 --gen 8 --deterministic on > "$W/ncu_decode.csv" 2> "$W/ncu_decode.log"
  log "ncu decode rc=$?"; cp "$W/ncu_decode.csv" "$O/ncu_decode.csv"
  python3 bench/ncu_summary.py "$W/ncu_decode.csv" --by-kernel | head -40 | tee -a "$S"
fi

# Session 28: one whole MoE layer per stage (bench_moe_layer, issue 25) with the torch peer in the same call.
if has layer; then
  cmake --build "$B" -j16 --target bench_moe_layer > "$W/build_layer.log" 2>&1 || log "FAIL: build bench_moe_layer"
  timeout 200 python3 bench/peer_moe_layer.py --out "$O/peer_moe_layer.json" --batch ${LAYER_BATCH:-1,64,512} --layers 4 --reps 100 \
    > "$W/peer_moe_layer.log" 2>&1; log "torch peer rc=$?"
  # pdl:routes — programmatic dependent launch (core/cuda/pdl.cuh) and the sparse GEMM's routes kernel
  # (ops/sparse_gemm/sparse_gemm_routes.cu) off / on: the same binary, the old schedule first.
  # pdl:routes[:max_tokens[:fused_topk[:prefetch_mb]]] — MOESQ_PDL_MAX_TOKENS (default 16), MOESQ_FUSED_TOPK (0, the
  # engine's default since session 29; session 30 found this script still defaulting to 1)
  # and MOESQ_L2_PREFETCH_MB (24; -1 = session 28's per-CTA rule), session 29.
  for run in ${LAYER_RUNS:-0:0 1:0 1:1}; do
    extra=""; [[ "$run" == *+* ]] && extra=${run#*+} && run=${run%%+*}  # +VAR=v,VAR=v: more environment
    IFS=: read -r pdl routes maxtok ftk pmb <<< "$run"; maxtok=${maxtok:-16}; ftk=${ftk:-0}; pmb=${pmb:-24}; tag=$pdl$routes; [ "$maxtok" = 16 ] || tag+="_t$maxtok"; [ "$ftk" = 0 ] || tag+="_f$ftk"; [ "$pmb" = 24 ] || tag+="_p$pmb"; [ -z "$extra" ] || tag+="_${extra//[^A-Za-z0-9]/}"
    env MOESQ_PDL=$pdl MOESQ_SPARSE_ROUTES=$routes MOESQ_PDL_MAX_TOKENS=$maxtok MOESQ_FUSED_TOPK=$ftk MOESQ_L2_PREFETCH_MB=$pmb ${extra//,/ } timeout 300 "$B/bench_moe_layer" --experts ${LAYER_EXPERTS:-sparse-w4a4,sparse-w4a16,bf16} \
      --batch ${LAYER_BATCH:-1,64,512} --layers 4 --reps 100 --peer-json "$O/peer_moe_layer.json" --out "$O/moe_layer_$tag.json" \
      > "$O/moe_layer_$tag.txt" 2> "$W/moe_layer$tag.err"
    log "bench_moe_layer MOESQ_PDL=$pdl MOESQ_SPARSE_ROUTES=$routes MOESQ_PDL_MAX_TOKENS=$maxtok MOESQ_FUSED_TOPK=$ftk MOESQ_L2_PREFETCH_MB=$pmb $extra rc=$?"; cat "$O/moe_layer_$tag.txt" | tee -a "$S"
    tail -3 "$W/moe_layer$tag.err" >> "$S"
  done
fi

# Session 28: the whole decode step with PDL off and on, Qwen3-30B-A3B shapes, all 48 layers.
if has pdl; then
  for run in ${E2E_RUNS:-0:0 1:1}; do
    extra=""; [[ "$run" == *+* ]] && extra=${run#*+} && run=${run%%+*}  # +VAR=v,VAR=v: more environment
    IFS=: read -r pdl routes maxtok ftk pmb <<< "$run"; maxtok=${maxtok:-16}; ftk=${ftk:-0}; pmb=${pmb:-24}; tag=$pdl$routes; [ "$maxtok" = 16 ] || tag+="_t$maxtok"; [ "$ftk" = 0 ] || tag+="_f$ftk"; [ "$pmb" = 24 ] || tag+="_p$pmb"; [ -z "$extra" ] || tag+="_${extra//[^A-Za-z0-9]/}"
    env MOESQ_PDL=$pdl MOESQ_SPARSE_ROUTES=$routes MOESQ_PDL_MAX_TOKENS=$maxtok MOESQ_FUSED_TOPK=$ftk MOESQ_L2_PREFETCH_MB=$pmb ${extra//,/ } timeout 300 "$B/moesq" bench e2e --synthetic qwen3-30b-a3b --experts ${PDL_EXPERTS:-sparse-w4a4} --batch ${PDL_BATCH:-1,64} \
      --prompt-len 1024 --gen 32 --deterministic on --json > "$O/e2e_$tag.json" 2> "$W/e2e_$tag.err"
    log "bench e2e qwen3-30b-a3b MOESQ_PDL=$pdl MOESQ_SPARSE_ROUTES=$routes MOESQ_PDL_MAX_TOKENS=$maxtok MOESQ_FUSED_TOPK=$ftk MOESQ_L2_PREFETCH_MB=$pmb $extra rc=$?"; grep -E '\[bench e2e\]|rror' "$W/e2e_$tag.err" | tee -a "$S"
  done
fi

if has kimi; then
  for run in ${KIMI_RUNS:-"bf16,sparse-w4a4:2" "sparse-w4a4:${KIMI_LAYERS:-8}"}; do
    ex=${run%%:*}; nl=${run##*:}
    for bin in ${BB:+base:$BB} "new:$B/moesq"; do
      tag=${bin%%:*}; exe=${bin#*:}
      timeout 300 "$exe" bench e2e --synthetic kimi-k2.5 --layers $nl --experts $ex --batch "${KIMI_BATCH:-1,64}" --prompt-len 1024 --prefill-tokens 1024 \
        --gen "${E2E_GEN:-64}" --deterministic on --json > "$O/e2e_kimi_${nl}_$tag.json" 2> "$O/e2e_kimi_${nl}_$tag.err"
      log "bench e2e kimi-k2.5 layers $nl $ex ($tag) rc=$?"; grep -E '\[bench e2e\]|rror' "$O/e2e_kimi_${nl}_$tag.err" | tee -a "$S"
    done
  done
fi
