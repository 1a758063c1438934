#!/usr/bin/env bash
# The Python module's GPU ops on the device: configures and builds moesq with CUDA and
# the Python module (the device's python3 holds PyTorch; pybind11 and a dlpack.h come from its
# site-packages, since the image has no libdlpack-dev), then runs
#   tests/python/gpu/test_gpu_ops.py  the GPU ops vs their CPU twins, the DLPack stream / zero-copy contract
#   test_engine                       the engine over runtime/moe_block (when GoogleTest is there)
#   tests/python/test_gpu_args.py     the shared argument checks, here with a GPU visible
#   tests/python/test_*.py            the CPU Python tests (the module is the CUDA one here)
# and prints one PASS/FAIL line per step and a summary; exit status 0 only when every step passed.
# OUT (default /tmp/moesq_device_python_gpu) gets at most 7 files: summary.txt, measured.txt (the
# "[measured] ..." lines of test_gpu_ops.py), gpu_ops.log, gpu_args.log, python_cpu.log, test_engine.log,
# build.log (its warning / error lines; all of it when the build fails); scratch (the dlpack include
# dir, a compressed checkpoint, per-step logs) stays in W.
# Usage (repository root on the device): scripts/device_python_gpu.sh [OUT_DIR]
set -uo pipefail
OUT=${1:-${OUT:-/tmp/moesq_device_python_gpu}}
W=/tmp/moesq_device_python_gpu_work
mkdir -p "$OUT" "$W"
PY=$(command -v python3)
B=build-pygpu
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
declare -a RESULTS=()
FAILED=0
fail_now() { echo "FAIL: $*" | tee "$OUT/summary.txt"; echo "SUMMARY: FAIL (setup)" | tee -a "$OUT/summary.txt"; exit 1; }

# ---- headers the image lacks: dlpack.h (any DLPack ≥ 0.6 header: kDLCUDA) and pybind11's CMake config
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
TORCH=$("$PY" -c "import os, torch; print(os.path.dirname(torch.__file__))" 2>/dev/null || true)
DL=""
for c in /usr/include/dlpack/dlpack.h "$SITE/cuda/core/_include/dlpack.h" "$TORCH/include/dlpack/dlpack.h" \
         "$TORCH/include/ATen/dlpack.h" $(find "$SITE" -name dlpack.h 2>/dev/null | head -20); do
  if [ -f "$c" ] && grep -q DLManagedTensor "$c" && grep -q kDLCUDA "$c"; then DL=$c; break; fi
done
[ -n "$DL" ] || fail_now "no dlpack.h with DLManagedTensor and kDLCUDA under /usr/include or $SITE"
mkdir -p "$W/dlpack_include/dlpack"
ln -sf "$DL" "$W/dlpack_include/dlpack/dlpack.h"
PB=$("$PY" -c "import pybind11; print(pybind11.get_cmake_dir())" 2>/dev/null) || fail_now "python3 has no pybind11"
echo "python3 $PY ($("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'))"
echo "dlpack.h $DL; pybind11 $PB"

# ---- configure (with GoogleTest for test_engine when it is there) and build -----------------------
# The module is compiled by the system GCC (/usr/bin/g++; the image points CMake at /opt/gcc/bin/g++, a
# wrapper of the same g++ 13). It links its C++ runtime privately (CMakeLists.txt): with the shared
# libstdc++, `import numpy` (pip) before the module made it crash in std::ostream number formatting
# (SIGSEGV in ostream::_M_insert<long>, measured 2026-12-01; tests/python/test_module_runtime.py).
SYSCXX=/usr/bin/g++
[ -x "$SYSCXX" ] || SYSCXX=$(command -v g++)
CFG=(-S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESQ_BENCH=OFF -DMOESQ_PYTHON=ON
     -DCMAKE_CXX_COMPILER="$SYSCXX" -DCMAKE_CUDA_HOST_COMPILER="$SYSCXX"
     -DPython_EXECUTABLE="$PY" -DDLPACK_INCLUDE_DIR="$W/dlpack_include" -Dpybind11_DIR="$PB")
TARGETS=(moesq moesq_python)
if cmake "${CFG[@]}" -DMOESQ_TESTS=ON > "$W/cmake.log" 2>&1; then
  TARGETS+=(test_engine)
