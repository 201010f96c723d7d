#!/usr/bin/env bash
# The plug-in's speed check with a verdict the noise cannot decide: one process per allocator varies between
# runs of the same code by more than the effect measured, even two native processes. Here each model trains in ROUNDS rounds,
# each round one native and one strata process back to back, the order alternating round by round (so drift
# over the run hits both alike). speed_verdict.py then reports, per model, the median over rounds of the
# same-round ratio strata/native, its range, and each allocator's median steps/s.
#   ROUNDS=6 MODELS="gpt2_varlen gpt2 resnet18" OUT=/tmp/strata-speed bash tests/device/torch/speed_verdict.sh
# MODELS (tests/device/torch/models.py): resnet18, gpt2, gpt2_varlen, bert_varlen (BERT-base, batch and length per
# step), mixtral_moe (a Mixtral-style mixture of experts), gpt2_generate (GPT-2 greedy generation, a generate()
# call per step; eager only).
# COMPILE=1: every model through torch.compile (reported as MODEL+compile). CONF: the plug-in's configuration
# (default: empty, the plug-in's defaults). STEPS: batches per pass (48). PASSES: passes over those batches, the
# last one timed (2: every shape timed was seen before; 1: the first 8 steps warm up). WINDOW: steps between the
# host's synchronizations (8; STEPS a multiple of it). BUDGET_S: no round starts
# after this many seconds (default 540); rounds not run are counted. CUDA_VISIBLE_DEVICES picks the GPU, so
# several of these can run side by side on a machine of several GPUs, one per GPU.
# Writes $OUT/runs.jsonl (a line per process) and $OUT/verdict.md; prints the verdict lines.
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/strata-speed-verdict}
ROUNDS=${ROUNDS:-6}
MODELS=${MODELS:-gpt2_varlen gpt2 resnet18}
CONF=${CONF:-}
STEPS=${STEPS:-48}
PASSES=${PASSES:-2}
WINDOW=${WINDOW:-8}
BUDGET_S=${BUDGET_S:-540}
mkdir -p "$OUT"
T0=$SECONDS
source tests/device/torch/build_plugin.sh
strata_build_plugin "$OUT/build.txt" || { echo "FAIL build: the plug-in did not build (see $OUT/build.txt)"; exit 1; }

# one MODEL ALLOC ROUND: one training process; its JSON line, with the round, appended to runs.jsonl.
one() {
  local extra=()
  [ "$2" = strata ] && [ -n "$CONF" ] && extra=(--conf "$CONF")
  [ -n "${COMPILE:-}" ] && extra+=(--compile)
  python3 tests/device/torch/train.py --model "$1" --alloc "$2" --mode perf --steps "$STEPS" --passes "$PASSES" --window "$WINDOW" "${extra[@]}" \
    2>>"$OUT/err.txt" | tail -1 > "$OUT/last.json"
  python3 - "$OUT/last.json" "$3" >> "$OUT/runs.jsonl" <<'PY' || echo "{\"model\": \"$1${COMPILE:++compile}\", \"alloc\": \"$2\", \"round\": $3, \"failed\": true}" >> "$OUT/runs.jsonl"
import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps({"model": d["model"] + ("+compile" if d.get("compile") else ""), "alloc": d["alloc"], "round": int(sys.argv[2]), "conf": d.get("conf", ""),
                  "passes": d.get("passes", 1),
                  "steps_per_s": d["steps_per_s"], "peak_reserved": d["peak_reserved"],
                  "peak_allocated": d["peak_allocated"],
                  "strata_calls_per_step": {k[len("strata.calls."):]: v for k, v in d.get("strata_calls_per_step", {}).items() if v}}))
PY
}

for m in $MODELS; do
  for ((r = 0; r < ROUNDS; r++)); do
    if ((SECONDS - T0 > BUDGET_S)); then
      echo "{\"model\": \"$m${COMPILE:++compile}\", \"round\": $r, \"not_run\": true}" >> "$OUT/runs.jsonl"
      continue
    fi
    if ((r % 2 == 0)); then one "$m" native $r; one "$m" strata $r; else one "$m" strata $r; one "$m" native $r; fi
  done
done
python3 tests/device/torch/speed_verdict.py "$OUT/runs.jsonl" --markdown "$OUT/verdict.md"
