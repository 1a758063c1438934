#!/usr/bin/env bash
# One device call (see bench/NOTES.md): run the prebuilt GPU test, the benchmark with both dense
# peers, SASS/resource summaries, then compute-sanitizer memcheck + racecheck on the GPU test.
# Binaries are built on the dev machine (nvcc 13.0, same as the device) and carried in build-cuda/.
# Usage (device): bash bench/run_device.sh   — writes logs and JSON under $OUT.
set -u
OUT=${OUT:-/tmp/moesq_out}; mkdir -p "$OUT"
B=${BUILD:-build-cuda}
export PYTHONUNBUFFERED=1
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib $(python3 - <<'PY' 2>/dev/null
import glob, os, site
for p in site.getsitepackages():
    for d in glob.glob(os.path.join(p, "nvidia", "*", "lib")) + glob.glob(os.path.join(p, "nvidia", "cu13", "lib")):
        print(d)
PY
); do [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
export LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/device.txt"
ldd $B/test_sparse_gemm $B/bench_gemm | grep "not found" | tee -a "$OUT/device.txt"
echo "== gpu test"; timeout 90 $B/test_sparse_gemm 2>&1 | tee "$OUT/gpu_test.log" | grep -E "probe|swiglu|OK|FAILED|PASSED|Failure|error|Expected|Which|actual" | head -80
echo "== sass"; (cuobjdump --dump-sass $B/bench_gemm | grep -oE "HMMA[.A-Z0-9_]*|HFMA2[.A-Z0-9_]*|LDG[.A-Z0-9_]*|LDL[.A-Z0-9_]*|STL[.A-Z0-9_]*|STG[.A-Z0-9_]*" | sort | uniq -c) 2>&1 | tee -a "$OUT/device.txt"
echo "== torch peer"; timeout 150 python3 bench/peer_grouped_mm.py --out "$OUT/torch_peer.json" ${QUICK:+--quick} > "$OUT/torch_peer.log" 2>&1; tail -3 "$OUT/torch_peer.log"
echo "== bench"; timeout 180 $B/bench_gemm --out "$OUT/bench_gemm.json" --peer-json "$OUT/torch_peer.json" ${QUICK:+--quick} 2>&1 | tee "$OUT/bench_gemm.log"
echo "== sanitizer"; (timeout 80 compute-sanitizer --tool memcheck $B/test_sparse_gemm --gtest_filter='SparseGemm.MetadataOrder*:SparseGemm.Extreme*:SparseGemm.Heuristic*:ActDispatch.*:SwigluQuant.*' 2>&1 | tail -4
 timeout 80 compute-sanitizer --tool racecheck $B/test_sparse_gemm --gtest_filter='SparseGemm.MetadataOrder*:SparseGemm.Heuristic*:ActDispatch.*:SwigluQuant.*' 2>&1 | tail -4) | tee "$OUT/sanitizer.log"
echo "== ncu (decode row)"; timeout 120 ncu --clock-control none --kernel-name regex:grouped_sparse --launch-skip 5 --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
  $B/bench_gemm --only qwen3-30b-a3b.gate_up/128/1 --reps 10 --out /tmp/ncu_bench.json > "$OUT/ncu.log" 2>&1
grep -E "Memory Throughput|DRAM Throughput|Duration|Achieved Occupancy|Registers|Stall|Warp Cycles|Issued Warp|No Eligible|Theoretical Occ" "$OUT/ncu.log" | head -30
