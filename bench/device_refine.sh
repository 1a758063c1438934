#!/usr/bin/env bash
# The GPU refinement on the device in ONE call: build, the new ops' and the step backend's GPU tests
# (+ compute-sanitizer memcheck), then the fixture's quality and speed with `compress --device cpu`
# vs `--device cuda` (same schedule and seed; held-out nats by `moesq eval`, SGPTQ for the gap
# closed), two CUDA runs compared byte for byte, and bench_refine_layer at Qwen3-30B-A3B shapes.
# Everything lands in $OUT: summary.txt (read this), logs.tgz, bench JSON.
#   CORPUS_TAR=.dev/corpus.tar.xz bash bench/device_refine.sh   (the fixture's corpus, corpus/*, packed to fit a call)
# STEPS: any of "tests quality quality_gpu datafree datafree_cuda profile scaling ncu nsys layer tf32 bench kimi
#   compress_layer compress_kimi schedule_layer schedule_calib schedule_df tokens8x bench_compress ncu_sgptq resume_gpu mpi_gpu" (default: tests quality datafree bench).
# mpi_gpu: `mpirun -np 1` and `-np 2` of a GPU compress on the one GPU, compared byte for byte (MPI_METHOD).
# resume_gpu (after quality_gpu): a GPU moesq run killed with SIGKILL after KILL_AFTER s, then --resume, compared byte for byte.
# schedule_*: the refinement's GEMM precision and step schedule (ARMS, each NAME:FLAGS) compared — at
#   Qwen3-30B-A3B shapes (schedule_layer: bench_compress_layer, one row per arm), and on the fixture with
#   --calib (schedule_calib) and data-free (schedule_df), seeds 0 and 1, against SGPTQ of the same
#   calibration. tokens8x: 16 experts of the layer at 1x and 8x the default rows per expert.
# quality_gpu: SGPTQ and moesq with --device cuda against the CPU's SGPTQ on the fixture (held-out nats), two
#   GPU runs of each compared byte for byte. compress_layer: bench_compress_layer (targets + SGPTQ + refinement
#   + error of a whole Qwen3-30B-A3B layer on the GPU, the CPU's SGPTQ as the peer).
set -uo pipefail
O=${OUT:-/tmp/moesq_refine}; mkdir -p "$O"
W=$(mktemp -d); S="$O/summary.txt"; : > "$S"
export PATH="/usr/local/cuda/bin:$PATH"
STEPS=${STEPS:-tests quality datafree bench}
has() { [[ " $STEPS " == *" $1 "* ]]; }
log() { echo "$*" | tee -a "$S"; }
ROOT=$(pwd); CORPUS=${CORPUS:-.dev/corpus}
if [ -n "${CORPUS_TAR:-}" ]; then mkdir -p .dev && tar -C .dev -xJf "$CORPUS_TAR" && CORPUS=.dev/corpus; fi
GPU_TESTS=$(ls ${GPU_TEST_FILES:-tests/gpu/test_refine_ops.cu tests/gpu/test_cuda_step_backend.cu tests/gpu/test_sgptq_cuda.cu} 2>/dev/null | xargs -rn1 basename | sed 's/\.cu$//')
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$S"
B=${BUILD_DIR:-$W/b}  # BUILD_DIR: keep the build for a later script of the same call (bench/device_serve.sh)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESQ_PYTHON=OFF -DMOESQ_BENCH=ON ${CMAKE_EXTRA:-} > "$W/cfg.log" 2>&1 &&
  cmake --build "$B" -j16 --target moesq bench_refine_layer bench_compress_layer $(has tests && echo $GPU_TESTS) > "$W/build.log" 2>&1 ||
  { log "FAIL: build"; tail -40 "$W/build.log" | tee -a "$S"; cp "$W"/*.log "$O/"; exit 1; }
log "build $(( $(date +%s) - t0 )) s"
finish() { (cd "$W" && tar czf "$O/logs.tgz" *.log 2>/dev/null); log "total $(( $(date +%s) - t0 )) s"; }
trap finish EXIT

if has tests; then
  for t in $GPU_TESTS; do
    timeout 300 "$B/$t" > "$W/$t.log" 2>&1; rc=$?
    log "$t rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]' "$W/$t.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Z]|Failure|error' "$W/$t.log" | head -20 | sed 's/^/  /' >> "$S"
    [[ " ${NO_MEMCHECK:-} " == *" $t "* ]] && continue  # NO_MEMCHECK: test programs run without memcheck
    timeout 300 compute-sanitizer --tool memcheck "$B/$t" > "$W/memcheck.$t.log" 2>&1
    log "memcheck $t: $(grep -E 'ERROR SUMMARY' "$W/memcheck.$t.log" | tail -1)"
  done
  log "tests $(( $(date +%s) - t0 )) s"
fi

M=$ROOT/models/tiny-qwen3-moe
# compress NAME ARGS... : times it, records the report's device, seconds and mean held-out losses.
compress() {
  local name=$1; shift
  local s=$(date +%s.%N)
  "$B/moesq" compress "$M" --out "$W/$name" --threads 16 --json "$@" > "$W/$name.json" 2> "$W/$name.log"
  local rc=$? e=$(date +%s.%N)
  log "compress $name rc=$rc wall $(python3 -c "print(f'{$e-$s:.1f}')") s  $(python3 - "$W/$name/report.json" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
    ll = [x for L in r["layers"] for x in L["experts"] if x.get("refine")]
    init = sum(x["refine"]["init_hard_loss"] for x in ll) / max(1, len(ll))
    fin = sum(x["refine"]["final_hard_loss"] for x in ll) / max(1, len(ll))
    print(f"device={r.get('device')} report_s={r['seconds']:.1f} experts={len(ll)} mean held-out loss {init:.5f} -> {fin:.5f}" if ll else f"device={r.get('device')} report_s={r['seconds']:.1f}")
except Exception as e:
    print("no report:", e)
EOF
)"
  [ $rc -eq 0 ] || tail -5 "$W/$name.log" | sed 's/^/  /' | tee -a "$S"
}
evaluate() {  # evaluate NAME (a compressed run in $W, or "bf16": the original model)
  local dir="$W/$1"; [ "$1" = bf16 ] && dir=$M
  "$B/moesq" eval "$dir" --data "$ROOT/$CORPUS"/* --split heldout --json --threads 16 > "$W/eval.$1.json" 2> "$W/eval.$1.log"
  log "eval $1 rc=$? $(python3 -c "
import json
j=json.load(open('$W/eval.$1.json'))
print(f\"nats {j['nats_per_token']:.5f} | \" + ' '.join(f\"{f['path'].split('/')[-1][:6]} {f['nats_per_token']:.4f}\" for f in j['files']))" 2>&1 | head -c 400)"
}
if has quality; then
  CAL=(--calib "$ROOT/$CORPUS"/* --calib-split train)
  compress sg_calib --method sgptq "${CAL[@]}" --device cpu
  compress cpu_calib --method moesq "${CAL[@]}" --device cpu
  compress cuda_calib --method moesq "${CAL[@]}" --device cuda
  compress cuda_calib2 --method moesq "${CAL[@]}" --device cuda
  if cmp -s "$W/cuda_calib/model.safetensors" "$W/cuda_calib2/model.safetensors"; then log "two cuda runs: model.safetensors byte-identical"
  else log "two cuda runs: model.safetensors DIFFER"; fi
  compress cuda_calib_s1 --method moesq "${CAL[@]}" --device cuda --seed 1
  for r in bf16 sg_calib cpu_calib cuda_calib cuda_calib_s1; do evaluate $r; done
  log "quality $(( $(date +%s) - t0 )) s"
fi
if has quality_gpu; then
  CAL=(--calib "$ROOT/$CORPUS"/* --calib-split train)
  compress sg_calib --method sgptq "${CAL[@]}" --device cpu
  compress sg_cuda --method sgptq "${CAL[@]}" --device cuda
  compress sg_cuda2 --method sgptq "${CAL[@]}" --device cuda
  cmp -s "$W/sg_cuda/model.safetensors" "$W/sg_cuda2/model.safetensors" && log "two sgptq cuda runs: byte-identical" || log "two sgptq cuda runs: DIFFER"
  compress cuda_calib --method moesq "${CAL[@]}" --device cuda
  compress cuda_calib2 --method moesq "${CAL[@]}" --device cuda
  cmp -s "$W/cuda_calib/model.safetensors" "$W/cuda_calib2/model.safetensors" && log "two moesq cuda runs: byte-identical" || log "two moesq cuda runs: DIFFER"
  for r in bf16 sg_calib sg_cuda cuda_calib; do evaluate $r; done
  log "quality_gpu $(( $(date +%s) - t0 )) s"
fi
if has resume_gpu; then  # kill -9 a GPU moesq run mid-way, --resume it: byte-identical to quality_gpu's cuda_calib
  CAL=(--calib "$ROOT/$CORPUS"/* --calib-split train)
  "$B/moesq" compress "$M" --out "$W/resume_run" --threads 16 --json --method moesq "${CAL[@]}" --device cuda > /dev/null 2> "$W/resume1.log" &
  pid=$!; sleep ${KILL_AFTER:-6}; kill -9 $pid; wait $pid 2>/dev/null
  "$B/moesq" compress "$M" --out "$W/resume_run" --threads 16 --json --method moesq "${CAL[@]}" --device cuda --resume > /dev/null 2> "$W/resume2.log"; rc=$?
  log "resume_gpu: killed after ${KILL_AFTER:-6} s; --resume rc=$rc: $(grep -m1 -E '^\[resume\]|resume' "$W/resume2.log" | head -c 200)"
  cmp -s "$W/cuda_calib/model.safetensors" "$W/resume_run/model.safetensors" && log "resume_gpu: model.safetensors byte-identical to the uninterrupted run" || log "resume_gpu: model.safetensors DIFFER from the uninterrupted run"
fi
if has mpi_gpu; then  # the rank protocol on one GPU: 1 and 2 ranks of a GPU moesq run, compared byte for byte
  CAL=(--calib "$ROOT/$CORPUS"/* --calib-split train)
  for np in 1 2; do
    s0=$(date +%s.%N)
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np $np "$B/moesq" compress "$M" --out "$W/mpi$np" \
      --threads $((16 / np)) --method ${MPI_METHOD:-moesq} "${CAL[@]}" --device cuda > /dev/null 2> "$W/mpi$np.log"
    log "mpirun -np $np compress --device cuda rc=$? wall $(python3 -c "print(f'{$(date +%s.%N)-$s0:.1f}')") s"
    [ -f "$W/mpi$np/model.safetensors" ] || tail -5 "$W/mpi$np.log" | sed 's/^/  /' | tee -a "$S"
  done
  cmp -s "$W/mpi1/model.safetensors" "$W/mpi2/model.safetensors" && log "mpi_gpu: 1 and 2 ranks byte-identical" || log "mpi_gpu: 1 and 2 ranks DIFFER"
fi
if has compress_layer; then
  timeout 420 "$B/bench_compress_layer" --model qwen3-30b-a3b --methods ${LAYER_METHODS:-sgptq,moesq} --cpu-experts ${CPU_EXPERTS:-16} \
    --out "$O/bench_compress_qwen3_layer.json" > "$W/compress_layer.log" 2>&1
  log "bench_compress_layer qwen3 rc=$?"; sed 's/^/  /' "$W/compress_layer.log" | tee -a "$S"
fi
if has compress_kimi; then
  timeout 400 "$B/bench_compress_layer" --model kimi-k2.5 --experts ${KIMI_EXPERTS:-32} --methods ${KIMI_METHODS:-sgptq,moesq} --cpu-experts 0 \
    --out "$O/bench_compress_kimi.json" > "$W/compress_kimi.log" 2>&1
  log "bench_compress_layer kimi rc=$?"; sed 's/^/  /' "$W/compress_kimi.log" | tee -a "$S"
fi
ARMS=${ARMS:-"fp32pe: tf32pe:--gpu-gemm,tf32 tf32lw:--gpu-gemm,tf32,--step-sequences,64"}
if has schedule_layer; then
  timeout 420 "$B/bench_compress_layer" --model qwen3-30b-a3b --methods moesq --gemm fp32,tf32 --step-sequences 0,64 \
    --cpu-experts 0 --out "$O/bench_compress_schedule.json" > "$W/schedule_layer.log" 2>&1
  log "bench_compress_layer schedules rc=$?"; sed 's/^/  /' "$W/schedule_layer.log" | tee -a "$S"
fi
# schedule_arms TAG CALIB_FLAGS...: SGPTQ and every arm x seeds (SEEDS, default "0 1") on the GPU, then their
# held-out nats. SCHED_SG=0 skips the SGPTQ run (its nats are in docs/RESULTS.md).
schedule_arms() {
  local tag=$1; shift
  local runs=""
  if [ "${SCHED_SG:-1}" = 1 ]; then compress sg_$tag --method sgptq "$@" --device cuda; runs="sg_$tag"; fi
  for arm in $ARMS; do for seed in ${SEEDS:-0 1}; do
    local name=${arm%%:*}_${tag}_s$seed flags=${arm#*:}
    compress $name --method moesq "$@" --device cuda --seed $seed ${flags//,/ }
    runs="$runs $name"
  done; done
  for r in $runs; do evaluate $r; done
}
if has schedule_calib; then
  [ "${SCHED_SG:-1}" = 1 ] && evaluate bf16
  SEEDS=${SEEDS_CALIB:-${SEEDS:-0 1}} schedule_arms calib --calib "$ROOT/$CORPUS"/* --calib-split train
  log "schedule_calib $(( $(date +%s) - t0 )) s"
fi
if has schedule_df; then
  SEEDS=${SEEDS_DF:-${SEEDS:-0 1}} schedule_arms df
  log "schedule_df $(( $(date +%s) - t0 )) s"
fi
if has tokens8x; then  # time per layer at 1x and 8x the rows (16 experts; the layer-wide arm and the default)
  for rows in 16384 131072; do
    timeout 300 "$B/bench_compress_layer" --model qwen3-30b-a3b --experts 16 --rows $rows --methods sgptq,moesq \
      --gemm ${T8_GEMM:-tf32} --step-sequences ${T8_SEQ:-0,64} --cpu-experts 0 --out "$O/bench_compress_rows$rows.json" \
      > "$W/tokens8x.$rows.log" 2>&1
    log "bench_compress_layer 16 experts x $rows rows rc=$?"; sed 's/^/  /' "$W/tokens8x.$rows.log" | tee -a "$S"
  done
fi
if has bench_compress; then  # Algorithm 1 per stage at real shapes (moesq bench compress), GPU then the CPU's SGPTQ
  # BC_THREADS: worker threads (one CUDA stream each), a list to sweep; BC_EXTRA: more flags, ';' between variants
  IFS=';' read -ra extras <<< "${BC_EXTRA:-}"; [ ${#extras[@]} -eq 0 ] && extras=("")
  v=0
  for T in ${BC_THREADS:-16}; do for X in "${extras[@]}"; do
    v=$((v + 1))
    timeout 300 "$B/moesq" bench compress --synthetic qwen3-30b-a3b --layers ${BC_LAYERS:-1} --methods ${BC_METHODS:-sgptq,moesq} \
      --device cuda --threads $T $X --json > "$O/bench_compress_synthetic_$v.json" 2> "$W/bench_compress.$v.log"
    log "moesq bench compress --device cuda --threads $T $X rc=$?"; grep -v '^\[' "$W/bench_compress.$v.log" | sed 's/^/  /' | tee -a "$S"
  done; done
  [ "${BC_CPU:-1}" = 1 ] && timeout 300 "$B/moesq" bench compress --synthetic qwen3-30b-a3b --layers 1 --methods sgptq --device cpu --threads 16 \
    --json > "$O/bench_compress_synthetic_cpu.json" 2> "$W/bench_compress_cpu.log"
  log "moesq bench compress --device cpu rc=$?"; grep -v '^\[' "$W/bench_compress_cpu.log" | sed 's/^/  /' | tee -a "$S"
fi
if has datafree; then
  compress sg_df --method sgptq --device cpu
  compress cpu_df --method moesq --device cpu
  compress cuda_df --method moesq --device cuda
  for r in sg_df cpu_df cuda_df; do evaluate $r; done
  log "datafree $(( $(date +%s) - t0 )) s"
fi
if has datafree_cuda; then  # the GPU arm alone (the CPU arm's nats: docs/RESULTS.md, same code path)
  compress cuda_df --method moesq --device cuda
  for r in bf16 cuda_df; do evaluate $r; done
  log "datafree_cuda $(( $(date +%s) - t0 )) s"
fi
if has ncu_sgptq; then  # per-kernel time of one expert's GPU SGPTQ (targets, Hessians, factorisation, column loop, error)
  timeout 300 ncu --clock-control none --launch-count ${NCU_COUNT:-400} \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum \
    --csv "$B/bench_compress_layer" --model qwen3-30b-a3b --methods sgptq --experts 1 --threads 1 --cpu-experts 0 > "$W/ncu_sgptq.csv" 2> "$W/ncu_sgptq.log"
  log "ncu sgptq rc=$?"; cp "$W/ncu_sgptq.csv" "$O/ncu_sgptq.csv"
  python3 bench/ncu_summary.py "$W/ncu_sgptq.csv" --by-kernel | tee -a "$S"
  for T in 1 16; do
    timeout 200 "$B/bench_compress_layer" --model qwen3-30b-a3b --methods sgptq --experts $((T == 1 ? 4 : 128)) --threads $T --cpu-experts 0 \
      > "$W/sgptq_t$T.log" 2>&1
    log "bench_compress_layer sgptq threads $T rc=$?"; sed 's/^/  /' "$W/sgptq_t$T.log" | tee -a "$S"
  done
fi
if has profile; then  # PROFILE_GEMMS: the --gpu-gemm precisions to profile (one run each)
  for g in ${PROFILE_GEMMS:-fp32}; do
    timeout 200 "$B/bench_refine_layer" --model qwen3-30b-a3b --profile --gemm $g > "$W/profile.$g.log" 2>&1
    log "bench_refine_layer --profile --gemm $g rc=$?"; grep -E 'profile|schedule' "$W/profile.$g.log" | sed 's/^/  /' | tee -a "$S"
  done
fi
if has scaling; then  # one epoch of 16 experts on T threads: does the throughput grow with the streams?
  for g in fp32 tf32; do for T in 1 4 16; do
    timeout 120 "$B/bench_refine_layer" --model qwen3-30b-a3b --profile --experts 16 --threads $T --gemm $g > "$W/scal.$g.$T.log" 2>&1
    log "scaling $g T=$T rc=$? $(grep -E 'profile, 16 experts' "$W/scal.$g.$T.log")"
  done; done
  grep -E 'one expert alone' "$W/scal.fp32.1.log" "$W/scal.tf32.1.log" | sed 's/^/  /' | tee -a "$S"
  CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 120 "$B/bench_refine_layer" --model qwen3-30b-a3b --profile --experts 16 --threads 16 > "$W/scal.conn32.log" 2>&1
  log "scaling fp32 T=16 CUDA_DEVICE_MAX_CONNECTIONS=32 rc=$? $(grep -E 'profile, 16 experts' "$W/scal.conn32.log")"
fi
if has ncu; then  # per-kernel time and DRAM/SM throughput of one expert's steps (kernels serialized by ncu)
  timeout 200 ncu --clock-control none --launch-skip 400 --launch-count 40 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum \
    --csv "$B/bench_refine_layer" --model qwen3-30b-a3b --profile --gemm ${NCU_GEMM:-fp32} --experts 1 --threads 1 > "$W/ncu.csv" 2> "$W/ncu.log"
  log "ncu rc=$?"; cp "$W/ncu.csv" "$O/ncu.csv"
  python3 bench/ncu_summary.py "$W/ncu.csv" | tee -a "$S"
fi
if has nsys; then  # the concurrent run's timeline: is the GPU busy, and what do the host's launches cost?
  NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /usr/local/cuda*/nsight-systems*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  [ -n "$NSYS" ] || log "nsys: not on this machine (the H200 image of 2026-12-02 has ncu and compute-sanitizer only)"
  for T in $([ -n "$NSYS" ] && echo 1 16); do
    timeout 240 "$NSYS" profile -t cuda --force-overwrite true -o "$W/nsys$T" "$B/bench_refine_layer" --model qwen3-30b-a3b \
      --experts 16 --epochs 2 --threads $T --gemm fp32 --cpu-experts 0 > "$W/nsys$T.log" 2>&1
    log "nsys T=$T rc=$? $(grep -E 'GPU fp32' "$W/nsys$T.log")"
    "$NSYS" stats -q --report cuda_gpu_trace --format csv -o "$W/nsys$T" "$W/nsys$T.nsys-rep" > /dev/null 2>&1
    "$NSYS" stats -q --report cuda_api_sum --format csv -o "$W/nsys$T" "$W/nsys$T.nsys-rep" > /dev/null 2>&1
    python3 bench/nsys_summary.py "$W/nsys${T}_cuda_gpu_trace.csv" "$W/nsys${T}_cuda_api_sum.csv" 2>&1 | sed 's/^/  /' | tee -a "$S"
  done
fi
if has layer; then  # the whole layer (LAYER_EXPERTS), fp32 and TF32 GEMMs, no CPU peer
  timeout 300 "$B/bench_refine_layer" --model qwen3-30b-a3b --experts ${LAYER_EXPERTS:-128} --gemm ${LAYER_GEMMS:-fp32,tf32} \
    --cpu-experts 0 --out "$O/bench_refine_qwen3_layer.json" > "$W/bench_layer.log" 2>&1
  log "bench_refine_layer layer --gemm fp32,tf32 rc=$?"; sed 's/^/  /' "$W/bench_layer.log" | tee -a "$S"
fi
if has tf32; then  # TF32 GEMMs vs fp32 at real shapes (TF32_EXPERTS of the layer), then on the fixture
  timeout 300 "$B/bench_refine_layer" --model qwen3-30b-a3b --experts ${TF32_EXPERTS:-128} --gemm fp32,tf32 \
    --cpu-experts 0 --out "$O/bench_refine_qwen3_tf32.json" > "$W/bench_tf32.log" 2>&1
  log "bench_refine_layer --gemm fp32,tf32 rc=$?"; sed 's/^/  /' "$W/bench_tf32.log" | tee -a "$S"
  CAL=(--calib "$ROOT/$CORPUS"/* --calib-split train)
  compress cuda_calib_tf32 --method moesq "${CAL[@]}" --device cuda --gpu-gemm tf32
  evaluate cuda_calib_tf32
fi
if has bench; then
  timeout 400 "$B/bench_refine_layer" --model qwen3-30b-a3b --out "$O/bench_refine_qwen3.json" > "$W/bench.log" 2>&1
  log "bench_refine_layer qwen3 rc=$?"; sed 's/^/  /' "$W/bench.log" | tee -a "$S"
fi
if has kimi; then
  timeout 400 "$B/bench_refine_layer" --model kimi-k2.5 --experts 48 --cpu-experts 16 --out "$O/bench_refine_kimi.json" > "$W/kimi.log" 2>&1
  log "bench_refine_layer kimi (48 of 384 experts) rc=$?"; sed 's/^/  /' "$W/kimi.log" | tee -a "$S"
fi
