#!/usr/bin/env bash
# One model trained under four allocators in rotated rounds, to tell what a slowdown belongs to: PyTorch's
# default allocator (native), PyTorch's expandable segments (page-mapped memory, PyTorch's own bookkeeping),
# strata's default stack, and strata with reclaim=never (no driver call once the pool has grown).
#   OUT=DIR MODEL=bert_varlen ROUNDS=2 bash tests/device/torch/alloc_rounds.sh     (from the repository root)
# Each process: tests/device/torch/train.py --mode perf --steps 24 --passes 2 --window 8. Round 0 runs the four
# in the order above, round 1 in reverse, and so on. Writes OUT/rounds.jsonl: a line per process with its
# steps/s per window, their median, the peak reserved bytes and (strata) its calls per timed step and the sizes
# of its physical allocations at the end (train.py's strata_layout).
set -u
OUT=${OUT:-/tmp/strata-alloc-rounds}
MODEL=${MODEL:-bert_varlen}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
source tests/device/torch/build_plugin.sh
strata_build_plugin "$OUT/build.txt" || { echo "the plug-in did not build (see $OUT/build.txt)"; exit 1; }
run() {  # ALLOCATOR ROUND
  local extra=() env=() alloc=$1
  case $1 in
    expandable) env=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ;;
    never) alloc=strata extra=(--conf reclaim=never) ;;
  esac
  env "${env[@]}" python3 tests/device/torch/train.py --model "$MODEL" --alloc "$alloc" --mode perf --steps 24 --passes 2 \
    --window 8 "${extra[@]}" 2>>"$OUT/err.txt" | tail -1 |
    python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'who':'$1','round':$2,'sps':d['steps_per_s'],'med':d['steps_per_s_median'],'peak':d['peak_reserved'],'calls':d.get('strata_calls_per_step'),'layout':d.get('strata_layout')}))" \
      >>"$OUT/rounds.jsonl"
}
for ((r = 0; r < ROUNDS; r++)); do
  order="native expandable strata never"
  ((r % 2)) && order="never strata expandable native"
  for a in $order; do run "$a" "$r"; done
done
cat "$OUT/rounds.jsonl"
