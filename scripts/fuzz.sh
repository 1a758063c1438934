#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang, ASan + UBSan, build dir build-fuzz), makes their seed
# corpora from the shared fixtures (fuzz_make_seeds), and runs each target for SECONDS (default 30).
# Any crash, sanitizer report, leak or timeout (-timeout=10 s per input) fails the script; the
# reproducer is left in build-fuzz/artifacts/. One line per target: executions, coverage, corpus size.
#   scripts/fuzz.sh [SECONDS] [TARGET[:SECONDS] ...]   e.g. scripts/fuzz.sh 30, scripts/fuzz.sh 60 plan:600 tokens
# Env: MOESQ_SHARED (default: ../shared beside the repo, else the repo's own copies of the fixtures),
#      FUZZ_JOBS (parallel build jobs, default 2), FUZZ_ARGS (extra libFuzzer flags),
#      FUZZ_NO_BUILD=1 (reuse build-fuzz and its seeds: for several runs side by side),
#      FUZZ_BUILD_DIR (default build-fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
bdir="${FUZZ_BUILD_DIR:-build-fuzz}"
secs="${1:-30}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors config tokens tokenizer compressed plan)

shared="${MOESQ_SHARED:-$(cd .. && pwd)/shared}"
models="$shared/models";         [ -d "$models/tiny-qwen3-moe" ] || models="$PWD/models"
tokenizers="$shared/tokenizers"; [ -d "$tokenizers" ] || tokenizers="$PWD/tests/fixtures/tokenizers"
corpus="$shared/data/corpus";    [ -d "$corpus" ] || corpus="$PWD/docs"

names=("${targets[@]%%:*}")
seeds="$bdir/seeds"
if [ -z "${FUZZ_NO_BUILD:-}" ]; then
cmake -S . -B "$bdir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DMOESQ_FUZZ=ON -DMOESQ_CUDA=OFF \
  -DMOESQ_TESTS=OFF -DMOESQ_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$bdir" -j"${FUZZ_JOBS:-2}" --target fuzz_make_seeds "${names[@]/#/fuzz_}"
rm -rf "$seeds" && "$bdir/fuzz_make_seeds" "$models" "$tokenizers" "$corpus" "$seeds"
cp tests/fixtures/tiny-reference.safetensors "$seeds/safetensors/"
cp tests/fixtures/hub-style-config.json "$seeds/config/"
fi

mkdir -p "$bdir/artifacts" "$bdir/corpus"
declare -A max_len=([safetensors]=16384 [config]=4096 [tokens]=4096 [tokenizer]=65536 [compressed]=16384 [plan]=16384)
status=0
for spec in "${targets[@]}"; do
  t="${spec%%:*}"
  secs_t="$secs"; [ "$spec" = "$t" ] || secs_t="${spec#*:}"
  corpus_dir="$bdir/corpus/$t"   # grows across runs; the seeds stay read-only input
  mkdir -p "$corpus_dir"
  log="$bdir/fuzz_$t.log"
  if ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     "$bdir/fuzz_$t" -max_total_time="$secs_t" -timeout=10 -rss_limit_mb=4096 -max_len="${max_len[$t]}" \
       -print_final_stats=1 -artifact_prefix="$bdir/artifacts/$t-" ${FUZZ_ARGS:-} \
       "$corpus_dir" "$seeds/$t" >"$log" 2>&1; then
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log" | tail -1 || true)
    echo "fuzz_$t: ${secs_t}s, $execs executions, $cov, 0 crashes"
  else
    status=1
    echo "fuzz_$t: FAILED (crash, sanitizer report or timeout); tail of $log:"
    grep -E "ERROR|runtime error|SUMMARY|Test unit written|^ *#[0-9]+ " "$log" | cut -c1-240 | head -n 30
    for a in "$bdir"/artifacts/*; do echo "  artifact: $a"; done
  fi
done
exit "$status"
