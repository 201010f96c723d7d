#!/usr/bin/env bash
# Where the plug-in's training time goes (docs/pytorch.md, "Where GPT-2's time went"), on a GPU machine with
# PyTorch: builds the plug-in, then
#   alloc_cost  tests/device/torch/alloc_cost.py for native, expandable segments and each strata configuration
#               in ALLOC_CONFS -> $OUT/alloc_cost.jsonl
#   train       tests/device/torch/train.py --mode perf --steps 48 for each model in MODELS: native, then each
#               strata configuration in CONFS, then native again -> $OUT/train.txt (model, allocator,
#               configuration, side stream, median steps/s, every window) and $OUT/train.jsonl
# SIDE=0 runs train.py with STRATA_TEST_SIDE_STREAM=0 (the batch copied on the main stream, for every allocator).
#   OUT=/tmp/speed bash tests/device/torch/speed_study.sh
#   PARTS=train MODELS=gpt2 CONFS="stack=default stack=default,reclaim=never" bash tests/device/torch/speed_study.sh
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/strata-speed-study}
mkdir -p "$OUT"
PARTS=${PARTS:-alloc_cost,train}
MODELS=${MODELS:-gpt2 gpt2_varlen resnet18}
CONFS=${CONFS:-stack=default stack=default,reclaim_headroom_fraction=0.0625 stack=default,reclaim=never stack=coalescing}
ALLOC_CONFS=${ALLOC_CONFS:-stack=default stack=default,check_capture=true stack=default,owner_cover_window=always stack=default,check_capture=true,owner_cover_window=always stack=coalescing}
source tests/device/torch/build_plugin.sh
strata_build_plugin "$OUT/build.txt" || { echo "the plug-in did not build (see $OUT/build.txt)"; exit 1; }
if [[ ",$PARTS," == *,alloc_cost,* ]]; then
  A=tests/device/torch/alloc_cost.py
  python3 $A --alloc native 2>>"$OUT/err.txt" | tee -a "$OUT/alloc_cost.jsonl"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 $A --alloc expandable 2>>"$OUT/err.txt" | tee -a "$OUT/alloc_cost.jsonl"
  for c in $ALLOC_CONFS; do python3 $A --alloc strata --conf "$c" 2>>"$OUT/err.txt" | tee -a "$OUT/alloc_cost.jsonl"; done
fi
# train MODEL ALLOC [CONF]: one process, its JSON line kept and summarized.
train() {
  local env=(env STRATA_TEST_SIDE_STREAM="${SIDE:-1}") extra=()
  [ "$2" = expandable ] && env+=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
  [ -n "${3:-}" ] && extra=(--conf "$3")
  "${env[@]}" python3 tests/device/torch/train.py --model "$1" --alloc "$2" --mode perf --steps 48 "${extra[@]}" \
    2>>"$OUT/err.txt" | tail -1 > "$OUT/last.json"
  python3 -c "import json; d=json.load(open('$OUT/last.json')); print('$1', '$2', '${3:-}', 'side=${SIDE:-1}', round(d['steps_per_s_median'], 3), [round(x, 2) for x in d['steps_per_s']])" | tee -a "$OUT/train.txt"
  cat "$OUT/last.json" >> "$OUT/train.jsonl"
}
if [[ ",$PARTS," == *,train,* ]]; then
  for m in $MODELS; do
    train "$m" native
    for c in $CONFS; do train "$m" strata "$c"; done
    train "$m" native
  done
fi
