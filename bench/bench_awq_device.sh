#!/bin/bash
# One device session for the audit helper: build, GPU tests, CUDA self-test, CUDA study, timing protocol.
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt 2>&1
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release > $O/cmake.log 2>&1
( time cmake --build build-dev -j16 --target test_awq_gemm bench_awq_gemm ) > $O/build.log 2>&1 || { tail -60 $O/build.log; exit 1; }
( time cmake --build build-dev -j16 --target moesq ) > $O/build_cli.log 2>&1 || tail -30 $O/build_cli.log
( time ./build-dev/test_awq_gemm ) > $O/gpu_test.log 2>&1; echo "gpu_test rc=$?" >> $O/gpu_test.log
./build-dev/moesq audit score --self-test --device cuda --fixture small > $O/selftest_cuda.log 2>&1; echo "rc=$?" >> $O/selftest_cuda.log
./build-dev/moesq audit schedule --grid 246 > $O/schedule.txt; ./build-dev/moesq audit schedule --grid 200 >> $O/schedule.txt
( time ./build-dev/moesq audit study --out /tmp/study_cuda --fixture qwen3 --device cuda ) > $O/study_cuda.log 2>&1; echo "rc=$?" >> $O/study_cuda.log
mkdir -p $O/study_cuda; cp -r /tmp/study_cuda/outcomes.md /tmp/study_cuda/score.json /tmp/study_cuda/plans $O/study_cuda/ 2>/dev/null
( time ./build-dev/bench_awq_gemm --protocol bench/awq_protocol.json --out $O/awq_raw.json ) > $O/bench.log 2>&1; echo "rc=$?" >> $O/bench.log
python3 bench/validate_awq_timing.py bench/awq_protocol.json $O/awq_raw.json --markdown $O/timing.md > $O/validate.log 2>&1; echo "rc=$?" >> $O/validate.log
tail -5 $O/gpu_test.log; tail -3 $O/selftest_cuda.log; tail -12 $O/study_cuda.log; cat $O/validate.log
