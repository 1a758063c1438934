#!/usr/bin/env bash
# Old tree vs this tree on the device in ONE call, for a change that must keep behaviour and speed:
# builds both (the old one = this tree with OLD_PATCH applied, a `git diff --no-renames --binary HEAD OLD`),
# runs every gpu-labelled test program of each, compares GPU outputs byte for byte (eval --device cuda
# nats for bf16 / sparse-w4a4 / sparse-w4a16, generate token ids), then alternates old and new
# `moesq bench e2e` and `bench_moe_layer` runs (old, new, old, new) and prints new ÷ old per row.
# Everything lands in $OUT: summary.txt (read this), compare.md, logs.tgz. Exit 1 when a step failed.
#   OLD_PATCH=.dev/old.patch DATA=.dev/data.txt bash bench/device_compare.sh
# DATA: a text file for eval (the tiny model's tokenizer); E2E_ARGS / LAYER_ARGS override the benchmarks;
# ONLY_NEW=1 runs only the new tree's GPU tests, SKIP_BENCH=1 skips the benchmarks, SANITIZE=0 memcheck.
set -uo pipefail
O=${OUT:-/tmp/moesq_compare}; mkdir -p "$O"
W=$(mktemp -d); S="$W/summary.txt"; : > "$S"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
fail=0
log() { echo "$*" | tee -a "$S"; }
ROOT=$(pwd)
E2E_ARGS=${E2E_ARGS:---synthetic qwen3-30b-a3b --experts bf16,sparse-w4a4 --batch 1,64 --prompt-len 1024 --gen 32 --json}
LAYER_ARGS=${LAYER_ARGS:---experts sparse-w4a4,sparse-w4a16,bf16 --batch 1,64,512 --layers 4 --reps 100}
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$S"

# ---- the old tree --------------------------------------------------------------------------
mkdir -p "$W/old"
tar --exclude='./build*' --exclude=./.dev -cf - . | tar -xf - -C "$W/old"
(cd "$W/old" && git apply --whitespace=nowarn "$ROOT/$OLD_PATCH") || { log "FAIL: $OLD_PATCH does not apply"; exit 1; }

