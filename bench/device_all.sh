#!/usr/bin/env bash
# The closing device call for the grouped sparse GEMM, on the nvidia-h200 machine, from the
# repo root: build the CUDA targets (or use prebuilt ones), run every gpu-labelled test program,
# compute-sanitizer (memcheck, synccheck, racecheck) on the wgmma.sp tests, the wgmma instruction
# ceiling (bench_wgmma_peak), the torch._grouped_mm peer and bench_gemm on all Table-8 rows with both
# dense peers (torch._grouped_mm needs python3 with PyTorch). Everything lands in $OUT/device_all.tgz
# (plus summary.txt and table.md); the exit status is 1 if any step failed.
#   bash bench/device_all.sh                       # builds in build-dev (16 cores)
#   BIN=build-carry bash bench/device_all.sh       # uses binaries built elsewhere (same nvcc)
# The AWQ timing protocol and the audit study have their own call: bench/bench_awq_device.sh.
set -u
O=${OUT:-/tmp/moesq_out}; mkdir -p "$O"
fail=0  # any failed step makes the script exit 1 (after packing what it has)
W=$(mktemp -d); export PYTHONUNBUFFERED=1
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$W/gpu.txt" 2>&1
if [ -z "${BIN:-}" ]; then
  BIN=build-dev
  cmake -S . -B $BIN -G Ninja -DCMAKE_BUILD_TYPE=Release > "$W/cmake.log" 2>&1
  cmake --build $BIN -j16 --target test_sparse_gemm test_act_dispatch test_swiglu_quant test_awq_gemm bench_gemm bench_wgmma_peak \
    > "$W/build.log" 2>&1 || { tail -40 "$W/build.log"; exit 1; }
  echo "build $(( $(date +%s) - t0 )) s" >> "$W/summary.txt"
fi
for t in test_sparse_gemm test_act_dispatch test_swiglu_quant test_awq_gemm; do
  timeout 180 $BIN/$t > "$W/$t.log" 2>&1; rc=$?; [ $rc -eq 0 ] || fail=1
  echo "$t rc=$rc $(grep -E '^\[  PASSED  \]|FAILED TEST' "$W/$t.log" | tr '\n' ' ')" >> "$W/summary.txt"
done
F='SparseGemm.Wgmma*:SparseGemm.IntegerValued*'
for tool in memcheck synccheck racecheck; do
  timeout 240 compute-sanitizer --tool $tool $BIN/test_sparse_gemm --gtest_filter="$F" > "$W/sanitizer_$tool.log" 2>&1
  echo "compute-sanitizer $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$W/sanitizer_$tool.log")" >> "$W/summary.txt"
done
timeout 120 $BIN/bench_wgmma_peak --out "$W/wgmma_peak.json" > "$W/wgmma_peak.log" 2>&1 || fail=1
cat "$W/wgmma_peak.log" >> "$W/summary.txt"
# Second dense peer: torch._grouped_mm (needs python3 with PyTorch); without it, cuBLAS alone.
timeout 300 python3 bench/peer_grouped_mm.py --out "$W/torch_peer.json" > "$W/torch_peer.log" 2>&1; rc=$?
echo "torch peer rc=$rc" >> "$W/summary.txt"
PEER=(--peer-json "$W/torch_peer.json")
if [ $rc -ne 0 ]; then fail=1; PEER=(); echo "torch peer failed (see torch_peer.log): bench_gemm runs against cuBLAS only" >> "$W/summary.txt"; fi
timeout 400 $BIN/bench_gemm --out "$W/bench_gemm.json" "${PEER[@]}" > "$W/bench_gemm.log" 2>&1; rc=$?
[ $rc -eq 0 ] || fail=1
echo "bench_gemm rc=$rc" >> "$W/summary.txt"
python3 - "$W/bench_gemm.json" > "$W/table.md" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"device {d['device']}: copy {d['copy_tbs_read_plus_write']:.2f} TB/s, cuBLAS bf16 {d['dense_bf16_tflops_cublas_8192']:.0f} TFLOP/s\n")
print("| shape | G | N | config | sparse µs | packed TB/s | TFLOP/s | floor % | cuBLAS µs | torch µs | × faster peer | best sweep |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in d["rows"]:
    sw = r.get("sweep_us_by_config", {})
    best = min(sw.items(), key=lambda kv: kv[1]) if sw else ("", 0)
    cfg = r["config"].split(":")[0].replace("sparse_gemm ", "") + " " + r["config"].split("BLOCK_M=")[1].split(" (")[0].replace(" BLOCK_N=", "x")
    print(f"| {r['name']} | {r['G']} | {r['N']} | {cfg} | {r['sparse_us']:.1f} | {r['packed_tbs']:.2f} | {r['tflops_dense_equiv']:.0f} | "
          f"{100*r['fraction_of_floor']:.0f} | {r['cublas_grouped_us']:.1f} | {r['torch_grouped_mm_us']:.1f} | {r['speedup_vs_faster_peer']:.2f} | "
          f"{best[0]} {best[1]:.1f} |")
PY
cat "$W/table.md" >> "$W/summary.txt"
echo "total $(( $(date +%s) - t0 )) s" >> "$W/summary.txt"
cp "$W/summary.txt" "$W/table.md" "$O/"
tar czf "$O/device_all.tgz" -C "$W" .
cat "$O/summary.txt"
exit $fail
