#!/usr/bin/env bash
# The closing device call: build the CUDA targets, run the gpu-labelled tests, the CUDA audit
# (self-test and the paper-000 study on the H200), the sparse grouped GEMM benchmark with both dense
# peers, and the AWQ timing protocol with its validator. Logs and JSON under $OUT.
# Usage (device machine, repo root): bash bench/device_all.sh
set -u
O=${OUT:-/tmp/moesq_out}; mkdir -p "$O"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/gpu.txt" 2>&1
t0=$(date +%s)
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release > "$O/cmake.log" 2>&1
cmake --build build-dev -j16 --target moesq test_sparse_gemm test_awq_gemm bench_gemm bench_awq_gemm > "$O/build.log" 2>&1 \
  || { tail -40 "$O/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
echo "== ctest -L gpu"; (cd build-dev && timeout 120 ctest -L gpu --output-on-failure) > "$O/ctest_gpu.log" 2>&1; tail -4 "$O/ctest_gpu.log"
echo "== audit self-test (cuda)"; timeout 60 ./build-dev/moesq audit score --self-test --device cuda --fixture small > "$O/selftest_cuda.log" 2>&1; echo "rc=$?" >> "$O/selftest_cuda.log"; tail -3 "$O/selftest_cuda.log"
echo "== audit study (cuda)"; timeout 120 ./build-dev/moesq audit study --out /tmp/study_cuda --fixture qwen3 --device cuda > "$O/study_cuda.log" 2>&1; echo "rc=$?" >> "$O/study_cuda.log"
cp /tmp/study_cuda/outcomes.md "$O/study_outcomes.md" 2>/dev/null; tail -25 "$O/study_cuda.log"
echo "== torch peer"; timeout 120 python3 bench/peer_grouped_mm.py --out "$O/torch_peer.json" > "$O/torch_peer.log" 2>&1; tail -2 "$O/torch_peer.log"
echo "== bench_gemm"; timeout 150 ./build-dev/bench_gemm --out "$O/bench_gemm.json" --peer-json "$O/torch_peer.json" > "$O/bench_gemm.log" 2>&1; tail -40 "$O/bench_gemm.log"
echo "== awq timing"; timeout 90 ./build-dev/bench_awq_gemm --protocol bench/awq_protocol.json --out "$O/awq_raw.json" > "$O/awq_bench.log" 2>&1
python3 bench/validate_awq_timing.py bench/awq_protocol.json "$O/awq_raw.json" --markdown "$O/awq_timing.md" > "$O/awq_validate.log" 2>&1; tail -15 "$O/awq_validate.log"
echo "total $(( $(date +%s) - t0 )) s"