gpu_targets() { (cd "$1" && ls tests/gpu/*.cu | xargs -n1 basename | sed 's/\.cu$//'); }
build() {  # build DIR SRC
  cmake -S "$2" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESQ_PYTHON=OFF -DMOESQ_BENCH=ON > "$1.cfg.log" 2>&1 &&
    cmake --build "$1" -j8 --target moesq bench_moe_layer $(gpu_targets "$2") > "$1.build.log" 2>&1
}
build "$W/b-new" "$ROOT" & p1=$!
build "$W/b-old" "$W/old" & p2=$!
wait $p1 || { log "FAIL: new build"; tail -30 "$W/b-new.build.log" | tee -a "$S"; fail=1; }
wait $p2 || { log "FAIL: old build"; tail -30 "$W/b-old.build.log" | tee -a "$S"; fail=1; }
log "builds $(( $(date +%s) - t0 )) s"
[ $fail -eq 0 ] || { cp "$S" "$O/"; exit 1; }
NEW=$W/b-new; OLD=$W/b-old

# ---- GPU tests of both trees (test_engine's compressed cases read MOESQ_TINY_COMPRESSED) ------
M=$ROOT/models/tiny-qwen3-moe
"$NEW/moesq" compress "$M" --method sgptq --out "$W/ck" --threads 16 > "$W/compress.log" 2>&1 || { log "FAIL: compress"; fail=1; }
export MOESQ_TINY_COMPRESSED=$W/ck
SIDES="new old"; [ "${ONLY_NEW:-0}" = 1 ] && SIDES=new
for side in $SIDES; do
  B=$W/b-$side; SRC=$ROOT; [ $side = old ] && SRC=$W/old
  for t in $(gpu_targets "$SRC"); do
    (cd "$SRC" && timeout 300 "$B/$t" > "$W/$side.$t.log" 2>&1); rc=$?
    [ $side = new ] && [ $rc -ne 0 ] && fail=1
    log "$side $t rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]' "$W/$side.$t.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Z]' "$W/$side.$t.log" | sed "s/^/  $side /" >> "$S"
  done
done
log "tests $(( $(date +%s) - t0 )) s"
# compute-sanitizer on the new tree's engine and the new ops' tests (SANITIZE=0 skips)
if [ "${SANITIZE:-1}" = 1 ]; then
  for t in test_engine test_embed_argmax; do
    [ -x "$NEW/$t" ] || continue
    (cd "$ROOT" && timeout 300 compute-sanitizer --tool memcheck "$NEW/$t" > "$W/memcheck.$t.log" 2>&1)
    log "compute-sanitizer memcheck $t: $(grep -E 'ERROR SUMMARY' "$W/memcheck.$t.log")"
  done
fi

# ---- GPU outputs byte for byte ---------------------------------------------------------------
same=0; diffs=0
for args in "$M --experts bf16" "$W/ck --experts sparse-w4a4" "$W/ck --experts sparse-w4a16" "$W/ck --experts bf16"; do
  for side in old new; do
    B=$W/b-$side
    "$B/moesq" eval $args --device cuda --data "$ROOT/$DATA" --seq-len 256 --json 2> "$W/eval.$side.err" | grep -v '"seconds"' > "$W/eval.$side.json"
    "$B/moesq" generate $args --device cuda --prompt "The meaning of" --max-new-tokens 48 > "$W/gen.$side.txt" 2> "$W/gen.$side.err"
  done
  for k in eval.json gen.txt; do
    if cmp -s "$W/${k%%.*}.old.${k#*.}" "$W/${k%%.*}.new.${k#*.}" && [ -s "$W/${k%%.*}.new.${k#*.}" ]; then same=$((same + 1))
    else diffs=$((diffs + 1)); fail=1; log "DIFF $k for: $args"; fi
  done
done
log "GPU outputs: $same identical, $diffs different (eval nats JSON and generated text, old vs new)"

# ---- benchmarks, alternated (SKIP_BENCH=1 skips) ------------------------------------------------
# The torch peer of one MoE layer (bench/peer_moe_layer.py: router, top-k, torch._grouped_mm, SwiGLU),
# measured once in this call and handed to both sides' bench_moe_layer.
PEER=()
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout 300 python3 bench/peer_moe_layer.py --out "$W/peer.json" --batch 1,64,512 --layers 4 --reps 100 > "$W/peer.log" 2>&1 \
    && PEER=(--peer-json "$W/peer.json") || log "torch peer failed (peer.log): moe_layer rows without it"
fi
for rep in $([ "${SKIP_BENCH:-0}" = 1 ] || echo 1 2); do
  for side in old new; do
    B=$W/b-$side
    timeout 400 "$B/moesq" bench e2e $E2E_ARGS > "$W/e2e.$side.$rep.json" 2> "$W/e2e.$side.$rep.err" || { log "FAIL e2e $side $rep"; fail=1; }
    timeout 200 "$B/bench_moe_layer" $LAYER_ARGS "${PEER[@]}" --out "$W/layer.$side.$rep.json" > "$W/layer.$side.$rep.log" 2>&1 || { log "FAIL layer $side $rep"; fail=1; }
  done
done
python3 - "$W" > "$W/compare.md" <<'PY'
import json, sys, os
w = sys.argv[1]
def load(p):
    try: return json.load(open(p))
    except Exception: return None
print("| bench | row | old run1 | new run1 | old run2 | new run2 | new ÷ old (sum) |\n|---|---|---|---|---|---|---|")
def rows_e2e(d): return {f"{r['experts']} B={r['batch']} {k}": r[k] for r in d["results"] for k in ("tpot_ms", "ttft_ms")}
def rows_layer(d):
    out = {f"{r['experts']} T={r['T']} us": r["us"] for r in d["rows"]}
    out.update({f"torch peer T={r['T']} us": r["peer_us"] for r in d["rows"] if r.get("peer_us") and r["experts"] == d["rows"][0]["experts"]})
    return out
for name, pre, f in (("e2e", "e2e", rows_e2e), ("moe_layer", "layer", rows_layer)):
    runs = {(s, r): load(os.path.join(w, f"{pre}.{s}.{r}.json")) for s in ("old", "new") for r in (1, 2)}
    if any(v is None for v in runs.values()): print(f"| {name} | missing output | | | | | |"); continue
    rr = {k: f(v) for k, v in runs.items()}
    for row in rr[("old", 1)]:
        o = [rr[("old", r)][row] for r in (1, 2)]; n = [rr[("new", r)][row] for r in (1, 2)]
        print(f"| {name} | {row} | {o[0]:.3f} | {n[0]:.3f} | {o[1]:.3f} | {n[1]:.3f} | {sum(n)/sum(o):.3f} |")
PY
cat "$W/compare.md" >> "$S"
log "total $(( $(date +%s) - t0 )) s"
cp "$S" "$W/compare.md" "$O/"
tar czf "$O/logs.tgz" -C "$W" --exclude=old --exclude=b-new --exclude=b-old --exclude=ck .
cat "$S"
exit $fail