else
  echo "note: configure with tests failed (no GoogleTest?); test_engine is not built"
  rm -rf "$B"
  cmake "${CFG[@]}" -DMOESQ_TESTS=OFF > "$W/cmake.log" 2>&1 || { tail -30 "$W/cmake.log"; fail_now "cmake"; }
fi
grep -q "moesq: Python module ON" "$W/cmake.log" || { grep "moesq:" "$W/cmake.log"; fail_now "the Python module is not configured"; }
grep -q "moesq: CUDA kernels ON" "$W/cmake.log" || fail_now "CUDA is not configured (nvcc not found?)"
echo "building ${TARGETS[*]} (-j16)"
t0=$(date +%s)
cmake --build "$B" -j16 --target "${TARGETS[@]}" > "$W/build.log" 2>&1 || { cp "$W/build.log" "$OUT/"; grep -B2 -A12 -m3 "error" "$W/build.log"; fail_now "build"; }
echo "built in $(( $(date +%s) - t0 )) s"

export PYTHONPATH="$PWD/$B:$PWD/tests/python" MOESQ_BINARY="$PWD/$B/moesq" MOESQ_QUIET=1
export MOESQ_DEFAULT_MODEL="$PWD/models/tiny-qwen3-moe" MOESQ_FIXTURES="$PWD/tests/fixtures" MOESQ_BUILT_WITH_CUDA=1 MOESQ_PY_PRIVATE_RUNTIME=1

# step NAME TIMEOUT_S COMMAND...: runs it, logs to W/NAME.log, records PASS/FAIL.
step() {
  local name=$1 limit=$2; shift 2
  local s=$(date +%s)
  timeout "$limit" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - s ))
  if [ $rc -eq 0 ]; then RESULTS+=("PASS $name (${dt} s)"); else RESULTS+=("FAIL $name (rc $rc, ${dt} s)"); FAILED=1; fi
  echo "${RESULTS[-1]}" | tee -a "$OUT/summary.txt"
  case $name in gpu_ops|test_engine|gpu_args) cp "$W/$name.log" "$OUT/" ;; esac  # there even if a later step hangs
  [ $rc -eq 0 ] || tail -40 "$W/$name.log"
}
: > "$OUT/summary.txt"

"$PY" -c "import moesq, torch; assert moesq.built_with_cuda() and moesq.cuda_available(), 'module without GPU'; print('moesq', moesq.__file__)" \
  || fail_now "the built module does not see the GPU"
step gpu_ops 300 "$PY" tests/python/gpu/test_gpu_ops.py -v
if [ -x "$B/test_engine" ]; then  # the engine over runtime/moe_block, which MoeLayer shares
  rm -rf "$W/tiny_sgptq"
  "$B/moesq" compress models/tiny-qwen3-moe --method sgptq --out "$W/tiny_sgptq" --calib-samples 32 \
    --threads 16 > "$W/compress.log" 2>&1 || { echo "note: compress for test_engine failed:"; tail -5 "$W/compress.log"; }
  step test_engine 240 env MOESQ_TINY_COMPRESSED="$W/tiny_sgptq" "$B/test_engine"
fi
step gpu_args 60 "$PY" tests/python/test_gpu_args.py -v
for t in tests/python/test_*.py; do
  n=$(basename "$t" .py)
  [ "$n" = test_gpu_args ] && continue
  step "py_$n" 120 "$PY" "$t"
done

grep -i -E "warning|error" "$W/build.log" | head -200 > "$OUT/build.log"
cat "$W"/py_*.log > "$OUT/python_cpu.log" 2>/dev/null
grep -h "^\[measured\]" "$W/gpu_ops.log" > "$OUT/measured.txt" 2>/dev/null || true
{
  echo "---- measured (tests/python/gpu/test_gpu_ops.py) ----"
  cat "$OUT/measured.txt"
  echo "---- summary ----"
  printf '%s\n' "${RESULTS[@]}"
  if [ $FAILED -eq 0 ]; then echo "SUMMARY: PASS (${#RESULTS[@]} steps)"; else echo "SUMMARY: FAIL"; fi
} | tee "$OUT/summary.txt"
exit $FAILED
